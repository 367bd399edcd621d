"""Train one cell into its run directory (see runs/README.md for the layout).

The loop is a plain GPT training loop with the configured optimizer, schedule and init. What
the harness adds: batches that depend only on (seed, step), per-layer probes with one host copy
per logged step, divergence recorded as a result, and checkpoints that make any interruption
resumable bit for bit.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import jsonlines
import torch

from ablate import fpmode, plugins
from ablate.config import IDENTITY_KEYS, NOT_COMPARED, OPTIONS, TrainConfig
from ablate.data import TokenData, load_data
from ablate.errors import ConfigError
from ablate.kernels import cpu_gelu, get_backend
from ablate.model import GPT, build_model
from ablate.probes import Probes
from ablate.provenance import git_commit, versions
from ablate.rundir import (CHECKPOINT, COMPLETED, CONFIG, DIVERGED, METRICS, SUMMARY, finite_or_none, read_json,
                           replace_atomic, write_json_atomic)
from ablate.schedule import lr_at
from ablate.sizes import ModelSize
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
    """A cell resolved for this machine: its config, device, precision, data and kernels."""

    cfg: TrainConfig
    device: torch.device
    amp: torch.dtype | None
    size: ModelSize
    data: TokenData
    ops: Any  # the kernel backend, `auto` resolved


def _size_and_data(cfg: TrainConfig) -> tuple[ModelSize, TokenData]:
    size = cfg.size
    data = load_data(cfg.data, size.tokenizer, size.vocab_size)
    if data.vocab_size != size.vocab_size:
        size = replace(size, vocab_size=data.vocab_size)  # pre-tokenized shards bring their own vocabulary
    return size, data


def plan_run(cell, execution=None) -> RunPlan:
    """Check everything that could refuse `cell` (device, data, kernel backend) without
    writing anything, so a refused run leaves no trace. `execution` (ablate.cell.CellResources)
    brings a scheduler's thread count, which a `threads` in the cell's own options overrides."""
    cfg = cell.config
    threads = execution.threads_for(cell) if execution is not None else cfg.threads
    if threads != cfg.threads:
        cfg = replace(cfg, threads=threads)
    device = pick_device(cfg)
    size, data = _size_and_data(cfg)
    check_data_fits(data, cfg.context)
    ops = get_backend(cfg.kernels, str(device))
    return RunPlan(cfg, device, autocast_dtype(cfg, device), size, data, ops)


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


def run_config(cell, cfg: TrainConfig, size: ModelSize, data: TokenData, device: torch.device, kernels: str,
               params: int | None = None, threads: int | None = None, flush_denormal: bool | None = None,
               subnormals_flushed: bool | None = None, gelu_cpu: str | None = None) -> dict:
    """config.json. threads, flush_denormal: the values the run trains with (a resumed run's
    own); subnormals_flushed: what ablate.fpmode measured in the torch threads once they were set
    (True in all, False in none, None mixed); gelu_cpu: the form of the CPU tanh-GELU
    (ablate/kernels/cpu_gelu.py)."""
    spec = cfg.spec
    flush = cfg.flush_denormal if flush_denormal is None else flush_denormal
    return {
        "cell_id": cell.id,
        "group": cell.group,
        "variant": {"id": spec.id, **spec.axes()},
        "model": {**size.as_dict(), "init": cfg.init_name, "params": params},
        # Resolved values: the context, and the CPU threads in use (they fix the reductions' bits).
        "train": {**cfg.as_dict(), "seq_len": cfg.context, "threads": threads, "flush_denormal": flush},
        # The `train` keys that define the run (ablate/config.py roles): what analysis compares
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
        "gelu_cpu": gelu_cpu,
        "versions": versions(),
        "git_commit": git_commit(),
        "plugins": plugins.records(),  # the code outside the package that defined values, with its sha256
    }


# Options compared by what they resolve to rather than as spelled: `--variant post-ln` and
# `--norm post` are one variant, `auto` is whatever it picked, the data is its token stream.
RESOLVED = ("variant", *AXES, "layers", "init", "data", "kernels", "device", "dtype")


def _identity(config: dict) -> dict[str, Any]:
    """What must match for a run directory to hold the run a command asks for: every option
    that changes the numbers or what is logged (ablate/config.py: all but NOT_COMPARED), named
    as on the command line. An option a config written before it existed lacks had its default
    value there: the option's definition is that its default changes nothing."""
    train = config.get("train", {})
    ident = {k: train.get(k, OPTIONS[k].default) for k in OPTIONS if k not in NOT_COMPARED + RESOLVED}
    model = config.get("model", {})
    resolved = {"variant": config.get("variant", {}).get("id"), "layers": model.get("n_layer"),
                "init": model.get("init"), "data": config.get("data", {}).get("fingerprint"),
                "kernels": config.get("kernels"), "device": config.get("device"), "dtype": config.get("dtype")}
    ident.update({k: v for k, v in resolved.items() if v is not None})  # a key an older config lacks is not compared
    return ident


def _shown(config: dict, key: str) -> str:
    """An identity value as the user would recognise it."""
    if key == "data":
        data = config["data"]
        return f"{data.get('path')!r} ({str(data.get('fingerprint'))[:19]})"
    return repr(_identity(config)[key])


