"""Train one cell into its run directory (see runs/README.md for the layout).

The loop is plain AdamW on a GPT. What the harness adds: batches that depend only on
(seed, step), per-layer probes with one host copy per logged step, divergence recorded
as a result, and checkpoints that make any interruption resumable bit for bit.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import jsonlines
import torch

from ablate.config import TrainConfig, resolve
from ablate.data import TokenData, load_data
from ablate.errors import ConfigError
from ablate.kernels import get_backend
from ablate.model import GPT, build_model
from ablate.probes import Probes
from ablate.provenance import git_commit, versions
from ablate.rundir import CHECKPOINT, CONFIG, METRICS, SUMMARY, finite_or_none, read_json, write_json_atomic
from ablate.schedule import lr_at

FINAL_LOSS_WINDOW = 10


class Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM arrived; a checkpoint was written at the last finished step.
    Not an Exception: an interrupted run is neither failed nor retried."""


def pick_device(cfg: TrainConfig) -> torch.device:
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA device is available; valid here: cpu, auto")
    return torch.device(cfg.device)


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    if cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return None  # float32 on the CPU: bitwise-repeatable


def run_config(cell, cfg: TrainConfig, model: GPT, data: TokenData, device, kernels: str) -> dict:
    spec = cfg.spec
    return {
        "cell_id": cell.id,
        "group": cell.group,
        "variant": {"id": spec.id, **spec.axes()},
        "model": {**model.size.as_dict(), "params": sum(p.numel() for p in model.parameters())},
        # Resolved values: the context, and the CPU threads in use (they fix the reductions' bits).
        "train": {**cfg.as_dict(), "seq_len": cfg.context, "threads": cfg.threads or torch.get_num_threads()},
        "seed": cfg.seed,
        "axes": cell.axes,
        "grid": cell.grid,
        "data": data.describe(),
        "kernels": kernels,
        "device": str(device),
        "dtype": str(autocast_dtype(cfg, device) or torch.float32).replace("torch.", ""),
        "versions": versions(),
        "git_commit": git_commit(),
    }


def _identity(config: dict) -> dict:
    """The parts of config.json that must match for a run directory to be resumed."""
    train = {k: v for k, v in config["train"].items() if k not in ("threads",)}
    return {"variant": config["variant"], "model": config["model"], "train": train,
            "seed": config["seed"], "data": config["data"]["fingerprint"], "kernels": config["kernels"]}


def _check_same_run(run_dir: Path, config: dict) -> None:
    old = read_json(run_dir / CONFIG)
    a, b = _identity(old), _identity(config)
    if a != b:
        diff = next(k for k in a if a[k] != b[k])
        raise ConfigError(f"{run_dir} holds a run with a different {diff}; use another --out or remove that directory")


def _keep_metrics_before(path: Path, step: int) -> None:
    """Drop metrics lines from steps at or after `step` (written after the checkpoint we
    resume from), and a last line cut short by a crash, so each step is logged once."""
    if not path.exists():
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break
            if row["step"] >= step:
                break
            kept.append(line if line.endswith("\n") else line + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def _save_checkpoint(path: Path, model, opt, step: int, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "torch_rng": torch.get_rng_state(), **state}, tmp)
    os.replace(tmp, path)


def make_optimizer(model: GPT, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    # Weight decay on matrices (embeddings included, as GPT-2), none on biases and gains.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused: one kernel for all parameters, on the CPU too (5x faster than the per-tensor loop
    # torch picks by default there; measured with `ablate bench`).
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)


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
def evaluate(model: GPT, data: TokenData, cfg: TrainConfig, device, amp) -> float:
    model.eval()
    total = 0.0
    for i in range(cfg.eval_batches):
        # Fixed validation batches (seed 0) so every cell of a grid is scored on the same text.
        x, y = data.batch("val", i, 0, cfg.batch_size, cfg.context, device)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            total += model(x, y)[1].item()
    model.train()
    return total / cfg.eval_batches


