"""One call from a folder to every number a report shows: `analyse(path) -> Analysis`.

A follow-up experiment reuses this to write its own verdict: `analyse` once, read
`analysis.comparisons` / `analysis.summary` / `analysis.lr_sweeps`, and pass a section to
`write_report`. Comparisons use the final validation loss; every p-value of one analysis
(final-loss and LR-sensitivity comparisons) is corrected together (`Settings.correction`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.analysis.baseline import Baseline, order_groups, resolve_baseline
from ablate.analysis.load import Runs, load_runs
from ablate.analysis.lr_sensitivity import DEFAULT_TOLERANCE, MIN_LRS, Sweep, compare_sensitivity, lr_sweeps
from ablate.analysis.metrics import DEFAULT_LAST_K, DEFAULT_SPIKE_WINDOW, DEFAULT_SPIKE_Z, cell_metrics, layer_profiles
from ablate.analysis.stats import (Comparison, DEFAULT_ALPHA, DEFAULT_CONFIDENCE, DEFAULT_CORRECTION, DEFAULT_POWER,
                                   DEFAULT_RESAMPLES, DEFAULT_SEED, VERDICT_VALUE, correct, group_stats,
                                   paired_comparison)


@dataclass(frozen=True)
class Settings:
    last_k: int = DEFAULT_LAST_K
    spike_z: float = DEFAULT_SPIKE_Z
    spike_window: int = DEFAULT_SPIKE_WINDOW
    confidence: float = DEFAULT_CONFIDENCE
    n_resamples: int = DEFAULT_RESAMPLES
    seed: int = DEFAULT_SEED  # the bootstrap's
    alpha: float = DEFAULT_ALPHA
    power: float = DEFAULT_POWER  # of the "about M seeds would tell" estimate
    correction: str = DEFAULT_CORRECTION  # stats.CORRECTIONS: one family per report
    basin_tolerance: float = DEFAULT_TOLERANCE  # nats: the LR basin's width is measured within this
    min_lrs: int = MIN_LRS  # a sweep of this many learning rates gets the LR-sensitivity section


@dataclass
class Analysis:
    runs: Runs
    settings: Settings
    baseline: Baseline
    metrics: pd.DataFrame  # one row per cell: cells + stability metrics, in report order
    summary: pd.DataFrame  # one row per group: statistics and the comparison (summary.csv)
    comparisons: list[Comparison] = field(default_factory=list)  # final val loss vs baseline, report order
    grad_profiles: pd.DataFrame = field(default_factory=pd.DataFrame)  # metrics.layer_profiles
    act_profiles: pd.DataFrame = field(default_factory=pd.DataFrame)
    lr_sweeps: list[Sweep] = field(default_factory=list)  # sweeps of min_lrs or more learning rates
    lr_comparisons: list[Comparison] = field(default_factory=list)  # LR sensitivity vs the baseline sweep

    @property
    def groups(self) -> list[str]:
        return list(self.summary["group"]) if not self.summary.empty else []

    def comparison(self, group: str) -> Comparison | None:
        return next((c for c in self.comparisons if c.group == group), None)


def analyse(source: str | Path | Runs, baseline: str | None = None, settings: Settings = Settings()) -> Analysis:
    """Load (unless given Runs), compute every metric and statistic. Raises RunsError on a
    path that is not a run or grid folder, UnknownBaseline on a baseline that did not run."""
    runs = source if isinstance(source, Runs) else load_runs(source)
    chosen = resolve_baseline(runs.cells, runs.option_axes, baseline)
    order = order_groups(runs.cells, chosen, runs.option_axes) if not runs.cells.empty else []

    metrics = cell_metrics(runs, settings.last_k, settings.spike_z, settings.spike_window)
    rank = {g: i for i, g in enumerate(order)}
    metrics = (metrics.assign(_rank=metrics["group"].map(rank))
               .sort_values(["_rank", "seed"], kind="stable").drop(columns="_rank").reset_index(drop=True))

    comparisons = [paired_comparison(metrics, g, chosen.of[g], VERDICT_VALUE, settings.confidence,
                                     settings.n_resamples, settings.seed)
                   for g in order if chosen.of.get(g) not in (None, g)]
    sweeps = lr_sweeps(metrics, runs.option_axes, VERDICT_VALUE, settings.basin_tolerance, settings.confidence,
                       settings.n_resamples, settings.seed, settings.min_lrs)
    lr_comparisons = compare_sensitivity(sweeps, chosen.of, metrics, settings.confidence, settings.n_resamples,
                                         settings.seed)
    # Every p-value the report states is one family: corrected together.
    family = correct(comparisons + lr_comparisons, settings.correction, settings.alpha, settings.power)
    comparisons, lr_comparisons = family[:len(comparisons)], family[len(comparisons):]
    summary = summary_table(metrics, runs, chosen, comparisons, settings)
    return Analysis(runs, settings, chosen, metrics, summary, comparisons,
                    layer_profiles(runs, "grad_norm"), layer_profiles(runs, "act_norm"), sweeps, lr_comparisons)


def summary_table(metrics: pd.DataFrame, runs: Runs, baseline: Baseline, comparisons: list[Comparison],
                  settings: Settings) -> pd.DataFrame:
    """group_stats plus the varying axes, the baseline and the comparison, one row per group."""
    table = group_stats(metrics, VERDICT_VALUE, settings.confidence, settings.n_resamples, settings.seed)
    if table.empty:
        return table
    by_group = {c.group: c for c in comparisons}
    first = metrics.groupby("group", sort=False).first()
    for axis in reversed(runs.varying_axes):
        table.insert(2, axis, table["group"].map(first[axis]))
    table.insert(1, "baseline", table["group"].map(lambda g: baseline.of.get(g) or ""))

    def field_of(name):
        return table["group"].map(lambda g: _or_nan(getattr(by_group[g], name)) if g in by_group else np.nan)

    position = table.columns.get_loc("interval") + 1
    for offset, (column, name) in enumerate([("delta_vs_baseline", "mean_diff"), ("delta_ci_low", "ci_low"),
                                             ("delta_ci_high", "ci_high"), ("test", "test"),
                                             ("p_value", "p_value"), ("p_adjusted", "p_adjusted"),
                                             ("n_pairs", "n_pairs"), ("seeds_for_power", "seeds_needed")]):
        table.insert(position + offset, column, field_of(name))
    return table


def _or_nan(value):
    return np.nan if value is None else value