def _read_config(run_dir: Path) -> dict | None:
    """The run directory's config.json, None when there is none."""
    path = run_dir / CONFIG
    if not path.exists():
        return None
    try:
        config = read_json(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} cannot be read ({type(e).__name__}); valid: remove {run_dir} to start that run again") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a run's config; valid: remove {run_dir} to start that run again")
    return config


def _refuse_another_run(run_dir: Path, old: dict, new: dict) -> None:
    a, b = _identity(old), _identity(new)
    differ = [k for k in b if k in a and a[k] != b[k]]
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
    """Whether to flush subnormal floats to zero (ablate.fpmode). Once a value falls below the
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


def _gelu_form_for(old: dict | None, run_dir: Path) -> str:
    """The form of the CPU tanh-GELU to train with (ablate/kernels/cpu_gelu.py). It fixes the
    GELU's last bits, so a run keeps the form it started with; a config.json without one was
    written before the fused kernel, by the torch passes. A form this machine cannot compute
    (no compiler, another CPU) is refused: the run would not continue on its own bits."""
    from ablate.kernels import cpu_gelu

    if old is None:
        return cpu_gelu.best()
    recorded = old.get("gelu_cpu") or cpu_gelu.PASSES
    if recorded not in (here := cpu_gelu.available()):
        raise ConfigError(f"{run_dir} holds a run whose GELU was computed as {recorded!r}, which this machine cannot "
                          f"compute ({cpu_gelu.library()[1] or 'another CPU'}); valid here: {', '.join(here)}: "
                          "resume it where it started, or remove that folder")
    return recorded


def check_existing_run(cell, run_dir: str | Path, plan: RunPlan | None = None) -> None:
    """Refuse (ConfigError, nothing written) when `run_dir` already holds a run of another
    config than `cell` asks for. `plan` is the cell planned to train; without it, the run is
    finished and only compared, so nothing is loaded or built that running would need."""
    run_dir = Path(run_dir)
    old = _read_config(run_dir)
    if old is None:
        return
    if plan is not None:
        cfg, size, data, device, kernels = plan.cfg, plan.size, plan.data, plan.device, plan.ops.name
    else:
        cfg = cell.config
        size, data = _size_and_data(cfg)
        device = requested_device(cfg)  # a finished cpu run and `--device cuda` differ even where no GPU is
        kernels = cfg.kernels
        if kernels == "auto":
            # The same request: `auto` may pick another backend on another machine, but a
            # finished run is not run again to find out. Otherwise resolve it as a run would.
            from ablate.kernels.select import pick_auto

            kernels = old.get("kernels") if old.get("train", {}).get("kernels") == "auto" else pick_auto(str(device))
    _refuse_another_run(run_dir, old, run_config(cell, cfg, size, data, device, kernels))
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
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                row = json.loads(raw)
                valid = isinstance(row, dict) and isinstance(row.get("step"), int) and "loss" in row
            except (UnicodeDecodeError, json.JSONDecodeError):
                valid = False
            if not valid:
                if raw.strip():
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
    with open(path, "rb") as f:
        for raw in f:
            try:
                expected.discard(json.loads(raw).get("step"))
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
        ckpt = torch.load(path, map_location=device, weights_only=True)
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
    plan_run, when the caller has already made it. `after_step`: called after each step's
    metrics row is written, outside the step time the row logs (`ablate bench` runs its plain
    loop's steps there, in lockstep with the harness's)."""
    run_dir = Path(run_dir)
    plan = plan or plan_run(cell)
    old = _read_config(run_dir)
    threads = _threads_for(cell, plan.cfg, old, run_dir)
    flush = _flush_for(cell, plan.cfg, old, run_dir)
    gelu = _gelu_form_for(old, run_dir)
    outer_threads, outer_flush = torch.get_num_threads(), fpmode.main_thread_flushing()
    torch.set_num_threads(threads)
    fpmode.apply(flush)  # after the thread count: it reaches every thread the run will use
    try:
        with cpu_gelu.using(gelu):
            return _train(cell, run_dir, plan, old, (threads, flush, gelu), quiet, after_step)
    finally:
        # The next run in this process (a bench, a test, a grid worker's next cell) starts clean.
        torch.set_num_threads(outer_threads)
        fpmode.set_flush_denormal(outer_flush)