def train(cell, run_dir: str | Path, quiet: bool = True) -> dict:
    """Train (or resume) `cell` in `run_dir`; returns the summary it wrote."""
    run_dir = Path(run_dir)
    cfg = resolve(cell.options)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = pick_device(cfg)
    amp = autocast_dtype(cfg, device)
    size = cfg.size
    data = load_data(cfg.data, size.tokenizer, size.vocab_size)
    if data.vocab_size != size.vocab_size:
        size = replace(size, vocab_size=data.vocab_size)  # pre-tokenized shards bring their own vocabulary
    ops = get_backend(cfg.kernels, str(device))
    torch.manual_seed(cfg.seed)  # the seed fixes the initial weights...
    model = build_model(cfg.spec, size, ops, device)
    opt = make_optimizer(model, cfg, device)
    config = run_config(cell, cfg, model, data, device, ops.name)

    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / CONFIG).exists():
        _check_same_run(run_dir, config)
    write_json_atomic(run_dir / CONFIG, config)

    start, first_loss, elapsed = 0, None, 0.0
    ckpt_path = run_dir / CHECKPOINT
    if ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["torch_rng"])
        start, first_loss, elapsed = ckpt["step"], ckpt["first_loss"], ckpt["elapsed"]
    _keep_metrics_before(run_dir / METRICS, start)

    probes = Probes(model) if cfg.probes else None
    model.record_act_norms = cfg.probes
    forward = torch.compile(model) if cfg.compile else model
    tokens_per_step = cfg.batch_size * cfg.context
    recent: list[float] = []
    status, diverged_at, val_loss, step = "completed", None, None, start - 1
    bar = _progress(cfg, start, quiet)
    clock0 = time.perf_counter() - elapsed  # time_s is wall-clock training time, resumes included
    with jsonlines.open(run_dir / METRICS, mode="a", flush=True) as log, _graceful_signals() as signals:
        for step in range(start, cfg.steps):
            t0 = time.perf_counter()
            lr = lr_at(step, lr=cfg.lr, warmup=cfg.warmup, steps=cfg.steps, schedule=cfg.schedule, min_lr_ratio=cfg.min_lr_ratio)
            for group in opt.param_groups:
                group["lr"] = lr
            x, y = data.batch("train", step, cfg.seed, cfg.batch_size, cfg.context, device)  # ...and the batch order
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                _, loss = forward(x, y)
            loss.backward()
            logged = probes is not None and step % cfg.log_every == 0
            if logged:
                grad_norms = probes.grad_norms()  # before clipping: what the model produced
                probes.before_step()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if logged:
                loss_value, metrics = probes.collect(loss, grad_norms, model.act_norms, x.numel() * size.d_model)
            else:
                loss_value, metrics = loss.item(), {}
            dt = time.perf_counter() - t0
            first_loss = loss_value if first_loss is None else first_loss
            diverged = not math.isfinite(loss_value) or loss_value > cfg.diverge_factor * first_loss
            last = step == cfg.steps - 1 or diverged
            if not diverged and (last or (step + 1) % cfg.eval_every == 0):
                val_loss = evaluate(model, data, cfg, device, amp)
                metrics["val_loss"] = finite_or_none(val_loss)
            if step % cfg.log_every == 0 or last:
                log.write({"step": step, "tokens": (step + 1) * tokens_per_step, "loss": finite_or_none(loss_value),
                           "lr": lr, **metrics, "time_s": time.perf_counter() - clock0,
                           "tokens_per_s": tokens_per_step / dt})
            recent = (recent + [loss_value])[-FINAL_LOSS_WINDOW:]
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", tok_s=f"{tokens_per_step / dt:,.0f}")
            if diverged:
                status, diverged_at = "diverged", step
                break
            if not last and ((step + 1) % cfg.checkpoint_every == 0 or signals):
                elapsed = time.perf_counter() - clock0
                _save_checkpoint(ckpt_path, model, opt, step + 1, {"first_loss": first_loss, "elapsed": elapsed})
                if signals:
                    raise Interrupted(f"stopped by signal {signals[0]} after step {step}; rerun to resume")
    elapsed = time.perf_counter() - clock0
    if bar is not None:
        bar.close()
    summary = {
        "status": status,
        "final_loss": sum(recent) / len(recent) if status == "completed" and recent else None,
        "final_val_loss": finite_or_none(val_loss) if status == "completed" else None,
        "diverged_at_step": diverged_at,
        "steps": step + 1,
        "wall_time_s": elapsed,
        "error": None,
    }
    write_json_atomic(run_dir / SUMMARY, summary)
    ckpt_path.unlink(missing_ok=True)  # a finished run is never resumed
    return summary


def _progress(cfg: TrainConfig, start: int, quiet: bool):
    if quiet or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=cfg.steps, initial=start, unit="step", dynamic_ncols=True)
