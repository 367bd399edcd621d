"""Stability metrics per cell, computed from the `steps` frame of a Runs.

Definitions (the report's Method section repeats them):
  final loss       mean training loss of the last `last_k` logged steps (NaN for a cell that
                   diverged or failed: it has no final loss, it counts in the divergence rate)
  final val loss   the validation loss at the end of training on the fixed held-out set:
                   summary.json `final_val_loss`, else the last logged validation loss (NaN
                   for diverged or failed cells). Verdicts and reports compare this one.
  init loss        the loss at initialisation: the validation loss logged at step 0 when
                   there is one, else the training loss of step 0 (before any update)
  plateau          a completed cell whose final val loss lies within PLATEAU_MARGIN nats of
                   the corpus's unigram entropy: it learnt (almost) nothing from context
  loss spike       a logged step whose loss lies more than `spike_z` robust standard
                   deviations above the median of the `spike_window` logged losses before it
                   (robust std = 1.4826 x median absolute deviation); each such step counts once
  grad-norm spread over the per-layer gradient norms at one step: max/min ratio and
                   coefficient of variation (population std / mean)
  profile phases   init = first logged step where every layer's value is finite, end = the
                   last such step, mid = the such step nearest to halfway between them
  RMS growth       act_norm of the last layer / act_norm of layer 0 at the end phase, and its
                   per-layer geometric rate ratio ** (1 / (n_layer - 1))
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ablate.analysis.load import Runs, layer_columns
from ablate.analysis.outcomes import (FAILED, PLATEAU_MARGIN, failure_kind, outcome_of, plateaued,  # noqa: F401
                                      scored_loss)
from ablate.core.rundir import COMPLETED, DIVERGED
from ablate.core.rundir import FAILED as STATUS_FAILED

PHASES = ("init", "mid", "end")
DEFAULT_LAST_K = 10
DEFAULT_SPIKE_Z = 5.0
DEFAULT_SPIKE_WINDOW = 20
# Fewer earlier losses than this and the running median is too noisy to call a spike.
SPIKE_MIN_HISTORY = 5
# A perfectly flat window has MAD 0; the floor keeps z finite so a jump out of it still counts.
MIN_ROBUST_STD = 1e-6
MAD_TO_STD = 1.4826  # the MAD of a normal distribution times this is its standard deviation


def final_loss(losses: np.ndarray, last_k: int = DEFAULT_LAST_K) -> float:
    """Mean of the last `last_k` finite losses (NaN when there are none)."""
    finite = losses[np.isfinite(losses)]
    return float(np.mean(finite[-last_k:])) if finite.size else float("nan")


def spike_mask(losses: np.ndarray, z: float = DEFAULT_SPIKE_Z, window: int = DEFAULT_SPIKE_WINDOW) -> np.ndarray:
    """True where a loss is a spike (see the module docstring). Non-finite losses are not
    judged here (divergence is reported separately) and are left out of later windows."""
    losses = np.asarray(losses, dtype=float)
    mask = np.zeros(losses.shape, dtype=bool)
    history: list[float] = []
    for i, loss in enumerate(losses):
        if not np.isfinite(loss):
            continue
        if len(history) >= SPIKE_MIN_HISTORY:
            recent = np.asarray(history[-window:])
            median = np.median(recent)
            robust_std = max(MAD_TO_STD * np.median(np.abs(recent - median)), MIN_ROBUST_STD)
            mask[i] = (loss - median) / robust_std > z
        history.append(loss)
    return mask


def spread(values: np.ndarray) -> tuple[float, float]:
    """(max/min ratio, coefficient of variation) of a per-layer profile; NaN if not all
    values are finite and positive."""
    values = np.asarray(values, dtype=float)
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        return float("nan"), float("nan")
    return float(values.max() / values.min()), float(values.std(ddof=0) / values.mean())


def phase_rows(cell_steps: pd.DataFrame, columns: list[str]) -> dict[str, pd.Series]:
    """The init / mid / end rows of one cell's steps for a per-layer metric (see module doc)."""
    if not columns:
        return {}
    complete = cell_steps[np.isfinite(cell_steps[columns].to_numpy(dtype=float)).all(axis=1)]
    if complete.empty:
        return {}
    first, last = complete.iloc[0], complete.iloc[-1]
    halfway = (first["step"] + last["step"]) / 2
    # idxmin returns the first minimum, so a tie resolves to the earlier step.
    mid_label = (complete["step"] - halfway).abs().idxmin()
    return {"init": first, "mid": complete.loc[mid_label], "end": last}


def layer_profiles(runs: Runs, metric: str = "grad_norm") -> pd.DataFrame:
    """Long frame of a per-layer metric at each phase: cell_id, group, seed, status, phase,
    step, layer, value. Empty when the runs have no per-layer metrics (probes = false)."""
    columns = layer_columns(runs.steps, metric)
    out = []
    status = runs.cells.set_index("cell_id")["status"]
    for cell_id, cell_steps in runs.steps.groupby("cell_id", sort=False):
        for phase, row in phase_rows(cell_steps, columns).items():
            for layer, column in enumerate(columns):
                out.append({
                    "cell_id": cell_id, "group": row["group"], "seed": row["seed"],
                    "status": status.get(cell_id), "phase": phase, "step": int(row["step"]),
                    "layer": layer, "value": float(row[column]),
                })
    return pd.DataFrame(out, columns=["cell_id", "group", "seed", "status", "phase", "step", "layer", "value"])


