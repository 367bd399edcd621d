"""Learning-rate sensitivity: how the final loss depends on the learning rate, per sweep.

A *sweep* is the cells that differ only in `lr` and seed (same variant, same other options);
it is analysed when it covers at least MIN_LRS learning rates. Every function takes the tidy
frames (`cell_metrics` rows), so a notebook or a claim can call them directly.

Definitions (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities", section 3.1), per seed, over the swept learning rates L:

  clipped loss     min(scored loss, loss at initialisation), the scored loss being the final
                   validation loss of a trained cell and, for a failed training run (plateaued
                   or diverged), the unigram entropy (analysis/outcomes.py: one score however a
                   run failed; Wortsman et al. count a diverged run at the loss at
                   initialisation, which would weigh a blow-up far above a plateau)
  best loss        min over L of the clipped loss
  LR sensitivity   mean over L of the clipped loss, minus the best loss (0 for a flat curve;
                   large when much of the swept range trains badly or diverges). It is
                   computed per seed, then averaged with an interval over seeds (stats.mean_interval); only
                   seeds with a result (completed or diverged) at every lr enter it.

Across seeds: the mean clipped loss at each lr gives the *best lr* (its minimum) and the
*best loss* (its value there, with its interval over seeds). The *basin* is the run
of swept lrs around the best lr whose mean clipped loss stays within `tolerance` nats of the
best; its width is log10(highest / lowest) in decades, "at least" when it reaches the end of
the swept range. The *unstable lr* is the smallest lr at which any seed diverged, or plateaued
(final loss near the unigram entropy) above the best lr: a plateau below it is too little
training, not instability.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ablate.analysis.load import DONE
from ablate.analysis.outcomes import PLATEAUED
from ablate.analysis.stats import (BATCH_KEYS, Comparison, DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, DEFAULT_SEED,
                                   Interval, VERDICT_VALUE, mean_interval, paired_comparison)
from ablate.core.rundir import COMPLETED, DIVERGED

MIN_LRS = 3
DEFAULT_TOLERANCE = 0.1  # nats above the best loss that still count as inside the basin
SENSITIVITY = "lr_sensitivity"  # the value name of the paired comparison between sweeps
_LR_IN_ID = re.compile(r"__lr=[^_]+")


@dataclass(frozen=True)
class Sweep:
    """One sweep's numbers; `curve` is the tidy frame everything else is computed from."""

    name: str  # the groups' id without its lr
    variant_id: str
    setting: dict  # the other option axes' values (what the sweep holds fixed)
    groups: dict  # lr -> group id
    curve: pd.DataFrame  # lr_curve(): one row per trained cell
    per_seed: pd.DataFrame  # per_seed_sensitivity(): seed, lr_sensitivity, best_loss, best_lr
    by_lr: pd.DataFrame  # lr_table(): one row per lr
    best_lr: float | None
    best_loss: float | None  # mean clipped loss at best_lr
    best_interval: Interval | None
    best_for: int  # seeds whose own best lr is best_lr (of len(per_seed))
    sensitivity: float | None  # mean over seeds
    sensitivity_interval: Interval | None
    basin: tuple | None  # (lowest lr, highest lr) inside the basin
    basin_decades: float | None
    basin_open: bool  # the basin reaches an end of the swept range: its width is a lower bound
    tolerance: float
    unstable_lr: float | None
    unstable_why: str  # "diverged", "plateaued", "diverged and plateaued", or ""

    @property
    def lrs(self) -> list[float]:
        return sorted(self.groups)

    @property
    def n_seeds(self) -> int:
        return len(self.per_seed)


def sweep_name(group: str, variant_id: str, setting: dict) -> str:
    """The group id without its `__lr=...` part (or the variant and settings, spelled alike)."""
    if _LR_IN_ID.search(group):
        return _LR_IN_ID.sub("", group)
    return "__".join([variant_id, *(f"{k}={v}" for k, v in sorted(setting.items()))])


