"""Synthetic run directories with known values, in the exact format of docs/run-directory.md.

For tests of anything that reads runs (analysis, reports, resuming): no training, no torch.

    run = write_run(tmp_path, "post.layernorm.gelu.dense.res", seed=1, losses=[3.0, 2.5, 2.2],
                    options={"lr": 3e-3})          # tmp_path/<run.cell_id>/{config,metrics,summary}
    write_grid(tmp_path, [run, ...], pending=["...__seed=2"])

Every per-step value can be given; what is not given is filled from simple deterministic
formulas (documented on each parameter) so a test can compute what it expects.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ablate.core.rundir import COMPLETED, DIVERGED, FAILED, FINISHED, RUNNING

DEFAULT_VARIANT = "pre.layernorm.gelu.dense.res"
GATED_MLPS = ("swiglu", "geglu", "reglu")
TOKENS_PER_STEP = 1024
DIVERGE_FACTOR = 2.0  # as the engine's default: diverged when loss > 2 x the first loss
STATUSES = (*FINISHED, RUNNING)  # what a synthetic run may be (ablate/core/rundir.py declares the words)


@dataclass
class SyntheticRun:
    path: Path  # the run directory
    cell_id: str
    group: str
    seed: int
    variant_id: str
    options: dict[str, Any]
    config: dict[str, Any]
    metrics: list[dict[str, Any]]  # as written (null for non-finite)
    summary: dict[str, Any] | None  # None: still running

    @property
    def status(self) -> str:
        return self.summary["status"] if self.summary else RUNNING


def variant_axes(variant_id: str) -> dict[str, Any]:
    """`post.layernorm.relu.dense.res` -> {norm, norm_type, act, mlp, residual} as config.json
    stores it (act None for gated MLPs, norm_type None for norm=none)."""
    parts = variant_id.split(".")
    norm, residual = parts[0], parts[-1] == "res"
    rest = parts[1:-1]
    norm_type = None if norm == "none" else rest.pop(0)
    mlp = rest[-1]
    act = None if mlp in GATED_MLPS else rest[0]
    return {"id": variant_id, "norm": norm, "norm_type": norm_type, "act": act, "mlp": mlp, "residual": residual}


def _fmt(value: Any) -> str:
    # The engine's spelling of an option value in a cell id (ablate/engine/config.py).
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def names(variant_id: str, options: Mapping[str, Any], seed: int) -> tuple[str, str]:
    """(cell_id, group) as the engine names them: variant, sorted options, then the seed."""
    group = "__".join([variant_id, *(f"{k}={_fmt(v)}" for k, v in sorted(options.items()))])
    return f"{group}__seed={seed}", group


def _finite(value):
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def write_run(
    root: str | Path,
    variant: str = DEFAULT_VARIANT,
    seed: int = 0,
    losses: Sequence[float] = (4.0, 3.5, 3.2, 3.0, 2.9),
    *,
    options: Mapping[str, Any] | None = None,
    status: str | None = None,
    val_loss: float | Mapping[int, float] | None = None,
    grad_norms: Sequence[Sequence[float]] | None = None,
    act_norms: Sequence[Sequence[float]] | None = None,
    grad_norm: Sequence[float] | None = None,
    n_layer: int = 2,
    planned_steps: int | None = None,
    probes: bool = True,
    axes: Mapping[str, Any] | None = None,
    grid: str | None = "synthetic",
    diverged_at_step: int | None = None,
    truncate_last_line: bool = False,
    probe_every: int | None = None,
    unigram_entropy: float | None = None,
    **extra: Any,
) -> SyntheticRun:
    """Write `root/<cell_id>/` and return what was written.

    losses        training loss per logged step (step i = index i); inf/nan are written as null
    options       the non-variant options that vary in the grid, e.g. {"lr": 3e-3}: they enter
                  the cell id and group, config.train and config.axes
    status        completed | diverged | failed | running (no summary.json); default: diverged
                  when a loss is non-finite or above 2 x the first, else completed
    val_loss      a number (logged on the last step) or {step: value}; default: none logged
                  except on the last step, where it is the last loss + 0.1
    grad_norms    [step][layer] -> grad_norm/layer_i; default (layer + 1) * (step + 1) ** -0.5.
                  /attn, /mlp and /norm are 0.6, 0.7 and 0.1 of it
    act_norms     [step][layer] -> act_norm/layer_i; default 1.5 ** layer
    grad_norm     total gradient norm per step; default: the root sum of squares of grad_norms
    probes        False: no per-layer keys at all (as `probes = false`)
    axes          config.axes; default {variant axes, options, seed}
    truncate_last_line   cut the last metrics line in half, as a crash mid-write would
    probe_every   log the stability probes on every step divisible by this (None: not at all):
                  attn_logit_max/layer_i = 2 + 0.1 * step * (i + 1), attn_entropy/layer_i = 1.0,
                  cos_sim/layer_i = 0.1 + 0.05 * i, logit_lse = 5.0, logit_max = 8.0
    unigram_entropy   config.data.unigram_entropy (default: not recorded, as for token shards)
    extra         top-level config.json fields to override (data=..., git_commit=...)
    """
    options = dict(options or {})
    axes_of_variant = variant_axes(variant)
    cell_id, group = names(variant, options, seed)
    n_steps = len(losses)
    planned = planned_steps if planned_steps is not None else n_steps
    first = losses[0] if losses else None

    bad = [i for i, x in enumerate(losses)
           if not math.isfinite(x) or (first is not None and x > DIVERGE_FACTOR * first)]
    if status is None:
        status = DIVERGED if bad else COMPLETED
    if status not in STATUSES:
        raise ValueError(f"status {status!r}; valid: {', '.join(STATUSES)}")
    if status == DIVERGED and diverged_at_step is None:
        diverged_at_step = bad[0] if bad else n_steps - 1

    if isinstance(val_loss, Mapping):
        val_by_step = dict(val_loss)
    elif val_loss is not None:
        val_by_step = {n_steps - 1: val_loss}
    else:
        val_by_step = {n_steps - 1: losses[-1] + 0.1} if losses and math.isfinite(losses[-1]) else {}

    rows = []
    for step, loss in enumerate(losses):
        row: dict[str, Any] = {"step": step, "tokens": (step + 1) * TOKENS_PER_STEP, "loss": _finite(loss),
                               "lr": options.get("lr", 1e-3)}
        layer_grads = (list(grad_norms[step]) if grad_norms is not None
                       else [(i + 1) * (step + 1) ** -0.5 for i in range(n_layer)])
        total = grad_norm[step] if grad_norm is not None else math.sqrt(sum(g * g for g in layer_grads))
        row["grad_norm"] = _finite(total)
        if probes:
            row["grad_norm/embed"] = 0.5
            for i, g in enumerate(layer_grads):
                row[f"grad_norm/layer_{i}"] = _finite(g)
                for part, share in (("attn", 0.6), ("mlp", 0.7), ("norm", 0.1)):
                    row[f"grad_norm/layer_{i}/{part}"] = _finite(share * g)
            acts = list(act_norms[step]) if act_norms is not None else [1.5 ** i for i in range(n_layer)]
            for i, a in enumerate(acts):
                row[f"act_norm/layer_{i}"] = _finite(a)
                row[f"update_ratio/layer_{i}"] = 1e-3
        if probes and probe_every and step % probe_every == 0:
            for i in range(n_layer):
                row[f"attn_logit_max/layer_{i}"] = 2 + 0.1 * step * (i + 1)
                row[f"attn_entropy/layer_{i}"] = 1.0
                row[f"cos_sim/layer_{i}"] = 0.1 + 0.05 * i
            row["logit_lse"], row["logit_max"] = 5.0, 8.0
        row["time_s"] = 0.1 * (step + 1)
        row["tokens_per_s"] = TOKENS_PER_STEP / 0.1
        if step in val_by_step:
            row["val_loss"] = _finite(val_by_step[step])
        rows.append(row)

    config: dict[str, Any] = {
        "cell_id": cell_id,
        "group": group,
        "variant": axes_of_variant,
        "model": {"name": "tiny", "n_layer": n_layer, "d_model": 64, "n_head": 2, "mlp_hidden": 256,
                  "vocab_size": 512, "context": 64, "tokenizer": "byte", "params": 100_000 + 1000 * n_layer},
        "train": {"steps": planned, "lr": options.get("lr", 1e-3), "warmup": options.get("warmup", 0),
                  "schedule": "cosine", "batch_size": 4, "seq_len": 64, "probes": probes,
                  **{k: v for k, v in options.items() if k not in ("lr", "warmup")}},
        "seed": seed,
        "axes": dict(axes) if axes is not None else {
            **{k: v for k, v in axes_of_variant.items() if k != "id"}, **options, "seed": seed},
        "grid": grid,
        "data": {"source": "synthetic", "path": None, "fingerprint": "f" * 64, "tokenizer": "byte",
                 "vocab_size": 512, "train_tokens": 10_000, "val_tokens": 1_000,
                 **({"unigram_entropy": unigram_entropy} if unigram_entropy is not None else {})},
        "kernels": "reference",
        "device": "cpu",
        "dtype": "float32",
        "versions": {"ablate": "0.1.0", "python": "3.11", "torch": "none", "numpy": "none"},
        "git_commit": "0" * 40,
    }
    config.update(extra)

    run_dir = Path(root) / cell_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config, indent=2))
    lines = [json.dumps(r, allow_nan=False) for r in rows]
    text = "\n".join(lines) + "\n"
    if truncate_last_line and lines:
        text = "\n".join(lines[:-1] + [lines[-1][: len(lines[-1]) // 2]])  # no newline: cut mid-write
    (run_dir / "metrics.jsonl").write_text(text)

    summary = None
    if status != RUNNING:
        healthy = status == COMPLETED
        finite = [x for x in losses if math.isfinite(x)]
        summary = {
            "status": status,
            "final_loss": sum(finite[-10:]) / len(finite[-10:]) if healthy and finite else None,
            "final_val_loss": _finite(val_by_step[max(val_by_step)]) if healthy and val_by_step else None,
            "diverged_at_step": diverged_at_step if status == DIVERGED else None,
            "steps": n_steps,
            "wall_time_s": 0.1 * n_steps,
            "error": "RuntimeError: synthetic failure" if status == FAILED else None,
        }
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return SyntheticRun(run_dir, cell_id, group, seed, variant, options, config, rows, summary)


def write_grid(root: str | Path, cells: Sequence[SyntheticRun], name: str = "synthetic",
               pending: Sequence[str] = (), base: Mapping[str, Any] | None = None,
               axes: Mapping[str, Sequence[Any]] | None = None) -> dict[str, Any]:
    """Write root/grid.json listing `cells` (status from what each wrote) and `pending` cell
    ids that have no folder yet; returns what was written. `axes` defaults to every axis
    value seen in the cells' config.axes."""
    if axes is None:
        seen: dict[str, list] = {}
        for run in cells:
            for key, value in run.config["axes"].items():
                if value not in seen.setdefault(key, []):
                    seen[key].append(value)
        axes = seen
    entries = [{"id": r.cell_id, "group": r.group, "status": r.status,
                "options": {"variant": r.variant_id, **r.options, "seed": r.seed}} for r in cells]
    entries += [{"id": cid, "group": cid.rsplit("__seed=", 1)[0], "status": "pending", "options": {}}
                for cid in pending]
    grid = {"name": name, "source": f"{name}.toml", "base": dict(base or {"model": "tiny"}),
            "axes": {k: list(v) for k, v in axes.items()}, "cells": entries, "updated": "2025-01-01T00:00:00"}
    Path(root).mkdir(parents=True, exist_ok=True)
    (Path(root) / "grid.json").write_text(json.dumps(grid, indent=2))
    return grid
