"""The group-sequential plan of `--decide`: the looks (seeds a clause has at each), the alpha
spent by each (Lan-DeMets, O'Brien-Fleming-like), the boundaries and nominal levels they give, a
continuation that keeps the boundaries already read, what a fixed design after a finished
`--decide` does to the error rate, and the power of a plan. Numbers only: no claim, no run."""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import optimize, special, stats as scipy_stats

from ablate.claims import decide


# Seeds a clause has at each look (fresh seeds for a best-rate comparison). The last look is the
# design's maximum: 12 seeds of a claim's cells is what a 30-minute budget reaches on 2 cores, and
# spending over a longer design would keep so much alpha for its last look that the sign test
# (smallest p 1/2^n) could not decide at 12 seeds at Holm's first level.
LOOKS = (3, 6, 12)


_GRID = 1201  # points of the numerical integration over the statistic's continuation region


def spent(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-like alpha spent by information fraction t (one-sided alpha)."""
    if t <= 0:
        return 0.0
    return float(2.0 * scipy_stats.norm.sf(scipy_stats.norm.isf(alpha / 2.0) / math.sqrt(min(t, 1.0))))


@lru_cache(maxsize=256)
def boundaries(looks: tuple = LOOKS, alpha: float = decide.ONE_SIDED_ALPHA, kept: tuple = ()) -> tuple:
    """Upper critical values c_k (z scale) at each look's seeds, spending alpha as `spent` says.
    `kept`: the boundaries the first len(kept) looks were already read at (an earlier plan's):
    they stay, and the later looks spend what is left of `spent` over this plan's fractions, an
    error-spending continuation (Lan & DeMets 1983). Where nothing is left (an earlier plan
    finished has spent all of alpha) a look's boundary is infinite: it cannot decide."""
    fractions = [n / looks[-1] for n in looks]
    out, grid, density, previous_t, previous_spent = [], None, None, 0.0, 0.0
    for k, t in enumerate(fractions):
        step = t - previous_t

        def crossing(b, grid=grid, density=density, step=step):
            # P(first crossing at this look): B(t) >= b * sqrt(t), having stayed below before
            if grid is None:
                return float(scipy_stats.norm.sf(b))
            tail = scipy_stats.norm.sf((b * math.sqrt(t) - grid) / math.sqrt(step))
            return float(np.trapezoid(density * tail, grid))

        target = spent(t, alpha) - previous_spent
        if k < len(kept):
            c = kept[k]
        elif target <= 1e-12:
            c = math.inf
        else:
            c = optimize.brentq(lambda b: crossing(b) - target, -10.0, 40.0, xtol=1e-10)
        out.append(c)
        previous_spent += crossing(c) if math.isfinite(c) else 0.0
        grid, density = _continue(grid, density, step, min(c, 12.0) * math.sqrt(t), t)
        previous_t = t
    return tuple(out)


def continued(old_looks: tuple, read: int, looks: tuple, alpha: float) -> tuple:
    """The boundaries of the plan `looks` continuing a plan `old_looks` whose first `read` looks
    were read (at their old boundaries, which stay); `looks` starts with those looks' seeds."""
    if tuple(looks[:read]) != tuple(old_looks[:read]):
        raise ValueError(f"looks {list(looks)} do not continue {list(old_looks[:read])}")
    return boundaries(tuple(looks), float(alpha), tuple(boundaries(tuple(old_looks), float(alpha))[:read]))


def fixed_after_decide(n_seeds: int, alpha: float = decide.ONE_SIDED_ALPHA, looks: tuple = LOOKS) -> float:
    """The chance of a false "agrees" (one null clause, the statistic's Brownian motion) when a
    `--decide` over `looks` has judged a folder and a fixed design of `n_seeds` seeds is then
    tested over the same seeds at `alpha`: the plan's alpha, plus the fixed test's crossing
    where the plan did not cross. Seeds within the plan's last look add nothing new to cross."""
    if n_seeds <= looks[-1]:
        return float(alpha)
    cs = boundaries(tuple(looks), float(alpha))
    grid, density, previous_t = None, None, 0.0
    for n, c in zip(looks, cs):
        t = n / n_seeds
        grid, density = _continue(grid, density, t - previous_t, c * math.sqrt(t), t)
        previous_t = t
    step = 1.0 - previous_t
    tail = scipy_stats.norm.sf((scipy_stats.norm.isf(alpha) - grid) / math.sqrt(step))
    return float(alpha + np.trapezoid(density * tail, grid))


def _continue(grid, density, step: float, upper: float, t: float):
    """The sub-density of B(t) on its continuation region (below `upper`), by one convolution."""
    new_grid = np.linspace(min(-8.0 * math.sqrt(t), upper - 1.0), upper, _GRID)
    if grid is None:
        return new_grid, scipy_stats.norm.pdf(new_grid, scale=math.sqrt(t))
    kernel = scipy_stats.norm.pdf((new_grid[:, None] - grid[None, :]) / math.sqrt(step)) / math.sqrt(step)
    return new_grid, np.trapezoid(kernel * density[None, :], grid, axis=1)


@lru_cache(maxsize=256)
def nominal_levels(alpha: float, looks: tuple = LOOKS, kept_from: tuple | None = None) -> tuple:
    """Each look's nominal one-sided level: a test decides at look k when its p <= this.
    `kept_from` (old looks, looks read): a continuation, `continued`'s boundaries."""
    cs = continued(*kept_from, tuple(looks), alpha) if kept_from else boundaries(tuple(looks), float(alpha))
    return tuple(float(scipy_stats.norm.sf(c)) for c in cs)


POWER_AT = (0.5, 1.0, 1.5)  # effects of interest, in standard deviations of the seeds' values, the plan states


MAX_POWER_SEEDS = 100  # the last look's seeds up to which `power` is computed (0.4 s a call at 100, cubic)


def power(effect_sd: float, level: float, looks: tuple = LOOKS) -> float:
    """The chance a clause of one comparison ends "agrees" when its true effect equals its
    smallest effect of interest and that is `effect_sd` standard deviations of the seeds' normal
    spread: its sign tests at each look's nominal level for `level`, futility stops included.
    Exact, by the multinomial of the seeds' three regions (at most 0, between 0 and the effect,
    at least the effect) carried across the looks; no simulation."""
    below0 = float(scipy_stats.norm.cdf(-effect_sd))
    probs = np.array([below0, 0.5 - below0, 0.5])  # the true median is the effect itself
    nominal = nominal_levels(float(level), tuple(looks))
    states, have, agrees = {(0, 0): 1.0}, 0, 0.0
    for n, cut in zip(looks, nominal):
        for _ in range(n - have):  # one seed at a time: (seeds above 0, seeds below the effect)
            nxt: dict = {}
            for (a, b), p in states.items():
                for (da, db), q in zip(((0, 1), (1, 1), (1, 0)), probs):
                    nxt[(a + da, b + db)] = nxt.get((a + da, b + db), 0.0) + p * q
            states = nxt
        have, left = n, {}
        for (a, b), p in states.items():
            futile = b and special.bdtrc(b - 1, n, 0.5) <= cut
            if not futile and a and special.bdtrc(a - 1, n, 0.5) <= cut:
                agrees += p
            elif not futile:
                left[(a, b)] = p
        states = left
    return agrees
