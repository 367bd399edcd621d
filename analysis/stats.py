"""Statistics across seeds: intervals, paired comparisons against a baseline, divergence rates,
multiple-testing correction and the number of seeds a test would need.

Two cells with the same seed start from the same weights and see the same batches, so their
difference is the variant alone: such cells are compared with the paired t-test on the
per-seed differences. Welch's t-test (which ignores pairing) is used only where the two sides
share fewer than two seeds or train on different batches (model, batch size, context or data
differ). The p-values of one report are corrected together (Benjamini-Hochberg by default,
Holm on request); a "no significant difference" comes with the number of seeds at which a
paired t-test would detect the observed mean difference with 80% power. A claim's
comparisons are tested apart from these (ablate/claims/decide.py: the exact sign test over
seeds, against 0, a bound, or within a non-inferiority margin).

Only finished cells count: a `completed` cell contributes its final loss; a `diverged` cell
has none and counts in the divergence rate instead; `failed` cells (a Python error, not a
training result) and `running` cells are counted but enter no statistic. With fewer than two
values there is no interval and no p-value: the result says so instead of a number. A mean over
seeds has the t interval below BOOTSTRAP_MIN_VALUES seeds (a percentile bootstrap covers far
less than it claims there) and the bootstrap from there on (mean_interval).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from ablate.analysis.load import DONE, FINISHED, RUNNING
from ablate.core.rundir import COMPLETED, DIVERGED

DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 9999
DEFAULT_SEED = 0  # the bootstrap's seed: the same runs always give the same interval
DEFAULT_ALPHA = 0.05
# The one error level of every claim test, whatever its kind (t, sign, sequential): one-sided,
# the usual convention (half of a two-sided 0.05). Claims import it; a claim file may declare its own.
ONE_SIDED_ALPHA = 0.025
DEFAULT_POWER = 0.8
# Multiple-testing corrections by name: what `--correction` accepts and the report spells out.
CORRECTIONS = {"bh": "Benjamini-Hochberg", "holm": "Holm"}
CONTROLS = {"bh": "false discovery rate", "holm": "family-wise error rate"}  # what each correction bounds
CORRECTION_SHORT = {"bh": "BH", "holm": "Holm"}
DEFAULT_CORRECTION = "bh"
PAIRED, WELCH = "paired t-test", "Welch t-test"
# Options that change which batches a seed gives (or their tokens): cells that differ in one of
# them share a seed but not their data, so they do not pair. Depth, width or lr change the
# initial weights or the updates, not the batches: those cells still pair.
BATCH_KEYS = ("model", "batch_size", "seq_len", "data")
MAX_SEEDS = 100_000  # seeds_for_power gives up above this: the difference is too small to chase


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float


# A percentile bootstrap of a mean covers less than it claims with few units: on normal data a
# 95% interval covered 76% of the time at 3 seeds, 84% at 5, 90% at 10 and 94% at 20 (2,000
# samples of each size, 2,000 resamples each). Below this many values a mean gets the t interval
# instead, which is exact for normal values at any n.
BOOTSTRAP_MIN_VALUES = 20
# The rule in words, for the report and the plots that show these intervals.
MEAN_INTERVAL_RULE = (f"Student's t interval below {BOOTSTRAP_MIN_VALUES} seeds, a percentile bootstrap from "
                      f"{BOOTSTRAP_MIN_VALUES} on")


def mean_interval(values, confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                  seed: int = DEFAULT_SEED) -> Interval | None:
    """The interval of a mean over seeds: Student's t interval below BOOTSTRAP_MIN_VALUES values
    (the one-sample t-test's own interval), the percentile bootstrap from there on;
    interval_note says which. None for fewer than two values."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    if not varies(values):  # every value alike: no spread to put an interval on
        return Interval(float(values.mean()), float(values.mean()), confidence)
    if values.size < BOOTSTRAP_MIN_VALUES:
        return t_interval(values, confidence)
    return bootstrap_ci(values, confidence, n_resamples, seed)


def bootstrap_ci(values, confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                 seed: int = DEFAULT_SEED) -> Interval | None:
    """Percentile bootstrap interval of the mean (scipy.stats.bootstrap); None for fewer
    than two values, where any interval would be invented. For a mean over seeds use
    mean_interval: below BOOTSTRAP_MIN_VALUES this one covers less than it claims."""
    values = np.asarray(values, dtype=float)
    if values.size < 2:
        return None
    if np.all(values == values[0]):  # every resample has the same mean; scipy warns and gives NaN
        return Interval(float(values[0]), float(values[0]), confidence)
    result = scipy_stats.bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                                   method="percentile", rng=np.random.default_rng(seed))
    ci = result.confidence_interval
    return Interval(float(ci.low), float(ci.high), confidence)