def _train(cell, run_dir: Path, plan: RunPlan, old: dict | None, execution: tuple[int, bool, str], quiet: bool,
           after_step: Callable[[], None] | None) -> dict:
    cfg, device, amp, size, data = plan.cfg, plan.device, plan.amp, plan.size, plan.data
    threads, flush, gelu = execution
    torch.manual_seed(cfg.seed)  # the seed fixes the initial weights...
    model = build_model(cfg.spec, size, plan.ops, device, init=cfg.init_name)
    opt = make_optimizer(model, cfg)
    config = run_config(cell, cfg, size, data, device, plan.ops.name,
                        params=sum(p.numel() for p in model.parameters()), threads=threads, flush_denormal=flush,
                        subnormals_flushed=fpmode.flushing(), gelu_cpu=gelu)
    if old is not None:
        _refuse_another_run(run_dir, old, config)

    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / CONFIG, config)

    start, first_loss, elapsed = 0, None, 0.0
    ckpt_path = run_dir / CHECKPOINT
    if ckpt_path.exists():
        ckpt = _load_checkpoint(ckpt_path, device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        start, first_loss, elapsed = ckpt["step"], ckpt["first_loss"], ckpt["elapsed"]
    # final_loss is the mean loss of the last FINAL_LOSS_WINDOW *logged* steps (runs/README.md),
    # the same rows `ablate report` reads, so a resume carries over the ones logged before it.
    recent = _keep_metrics_before(run_dir / METRICS, start)
    missing = missing_logged_steps(run_dir / METRICS, start, cfg.log_every) if start else []
    if missing:
        print(f"ablate: {run_dir / METRICS}: no row for step{'s' if len(missing) > 1 else ''} "
              f"{', '.join(map(str, missing[:10]))}{' ...' if len(missing) > 10 else ''} (an unreadable line dropped "
              "on resume); summary.json names them", file=sys.stderr)

    probes = Probes(model, compiled=cfg.compile, autocast=(device.type, amp)) if cfg.probes else None
    model.record_act_norms = cfg.probes
    forward = torch.compile(model) if cfg.compile else model
    tokens_per_step = cfg.batch_size * cfg.context
    status, diverged_at, val_loss, step = COMPLETED, None, None, start - 1
    bar = _progress(cfg, start, quiet)
    clock0 = time.perf_counter() - elapsed  # time_s is wall-clock training time, resumes included
    with _open_metrics(run_dir / METRICS) as log, _graceful_signals() as signals:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = data.batch("train", step, cfg.seed, cfg.batch_size, cfg.context, device)  # ...and the batch order
            logged = probes is not None and step % cfg.log_every == 0
            probing = logged and step % cfg.probe_every == 0
            if probes is not None:
                probes.stability.capture = probing and not cfg.compile  # the hooks keep what measure() reads
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                logits, loss = forward(x, y)
            # The logged loss is the cross-entropy alone, comparable across z_loss values.
            objective = loss + cfg.z_loss * z_loss_term(logits) if cfg.z_loss > 0 else loss
            objective.backward()
            if logged:
                grad_norms = probes.grad_norms()  # before clipping: what the model produced
            if probing:  # the costlier metrics (a copy of the weights; attention scores) every probe_every steps
                probes.before_step()
                # Before the optimizer step: at the weights this step's forward ran with.
                stability = probes.stability.measure(x, logits)
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if logged:
                loss_value, metrics = probes.collect(loss, grad_norms, model.act_norms, x.numel() * size.d_model,
                                                     stability if probing else None)
            else:
                loss_value, metrics = loss.item(), {}
            dt = time.perf_counter() - t0
            first_loss = loss_value if first_loss is None else first_loss
            diverged = not math.isfinite(loss_value) or loss_value > cfg.diverge_factor * first_loss
            last = step == cfg.steps - 1 or diverged
            if not diverged and (last or (step + 1) % cfg.eval_every == 0):
                val_loss = evaluate(model, data, cfg, device, amp, cfg.final_eval_batches if last else cfg.eval_batches)
                metrics["val_loss"] = finite_or_none(val_loss)
            if step % cfg.log_every == 0 or last:
                log.write({"step": step, "tokens": (step + 1) * tokens_per_step, "loss": finite_or_none(loss_value),
                           "lr": lr, **metrics, "time_s": time.perf_counter() - clock0,
                           "tokens_per_s": tokens_per_step / dt})
                recent = (recent + [loss_value])[-FINAL_LOSS_WINDOW:]
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_step / dt:,.0f}")
            if after_step is not None:
                after_step()
            if diverged:
                status, diverged_at = DIVERGED, step
                break
            if not last and ((step + 1) % cfg.checkpoint_every == 0 or signals):
                elapsed = time.perf_counter() - clock0
                _save_checkpoint(ckpt_path, model, opt, step + 1, {"first_loss": first_loss, "elapsed": elapsed})
                if signals:
                    raise Interrupted(f"interrupted by {signal.Signals(signals[0]).name} after step {step}; "
                                      f"checkpointed in {run_dir}: rerun the same command to resume")
    elapsed = time.perf_counter() - clock0
    if bar is not None:
        bar.close()
    summary = {
        "status": status,
        "final_loss": sum(recent) / len(recent) if status == COMPLETED and recent else None,
        "final_val_loss": finite_or_none(val_loss) if status == COMPLETED else None,
        "diverged_at_step": diverged_at,
        "steps": step + 1,
        "wall_time_s": elapsed,
        "error": None,
        **({"missing_steps": missing} if missing else {}),  # logged steps whose rows were lost
    }
    write_json_atomic(run_dir / SUMMARY, summary)
    ckpt_path.unlink(missing_ok=True)  # a finished run is never resumed
    return summary


def _progress(cfg: TrainConfig, start: int, quiet: bool):
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=start, unit="step", dynamic_ncols=True)
