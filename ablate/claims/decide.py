"""The tests a claim's verdict uses, over SEEDS: the seed is the unit of every test.

Only the seed is random (its initial weights and its batches); rates, warmups and the other axes
a clause reads are fixed design. So a clause first reduces each seed's cells to one value
(`per_seed`: the mean over the seed's paired cells of a - b; for a failure measure that mean is
the difference in the share of failed cells over the rates and warmups it reads), and tests the
seeds' values. Cells of one seed are never counted as separate units: adding rates cannot shrink
a p-value (tests/ablate/claims/test_decide.py holds it to that with perfectly correlated cells).

Every test is one-sided in the claimed direction at one level (stats.ONE_SIDED_ALPHA, 0.025,
unless the claim declares its own), and answers three questions at a look's nominal level:

    shown     the effect lies beyond 0 the claimed way (for "a matches b": a is not worse than b
              by the margin)                                                          -> agrees
    beyond    the effect lies beyond the declared smallest effect of interest (said, not deciding)
    futile    the effect lies short of the smallest effect of interest, the claimed way
              ("no effect as large as X"; for "a matches b": a is worse by the margin or more)
                                                                              -> does not agree

The estimands and the kinds (each test is exact for what it is about, at any number of seeds):

    t       continuous measures (a loss, a gradient ratio): the estimand is the MEDIAN seed's
            a - b, tested by the exact sign test (scipy.stats.binomtest against 1/2, seeds equal
            to the null value dropped; Conover 1999, 3.4), its interval the order statistics that
            bound the median at 1 - 2 level. Why not the mean: per-seed differences are skewed
            whenever an arm sometimes fails (a failed run scores the unigram entropy), and no
            test of a mean is valid over skewed distributions at 6-12 seeds (Bahadur & Savage
            1956): with a mean 0 and a centred exponential opposite the claim the t-test says
            "agrees" 0.096 of the time at 0.025 over 12 seeds, a sign-flip permutation test
            0.093, Wilcoxon's signed-rank 0.102 (both exact only under symmetry); with a rare
            failure opposite the claim (mean 0) 0.28 to 0.67. The sign test needs no symmetry
            and no bound; its price is power (12 seeds find a 1 sd shift 0.70 of the time at
            0.025 against the t-test's 0.88; spending.power states each clause's before
            training).
    binary  failure measures: the estimand is the MEDIAN seed's share of failed cells (a - b, or
            the share against a bound), by the same exact sign test. Not the failure rate (the
            mean share): with the seed as the unit no test of the rate can decide at 12 seeds,
            since a seed whose cells all fail or all train makes 12 seeds without a failure
            happen 0.75^12 = 0.032 > 0.025 of the time at a true rate of 0.25. A claim file's
            wording says "the median seed's share" accordingly.
    exact   a deterministic quantity (a parameter count): no sampling, no p-value; the
            difference itself decides against the smallest effect of interest.

Under "a matches b" (non-inferiority) the same sign test reads the median against the margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special, stats as scipy_stats

from ablate.analysis.stats import DEFAULT_POWER, Interval, ONE_SIDED_ALPHA

RIGHT, WRONG = "right", "wrong"  # which way an estimate points, against the claimed direction
KINDS = {"t": "exact sign test over seeds", "binary": "exact sign test over seeds", "exact": "exact count"}
# What each kind's test is about, in the words the reports use.
ESTIMANDS = {"t": "the median seed's a - b", "binary": "the median seed's share of failed cells",
             "exact": "the exact difference"}
__all__ = ["ONE_SIDED_ALPHA", "RIGHT", "WRONG", "Test", "per_seed", "sign_test", "exact",
           "sign_test_min_seeds", "sign_seeds_for", "sign_power", "pooled_sd",
           "ESTIMANDS"]


@dataclass(frozen=True)
class Test:
    name: str
    estimate: float  # the seeds' mean (t, exact) or median (sign) of a - b (or a - `than`)
    interval: Interval | None  # at 1 - 2 level: each end the one-sided bound of its test
    p_value: float | None  # one-sided p of "shown" (beyond `null` the claimed way)
    side: str | None  # RIGHT, WRONG or None (no direction: the estimate is at the null)
    null: float  # what "shown" is read against: 0, or the margin for non-inferiority
    detail: str = ""  # the counts behind a sign test
    p_beyond: float | None = None  # one-sided p of "beyond the smallest effect of interest"
    p_futile: float | None = None  # one-sided p of "short of the smallest effect of interest"
    n: int = 0  # seeds
    level: float = ONE_SIDED_ALPHA  # the nominal one-sided level the interval is drawn at

    def shown(self, level: float) -> bool:
        return self.p_value is not None and self.p_value <= level

    def futile(self, level: float) -> bool:
        return self.p_futile is not None and self.p_futile <= level

    def beyond(self, level: float) -> bool:
        return self.p_beyond is not None and self.p_beyond <= level


def z_of(p: float | None) -> float | None:
    """The standard normal statistic of a one-sided p-value (norm.isf(p)): the scale of the looks' boundaries."""
    return None if p is None else float(-special.ndtri(min(max(p, 1e-300), 1.0)))