def varies(values: np.ndarray) -> bool:
    """Two or more values, not all equal. Equal up to rounding counts as constant: a t statistic of
    rounding noise means nothing (scipy warns of catastrophic cancellation and returns an arbitrary p)."""
    return bool(values.size > 1 and np.ptp(values) > 1e-12 * max(1.0, float(np.max(np.abs(values)))))


def welch_p_value(a, b) -> float | None:
    """Two-sided Welch t-test p-value; None when either side has fewer than two values or
    neither varies (the test is undefined)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2 or not (varies(a) or varies(b)):
        return None
    p = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    return float(p) if math.isfinite(p) else None


def one_sample_p_value(values, popmean: float = 0.0) -> float | None:
    """Two-sided one-sample t-test p-value of mean(values) = popmean (scipy.stats.ttest_1samp):
    the paired t-test when `values` are per-seed differences, or a measure against a fixed
    number. None for fewer than two values or values that do not vary (no test)."""
    values = np.asarray(values, dtype=float)
    if values.size < 2 or not varies(values):
        return None
    p = scipy_stats.ttest_1samp(values, popmean).pvalue
    return float(p) if math.isfinite(p) else None


def paired_p_value(a, b) -> float | None:
    """Two-sided paired t-test p-value (same seed = same batches, so pairs share noise);
    None for fewer than two pairs or differences that do not vary. The paired t-test is the
    one-sample test of the differences (scipy.stats.ttest_rel computes it the same way)."""
    return one_sample_p_value(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))


def _upper_tail_power(critical: float, df: int, noncentrality: float) -> float:
    """P(T > critical) for a noncentral t: the chance a t statistic clears an upper critical
    value. scipy's sf gives NaN for some large noncentralities, where 1 - cdf still works."""
    near = scipy_stats.nct.sf(critical, df, noncentrality)
    return float(near if math.isfinite(near) else 1.0 - scipy_stats.nct.cdf(critical, df, noncentrality))


def paired_power(effect_size: float, n: int, alpha: float = DEFAULT_ALPHA) -> float:
    """Power of the two-sided paired t-test with `n` pairs when the differences have mean /
    standard deviation `effect_size` (Cohen's d_z): the noncentral t distribution's mass
    beyond the critical values (scipy.stats.nct)."""
    df = n - 1
    critical = scipy_stats.t.ppf(1 - alpha / 2, df)
    noncentrality = abs(effect_size) * math.sqrt(n)  # the test is symmetric in the sign
    near = _upper_tail_power(critical, df, noncentrality)
    # The tail on the far side is tiny; scipy returns NaN for some of those (e.g. df 1, nc 14).
    far = scipy_stats.nct.cdf(-critical, df, noncentrality)
    return float(near + (far if math.isfinite(far) else 0.0))


def one_sided_power(effect_size: float, n: int, alpha: float = DEFAULT_ALPHA) -> float:
    """Power of a one-sided one-sample t-test at `alpha` with `n` values when the true effect
    in the tested direction is `effect_size` standard deviations (scipy.stats.nct): what each
    half of a TOST, or a test that a difference lies beyond a margin, can detect."""
    df = n - 1
    return _upper_tail_power(scipy_stats.t.ppf(1 - alpha, df), df, effect_size * math.sqrt(n))


