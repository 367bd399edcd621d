"""Train one cell into its run directory (see docs/run-directory.md for the layout).

The loop is a plain GPT training loop with the configured optimizer, schedule and init. What
the harness adds: batches that depend only on (seed, step), per-layer probes with one host copy
per logged step, divergence recorded as a result, and checkpoints that make any interruption
resumable bit for bit.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import jsonlines
import torch
from tqdm import tqdm

from ablate.core.bounded_read import UnreadableFile, bounded_lines, parse_json
from ablate.core.errors import ConfigError
from ablate.core.provenance import git_commit, machine_changed, machine_record, versions
from ablate.core.rundir import (CHECKPOINT, COMPLETED, CONFIG, DIVERGED, METRICS, SUMMARY, differing, file_version,
                                finite_or_none, identity, open_regular, read_json, replace_atomic, run_summary,
                                write_json_atomic)
from ablate.engine import fpmode, plugins
from ablate.engine.config import IDENTITY_KEYS, NOT_COMPARED, OPTIONS, TrainConfig
from ablate.engine.data import TokenData, load_data
from ablate.engine.dead_stop import WATCH_KEYS, dead_watch
from ablate.engine.lr import lr_at
from ablate.engine.model import GPT, build_model
from ablate.engine.probes import Probes
from ablate.engine.sizes import ModelSize
from ablate.kernels import cpu_attention, cpu_gelu, get_backend
from ablate.kernels.cpu_build import say_fallbacks
from ablate.kernels.select import pick_auto
from ablate.kernels.step_cache import step_shape
from ablate.variants import AXES, OPTIMIZERS

FINAL_LOSS_WINDOW = 10


class Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM arrived; a checkpoint was written at the last finished step.
    Not an Exception: an interrupted run is neither failed nor retried."""


def requested_device(cfg: TrainConfig) -> torch.device:
    """The device `cfg` asks for, `auto` resolved, whether or not this machine has it."""
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def pick_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available; valid here: cpu, auto")
    return requested_device(cfg)


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None  # float32 on the CPU: bitwise-repeatable


@dataclass
class RunPlan:
    """A cell resolved for this machine: its config, device, precision, data and kernels; and,
    once planned into a run folder, what that folder's config.json said and what the run
    therefore trains with. The folder is read and checked once, here; training uses the plan."""
    cfg: TrainConfig
    device: torch.device
    amp: torch.dtype | None
    size: ModelSize
    data: TokenData
    ops: Any  # the kernel backend, `auto` resolved
    run_dir: Path | None = None
    recorded: dict | None = None  # the folder's config.json when planned (None: a new run)
    recorded_version: tuple | None = None  # rundir.file_version of that config.json
    # What the run trains with: a resumed run keeps its own (see _threads_for, _flush_for; the
    # GELU form is settled from `recorded` when training starts, where its kernel is built).
    threads: int | None = None
    flush: bool = False


def _size_and_data(cfg: TrainConfig) -> tuple[ModelSize, TokenData]:
    size = cfg.size
    data = load_data(cfg.data, size.tokenizer, size.vocab_size)
    if data.vocab_size != size.vocab_size:
        size = replace(size, vocab_size=data.vocab_size)  # pre-tokenized shards bring their own vocabulary
    return size, data


def plan_run(cell, execution=None, run_dir: str | Path | None = None) -> RunPlan:
    """Check everything that could refuse `cell` (device, data, kernel backend, and with
    `run_dir` the run that folder already holds) without writing anything, so a refused run
    leaves no trace. `execution` (ablate.engine.cell.CellResources) brings a scheduler's thread count,
    which a `threads` in the cell's own options overrides."""
    cfg = cell.config
    threads = execution.threads_for(cell) if execution is not None else cfg.threads
    if threads != cfg.threads:
        cfg = replace(cfg, threads=threads)
    device = pick_device(cfg)
    size, data = _size_and_data(cfg)
    check_data_fits(data, cfg.context)
    dead_watch(cfg, data.unigram_entropy)  # refuses stop_dead on data without the plateau's loss

    amp = autocast_dtype(cfg, device)
    ops = get_backend(cfg.kernels, str(device), shape=step_shape(cfg, size, amp))
    if getattr(ops, "interpreted", False):
        _note_interpreted(ops.name, cfg.batch_size * cfg.context)
    plan = RunPlan(cfg, device, amp, size, data, ops)
    if run_dir is not None:
        _plan_into(cell, plan, Path(run_dir))
    return plan