def per_seed(keys, a, b) -> tuple[np.ndarray, np.ndarray]:
    """(seeds, each seed's mean of a - b over its paired keys); keys are tuples, seed first."""
    by_seed: dict = {}
    for key, x, y in zip(keys, a, b):
        by_seed.setdefault(key[0], []).append(float(x) - float(y))
    seeds = sorted(by_seed, key=lambda s: (str(type(s)), s))
    return np.asarray(seeds), np.asarray([np.mean(by_seed[s]) for s in seeds], dtype=float)


def _side(estimate: float, null: float, higher: bool) -> str | None:
    if estimate == null:
        return None
    return RIGHT if (estimate > null) == higher else WRONG


def _sign_p(x: np.ndarray, null: float) -> tuple[float | None, int, int]:
    """One-sided exact sign test of "the median of x exceeds null": (p, seeds above, seeds off null)."""
    above, off = int((x > null).sum()), int((x != null).sum())
    if off == 0:
        return None, above, off
    # binomtest(above, off, 1/2, alternative="greater").pvalue, without its overhead
    return (1.0 if above == 0 else float(special.bdtrc(above - 1, off, 0.5))), above, off


def _median(d: np.ndarray) -> float:
    """np.median of a few seeds' values, without its overhead (the simulations call it often)."""
    x = sorted(d.tolist())
    half = len(x) // 2
    return float(x[half] if len(x) % 2 else (x[half - 1] + x[half]) / 2.0)


def _median_interval(d: np.ndarray, level: float) -> Interval:
    """The order statistics that bound the median at 1 - 2 level (the sign test inverted); an
    end the seeds cannot bound is infinite."""
    x, n = np.sort(d), d.size
    # the largest k with P(Binomial(n, 1/2) >= k) >= 1 - level: x_(k) <= median with that confidence
    reach = special.bdtrc(np.arange(n), n, 0.5)  # P(Binomial >= j) for j = 1..n
    k = int(np.flatnonzero(reach >= 1 - level)[-1] + 1) if (reach >= 1 - level).any() else 0
    low = float(x[k - 1]) if k else -math.inf
    high = float(x[n - k]) if k else math.inf
    return Interval(low, high, 1 - 2 * level)


def sign_test(d: np.ndarray, higher: bool, effect: float | None, level: float = ONE_SIDED_ALPHA,
              what: str = "seeds", margin: float | None = None, higher_is_worse: bool = True) -> Test | None:
    """The seeds' median of d by the exact sign test: shown / beyond / futile (module docstring).
    With `margin` (non-inferiority, "a matches b"): shown = the median is not worse by the margin,
    futile = it is worse by the margin or more."""
    if d.size == 0:
        return None
    estimate = _median(d)
    if margin is not None:
        worse = d if higher_is_worse else -d  # "worse" is always above +margin
        p_shown, above, off = _sign_p(margin - worse, 0.0)
        p_futile = _sign_p(worse - margin, 0.0)[0]
        detail = f"{above} of {d.size} {what} inside the margin, {d.size - off} on it"
        side = (RIGHT if _median(worse) < margin else WRONG) if off else None
        return Test("exact sign test over seeds against the margin", estimate, _median_interval(d, level), p_shown,
                    side, margin if higher_is_worse else -margin, detail, None, p_futile, int(d.size), level)
    x = d if higher else -d
    effect = effect or 0.0
    p_shown, above, off = _sign_p(x, 0.0)
    p_beyond = _sign_p(x, effect)[0] if effect else None
    p_futile = _sign_p(-x, -effect)[0] if effect else None
    detail = f"{above} of {d.size} {what} the claimed way, {d.size - off} tied"
    return Test("exact sign test over seeds", estimate, _median_interval(d, level), p_shown,
                _side(_median(x), 0.0, True) if off else None, 0.0, detail, p_beyond, p_futile,
                int(d.size), level)