def _smallest_n_reaching(power_at: Callable[[int], float], power: float, max_n: int) -> int | None:
    """The smallest n >= 2 with power_at(n) >= power, or None when even `max_n` falls short.
    Power grows with n, so doubling then bisecting finds it in O(log n) power evaluations
    (each a noncentral t tail) instead of one per candidate."""
    if power_at(max_n) < power:
        return None
    low, high = 1, 2  # power(low) < target (one value has no test), power(high) to be found
    while power_at(high) < power:
        low, high = high, high * 2
    while high - low > 1:  # bisect for the first n that reaches it
        middle = (low + high) // 2
        low, high = (middle, high) if power_at(middle) < power else (low, middle)
    return min(high, max_n)


def seeds_for_power(differences, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                    max_seeds: int = MAX_SEEDS) -> int | None:
    """The smallest number of paired seeds at which a two-sided paired t-test at `alpha` would
    detect a true mean difference equal to the observed one (with the observed spread) with
    probability `power`. None when it cannot be estimated: fewer than two differences, a mean
    of zero or differences that do not vary, or more than `max_seeds` seeds needed."""
    d = np.asarray(differences, dtype=float)
    d = d[np.isfinite(d)]
    if d.size < 2 or not varies(d) or d.mean() == 0:
        return None
    effect = abs(float(d.mean())) / float(d.std(ddof=1))
    return _smallest_n_reaching(lambda n: paired_power(effect, n, alpha), power, max_seeds)


def one_sided_seeds_for_power(effect_size: float, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                              max_seeds: int = MAX_SEEDS) -> int | None:
    """The smallest number of seeds at which a one-sided t-test at `alpha` detects a true
    effect of `effect_size` standard deviations with probability `power` (one_sided_power).
    None when there is no effect in the tested direction (effect_size <= 0) or more than
    `max_seeds` seeds would be needed."""
    if not effect_size > 0:
        return None
    return _smallest_n_reaching(lambda n: one_sided_power(effect_size, n, alpha), power, max_seeds)


@dataclass(frozen=True)
class Equivalence:
    """What tost found: the evidence for equivalence, the evidence against it, and which of
    the two the mean points to."""

    within: bool  # |mean| < margin: only then can equivalence be shown, else only refuted
    p_equivalent: float  # TOST: the larger of the two one-sided p-values against -margin and +margin
    p_beyond: float  # one-sided p-value that the mean lies beyond the margin on its own side
    interval: Interval  # the (1 - 2 alpha) t interval of the mean: inside +-margin iff TOST rejects
    effect_size: float  # |distance from the mean to the nearer margin| / sd, for one_sided_seeds_for_power

    @property
    def p_value(self) -> float:
        """The decisive p-value: TOST's when the mean is within the margin, else the test beyond it."""
        return self.p_equivalent if self.within else self.p_beyond


def tost(differences, margin: float, alpha: float = DEFAULT_ALPHA) -> Equivalence | None:
    """Two one-sided t-tests (TOST) that the mean of `differences` lies within +-`margin`:
    "mean <= -margin" and "mean >= margin" must both be rejected, so the p-value of equivalence
    is the larger of the two (scipy.stats.ttest_1samp, alternative="greater" / "less"). A mean
    at or beyond the margin cannot be shown equivalent, only shown beyond it: the one-sided test
    of that is given too, so the data can refute equivalence as well as support it. None for
    fewer than two differences or differences without spread (no t statistic)."""
    d = np.asarray(differences, dtype=float)
    if d.size < 2 or float(d.std(ddof=1)) == 0:
        return None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    above_low = scipy_stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    below_high = scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue
    beyond = (scipy_stats.ttest_1samp(d, margin, alternative="greater") if mean > 0 else
              scipy_stats.ttest_1samp(d, -margin, alternative="less")).pvalue
    half = scipy_stats.t.ppf(1 - alpha, d.size - 1) * sd / math.sqrt(d.size)
    return Equivalence(abs(mean) < margin, float(max(above_low, below_high)), float(beyond),
                       Interval(mean - half, mean + half, 1 - 2 * alpha), abs(margin - abs(mean)) / sd)