@functools.lru_cache(maxsize=None)  # once a process: a grid worker plans every cell it trains
def _note_interpreted(kernels: str, rows: int) -> None:
    """Why a run on interpreted kernels crawls (measured: about 5 ms a program instance, one
    instance per token row, so seconds per launch and minutes per step at `tiny`'s defaults;
    not a loop), and the bounded way to check those kernels on a CPU."""
    print(f"ablate: kernels {kernels!r} run in Triton's CPU interpreter (TRITON_INTERPRET=1): every launch runs "
          f"one Python program per token row ({rows:,} here, about 5 ms each: about {rows * 0.005:.2g} s a launch, "
          f"dozens of launches a step); to check the kernels on a CPU, run `ablate kernels check --backends "
          f"{kernels}`", file=sys.stderr, flush=True)


def _plan_into(cell, plan: RunPlan, run_dir: Path) -> None:
    """Read `run_dir`'s config.json once, refuse it when it holds another run, and settle what
    a resumed run keeps (its threads and subnormal flushing)."""
    plan.run_dir = run_dir
    plan.recorded_version = file_version(run_dir / CONFIG)  # before reading: a later write reads as changed
    plan.recorded = old = _read_config(run_dir)
    if old is not None:
        kernels = recorded_kernels(old)
        if plan.ops.name == "reference" and kernels == "cpu" and plan.cfg.kernels == old.get("train", {}).get("kernels"):
            plan.ops = get_backend("cpu", str(plan.device))  # the same request resumes as it ran (recorded_kernels)
        _refuse_another_run(run_dir, _by_todays_names(old),
                            run_config(cell, plan.cfg, plan.size, plan.data, plan.device, plan.ops.name))
    plan.threads = _threads_for(cell, plan.cfg, old, run_dir)
    plan.flush = _flush_for(cell, plan.cfg, old, run_dir)


def check_data_fits(data: TokenData, seq_len: int) -> None:
    """Refuse data that the first batch or the first evaluation would fail on."""
    name = repr(data.path) if data.path else "the default corpus"
    for split in ("train", "val"):
        arrays = getattr(data, split)
        if not any(a.size > seq_len for a in arrays):  # a window needs seq_len + 1 tokens
            tokens = sum(int(a.size) for a in arrays)
            raise ConfigError(f"data {name}: its {split} split has {tokens} tokens, fewer than seq_len {seq_len} + 1; "
                              "valid: more data (validation holds out the last 5% of a text) or a smaller seq_len")
    if data.source == "shards":  # text is tokenized into the model's vocabulary; shards bring their own ids
        top = data.max_token if data.max_token is not None else max(
            (int(a.max()) for a in data.train + data.val if a.size), default=0)
        if top >= data.vocab_size:
            raise ConfigError(f"data {name} holds token id {top}, outside the model's vocabulary of "
                              f"{data.vocab_size}; valid: shards with token ids below {data.vocab_size}")


# The CPU kernels whose form a run records and keeps: config.json key -> (kernel, what it computes).
CPU_KERNELS = {"gelu_cpu": (cpu_gelu.KERNEL, "GELU"), "attention_cpu": (cpu_attention.KERNEL, "attention")}
# Forms of earlier runs this code no longer computes: a run made with one is refused, not resumed.
RETIRED_FORMS = {"gelu_cpu": cpu_gelu.RETIRED}


def recorded_kernels(config: dict) -> str | None:
    """The kernel backend a config.json's run trained with, by today's names. Before the `cpu`
    backend, `reference` ran the CPU kernels on a CPU, as `cpu` does now (a run with forms
    recorded, or one made before the kernels, whose torch fallbacks `cpu` keeps computing);
    a `reference` run of today records no forms (None)."""
    kernels = config.get("kernels")
    if kernels == "reference" and str(config.get("device", "")).startswith("cpu") and \
            any(config.get(key, "unrecorded") is not None for key in CPU_KERNELS):
        return "cpu"
    return kernels


def _by_todays_names(config: dict) -> dict:
    return {**config, "kernels": recorded_kernels(config)}