def _final_val_loss(steps: pd.DataFrame, from_summary) -> float:
    """summary.json's final_val_loss (the fixed held-out set), else the last logged val_loss."""
    if from_summary is not None and np.isfinite(float(from_summary)):
        return float(from_summary)
    if "val_loss" not in steps:
        return float("nan")
    val = steps["val_loss"].to_numpy(dtype=float)
    val = val[np.isfinite(val)]
    return float(val[-1]) if val.size else float("nan")


def _init_loss(steps: pd.DataFrame) -> float:
    """Validation loss at step 0 if it was measured, else step 0's training loss."""
    at_zero = steps[steps["step"] == 0]
    if at_zero.empty:  # logging started later (or not at all): the initial loss is unknown
        return float("nan")
    first = at_zero.iloc[0]
    for column in ("val_loss", "loss"):
        if column in first and np.isfinite(float(first[column])):
            return float(first[column])
    return float("nan")


def cell_metrics(runs: Runs, last_k: int = DEFAULT_LAST_K, spike_z: float = DEFAULT_SPIKE_Z,
                 spike_window: int = DEFAULT_SPIKE_WINDOW) -> pd.DataFrame:
    """One row per cell: the cells frame plus final_loss, final_val_loss, init_loss, plateau,
    outcome, failure (dead, slow or diverged) and scored_loss (analysis/outcomes.py), spikes,
    max_grad_norm, grad_ratio_{phase},
    grad_cv_{phase}, rms_growth, rms_growth_per_layer."""
    grad_columns = layer_columns(runs.steps, "grad_norm")
    act_columns = layer_columns(runs.steps, "act_norm")
    by_cell = dict(tuple(runs.steps.groupby("cell_id", sort=False))) if not runs.steps.empty else {}
    rows = []
    for cell in runs.cells.itertuples(index=False):
        steps = by_cell.get(cell.cell_id)
        row: dict[str, float] = {"cell_id": cell.cell_id}
        healthy = cell.status not in (DIVERGED, STATUS_FAILED)
        if steps is None or steps.empty:
            rows.append({**row, "outcome": FAILED})
            continue
        losses = steps["loss"].to_numpy(dtype=float) if "loss" in steps else np.array([])
        row["final_loss"] = final_loss(losses, last_k) if healthy else float("nan")
        from_summary = getattr(cell, "summary_final_val_loss", None)
        row["final_val_loss"] = _final_val_loss(steps, from_summary) if healthy else float("nan")
        row["init_loss"] = _init_loss(steps)
        entropy = getattr(cell, "unigram_entropy", None)
        row["plateau"] = cell.status == COMPLETED and plateaued(row["final_val_loss"], entropy)
        row["outcome"] = outcome_of(cell.status, row["final_val_loss"], entropy)
        row["scored_loss"] = scored_loss(row["outcome"], row["final_val_loss"], entropy, row["init_loss"])
        row["failure"] = failure_kind(row["outcome"], steps)  # dead, slow or diverged; None: it trained
        row["spikes"] = int(spike_mask(losses, spike_z, spike_window).sum())
        if "grad_norm" in steps:
            grad = steps["grad_norm"].to_numpy(dtype=float)
            row["max_grad_norm"] = float(np.nanmax(grad)) if np.isfinite(grad).any() else float("nan")
        for phase, phase_row in phase_rows(steps, grad_columns).items():
            ratio, cv = spread(phase_row[grad_columns].to_numpy(dtype=float))
            row[f"grad_ratio_{phase}"], row[f"grad_cv_{phase}"] = ratio, cv
        end = phase_rows(steps, act_columns).get("end")
        if end is not None and len(act_columns) >= 2:
            rms = end[act_columns].to_numpy(dtype=float)
            row["rms_growth"] = float(rms[-1] / rms[0]) if rms[0] > 0 else float("nan")
            row["rms_growth_per_layer"] = float(row["rms_growth"] ** (1 / (len(act_columns) - 1)))
        rows.append(row)
    metric_columns = ["final_loss", "final_val_loss", "init_loss", "plateau", "outcome", "failure", "scored_loss",
                      "spikes",
                      "max_grad_norm",
                      *[f"grad_{kind}_{phase}" for phase in PHASES for kind in ("ratio", "cv")],
                      "rms_growth", "rms_growth_per_layer"]
    metrics = pd.DataFrame(rows, columns=["cell_id", *metric_columns])
    metrics = runs.cells.merge(metrics, on="cell_id", how="left")
    metrics["outcome"] = metrics["outcome"].fillna(FAILED)  # a cell with no logged step has no result
    return metrics
