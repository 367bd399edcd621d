"""Statistics across seeds: intervals, paired comparisons against a baseline, divergence rates.

Only finished cells count: a `completed` cell contributes its final loss; a `diverged` cell
has none and counts in the divergence rate instead; `failed` cells (a Python error, not a
training result) and `running` cells are counted but enter no statistic. With fewer than two
values there is no interval and no p-value: the result says so instead of a number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 9999
DEFAULT_SEED = 0  # the bootstrap's seed: the same runs always give the same interval
DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float


def bootstrap_ci(values, confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int = DEFAULT_SEED) -> Interval | None:
    """Percentile bootstrap interval of the mean (scipy.stats.bootstrap); None for fewer
    than two values, where any interval would be invented."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    if np.all(values == values[0]):  # every resample has the same mean; scipy warns and gives NaN
        return Interval(float(values[0]), float(values[0]), confidence)
    result = scipy_stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                                   method="percentile", rng=np.random.default_rng(seed))
    ci = result.confidence_interval
    return Interval(float(ci.low), float(ci.high), confidence)


def _varies(values: np.ndarray) -> bool:
    # Equal up to rounding counts as constant: a t statistic of rounding noise means nothing
    # (scipy warns of catastrophic cancellation and returns an arbitrary p).
    return bool(np.ptp(values) > 1e-12 * max(1.0, float(np.max(np.abs(values)))))


def welch_p_value(a, b) -> float | None:
    """Two-sided Welch t-test p-value; None when either side has fewer than two values or
    neither varies (the test is undefined)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2 or not (_varies(a) or _varies(b)):
        return None
    p = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    return float(p) if math.isfinite(p) else None


def paired_p_value(a, b) -> float | None:
    """Two-sided paired t-test p-value (same seed = same batches, so pairs share noise);
    None for fewer than two pairs or differences that do not vary."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or not _varies(a - b):
        return None
    p = scipy_stats.ttest_rel(a, b).pvalue
    return float(p) if math.isfinite(p) else None


def finished_values(cells: pd.DataFrame, value: str = "final_loss") -> pd.DataFrame:
    """Completed cells with a finite `value`: the ones statistics are computed on."""
    ok = (cells["status"] == "completed") & np.isfinite(pd.to_numeric(cells[value], errors="coerce"))
    return cells[ok]