def run_config(cell, cfg: TrainConfig, size: ModelSize, data: TokenData, device: torch.device, kernels: str,
               params: int | None = None, threads: int | None = None, flush_denormal: bool | None = None,
               subnormals_flushed: bool | None = None, cpu_forms: dict[str, str | None] | None = None,
               machines: dict | None = None) -> dict:
    """config.json. threads, flush_denormal: the values the run trains with (a resumed run's
    own); subnormals_flushed: what ablate.engine.fpmode measured in the torch threads once they were set
    (True in all, False in none, None mixed); cpu_forms: the forms of the CPU kernels, by their
    config.json keys (CPU_KERNELS); machines: `machine` and `resumed_on` (ablate.core.provenance.machine_record,
    this machine alone when not given)."""
    spec = cfg.spec
    flush = cfg.flush_denormal if flush_denormal is None else flush_denormal
    return {
        "cell_id": cell.id,
        "group": cell.group,
        "variant": {"id": spec.id, **spec.axes()},
        "model": {**size.as_dict(), "init": cfg.init_name, "params": params},
        # Resolved values: the context, and the CPU threads in use (they fix the reductions' bits).
        "train": {**cfg.as_dict(), "seq_len": cfg.context, "threads": threads, "flush_denormal": flush},
        # The `train` keys that define the run (ablate/engine/config.py roles): what analysis compares
        # to call two cells "the same settings".
        "identity_keys": list(IDENTITY_KEYS),
        "seed": cfg.seed,
        "axes": cell.axes,
        "grid": cell.grid,
        "data": data.describe(),
        "kernels": kernels,
        "device": str(device),
        "dtype": str(autocast_dtype(cfg, device) or torch.float32).replace("torch.", ""),
        "subnormals_flushed": subnormals_flushed,
        **{key: (cpu_forms or {}).get(key) for key in CPU_KERNELS},
        "versions": versions(),
        **(machines or machine_record(None)),
        "git_commit": git_commit(),
        "plugins": plugins.records(),  # the code outside the package that defined values, with its sha256
    }


# What "the same run" compares (ablate.core.rundir.identity): every option that changes the numbers
# or what is logged (ablate/engine/config.py: all but NOT_COMPARED), with the default a config written
# before it existed had. The variant axes are compared as the variant they resolve to (its id):
# `--variant post-ln` and `--norm post` are one variant.
def compared() -> dict:
    """Worked out when asked: a plugin's component options join OPTIONS when it is imported."""
    return {k: OPTIONS[k].default for k in OPTIONS if k not in NOT_COMPARED + AXES}


def _shown(config: dict, key: str) -> str:
    """An identity value as the user would recognise it."""
    if key == "data":
        data = config["data"]
        return f"{data.get('path')!r} ({str(data.get('fingerprint'))[:19]})"
    return repr(identity(config, compared())[key])


def _read_config(run_dir: Path) -> dict | None:
    """The run directory's config.json, None when there is none."""
    path = run_dir / CONFIG
    if not path.exists():
        return None
    try:
        config = read_json(path)
    except UnreadableFile as e:  # a FIFO, a device, too large, not JSON, nested, non-finite
        raise ConfigError(f"{e}; valid: remove {run_dir} to start that run again") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read ({_reason(e)}); valid: remove {run_dir} to start that run again") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a run's config; valid: remove {run_dir} to start that run again")
    return config


def _reason(e: Exception) -> str:
    """An error reading a run file, in a few words: `OSError: not a regular file` for a FIFO."""
    return f"{type(e).__name__}: {e.strerror}" if isinstance(e, OSError) and e.strerror else type(e).__name__


def _refuse_another_run(run_dir: Path, old: dict, new: dict) -> None:
    differ = differing(old, new, compared())
    if differ:
        was = ", ".join(f"{k}={_shown(old, k)}" for k in differ)
        now = ", ".join(f"{k}={_shown(new, k)}" for k in differ)
        raise ConfigError(f"{run_dir} holds a run with a different training config ({was}), but this command "
                          f"asks for {now}; valid: the run's own options, another --out, or remove that folder")
    _refuse_changed_plugins(run_dir, old, new)


def _refuse_changed_plugins(run_dir: Path, old: dict, new: dict) -> None:
    """A plugin defines values the run trained with: the same plugin with other code is another
    run, refused like any other setting that differs (resuming would mix two codes in one run)."""
    def by_name(config: dict) -> dict:
        records = config.get("plugins")
        return {(r.get("source"), r.get("name")): r for r in records if isinstance(r, dict)} \
            if isinstance(records, list) else {}

    now = by_name(new)
    for key, was in by_name(old).items():
        if key in now and was.get("sha256") != now[key].get("sha256"):
            where = was.get("file") or was.get("name")
            raise ConfigError(f"{run_dir} was trained with plugin {where} at {was.get('sha256')}, but that plugin "
                              f"is now {now[key].get('sha256')}; a changed plugin is a changed run; valid: the "
                              "plugin as it was, another --out, or remove that folder")


