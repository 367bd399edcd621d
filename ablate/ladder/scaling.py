"""Effects against model size: the trend across a ladder's rungs, its prediction at a larger
size, and an effect restated as a compute multiplier. Pure numbers in, numbers out: the
ladder's report (ablate/ladder/report.py) feeds it what each rung measured.

The trend is a weighted least-squares line of the effect against log10(parameters), each rung
weighted by 1 / se^2, its standard error over seeds (a fixed-effect meta-regression). With more
rungs than the line has parameters, a scatter of the rungs about the line larger than their
standard errors explain (Birge ratio chi^2 / dof above 1) widens every interval by it. A
prediction at a new size adds that rung's own measurement noise (the rungs' median se^2), so it
is an interval for what the new rung will *measure*, which is what a backtest checks it
against. Quantiles are Student t at the smallest per-rung degrees of freedom (seeds - 1): the
standard errors are themselves estimated from a few seeds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

GROWING, SHRINKING, FLAT = "growing", "shrinking", "flat"


@dataclass(frozen=True)
class Trend:
    """effect = intercept + slope * log10(size); cov is the 2x2 covariance of (intercept, slope)."""

    intercept: float
    slope: float
    cov: np.ndarray
    df: int  # for the t quantiles
    noise: float  # a new rung's own measurement variance (the rungs' median se^2)
    birge: float  # chi^2 / dof of the rungs about the line (1.0 with two rungs)
    alpha: float = 0.05

    def at(self, size: float) -> float:
        return self.intercept + self.slope * math.log10(size)

    def predict(self, size: float) -> tuple[float, float, float]:
        """(predicted effect, low, high): a 1 - alpha interval for the effect a rung of this size
        would measure."""
        x = np.array([1.0, math.log10(size)])
        var = float(x @ self.cov @ x) + self.noise
        half = stats.t.ppf(1 - self.alpha / 2, self.df) * math.sqrt(max(var, 0.0))
        mean = self.at(size)
        return mean, mean - half, mean + half

    def slope_interval(self) -> tuple[float, float]:
        half = stats.t.ppf(1 - self.alpha / 2, self.df) * math.sqrt(max(float(self.cov[1, 1]), 0.0))
        return self.slope - half, self.slope + half


def fit_trend(sizes, effects, ses, df: int, alpha: float = 0.05) -> Trend:
    """The weighted line of `effects` (with standard errors `ses`) against log10(`sizes`).

    An exact effect (se 0 at every rung, e.g. a parameter count) is fitted by ordinary least
    squares with its residual variance; at least two distinct sizes are needed."""
    x = np.log10(np.asarray(sizes, dtype=float))
    y = np.asarray(effects, dtype=float)
    se = np.asarray(ses, dtype=float)
    if len(np.unique(x)) < 2:
        raise ValueError("a trend needs at least two distinct sizes")
    design = np.column_stack([np.ones_like(x), x])
    exact = bool(np.all(se <= 0))
    floor = np.min(se[se > 0]) if np.any(se > 0) else 1.0
    weights = np.ones_like(y) if exact else 1.0 / np.maximum(se, floor * 1e-3) ** 2
    xtwx = design.T @ (design * weights[:, None])
    cov = np.linalg.inv(xtwx)
    beta = cov @ (design.T @ (weights * y))
    resid = y - design @ beta
    dof = len(y) - 2
    chi2 = float(np.sum(weights * resid**2))
    if exact:
        residual_var = chi2 / dof if dof > 0 else 0.0
        return Trend(float(beta[0]), float(beta[1]), cov * residual_var, max(dof, 1), 0.0,
                     1.0, alpha)
    birge = max(1.0, chi2 / dof) if dof > 0 else 1.0
    return Trend(float(beta[0]), float(beta[1]), cov * birge, max(int(df), 1),
                 float(np.median(se**2)) * birge, birge, alpha)


def trend_word(trend: Trend, expected_sign: int) -> str:
    """GROWING when the effect's size grows with model size in the claimed direction (the
    slope's interval excludes 0 on the claimed side), SHRINKING when it excludes 0 on the
    other side, else FLAT (no trend the rungs can tell)."""
    lo, hi = trend.slope_interval()
    if lo > 0 or hi < 0:
        return GROWING if (1 if lo > 0 else -1) == expected_sign else SHRINKING
    return FLAT


def sign_changes(sizes, effects) -> list[tuple[float, float]]:
    """Consecutive (smaller, larger) sizes between which the point estimate changes sign."""
    order = np.argsort(np.asarray(sizes, dtype=float))
    s = [float(np.asarray(sizes, dtype=float)[i]) for i in order]
    e = [float(np.asarray(effects, dtype=float)[i]) for i in order]
    return [(s[i], s[i + 1]) for i in range(len(e) - 1) if np.sign(e[i]) * np.sign(e[i + 1]) < 0]


# --------------------------------------------------------------------- compute multipliers


@dataclass(frozen=True)
class Reach:
    """How one seed's baseline curve compares with the other arm's final loss."""

    factor: float | None  # compute the baseline needs / compute the other arm used (None: not measured)
    how: str  # "baseline" (read on the baseline's curve), "other" (on the other arm's), or "not reached"
    step: float | None  # the interpolated step at which the curve reached the other's final loss


def first_reach(steps, losses, target: float) -> float | None:
    """The first step at which a validation curve reaches `target`, linearly interpolated between
    evaluations; None if it never does (or its first evaluation is already below: a bound only)."""
    steps = np.asarray(steps, dtype=float)
    losses = np.asarray(losses, dtype=float)
    ok = np.isfinite(losses)
    steps, losses = steps[ok], losses[ok]
    below = np.nonzero(losses <= target)[0]
    if below.size == 0 or below[0] == 0:
        return None
    i = below[0]
    s0, s1, l0, l1 = steps[i - 1], steps[i], losses[i - 1], losses[i]
    return float(s0 + (s1 - s0) * (l0 - target) / (l0 - l1)) if l0 != l1 else float(s1)


def reach(base_curve, other_curve, base_flops_per_step: float, other_flops_per_step: float) -> Reach:
    """The compute multiplier of the other arm against the baseline, for one seed.

    If the baseline's own curve reaches the other arm's final loss inside the run (the other
    arm is worse), the factor is the baseline's compute to that point over the other arm's
    whole run (below 1). If it does not (the other arm is better), the baseline would have to
    train past the run: that is not extrapolated; the factor is read on the other arm's curve
    instead, as the baseline's whole run over the other arm's compute to reach the baseline's
    final loss (above 1), and `how` says so. Neither: "not reached"."""
    (bs, bl), (os_, ol) = base_curve, other_curve
    if not len(bl) or not len(ol) or not (np.isfinite(bl[-1]) and np.isfinite(ol[-1])):
        return Reach(None, "not reached", None)
    base_total, other_total = base_flops_per_step * bs[-1], other_flops_per_step * os_[-1]
    step = first_reach(bs, bl, ol[-1])
    if step is not None and ol[-1] >= bl[-1]:
        return Reach(base_flops_per_step * step / other_total, "baseline", step)
    step = first_reach(os_, ol, bl[-1])
    if step is not None and step > 0:
        return Reach(base_total / (other_flops_per_step * step), "other", step)
    return Reach(None, "not reached", None)


def multiplier_summary(reaches: list[Reach], alpha: float = 0.05) -> dict:
    """Geometric mean of the per-seed factors with a t interval on their logs, and how many
    seeds had none. With one measured seed or identical factors there is no interval."""
    factors = np.array([r.factor for r in reaches if r.factor is not None and r.factor > 0], dtype=float)
    out = {"seeds": len(reaches), "measured": int(factors.size), "how": sorted({r.how for r in reaches}),
           "factor": None, "low": None, "high": None}
    if factors.size == 0:
        return out
    logs = np.log(factors)
    out["factor"] = float(np.exp(logs.mean()))
    if factors.size >= 2 and np.ptp(logs) > 0:
        half = stats.t.ppf(1 - alpha / 2, factors.size - 1) * logs.std(ddof=1) / math.sqrt(factors.size)
        out["low"], out["high"] = float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))
    return out