def group_stats(cells: pd.DataFrame, value: str = "final_loss", confidence: float = DEFAULT_CONFIDENCE,
                n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """One row per group (in order of first appearance) from a cell_metrics frame: counts by
    status, mean / std / bootstrap interval of `value` over completed seeds, the divergence
    rate (diverged / (completed + diverged)), and the mean of the other stability metrics."""
    rows = []
    for group, members in cells.groupby("group", sort=False):
        done = finished_values(members, value)
        counts = {s: int((members["status"] == s).sum()) for s in ("completed", "diverged", "failed", "running")}
        trained = counts["completed"] + counts["diverged"]  # runs that trained to a result
        values = done[value].to_numpy(dtype=float)
        interval = bootstrap_ci(values, confidence, n_resamples, seed)
        row = {
            "group": group,
            "variant_id": members["variant_id"].iloc[0],
            "n_cells": len(members),
            **{f"n_{s}": n for s, n in counts.items()},
            "seeds": ",".join(str(s) for s in sorted(done["seed"].tolist())),
            "n_values": int(values.size),
            f"{value}_mean": float(values.mean()) if values.size else float("nan"),
            f"{value}_std": float(values.std(ddof=1)) if values.size >= 2 else float("nan"),
            f"{value}_ci_low": interval.low if interval else float("nan"),
            f"{value}_ci_high": interval.high if interval else float("nan"),
            "interval": interval_note(values.size, confidence),
            "divergence_rate": counts["diverged"] / trained if trained else float("nan"),
            "divergence": f"{counts['diverged']}/{trained}",
        }
        settled = members[members["status"].isin(["completed", "diverged"])]
        for metric, how in [("final_val_loss", "mean"), ("spikes", "mean"), ("max_grad_norm", "max"),
                            ("grad_ratio_end", "mean"), ("grad_cv_end", "mean"), ("rms_growth", "mean")]:
            if metric in settled:
                column = pd.to_numeric(settled[metric], errors="coerce")
                row[metric] = float(getattr(column, how)()) if column.notna().any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def interval_note(n_values: int, confidence: float = DEFAULT_CONFIDENCE) -> str:
    if n_values >= 2:
        return f"{confidence:.0%} bootstrap over {n_values} seeds"
    if n_values == 1:
        return "no interval: only one seed"
    return "no interval: no completed seed"


@dataclass(frozen=True)
class Comparison:
    """`group` minus `baseline`, paired by seed, over seeds that completed in both."""

    group: str
    baseline: str
    value: str
    seeds: tuple
    mean_group: float | None
    mean_baseline: float | None
    mean_diff: float | None  # mean over paired seeds of (group - baseline)
    ci_low: float | None  # bootstrap interval of the mean paired difference
    ci_high: float | None
    p_value: float | None  # Welch t-test on the paired seeds' values of the two groups
    confidence: float = DEFAULT_CONFIDENCE
    # Welch's test (what the report's sentences use) ignores the pairing; with shared batches
    # the paired test is often far more sensitive, so it is kept alongside, in summary.csv.
    p_value_paired: float | None = None
    n_group: int = 0  # completed seeds of each side, paired or not (why there may be no pairs)
    n_baseline: int = 0

    @property
    def n_pairs(self) -> int:
        return len(self.seeds)

    def significant(self, alpha: float = DEFAULT_ALPHA) -> bool:
        return self.p_value is not None and self.p_value < alpha

    def sentence(self, unit: str = "nats", alpha: float = DEFAULT_ALPHA, digits: int = 4) -> str:
        """One plain sentence stating what the numbers show (and what they cannot)."""
        g, b = f"`{self.group}`", f"`{self.baseline}`"
        what = self.value.replace("_", " ")
        if self.n_pairs == 0:
            if self.n_group == 0:
                return f"{g} has no completed seed, so its {what} cannot be compared with {b}."
            if self.n_baseline == 0:
                return f"The baseline {b} has no completed seed, so {g} cannot be compared with it."
            return f"{g} vs {b}: no seed completed in both, so there is nothing to compare."
        size = abs(self.mean_diff)
        direction = "lower" if self.mean_diff < 0 else "higher"
        if self.n_pairs == 1:
            if self.mean_diff == 0:
                return f"{g} and {b} have the same {what} on the one seed both completed: only one seed, no interval."
            return (f"{g} has a {direction} {what} than {b} by {size:.{digits}f} {unit} on the one seed "
                    f"both completed (seed {self.seeds[0]}): only one seed, no interval and no p-value.")
        ci = (f"{self.confidence:.0%} CI of the difference {self.ci_low:+.{digits}f} to {self.ci_high:+.{digits}f}"
              if self.ci_low is not None else "no interval")
        seeds = f"{self.n_pairs} paired seeds"
        if self.p_value is None:
            return (f"{g} differs from {b} by {self.mean_diff:+.{digits}f} {unit} ({ci}, {seeds}); the seeds do "
                    f"not vary, so there is no p-value.")
        if self.significant(alpha):
            return (f"{g} has a {direction} {what} than {b} by {size:.{digits}f} {unit} "
                    f"({ci}, Welch {format_p(self.p_value)}, {seeds}).")
        return (f"No significant difference between {g} and {b}: difference {self.mean_diff:+.{digits}f} {unit} "
                f"({ci}, Welch {format_p(self.p_value)}, {seeds}).")


def paired_comparison(cells: pd.DataFrame, group: str, baseline: str, value: str = "final_loss",
                      confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                      seed: int = DEFAULT_SEED) -> Comparison:
    """Compare `group` with `baseline` on the seeds that completed in both (same seed = same
    initial weights and batches, so the difference is the variant alone)."""
    done = finished_values(cells, value)
    a = done[done["group"] == group].set_index("seed")[value]
    b = done[done["group"] == baseline].set_index("seed")[value]
    seeds = sorted(set(a.index) & set(b.index))
    counts = {"n_group": len(a), "n_baseline": len(b)}
    a, b = a.loc[seeds].to_numpy(dtype=float), b.loc[seeds].to_numpy(dtype=float)
    if not seeds:
        return Comparison(group, baseline, value, (), None, None, None, None, None, None, confidence, **counts)
    interval = bootstrap_ci(a - b, confidence, n_resamples, seed)
    return Comparison(
        group, baseline, value, tuple(seeds), float(a.mean()), float(b.mean()), float((a - b).mean()),
        interval.low if interval else None, interval.high if interval else None, welch_p_value(a, b), confidence,
        paired_p_value(a, b), **counts,
    )


def compare_to_baseline(cells: pd.DataFrame, baseline: str, value: str = "final_loss",
                        confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                        seed: int = DEFAULT_SEED) -> list[Comparison]:
    """paired_comparison for every group except the baseline, in order of appearance."""
    return [paired_comparison(cells, group, baseline, value, confidence, n_resamples, seed)
            for group in cells["group"].unique() if group != baseline]


def divergence_sentence(row: pd.Series, baseline_row: pd.Series | None = None) -> str | None:
    """A sentence when a group diverged at all, with the baseline's count for scale."""
    if not row["n_diverged"]:
        return None
    text = f"`{row['group']}` diverged in {row['divergence']} seeds"
    if baseline_row is not None and baseline_row["group"] != row["group"]:
        text += f" (baseline `{baseline_row['group']}`: {baseline_row['divergence']})"
    return text + "."


def format_p(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return "no p-value"
    return "p<0.001" if p < 0.001 else f"p={p:.2g}" if p < 0.01 else f"p={p:.2f}"