def _threads_for(cell, cfg: TrainConfig, old: dict | None, run_dir: Path) -> int:
    """The CPU threads to train with. Results repeat bit for bit only at one thread count, so
    a run keeps the count it started with; asking for another one explicitly is refused.
    (A scheduler's per-worker count is not the user's request: Cell.is_given tells them apart.)"""
    recorded = (old or {}).get("train", {}).get("threads")
    if recorded is None:
        return cfg.threads or torch.get_num_threads()
    if cfg.threads is not None and cfg.threads != recorded and cell.is_given("threads"):
        raise ConfigError(f"{run_dir} holds a run trained with threads={recorded}, but this command asks for "
                          f"threads={cfg.threads}, which would change its bits; valid: threads={recorded} or no "
                          "threads option, another --out, or remove that folder")
    return recorded


def _flush_for(cell, cfg: TrainConfig, old: dict | None, run_dir: Path) -> bool:
    """Whether to flush subnormal floats to zero (ablate.engine.fpmode). Once a value falls below the
    normal range it changes the run's bits, so a run keeps the setting it started with; a
    config.json written before the option existed trained with subnormals kept (torch's
    default), and resumes so, bit for bit. Asking explicitly for the other value is refused."""
    if old is None:
        return cfg.flush_denormal
    recorded = bool(old.get("train", {}).get("flush_denormal", False))
    if cfg.flush_denormal != recorded and cell.is_given("flush_denormal"):
        was, now = str(recorded).lower(), str(cfg.flush_denormal).lower()
        raise ConfigError(f"{run_dir} holds a run trained with flush_denormal={was}, but this command asks for "
                          f"flush_denormal={now}, which would change its bits; valid: flush_denormal={was} or no "
                          "flush_denormal option, another --out, or remove that folder")
    return recorded


def _cpu_forms_for(old: dict | None, run_dir: Path, device: torch.device, kernels: str) -> dict[str, str | None]:
    """The forms of the CPU kernels to train with, by config.json key (ablate/kernels/cpu_build.py).
    A form fixes its op's last bits, so a run keeps the forms it started with; a config.json
    without one was written before that kernel, by its torch fallback. A form this machine
    cannot compute (no compiler, another CPU), or one retired (RETIRED_FORMS), is refused: the
    run would not continue on its own bits. A run on another device or another backend than
    `cpu` computes none of them (None: nothing built, nothing refused)."""
    if device.type != "cpu" or kernels != "cpu":
        return dict.fromkeys(CPU_KERNELS)
    if old is None:
        forms = {key: kernel.best() for key, (kernel, _) in CPU_KERNELS.items()}
        say_fallbacks(CPU_KERNELS, forms)
        return forms
    forms = {}
    for key, (kernel, what) in CPU_KERNELS.items():
        recorded = old.get(key)
        if recorded is None:  # written before that kernel existed: by its torch fallback
            recorded = kernel.fallback
        elif not isinstance(recorded, str) or not recorded:  # "" is no form: never resumed as the fallback
            raise ConfigError(f"{run_dir}: config.json records {key} = {json.dumps(recorded)[:40]}, which is no "
                              f"form of the {what}; valid: remove that folder to train it again")
        if recorded in RETIRED_FORMS.get(key, ()):
            raise ConfigError(f"{run_dir} holds a run whose {what} was computed as {recorded!r}, a form this "
                              f"version of ablate no longer computes; valid: remove that folder to train it again "
                              f"(as {kernel.best()!r})")
        if recorded not in (here := kernel.available()):
            raise ConfigError(f"{run_dir} holds a run whose {what} was computed as {recorded!r}, which this machine "
                              f"cannot compute ({kernel.library()[1] or 'another CPU'}); valid here: "
                              f"{', '.join(here)}: resume it where it started, or remove that folder")
        forms[key] = recorded
    return forms