def exact(d: np.ndarray, higher: bool) -> Test:
    """A deterministic difference: its value, no interval and no p-value (nothing is sampled)."""
    estimate = float(d.mean())
    return Test("exact count", estimate, Interval(float(d.min()), float(d.max()), 1.0), None,
                _side(estimate, 0.0, higher), 0.0, n=int(d.size))


# -------------------------------------------------------- what a test can reach, and needs


def sign_test_min_seeds(level: float) -> int:
    """The fewest seeds at which the exact sign test can reach `level` at all (every seed the
    claimed way gives its smallest p, 1/2^n)."""
    return max(1, math.ceil(math.log2(1.0 / level) - 1e-12))


def pooled_sd(differences_by_design: list[np.ndarray]) -> tuple[float, int] | None:
    """(standard deviation, degrees of freedom) of a - b pooled across a clause's comparable
    cells: each design point (a rate, a warmup) gives its differences over seeds. A seed's mean
    over its cells varies no more than one cell does (a mean's variance is at most the mean of
    the variances), so this bounds the per-seed spread from above, on many more degrees of
    freedom than the 2 of three seeds' means."""
    ss, df = 0.0, 0
    for d in differences_by_design:
        d = np.asarray(d, dtype=float)
        if d.size > 1:
            ss += float(((d - d.mean()) ** 2).sum())
            df += d.size - 1
    return (math.sqrt(ss / df), df) if df and ss > 0 else None


# "About N seeds" is also given at this one-sided upper confidence bound of the pooled spread: a
# spread read off few degrees of freedom may be well under the truth, so N alone can promise too few.
SPREAD_UPPER_LEVEL = 0.8


def sd_upper_bound(sd: float, df: int, level: float = SPREAD_UPPER_LEVEL) -> float:
    """The one-sided `level` upper confidence bound of a normal population's standard deviation
    from a sample one on `df` degrees of freedom: sd * sqrt(df / chi2_{1 - level}(df))."""
    return sd * math.sqrt(df / scipy_stats.chi2.ppf(1.0 - level, df))


def sign_power(q: float, n: int, level: float) -> float:
    """The chance the one-sided exact sign test over `n` seeds reaches `level` when each seed
    points the claimed way with probability `q` (no ties): P(Binomial(n, q) >= k), k the fewest
    seeds the claimed way whose p is within the level."""
    counts = np.arange(n + 1)
    p = special.bdtrc(counts - 1, n, 0.5)  # P(Binomial(n, 1/2) >= k), the sign test's p at k
    reach = counts[p <= level]
    return 0.0 if reach.size == 0 else float(special.bdtrc(int(reach[0]) - 1, n, q))


def sign_seeds_for(effect: float, sd: float, level: float, power: float = DEFAULT_POWER,
                   most: int = 1000) -> int | None:
    """Seeds at which the one-sided sign test at `level` shows a median shift of `effect` (the
    declared smallest effect of interest) with probability `power`, for seeds spread normally
    with `sd` about it (each seed the claimed way with probability Phi(effect / sd)); None without
    an effect or a spread, or beyond `most`."""
    if not (effect > 0 and sd > 0):
        return None
    q = float(special.ndtr(effect / sd))
    return next((n for n in range(1, most + 1) if sign_power(q, n, level) >= power), None)