def discordant_pairs(a, b) -> tuple[int, int]:
    """(pairs with a = 1 and b = 0, pairs with a = 0 and b = 1) of paired 0/1 outcomes: the
    only pairs that say which side is more likely to be 1."""
    a, b = np.asarray(a), np.asarray(b)
    return int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())


def mcnemar_exact(a, b) -> float | None:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes: under no difference each
    discordant pair is (1, 0) or (0, 1) with probability 1/2, so the count of (1, 0) pairs is
    tested with scipy.stats.binomtest. Exact, because the seeds are few (the chi-square
    approximation needs many discordant pairs). None when no pair is discordant."""
    n10, n01 = discordant_pairs(a, b)
    return float(scipy_stats.binomtest(n10, n10 + n01, 0.5).pvalue) if n10 + n01 else None


def mcnemar_pairs_for_power(p10: float, p01: float, alpha: float = DEFAULT_ALPHA, power: float = DEFAULT_POWER,
                            max_pairs: int = 500) -> int | None:
    """The smallest number of pairs at which the exact McNemar test at `alpha` rejects with
    probability `power` when a pair is (1, 0) with probability p10 and (0, 1) with p01: the
    exact binomial power, summed over how many pairs turn out discordant. None when p10 = p01
    (no effect to detect) or more than `max_pairs` pairs would be needed."""
    q = p10 + p01
    if q <= 0 or p10 == p01:
        return None
    rejects = _mcnemar_rejection_chances(p10 / q, alpha, max_pairs)
    for n in range(2, max_pairs + 1):
        if float(scipy_stats.binom.pmf(np.arange(n + 1), n, q) @ rejects[:n + 1]) >= power:
            return n
    return None


def _mcnemar_rejection_chances(r: float, alpha: float, max_pairs: int) -> np.ndarray:
    """[d]: the chance that d discordant pairs, each (1, 0) with probability r, give a two-sided
    exact binomial p < alpha. The p-value of k of d is binomtest's for p = 1/2 (twice the
    smaller tail, capped at 1), computed for every k at once: binomtest per k is far slower."""
    rejects = np.zeros(max_pairs + 1)
    for d in range(1, max_pairs + 1):
        k = np.arange(d + 1)
        p_two = np.minimum(1.0, 2 * scipy_stats.binom.cdf(np.minimum(k, d - k), d, 0.5))
        tail = k[p_two < alpha]
        rejects[d] = scipy_stats.binom.pmf(tail, d, r).sum() if tail.size else 0.0
    return rejects


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values (controls the family-wise error rate): the i-th
    smallest of m p-values is multiplied by (m - i), made non-decreasing, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    m = p.size
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def adjust_p_values(p_values, method: str = DEFAULT_CORRECTION) -> list[float | None]:
    """Correct a family of p-values for multiple testing; None entries (no test) stay None and
    do not count in the family. `method`: "bh" (Benjamini-Hochberg, scipy.stats.
    false_discovery_control) or "holm"."""
    if method not in CORRECTIONS:
        raise ValueError(f"unknown correction {method!r}; valid: {', '.join(CORRECTIONS)}")
    present = [i for i, p in enumerate(p_values) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * len(p_values)
    if not present:
        return out
    raw = np.array([p_values[i] for i in present], dtype=float)
    adjusted = holm(raw) if method == "holm" else scipy_stats.false_discovery_control(raw, method="bh")
    for i, p in zip(present, np.atleast_1d(adjusted)):
        out[i] = float(p)
    return out


# The loss a verdict or report compares: the validation loss at the end of training, on the
# fixed held-out set (summary.json `final_val_loss`). The training-loss mean is a column.
VERDICT_VALUE = "final_val_loss"
VALUE_NAMES = {"final_val_loss": "final validation loss", "lr_sensitivity": "LR sensitivity"}  # in sentences


def finished_values(cells: pd.DataFrame, value: str = VERDICT_VALUE) -> pd.DataFrame:
    """Completed cells with a finite `value`: the ones statistics are computed on."""
    ok = (cells["status"] == COMPLETED) & np.isfinite(pd.to_numeric(cells[value], errors="coerce"))
    return cells[ok]


def group_stats(cells: pd.DataFrame, value: str = VERDICT_VALUE, confidence: float = DEFAULT_CONFIDENCE,
                n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED) -> pd.DataFrame:
    """One row per group (in order of first appearance) from a cell_metrics frame: counts by
    status, mean / std / interval (mean_interval) of `value` over completed seeds, the divergence
    rate (diverged / (completed + diverged)), and the mean of the other stability metrics
    (the training-loss mean `final_loss` among them)."""
    rows = []
    for group, members in cells.groupby("group", sort=False):
        done = finished_values(members, value)
        counts = {s: int((members["status"] == s).sum()) for s in (*FINISHED, RUNNING)}
        trained = sum(counts[s] for s in DONE)  # runs that trained to a result
        values = done[value].to_numpy(dtype=float)
        interval = mean_interval(values, confidence, n_resamples, seed)
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
            "divergence_rate": counts[DIVERGED] / trained if trained else float("nan"),
            "divergence": f"{counts[DIVERGED]}/{trained}",
        }
        settled = members[members["status"].isin(DONE)]
        for metric, how in [("final_loss", "mean"), ("final_val_loss", "mean"), ("spikes", "mean"),
                            ("max_grad_norm", "max"), ("grad_ratio_end", "mean"), ("grad_cv_end", "mean"),
                            ("rms_growth", "mean")]:
            if metric in settled and metric != value:
                column = pd.to_numeric(settled[metric], errors="coerce")
                row[metric] = float(getattr(column, how)()) if column.notna().any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def interval_note(n_values: int, confidence: float = DEFAULT_CONFIDENCE) -> str:
    if n_values >= BOOTSTRAP_MIN_VALUES:
        return f"{confidence:.0%} bootstrap over {n_values} seeds"
    if n_values >= 2:
        return f"{confidence:.0%} t interval over {n_values} seeds"
    if n_values == 1:
        return "no interval: only one seed"
    return "no interval: no completed seed"


@dataclass(frozen=True)
class Comparison:
    """`group` minus `baseline` on `value`: paired by seed where the two share seeds (and
    batches), otherwise the difference of the two groups' means with Welch's test."""

    group: str
    baseline: str
    value: str
    seeds: tuple  # the paired seeds; () when unpaired
    mean_group: float | None
    mean_baseline: float | None
    mean_diff: float | None  # paired: mean of (group - baseline) per seed; unpaired: difference of means
    ci_low: float | None  # the t interval of mean_diff from the test that gives p_value
    ci_high: float | None
    p_value: float | None  # of `test`, before correction
    confidence: float = DEFAULT_CONFIDENCE
    test: str | None = None  # PAIRED, WELCH, or None (no test possible)
    n_group: int = 0  # completed seeds of each side, paired or not (why there may be no pairs)
    n_baseline: int = 0
    differences: tuple = ()  # the per-seed paired differences
    p_adjusted: float | None = None  # after the report's multiple-testing correction
    correction: str | None = None  # its key in CORRECTIONS
    alpha: float = DEFAULT_ALPHA
    power: float = DEFAULT_POWER

    @property
    def n_pairs(self) -> int:
        return len(self.seeds)

    @property
    def paired(self) -> bool:
        return self.test == PAIRED

    @property
    def p_decisive(self) -> float | None:
        """The p-value significance is judged on: corrected when a correction was applied."""
        return self.p_adjusted if self.correction else self.p_value

    @property
    def seeds_needed(self) -> int | None:
        """Paired seeds at which this mean difference would be detected with `power`."""
        return seeds_for_power(self.differences, self.alpha, self.power) if self.paired else None

    def significant(self, alpha: float | None = None) -> bool:
        p = self.p_decisive
        return p is not None and p < (self.alpha if alpha is None else alpha)

    def _p_text(self) -> str:
        name = "paired t-test" if self.paired else "Welch t-test"
        text = f"{name} {format_p(self.p_value)}"
        if self.correction:
            text += f", {CORRECTION_SHORT[self.correction]}-adjusted {format_p(self.p_adjusted)}"
        return text

    def power_note(self) -> str:
        """What more seeds would do, for a difference that is not significant."""
        if not self.paired:
            return "the seeds do not pair, so there is no paired power estimate"
        needed = self.seeds_needed
        if needed is None:
            return f"more than {MAX_SEEDS:,} seeds would be needed to detect a difference this small"
        return (f"about {needed} paired seeds would detect a difference of this size with {self.power:.0%} power "
                f"(paired t-test at alpha {self.alpha:g} before correction)")

    def sentence(self, unit: str = "nats", alpha: float | None = None, digits: int = 4) -> str:
        """One plain sentence stating what the numbers show (and what they cannot)."""
        g, b = f"`{self.group}`", f"`{self.baseline}`"
        what = VALUE_NAMES.get(self.value, self.value.replace("_", " "))
        if self.mean_diff is None:
            if self.n_group == 0:
                return f"{g} has no completed seed, so its {what} cannot be compared with {b}."
            if self.n_baseline == 0:
                return f"The baseline {b} has no completed seed, so {g} cannot be compared with it."
            return f"{g} vs {b}: no seed completed in both, so there is nothing to compare."
        size = abs(self.mean_diff)
        direction = "lower" if self.mean_diff < 0 else "higher"
        if self.test is None and self.n_pairs <= 1:
            if self.mean_diff == 0:
                return f"{g} and {b} have the same {what} on the one seed both completed: only one seed, no interval."
            return (f"{g} has a {direction} {what} than {b} by {size:.{digits}f} {unit} on the one seed "
                    f"both completed (seed {self.seeds[0]}): only one seed, no interval and no p-value.")
        ci = (f"{self.confidence:.0%} CI of the difference {self.ci_low:+.{digits}f} to {self.ci_high:+.{digits}f}"
              if self.ci_low is not None else "no interval")
        seeds = (f"{self.n_pairs} paired seeds" if self.paired
                 else f"unpaired: {self.n_group} and {self.n_baseline} seeds")
        if self.p_value is None:
            return (f"{g} differs from {b} by {self.mean_diff:+.{digits}f} {unit} ({ci}, {seeds}); the seeds do "
                    f"not vary, so there is no p-value.")
        if self.significant(alpha):
            return (f"{g} has a {direction} {what} than {b} by {size:.{digits}f} {unit} "
                    f"({ci}, {self._p_text()}, {seeds}).")
        return (f"No significant difference between {g} and {b}: difference {self.mean_diff:+.{digits}f} {unit} "
                f"({ci}, {self._p_text()}, {seeds}); {self.power_note()}.")



def _share_batches(cells: pd.DataFrame, group: str, baseline: str) -> bool:
    """Whether the same seed gives both groups the same batches (see BATCH_KEYS)."""
    a, b = cells[cells["group"] == group], cells[cells["group"] == baseline]
    for key in BATCH_KEYS:
        if key in cells and not a.empty and not b.empty:
            if str(a[key].iloc[0]) != str(b[key].iloc[0]):
                return False
    return True


def t_interval(differences, confidence: float = DEFAULT_CONFIDENCE) -> Interval | None:
    """The t interval of the mean of paired differences: the interval of the same one-sample
    t-test whose p-value the comparison reports (scipy's TtestResult.confidence_interval), so
    the interval excludes 0 exactly when p < 1 - confidence. None without a spread."""
    d = np.asarray(differences, dtype=float)
    if d.size < 2 or not varies(d):
        return None
    ci = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(confidence)
    return Interval(float(ci.low), float(ci.high), confidence)


def welch_interval(a, b, confidence: float = DEFAULT_CONFIDENCE) -> Interval | None:
    """The interval of Welch's t-test of mean(a) - mean(b), the test whose p-value is reported."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size < 2 or b.size < 2 or not (varies(a) or varies(b)):
        return None
    ci = scipy_stats.ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
    return Interval(float(ci.low), float(ci.high), confidence)


def paired_comparison(cells: pd.DataFrame, group: str, baseline: str, value: str = VERDICT_VALUE,
                      confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                      seed: int = DEFAULT_SEED) -> Comparison:
    """Compare `group` with `baseline`: on the seeds that completed in both with the paired
    t-test (same seed = same initial weights and batches, so the difference is the variant
    alone) when there are two such seeds and the groups share batches; otherwise on all
    completed seeds of each with Welch's t-test."""
    done = finished_values(cells, value)
    a = done[done["group"] == group].set_index("seed")[value]
    b = done[done["group"] == baseline].set_index("seed")[value]
    seeds = sorted(set(a.index) & set(b.index))
    counts = {"n_group": len(a), "n_baseline": len(b)}
    pairs = _share_batches(cells, group, baseline)
    if pairs and len(seeds) >= 2:
        x, y = a.loc[seeds].to_numpy(dtype=float), b.loc[seeds].to_numpy(dtype=float)
        interval = t_interval(x - y, confidence)
        return Comparison(group, baseline, value, tuple(seeds), float(x.mean()), float(y.mean()),
                          float((x - y).mean()), interval.low if interval else None,
                          interval.high if interval else None, paired_p_value(x, y), confidence, PAIRED,
                          differences=tuple(float(d) for d in x - y), **counts)
    if len(a) >= 2 and len(b) >= 2:  # the seeds do not pair: compare the two groups' means
        x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
        interval = welch_interval(x, y, confidence)
        return Comparison(group, baseline, value, (), float(x.mean()), float(y.mean()), float(x.mean() - y.mean()),
                          interval.low if interval else None, interval.high if interval else None,
                          welch_p_value(x, y), confidence, WELCH, **counts)
    if pairs and len(seeds) == 1:
        x, y = float(a.loc[seeds[0]]), float(b.loc[seeds[0]])
        return Comparison(group, baseline, value, tuple(seeds), x, y, x - y, None, None, None, confidence,
                          differences=(x - y,), **counts)
    return Comparison(group, baseline, value, (), None, None, None, None, None, None, confidence, **counts)


def compare_to_baseline(cells: pd.DataFrame, baseline: str, value: str = VERDICT_VALUE,
                        confidence: float = DEFAULT_CONFIDENCE, n_resamples: int = DEFAULT_RESAMPLES,
                        seed: int = DEFAULT_SEED) -> list[Comparison]:
    """paired_comparison for every group except the baseline, in order of appearance."""
    return [paired_comparison(cells, group, baseline, value, confidence, n_resamples, seed)
            for group in cells["group"].unique() if group != baseline]


def correct(comparisons: list[Comparison], method: str = DEFAULT_CORRECTION, alpha: float = DEFAULT_ALPHA,
            power: float = DEFAULT_POWER) -> list[Comparison]:
    """The comparisons with their p-values corrected together as one family (a report's)."""
    adjusted = adjust_p_values([c.p_value for c in comparisons], method)
    return [replace(c, p_adjusted=p, correction=method, alpha=alpha, power=power)
            for c, p in zip(comparisons, adjusted)]


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