def check_existing_run(cell, run_dir: str | Path) -> None:
    """Refuse (ConfigError, nothing written) when `run_dir` already holds a run of another
    config than `cell` asks for, without planning the cell to train: for a finished run, only
    compared, so nothing is loaded or built that running would need (a run to train is checked
    by plan_run)."""
    run_dir = Path(run_dir)
    old = _read_config(run_dir)
    if old is None:
        return
    cfg = cell.config
    size, data = _size_and_data(cfg)
    device = requested_device(cfg)  # a finished cpu run and `--device cuda` differ even where no GPU is
    kernels = cfg.kernels
    if kernels == old.get("train", {}).get("kernels"):
        # The same request: `auto` may pick another backend on another machine, but a
        # finished run is not run again to find out. Otherwise resolve it as a run would.
        kernels = recorded_kernels(old)
    elif kernels == "auto":
        kernels = pick_auto(str(device), step_shape(cfg, size, autocast_dtype(cfg, device)))
    _refuse_another_run(run_dir, _by_todays_names(old), run_config(cell, cfg, size, data, device, kernels))
    _threads_for(cell, cfg, old, run_dir)
    _flush_for(cell, cfg, old, run_dir)


def _keep_metrics_before(path: Path, step: int) -> list[float]:
    """Drop metrics rows from steps at or after `step` (written after the checkpoint we resume
    from) so each step is logged once, keep every valid row before it, and skip (with a warning
    naming it) any line that is not a metrics row: a last line cut short by a crash, or garbage.
    Returns the losses of the last FINAL_LOSS_WINDOW rows kept, for final_loss."""
    if not path.exists():
        return []
    kept, skipped = [], []
    try:
        f = open_regular(path)  # a FIFO would block the reader (and the writer after it)
    except OSError as e:
        raise ConfigError(f"{path} cannot be read ({_reason(e)}); valid: remove {path.parent} to start that run "
                          "again") from None
    with f:
        for number, raw in enumerate(bounded_lines(f), start=1):  # a line over LINE_BYTES is None
            try:
                row = parse_json(raw, top=dict, finite=False) if raw is not None else None
                valid = isinstance(row, dict) and isinstance(row.get("step"), int) and "loss" in row
            except ValueError:  # not JSON, not UTF-8, nested thousands deep
                valid = False
            if not valid:
                if raw is None or raw.strip():
                    skipped.append(number)
                continue
            if row["step"] < step:
                kept.append((raw if raw.endswith(b"\n") else raw + b"\n", row["loss"]))
    if skipped:
        lines = ", ".join(map(str, skipped[:5])) + (" ..." if len(skipped) > 5 else "")
        print(f"ablate: {path}: skipped {len(skipped)} unreadable line(s) ({lines}) on resume", file=sys.stderr)
    data = b"".join(line for line, _ in kept)
    replace_atomic(path, lambda f: f.write(data))
    return [loss for _, loss in kept[-FINAL_LOSS_WINDOW:] if loss is not None]


def missing_logged_steps(path: Path, start: int, log_every: int) -> list[int]:
    """The steps before `start` the schedule logged but metrics.jsonl has no row for: a line a
    resume could not read and dropped. Derived from the file alone, so every later resume and
    the summary find the same gap."""
    expected = set(range(0, start, log_every))
    if not expected or not path.exists():
        return sorted(expected)
    with open_regular(path) as f:
        for raw in bounded_lines(f):
            try:
                expected.discard(parse_json(raw, top=dict, finite=False).get("step"))
            except (ValueError, AttributeError, TypeError):  # rows kept by a resume are valid; be safe
                continue
    return sorted(expected)


def _save_checkpoint(path: Path, model, opt, step: int, state: dict) -> None:
    """Tensors and plain values only, so that resuming loads it with weights_only=True: a
    checkpoint on disk can never run code. Written beside and renamed over (never through a link)."""
    ckpt = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
            "torch_rng": torch.get_rng_state(), **state}
    replace_atomic(path, lambda f: torch.save(ckpt, f))