def sweep_cells(metrics: pd.DataFrame, option_axes=(), min_lrs: int = MIN_LRS) -> dict[str, pd.DataFrame]:
    """{sweep name: its cells} for every set of cells that differ only in lr and seed and
    cover at least `min_lrs` learning rates, in order of first appearance."""
    if metrics.empty or "lr" not in metrics:
        return {}
    fixed = ["variant_id", *[a for a in option_axes if a not in ("lr", "seed") and a in metrics]]
    out = {}
    keyed = metrics.assign(_key=metrics[fixed].astype(str).agg("|".join, axis=1))
    for _, cells in keyed.groupby("_key", sort=False):
        cells = cells.drop(columns="_key")
        if cells["lr"].nunique() < min_lrs:
            continue
        first = cells.iloc[0]
        setting = {a: first[a] for a in fixed[1:]}
        out[sweep_name(str(first["group"]), str(first["variant_id"]), setting)] = cells
    return out


def lr_curve(cells: pd.DataFrame, value: str = VERDICT_VALUE) -> pd.DataFrame:
    """One row per trained cell of a sweep: seed, lr, status, loss (NaN if diverged),
    init_loss (the seed's loss at initialisation), clipped (min(scored loss, init_loss)),
    plateau."""
    trained = cells[cells["status"].isin(DONE)]  # the statuses that are a result at an lr
    loss = pd.to_numeric(trained[value], errors="coerce").where(trained["status"] == COMPLETED)
    init = pd.to_numeric(trained.get("init_loss", pd.Series(np.nan, index=trained.index)), errors="coerce")
    # Every lr of a seed starts from the same weights and first batch: one init loss per seed.
    per_seed_init = init.groupby(trained["seed"]).transform(lambda x: x.dropna().iloc[0] if x.notna().any() else np.nan)
    # A failed training run (plateaued or diverged) scores one way, analysis/outcomes.py's rule.
    scored = (pd.to_numeric(trained["scored_loss"], errors="coerce") if "scored_loss" in trained else
              pd.Series(np.where(trained["status"] == DIVERGED, per_seed_init, loss), index=trained.index))
    clipped = np.fmin(scored, per_seed_init)
    curve = pd.DataFrame({
        "seed": trained["seed"].to_numpy(), "lr": trained["lr"].astype(float).to_numpy(),
        "status": trained["status"].to_numpy(), "loss": loss.to_numpy(dtype=float),
        "init_loss": per_seed_init.to_numpy(dtype=float), "clipped": np.asarray(clipped, dtype=float),
        "plateau": trained["plateau"].fillna(False).astype(bool).to_numpy() if "plateau" in trained
        else np.zeros(len(trained), dtype=bool),
    })
    # A completed cell without the value (no validation loss) is no result at that lr.
    curve = curve[~((curve["status"] == COMPLETED) & curve["loss"].isna())]
    return curve.sort_values(["seed", "lr"], kind="stable").reset_index(drop=True)


def per_seed_sensitivity(curve: pd.DataFrame) -> pd.DataFrame:
    """One row per seed with a result at every swept lr: lr_sensitivity (mean clipped loss
    minus the best), best_loss (the lowest clipped loss) and best_lr (where)."""
    lrs = sorted(curve["lr"].unique())
    rows = []
    for seed, mine in curve.groupby("seed", sort=True):
        clipped = mine.set_index("lr")["clipped"]
        if sorted(clipped.index) != lrs or not np.isfinite(clipped.to_numpy()).all():
            continue
        best = float(clipped.min())
        rows.append({"seed": seed, SENSITIVITY: float(clipped.mean()) - best, "best_loss": best,
                     "best_lr": float(clipped.idxmin())})
    return pd.DataFrame(rows, columns=["seed", SENSITIVITY, "best_loss", "best_lr"])


