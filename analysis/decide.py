"""The tests a claim's verdict uses: each returns its estimate, its interval and its p-value from
one and the same test, so "the interval excludes the null" and "p < alpha" never disagree.

    paired t      per-unit differences a - b (or a - `than`): scipy.stats.ttest_1samp, two-sided;
                  the interval is that test's own t interval (TtestResult.confidence_interval)
                  at 1 - alpha. The t interval, not a bootstrap: a percentile bootstrap over 3
                  seeds is the seeds' [min, max] and covers about 75% where it claims 95%.
    not worse     non-inferiority within a margin M (a - b < M for "not_higher"): the one-sided
                  t-test of H0 "mean >= M"; the interval is the two-sided 1 - 2 alpha t interval,
                  whose upper end is the one-sided 1 - alpha bound the test uses. The opposite
                  one-sided test ("mean <= M") says when the data show a is worse by M or more.
    exact McNemar paired 0/1 outcomes (a run failed or not): the discordant pairs only;
                  scipy.stats.binomtest of the pairs where a alone is 1 among all discordant
                  ones, against 1/2, two-sided; the interval is that test's Clopper-Pearson
                  interval of the share where a alone is 1 (null 1/2). With p0 = 1/2 the
                  binomial is symmetric, so the interval excludes 1/2 exactly when p < alpha.
    exact binomial  0/1 outcomes of one side against a rate `than`: binomtest, one-sided in the
                  claimed direction, with its one-sided Clopper-Pearson interval.
    exact         a deterministic quantity (a parameter count): no sampling, no p-value; the
                  difference itself decides, against the smallest effect of interest.

Units are assumed independent: seeds always are (each its own weights and batches); several
units per seed (seed x lr ...) share a seed's data order, which the report states.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from ablate.analysis.stats import (DEFAULT_POWER, Interval, _smallest_n_reaching, discordant_pairs,
                                   mcnemar_pairs_for_power, paired_power)

RIGHT, WRONG = "right", "wrong"  # which way an estimate points, against the claimed direction


@dataclass(frozen=True)
class Test:
    name: str
    estimate: float  # a - b (t tests, exact), or the share of discordant pairs where a alone is 1
    interval: Interval | None
    p_value: float | None  # the decisive p-value: for the claimed direction when `side` is RIGHT
    side: str | None  # RIGHT, WRONG or None (no direction: a zero estimate)
    null: float  # what the interval is read against: 0, the margin, 1/2, the rate `than`
    detail: str = ""  # the counts behind a binary test


def _varies(values: np.ndarray) -> bool:
    return bool(np.ptp(values) > 1e-12 * max(1.0, float(np.max(np.abs(values)))))


def _side(estimate: float, null: float, higher: bool) -> str | None:
    if estimate == null:
        return None
    return RIGHT if (estimate > null) == higher else WRONG


def paired_t(d: np.ndarray, higher: bool, alpha: float, name: str = "paired t-test") -> Test | None:
    """Two-sided t-test of mean(d) = 0 with its 1 - alpha t interval; None without a spread."""
    if d.size < 2 or not _varies(d):
        return None
    result = scipy_stats.ttest_1samp(d, 0.0)
    ci = result.confidence_interval(1 - alpha)
    estimate = float(d.mean())
    return Test(name, estimate, Interval(float(ci.low), float(ci.high), 1 - alpha), float(result.pvalue),
                _side(estimate, 0.0, higher), 0.0)


def not_worse(d: np.ndarray, margin: float, higher_is_worse: bool, alpha: float) -> Test | None:
    """Non-inferiority: a is not worse than b by `margin` or more (see the module docstring)."""
    if d.size < 2 or not _varies(d):
        return None
    sign = 1.0 if higher_is_worse else -1.0  # flip so that "worse" is always "above +margin"
    x = sign * d
    shown = scipy_stats.ttest_1samp(x, margin, alternative="less")
    worse = scipy_stats.ttest_1samp(x, margin, alternative="greater")
    ci = scipy_stats.ttest_1samp(d, 0.0).confidence_interval(1 - 2 * alpha)
    estimate = float(d.mean())
    right = float(x.mean()) < margin
    return Test("one-sided t-test against the margin", estimate, Interval(float(ci.low), float(ci.high), 1 - 2 * alpha),
                float(shown.pvalue if right else worse.pvalue), RIGHT if right else WRONG, sign * margin)


def mcnemar(a: np.ndarray, b: np.ndarray, higher: bool, alpha: float) -> Test | None:
    """Exact McNemar test with its Clopper-Pearson interval; None with no discordant pair."""
    n10, n01 = discordant_pairs(a, b)
    detail = f"{int(a.sum())} of {a.size} vs {int(b.sum())} of {b.size}; discordant pairs {n10}:{n01}"
    if n10 + n01 == 0:
        return Test("exact McNemar test", math.nan, None, None, None, 0.5, detail)
    result = scipy_stats.binomtest(n10, n10 + n01, 0.5)
    ci = result.proportion_ci(1 - alpha, method="exact")
    share = n10 / (n10 + n01)
    return Test("exact McNemar test", share, Interval(float(ci.low), float(ci.high), 1 - alpha),
                float(result.pvalue), _side(share, 0.5, higher), 0.5, detail)


def binomial_rate(a: np.ndarray, than: float, higher: bool, alpha: float) -> Test:
    """One side's 0/1 outcomes against a rate: exact one-sided binomial test in the claimed
    direction and its one-sided Clopper-Pearson interval (the opposite test when it points away)."""
    k, n = int(a.sum()), int(a.size)
    rate = k / n
    right = (rate > than) == higher and rate != than
    alternative = ("greater" if higher else "less") if right else ("less" if higher else "greater")
    result = scipy_stats.binomtest(k, n, than, alternative=alternative)
    ci = result.proportion_ci(1 - alpha, method="exact")
    return Test("exact binomial test", rate, Interval(float(ci.low), float(ci.high), 1 - alpha), float(result.pvalue),
                _side(rate, than, higher), than, f"{k} of {n}")


def exact(d: np.ndarray, higher: bool) -> Test:
    """A deterministic difference: its value, no interval and no p-value (nothing is sampled)."""
    estimate = float(d.mean())
    return Test("exact count", estimate, Interval(float(d.min()), float(d.max()), 1.0), None,
                _side(estimate, 0.0, higher), 0.0)


# --------------------------------------------------------- what a clause's smallest effect needs


def t_seeds_for(effect: float, d: np.ndarray, alpha: float, power: float = DEFAULT_POWER) -> int | None:
    """Units at which the two-sided t-test at `alpha` detects a true mean difference of `effect`
    (the declared smallest effect of interest, not the observed one) with the observed spread;
    None where the spread is unknown (fewer than two values, or none)."""
    if d.size < 2 or not _varies(d) or effect <= 0:
        return None
    size = effect / float(d.std(ddof=1))
    return _smallest_n_reaching(lambda n: paired_power(size, n, alpha), power, 100_000)


def mcnemar_pairs_for(effect: float, alpha: float, power: float = DEFAULT_POWER) -> int | None:
    """Pairs at which the exact McNemar test detects a difference of `effect` in the rate of
    failure, in the most favourable case (no pair going the other way)."""
    return mcnemar_pairs_for_power(min(effect, 1.0), 0.0, alpha, power) if effect > 0 else None