def _open_metrics(path: Path):
    """metrics.jsonl for appending, one row per line flushed as written; O_NOFOLLOW: a link
    planted in the run folder is refused, never written through."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o666)
    return jsonlines.Writer(os.fdopen(fd, "w"), flush=True)


def _load_checkpoint(path: Path, device) -> dict:
    try:
        with open_regular(path) as f:  # a FIFO would block the load
            ckpt = torch.load(f, map_location=device, weights_only=True)
        if not isinstance(ckpt, dict) or not {"model", "optimizer", "step", "torch_rng"} <= set(ckpt):
            raise ValueError("not a checkpoint of this harness")
        return ckpt
    except Exception as e:  # noqa: BLE001  (a damaged or foreign file: refuse it, run nothing from it)
        raise ConfigError(f"{path} cannot be resumed from ({type(e).__name__}: {' '.join(str(e).split())[:160]}); "
                          f"valid: remove it to restart the run from step 0") from None


def make_optimizer(model: GPT, cfg: TrainConfig):
    return OPTIMIZERS.get(cfg.optimizer).build(model, cfg)


def z_loss_term(logits: torch.Tensor) -> torch.Tensor:
    """mean(logsumexp(logits)^2) over positions (PaLM's auxiliary loss; its coefficient is z_loss)."""
    return torch.logsumexp(logits.float(), dim=-1).square().mean()


@contextlib.contextmanager
def _graceful_signals():
    """Turn SIGINT/SIGTERM into a flag the loop checks between steps."""
    received: list[int] = []
    handler = lambda signum, frame: received.append(signum)  # noqa: E731
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    in_main = True
    try:
        for s in old:
            signal.signal(s, handler)
    except ValueError:  # not the main thread (e.g. a Ray task): leave signals alone
        in_main = False
    try:
        yield received
    finally:
        if in_main:
            for s, h in old.items():
                signal.signal(s, h)


@torch.no_grad()
def evaluate(model: GPT, data: TokenData, cfg: TrainConfig, device, amp, batches: int) -> float:
    """Mean loss on the first `batches` validation batches. They are fixed (seed 0), so every
    cell of a grid is scored on the same text, and the final evaluation's larger set contains the
    periodic one's."""
    model.eval()
    total = 0.0
    for i in range(batches):
        x, y = data.batch("val", i, 0, cfg.batch_size, cfg.context, device)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            total += model(x, y)[1].item()
    model.train()
    return total / batches


def train(cell, run_dir: str | Path, quiet: bool = True, plan: RunPlan | None = None,
          after_step: Callable[[], None] | None = None) -> dict:
    """Train (or resume) `cell` in `run_dir`; returns the summary it wrote. `plan`: the cell's
    plan_run into `run_dir`, when the caller has already made it. `after_step`: called after
    each step's metrics row is written, outside the step time the row logs (`ablate bench` runs
    its plain loop's steps there, in lockstep with the harness's)."""
    run_dir = Path(run_dir)
    if plan is None:
        plan = plan_run(cell, run_dir=run_dir)
    elif plan.run_dir != run_dir:
        raise ValueError(f"the plan was made for {plan.run_dir}, not {run_dir}: plan_run(cell, execution, run_dir)")
    forms = _cpu_forms_for(plan.recorded, run_dir, plan.device, plan.ops.name)
    outer_threads, outer_flush = torch.get_num_threads(), fpmode.main_thread_flushing()
    torch.set_num_threads(plan.threads)
    fpmode.apply(plan.flush)  # after the thread count: it reaches every thread the run will use
    try:
        with contextlib.ExitStack() as stack:
            for key, (kernel, _) in CPU_KERNELS.items():
                stack.enter_context(kernel.using(forms[key]))
            return _train(cell, plan, forms, quiet, after_step)
    finally:
        # The next run in this process (a bench, a test, a grid worker's next cell) starts clean.
        torch.set_num_threads(outer_threads)
        fpmode.set_flush_denormal(outer_flush)


@dataclass
class RunState:
    """Where a run stands between steps: restored from the checkpoint on a resume."""
    start: int = 0  # the first step this process trains
    first_loss: float | None = None  # the run's first loss: divergence is measured against it
    elapsed: float = 0.0  # training time before this process, for time_s
    # The losses of the last FINAL_LOSS_WINDOW *logged* steps (docs/run-directory.md: final_loss), the
    # same rows `ablate report` reads, so a resume carries over the ones logged before it.
    recent: list[float] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)  # logged steps whose rows a resume lost
    val_loss: float | None = None
    watch: dict = field(default_factory=dict)  # the dead-run watch's state (ablate/engine/dead_stop.py)
    stopped_dead: bool = False