def lr_table(curve: pd.DataFrame) -> pd.DataFrame:
    """One row per lr: n_trained, n_completed, n_diverged, n_plateau, mean_loss (completed
    seeds), mean_clipped (every trained seed, diverged ones at their init loss)."""
    rows = []
    for lr, at in curve.groupby("lr", sort=True):
        done = at[at["status"] == COMPLETED]
        rows.append({"lr": float(lr), "n_trained": len(at), "n_completed": len(done),
                     "n_diverged": int((at["status"] == DIVERGED).sum()), "n_plateau": int(done["plateau"].sum()),
                     "mean_loss": float(done["loss"].mean()) if len(done) else float("nan"),
                     "mean_clipped": float(at["clipped"].mean()) if at["clipped"].notna().any() else float("nan")})
    return pd.DataFrame(rows, columns=["lr", "n_trained", "n_completed", "n_diverged", "n_plateau", "mean_loss",
                                       "mean_clipped"])


def basin(by_lr: pd.DataFrame, best_lr: float, tolerance: float = DEFAULT_TOLERANCE) -> tuple[float, float, bool]:
    """(lowest lr, highest lr, open) of the contiguous swept lrs around `best_lr` whose mean
    clipped loss is within `tolerance` of the best; open when it reaches an end of the sweep."""
    lrs, losses = by_lr["lr"].to_list(), by_lr["mean_clipped"].to_numpy(dtype=float)
    i = lrs.index(best_lr)
    limit = losses[i] + tolerance
    low = i
    while low > 0 and losses[low - 1] <= limit:
        low -= 1
    high = i
    while high < len(lrs) - 1 and losses[high + 1] <= limit:
        high += 1
    return lrs[low], lrs[high], low == 0 or high == len(lrs) - 1


def unstable_lr(by_lr: pd.DataFrame, best_lr: float | None) -> tuple[float | None, str]:
    """The smallest lr where any seed diverged, or plateaued above the best lr, and why."""
    for row in by_lr.itertuples():
        diverged = row.n_diverged > 0
        stuck = row.n_plateau > 0 and best_lr is not None and row.lr > best_lr
        if diverged or stuck:
            return row.lr, " and ".join(w for w, hit in ((DIVERGED, diverged), (PLATEAUED, stuck)) if hit)
    return None, ""


def analyse_sweep(name: str, cells: pd.DataFrame, value: str = VERDICT_VALUE, tolerance: float = DEFAULT_TOLERANCE,
                  confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                  seed: int = DEFAULT_SEED, option_axes=()) -> Sweep:
    """Every number of one sweep (see the module docstring)."""
    first = cells.iloc[0]
    setting = {a: first[a] for a in option_axes if a not in ("lr", "seed") and a in cells}
    groups = {float(lr): str(g["group"].iloc[0]) for lr, g in cells.groupby("lr", sort=True)}
    curve = lr_curve(cells, value)
    by_lr = lr_table(curve)
    per_seed = per_seed_sensitivity(curve)
    finite = by_lr[np.isfinite(by_lr["mean_clipped"])]
    best_lr = best_loss = best_interval = window = decades = None
    is_open, best_for = False, 0
    if not finite.empty:
        best_lr = float(finite.loc[finite["mean_clipped"].idxmin(), "lr"])
        at_best = curve.loc[curve["lr"] == best_lr, "clipped"].dropna().to_numpy(dtype=float)
        best_loss = float(at_best.mean())
        best_interval = mean_interval(at_best, confidence, n_resamples, seed)
        low, high, is_open = basin(finite.reset_index(drop=True), best_lr, tolerance)
        window, decades = (low, high), math.log10(high / low)
        best_for = int((per_seed["best_lr"] == best_lr).sum())
    values = per_seed[SENSITIVITY].to_numpy(dtype=float)
    threshold, why = unstable_lr(by_lr, best_lr)
    return Sweep(name, str(first["variant_id"]), setting, groups, curve, per_seed, by_lr, best_lr, best_loss,
                 best_interval, best_for, float(values.mean()) if values.size else None,
                 mean_interval(values, confidence, n_resamples, seed), window, decades, is_open, tolerance,
                 threshold, why)