def _train(cell, plan: RunPlan, forms: dict[str, str | None], quiet: bool,
           after_step: Callable[[], None] | None) -> dict:
    """The training loop: set the lr, take a batch, step, evaluate, log, checkpoint."""
    cfg, data, device, run_dir = plan.cfg, plan.data, plan.device, plan.run_dir
    model, opt = _build(cell, plan, forms)
    state = _resume(plan, model, opt)
    probes = Probes(model, compiled=cfg.compile, autocast=(device.type, plan.amp)) if cfg.probes else None
    model.record_act_norms = cfg.probes
    forward = torch.compile(model) if cfg.compile else model
    tokens_per_step = cfg.batch_size * cfg.context
    watch = dead_watch(cfg, data.unigram_entropy)
    if watch is not None:
        watch.restore(state.watch)
    status, step = COMPLETED, state.start - 1
    bar = _progress(cfg, state.start, quiet)
    clock0 = time.perf_counter() - state.elapsed  # time_s is wall-clock training time, resumes included
    with _open_metrics(run_dir / METRICS) as log, _graceful_signals() as signals:
        for step in range(state.start, cfg.steps):
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = data.batch("train", step, cfg.seed, cfg.batch_size, cfg.context, device)  # ...and the batch order
            loss_value, metrics = train_step(plan, model, forward, opt, probes, step, x, y)
            dt = time.perf_counter() - t0
            state.first_loss = loss_value if state.first_loss is None else state.first_loss
            diverged = not math.isfinite(loss_value) or loss_value > cfg.diverge_factor * state.first_loss
            state.stopped_dead = not diverged and watch is not None and watch.stops(step, {"loss": loss_value, **metrics})
            last = step == cfg.steps - 1 or diverged or state.stopped_dead
            if not diverged and (last or (step + 1) % cfg.eval_every == 0):
                state.val_loss = evaluate(model, data, cfg, device, plan.amp,
                                          cfg.final_eval_batches if last else cfg.eval_batches)
                metrics["val_loss"] = finite_or_none(state.val_loss)
            if step % cfg.log_every == 0 or last:
                log.write({"step": step, "tokens": (step + 1) * tokens_per_step, "loss": finite_or_none(loss_value),
                           "lr": lr, **metrics, "time_s": time.perf_counter() - clock0,
                           "tokens_per_s": tokens_per_step / dt})
                state.recent = (state.recent + [loss_value])[-FINAL_LOSS_WINDOW:]
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_step / dt:,.0f}")
            if after_step is not None:
                after_step()
            if diverged:
                status = DIVERGED
            if last:
                break
            if (step + 1) % cfg.checkpoint_every == 0 or signals:
                state.elapsed = time.perf_counter() - clock0
                _save_checkpoint(run_dir / CHECKPOINT, model, opt, step + 1,
                                 {"first_loss": state.first_loss, "elapsed": state.elapsed,
                                  **(watch.state() if watch is not None else {})})
                if signals:
                    raise Interrupted(f"interrupted by {signal.Signals(signals[0]).name} after step {step}; "
                                      f"checkpointed in {run_dir}: rerun the same command to resume")
    if bar is not None:
        bar.close()
    return finish_panels(run_dir, state, status, step, time.perf_counter() - clock0)


def _build(cell, plan: RunPlan, forms: dict[str, str | None]) -> tuple[GPT, Any]:
    """The model and its optimizer, and the run's config.json (written before the first step)."""
    cfg = plan.cfg
    torch.manual_seed(cfg.seed)  # the seed fixes the initial weights...
    model = build_model(cfg.spec, plan.size, plan.ops, plan.device, init=cfg.init_name)
    opt = make_optimizer(model, cfg)
    continuing = plan.recorded if (plan.run_dir / CHECKPOINT).exists() else None  # else it starts at step 0
    moved = machine_changed(continuing) if plan.device.type == "cpu" else None
    if moved:
        print(f"ablate: {plan.run_dir} {moved}", file=sys.stderr)
    config = run_config(cell, cfg, plan.size, plan.data, plan.device, plan.ops.name,
                        params=sum(p.numel() for p in model.parameters()), threads=plan.threads,
                        flush_denormal=plan.flush, subnormals_flushed=fpmode.flushing(), cpu_forms=forms,
                        machines=machine_record(continuing))
    plan.run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(plan.run_dir / CONFIG, config)
    return model, opt


def _resume(plan: RunPlan, model: GPT, opt) -> RunState:
    """Load the checkpoint into `model` and `opt` if there is one, and drop the metrics rows
    written after it (so each step is logged once)."""
    state = RunState()
    ckpt_path, metrics = plan.run_dir / CHECKPOINT, plan.run_dir / METRICS
    if ckpt_path.exists():
        ckpt = _load_checkpoint(ckpt_path, plan.device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        state.start, state.first_loss, state.elapsed = ckpt["step"], ckpt["first_loss"], ckpt["elapsed"]
        state.watch = {k: ckpt[k] for k in WATCH_KEYS if k in ckpt}
    state.recent = _keep_metrics_before(metrics, state.start)
    state.missing = missing_logged_steps(metrics, state.start, plan.cfg.log_every) if state.start else []
    if state.missing:
        missing = state.missing
        print(f"ablate: {metrics}: no row for step{'s' if len(missing) > 1 else ''} "
              f"{', '.join(map(str, missing[:10]))}{' ...' if len(missing) > 10 else ''} (an unreadable line dropped "
              "on resume); summary.json names them", file=sys.stderr)
    return state


def train_step(plan: RunPlan, model: GPT, forward, opt, probes: Probes | None, step: int,
                x: torch.Tensor, y: torch.Tensor) -> tuple[float, dict]:
    """One optimizer step on the batch (x, y): its loss, and on a logged step the probes'
    metrics (on every probe_every-th one the costlier stability metrics too)."""
    cfg, amp = plan.cfg, plan.amp
    logged = probes is not None and step % cfg.log_every == 0
    probing = logged and step % cfg.probe_every == 0
    if probes is not None:
        probes.stability.capture = probing and not cfg.compile  # the hooks keep what measure() reads
    with torch.autocast(plan.device.type, dtype=amp, enabled=amp is not None):
        logits, loss = forward(x, y)
    # The logged loss is the cross-entropy alone, comparable across z_loss values.
    objective = loss + cfg.z_loss * z_loss_term(logits) if cfg.z_loss > 0 else loss
    objective.backward()
    if logged:
        grad_norms = probes.grad_norms()  # before clipping: what the model produced
    stability = None
    if probing:  # the costlier metrics (a copy of the weights; attention scores) every probe_every steps
        probes.before_step()
        stability = probes.stability.measure(x, logits)  # before the optimizer step: at this forward's weights
    if cfg.grad_clip > 0:
        clip_gradients(model, cfg.grad_clip, probes.norms if logged and probes.norms_clip else None)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if not logged:
        return loss.item(), {}
    return probes.collect(loss, grad_norms, model.act_norms, x.numel() * plan.size.d_model, stability)


def clip_gradients(model: GPT, max_norm: float, norms: list[torch.Tensor] | None = None) -> None:
    """torch's clip_grad_norm_. `norms`: every gradient's norm, as the probes just computed them
    (the same _foreach_norm over the same gradients in the same order): the total is taken from
    them instead of computing them a second time, to the same bits (tested)."""
    if norms is None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return
    total = torch.linalg.vector_norm(torch.stack(norms), 2.0)  # as torch.nn.utils.get_total_norm
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, total)


def finish_panels(run_dir: Path, state: RunState, status: str, step: int, elapsed: float) -> dict:
    """Write summary.json and drop the checkpoint: a finished run is never resumed."""
    completed = status == COMPLETED
    summary = run_summary(status,
                          final_loss=sum(state.recent) / len(state.recent) if completed and state.recent else None,
                          final_val_loss=state.val_loss if completed else None,
                          diverged_at_step=step if status == DIVERGED else None,
                          steps=step + 1, wall_time_s=elapsed, missing_steps=state.missing,
                          stopped_dead_at_step=step if state.stopped_dead else None)
    write_json_atomic(run_dir / SUMMARY, summary)
    (run_dir / CHECKPOINT).unlink(missing_ok=True)
    return summary


def _progress(cfg: TrainConfig, start: int, quiet: bool):
    if quiet or not sys.stderr.isatty():
        return None

    return tqdm(total=cfg.steps, initial=start, unit="step", dynamic_ncols=True)


# The lone loop's parts that a pack of stacked seeds (ablate/engine/pack_train.py) reuses, so each member
# is built, resumed, logged, checkpointed and finished by the same code as its cell alone.
build_run, resume_run, finish_run, save_checkpoint = _build, _resume, finish_panels, _save_checkpoint
open_metrics, graceful_signals, cpu_forms_for = _open_metrics, _graceful_signals, _cpu_forms_for