def lr_sweeps(metrics: pd.DataFrame, option_axes=(), value: str = VERDICT_VALUE, tolerance: float = DEFAULT_TOLERANCE,
              confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED,
              min_lrs: int = MIN_LRS) -> list[Sweep]:
    """analyse_sweep for every sweep of `min_lrs` or more learning rates in a cell_metrics frame."""
    return [analyse_sweep(name, cells, value, tolerance, confidence, n_resamples, seed, option_axes)
            for name, cells in sweep_cells(metrics, option_axes, min_lrs).items()]


def sweep_table(sweeps: list[Sweep]) -> pd.DataFrame:
    """One row per sweep with every number the report states (lr_sensitivity.csv)."""
    rows = []
    for sw in sweeps:
        rows.append({
            "sweep": sw.name, "variant_id": sw.variant_id, **sw.setting,
            "lrs": " ".join(f"{lr:g}" for lr in sw.lrs), "n_seeds": sw.n_seeds,
            "best_lr": sw.best_lr, "best_for_seeds": sw.best_for, "best_loss": sw.best_loss,
            "best_loss_ci_low": sw.best_interval.low if sw.best_interval else np.nan,
            "best_loss_ci_high": sw.best_interval.high if sw.best_interval else np.nan,
            SENSITIVITY: sw.sensitivity,
            f"{SENSITIVITY}_ci_low": sw.sensitivity_interval.low if sw.sensitivity_interval else np.nan,
            f"{SENSITIVITY}_ci_high": sw.sensitivity_interval.high if sw.sensitivity_interval else np.nan,
            "basin_low_lr": sw.basin[0] if sw.basin else np.nan, "basin_high_lr": sw.basin[1] if sw.basin else np.nan,
            "basin_decades": sw.basin_decades, "basin_open": sw.basin_open, "basin_tolerance": sw.tolerance,
            "unstable_lr": sw.unstable_lr, "unstable_why": sw.unstable_why,
        })
    return pd.DataFrame(rows)


def sensitivity_frame(sweeps: list[Sweep], metrics: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-seed LR sensitivities as a cells-like frame (group = sweep name), the input of
    stats.paired_comparison; the options that decide whether seeds share batches come along."""
    rows = []
    for sweep in sweeps:
        extra = {}
        if metrics is not None:
            first = metrics[metrics["group"] == next(iter(sweep.groups.values()))].iloc[0]
            extra = {k: first[k] for k in BATCH_KEYS if k in metrics}
        for r in sweep.per_seed.itertuples(index=False):
            rows.append({"group": sweep.name, "variant_id": sweep.variant_id, "seed": r.seed, "status": COMPLETED,
                         SENSITIVITY: getattr(r, SENSITIVITY), **extra})
    return pd.DataFrame(rows, columns=["group", "variant_id", "seed", "status", SENSITIVITY,
                                       *([k for k in BATCH_KEYS if metrics is not None and k in metrics])])


def baseline_sweeps(sweeps: list[Sweep], baseline_of: dict) -> dict[str, str | None]:
    """{sweep name: the sweep its LR sensitivity is compared with}: the sweep holding the
    baseline group of the sweep's groups (None when that baseline has no sweep)."""
    holding = {group: s.name for s in sweeps for group in s.groups.values()}
    out = {}
    for sweep in sweeps:
        bases = {holding.get(baseline_of.get(g)) for g in sweep.groups.values() if baseline_of.get(g)}
        bases.discard(None)
        out[sweep.name] = sorted(bases)[0] if len(bases) == 1 else None
    return out


def compare_sensitivity(sweeps: list[Sweep], baseline_of: dict, metrics: pd.DataFrame | None = None,
                        confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                        seed: int = DEFAULT_SEED) -> list[Comparison]:
    """Each sweep's LR sensitivity against its baseline sweep's, paired by seed (the same seed
    gives both the same batches), via stats.paired_comparison."""
    frame = sensitivity_frame(sweeps, metrics)
    return [paired_comparison(frame, name, base, SENSITIVITY, confidence, n_resamples, seed)
            for name, base in baseline_sweeps(sweeps, baseline_of).items() if base is not None and base != name]
