"""Seeds until decided: the group-sequential design behind `ablate reproduce CLAIM --decide`.

A clause is looked at when it has LOOKS[k] seeds (its fresh seeds, for a best-rate comparison);
an undecided clause gets the seeds of its next look, only for the cells its selectors name,
until it is decided or the last look is reached. Looking again after adding seeds is allowed
because each look tests at its own nominal level, from an alpha-spending function:

    spending    Lan & DeMets (1983, Biometrika 70(3), 659-663) with the O'Brien-Fleming-like
                function alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)), t = seeds / LOOKS[-1]:
                almost nothing is spent at 3 seeds, most of alpha is kept for the last look.
    boundaries  the upper critical values c_k of the standardised statistic at each look, solved
                (scipy.optimize.brentq) so that the chance of first crossing at look k under the
                null is alpha(t_k) - alpha(t_{k-1}); the chance is integrated numerically over
                the Brownian motion the statistic follows across looks (the recursion of Armitage,
                McPherson & Rowe 1969, with scipy.stats.norm), not simulated.
    each test   turns its one-sided p-value at a look into the statistic z = Phi^-1(1 - p) and is
                compared with c_k: equivalently, p <= nominal_k = 1 - Phi(c_k). A t-test over n
                seeds or an exact sign test is not exactly the Brownian motion the boundaries
                assume; tests/analysis/test_sequential.py simulates each kind under the null to hold the
                false-decision rate at alpha.
    futility    "does not agree: no effect as large as X" when the test of "short of X" crosses the
                same boundary: the repeated confidence bound (Jennison & Turnbull 1989) excludes X.
                Non-binding: the efficacy boundaries ignore it, so stopping early for futility never
                raises the chance of a false "agrees".
    clauses     Holm across clauses carried to sequential boundaries (graphical Holm, Maurer &
                Bretz 2013): each undecided clause runs at alpha / (clauses not yet decided); a
                decision frees its share, and the others' boundaries at every look are recomputed
                at the larger level (a past look may then decide). The headline conjunction runs
                every clause at the full alpha (intersection-union: no correction).

Nothing is stored: the decision is recomputed from the run directories at every call (the first
LOOKS[k] seeds of each clause, in seed order), so a killed and resumed `--decide` gives the same
verdict. The contract with the runner is /work/notes/45-contract.md in words and `Decision` here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy import optimize, special
from scipy import stats as scipy_stats

from ablate.analysis import decide
from ablate.analysis.claim_checks import CLAUSE_LETTERS
from ablate.analysis.claim_measures import Context
from ablate.analysis.claims import Claim, Clause
from ablate.analysis.verdict import (AGREES, CANNOT_TELL, DISAGREES, SWEEP_SEEDS, Result, compare, headline,
                                     run_test)

# Seeds a clause has at each look (fresh seeds for a best-rate comparison). The last look is the
# design's maximum: 12 seeds of a claim's cells is what a 30-minute budget reaches on 2 cores, and
# spending over a longer design would keep so much alpha for its last look that the sign test
# (smallest p 1/2^n) could not decide at 12 seeds at Holm's first level.
LOOKS = (3, 6, 12)
_GRID = 1201  # points of the numerical integration over the statistic's continuation region


# ------------------------------------------------------------------------- the boundaries


def spent(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-like alpha spent by information fraction t (one-sided alpha)."""
    if t <= 0:
        return 0.0
    return float(2.0 * scipy_stats.norm.sf(scipy_stats.norm.isf(alpha / 2.0) / math.sqrt(min(t, 1.0))))


@lru_cache(maxsize=256)
def boundaries(looks: tuple = LOOKS, alpha: float = decide.ONE_SIDED_ALPHA) -> tuple:
    """Upper critical values c_k (z scale) at each look's seeds, spending alpha as `spent` says."""
    fractions = [n / looks[-1] for n in looks]
    out, grid, density, previous_t, previous_spent = [], None, None, 0.0, 0.0
    for t in fractions:
        step = t - previous_t
        target = spent(t, alpha) - previous_spent

        def crossing(b, grid=grid, density=density, step=step):
            # P(first crossing at this look): B(t) >= b * sqrt(t), having stayed below before
            if grid is None:
                return float(scipy_stats.norm.sf(b))
            tail = scipy_stats.norm.sf((b * math.sqrt(t) - grid) / math.sqrt(step))
            return float(np.trapezoid(density * tail, grid))

        c = optimize.brentq(lambda b: crossing(b) - target, -10.0, 40.0, xtol=1e-10)
        out.append(c)
        grid, density = _continue(grid, density, step, c * math.sqrt(t), t)
        previous_t, previous_spent = t, spent(t, alpha)
    return tuple(out)


def _continue(grid, density, step: float, upper: float, t: float):
    """The sub-density of B(t) on its continuation region (below `upper`), by one convolution."""
    new_grid = np.linspace(min(-8.0 * math.sqrt(t), upper - 1.0), upper, _GRID)
    if grid is None:
        return new_grid, scipy_stats.norm.pdf(new_grid, scale=math.sqrt(t))
    kernel = scipy_stats.norm.pdf((new_grid[:, None] - grid[None, :]) / math.sqrt(step)) / math.sqrt(step)
    return new_grid, np.trapezoid(kernel * density[None, :], grid, axis=1)


@lru_cache(maxsize=256)
def nominal_levels(alpha: float, looks: tuple = LOOKS) -> tuple:
    """Each look's nominal one-sided level: a test decides at look k when its p <= this."""
    return tuple(float(scipy_stats.norm.sf(c)) for c in boundaries(tuple(looks), float(alpha)))


def _z(p: float | None) -> float | None:
    return None if p is None else float(-special.ndtri(min(max(p, 1e-300), 1.0)))  # norm.isf(p)


# --------------------------------------------------------------------------- a clause's looks


@dataclass(frozen=True)
class Look:
    n_seeds: int
    seeds: tuple
    statistic: float | None  # z of "agrees" (the clause's largest p among its comparisons)
    futility_statistic: float | None  # z of "no effect as large as the claim needs"
    boundary: float  # c_k at the clause's level
    nominal_level: float
    estimate: float | None  # the decisive comparison's estimate (seeds' mean or median of a - b)
    p_value: float | None
    p_futile: float | None
    outcome: str = CANNOT_TELL
    level: float = decide.ONE_SIDED_ALPHA  # the clause's one-sided level when this look was read
    beyond: bool = False  # every comparison also shown beyond its smallest effect of interest


@dataclass
class ClauseDecision:
    letter: str
    label: str
    status: str  # AGREES, DISAGREES or CANNOT_TELL
    decided: bool
    why: str
    looks: list  # of Look
    level: float  # the one-sided level the clause ran at (Holm's share of alpha)
    results: tuple = ()  # of Result, on every seed on disk (the report's figures)
    next_seeds: tuple | None = None
    needs: list = field(default_factory=list)
    rates: dict = field(default_factory=dict)

    @property
    def seeds_used(self) -> int:
        return self.looks[-1].n_seeds if self.looks else 0


def _units(results: list[Result]) -> int:
    return min((r.n_seeds for r in results), default=0)


def clause_looks(results: list[Result], level: float, looks: tuple = LOOKS) -> list[Look]:
    """The clause's looks up to and including its first decision, at one-sided `level`."""
    if results and all(r.kind == "exact" for r in results):
        return [_exact_look(results)]
    n_have, out = _units(results), []
    nominal, cs = nominal_levels(float(level), tuple(looks)), boundaries(tuple(looks), float(level))
    for k, n in enumerate(looks):
        if n > n_have:
            break
        tests = [run_test(r, nominal[k], n) for r in results]
        p_agree = None if any(t is None or t.p_value is None for t in tests) else max(t.p_value for t in tests)
        futile = [t.p_futile for t in tests if t is not None and t.p_futile is not None]
        p_futile = min(1.0, min(futile) * len(tests)) if futile else None
        outcome = (DISAGREES if p_futile is not None and p_futile <= nominal[k] else
                   AGREES if p_agree is not None and p_agree <= nominal[k] else CANNOT_TELL)
        decisive = max(tests, key=lambda t: -1 if t is None or t.p_value is None else t.p_value)
        beyond = all(t is not None and t.beyond(nominal[k]) for t in tests)
        out.append(Look(n, tuple(results[0].seed_ids[:n]), _z(p_agree), _z(p_futile), cs[k], nominal[k],
                        None if decisive is None else decisive.estimate, p_agree, p_futile, outcome, level, beyond))
        if outcome != CANNOT_TELL:
            break
    return out


def _exact_look(results: list[Result]) -> Look:
    right = all(r.exact_right() for r in results)
    return Look(results[0].n_seeds, tuple(results[0].seed_ids), None, None, math.inf, 0.0,
                results[0].test.estimate if results[0].test else None, None, None,
                (AGREES if right else DISAGREES) if all(r.test for r in results) else CANNOT_TELL, 0.0, right)


# ------------------------------------------------------------------------------ the claim


@dataclass
class Decision:
    claim: Claim
    clauses: list  # of ClauseDecision
    headline: str
    conjunction: bool  # every clause shown at the full alpha (the headline's "agrees")

    @property
    def done(self) -> bool:
        return all(c.decided or c.next_seeds is None for c in self.clauses)

    @property
    def next_cells(self) -> list:
        return [need for c in self.clauses if not c.decided for need in c.needs]

    def to_json(self) -> dict:
        return {"claim": self.claim.name, "headline": self.headline, "done": self.done, "unit": "seed",
                "alpha": self.claim.alpha, "looks": list(LOOKS), "conjunction": self.conjunction,
                "clauses": [_clause_json(c) for c in self.clauses]}


def _clause_json(c: ClauseDecision) -> dict:
    return {"letter": c.letter, "label": c.label, "status": c.status, "decided": c.decided, "why": c.why,
            "level": c.level, "seeds_used": c.seeds_used, "next_seeds": list(c.next_seeds or []),
            "needs": c.needs, "rates": c.rates,
            "looks": [{"seeds": lk.n_seeds, "seed_ids": list(lk.seeds), "statistic": _finite(lk.statistic),
                       "futility_statistic": _finite(lk.futility_statistic), "boundary": _finite(lk.boundary),
                       "nominal_level": lk.nominal_level, "estimate": lk.estimate, "p_value": lk.p_value,
                       "p_futile": lk.p_futile, "outcome": lk.outcome} for lk in c.looks]}


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an unbounded statistic or an exact count's boundary is null."""
    return x if x is not None and math.isfinite(x) else None


def decide_claim(claim: Claim, source, metrics=None, looks: tuple = LOOKS) -> Decision:
    """The claim's sequential decision from a grid folder or loaded Runs (see the module docstring)."""
    from ablate.analysis.load import Runs, load_runs
    from ablate.analysis.metrics import cell_metrics

    runs = source if isinstance(source, Runs) else load_runs(Path(source))
    ctx = Context(runs, metrics if metrics is not None else cell_metrics(runs))
    results = [[compare(ctx, c, claim.alpha, claim.first_step_level) for c in clause.compare]
               for clause in claim.clauses]
    return decide_results(claim, results, looks)


def decide_results(claim: Claim, results: list[list[Result]], looks: tuple = LOOKS) -> Decision:
    """Graphical Holm over the clauses' sequential paths; the conjunction at the full level."""
    m = len(claim.clauses)
    decided: set[int] = set()
    paths: dict[int, list[Look]] = {}
    while True:  # recycle a decided clause's share of alpha to the others until nothing changes
        level = claim.alpha / max(1, m - len(decided))
        paths = {j: (paths[j] if j in decided else clause_looks(results[j], level, looks)) for j in range(m)}
        newly = {j for j in range(m) if j not in decided and paths[j] and paths[j][-1].outcome != CANNOT_TELL}
        if not newly:
            break
        decided |= newly
    levels = {j: paths[j][-1].level if paths[j] else claim.alpha / max(1, m - len(decided)) for j in range(m)}
    clauses = [_clause_decision(j, claim.clauses[j], results[j], paths[j], levels[j], looks) for j in range(m)]
    full = [clause_looks(results[j], claim.alpha, looks) for j in range(m)]
    conjunction = all(p and p[-1].outcome == AGREES for p in full)
    return Decision(claim, clauses, headline([c.status for c in clauses], conjunction), conjunction)


def _clause_decision(j: int, clause: Clause, results: list[Result], path: list[Look], level: float,
                     looks: tuple) -> ClauseDecision:
    status = path[-1].outcome if path else CANNOT_TELL
    rates = _rates(results)
    shown = tuple(_at_look(r, path[-1]) for r in results) if path else tuple(results)
    c = ClauseDecision(CLAUSE_LETTERS[j], clause.label, status, status != CANNOT_TELL, "", path, level, shown, rates=rates)
    c.why = _why(c, results, looks)
    if not c.decided:
        have = _units(results)
        later = [n for n in looks if n > max(have, path[-1].n_seeds if path else 0)]
        if later:
            c.next_seeds = _seeds_for(results, later[0])
            c.needs = _needs(results, c.next_seeds)
    return c


def _at_look(r: Result, look: Look) -> Result:
    """The comparison as its last look read it: its first look.n_seeds seeds, tested at that
    look's nominal level (seeds on disk beyond the look do not enter the report's figures)."""
    if r.kind == "exact" or not r.seed_ids:
        return r
    used = set(r.seed_ids[:look.n_seeds])
    keep = [i for i, k in enumerate(r.keys) if k[0] in used]
    return replace(r, keys=tuple(r.keys[i] for i in keep), a=tuple(r.a[i] for i in keep),
                   b=tuple(r.b[i] for i in keep), seed_ids=r.seed_ids[:look.n_seeds],
                   seed_values=r.seed_values[:look.n_seeds], test=run_test(r, look.nominal_level, look.n_seeds))


def _why(c: ClauseDecision, results: list[Result], looks: tuple) -> str:
    if not c.looks:
        notes = [r.note for r in results if r.note]
        return f"no look yet: {_units(results)} seeds, the first look needs {looks[0]}" + (
            f" ({notes[0]})" if notes else "")
    last = c.looks[-1]
    if c.status == AGREES:
        if last.statistic is None:
            return "an exact count, the claimed way by at least the effect"
        effects = ", ".join(f"{r.compare.effect:g} {r.unit}" for r in results if r.compare.effect)
        return (f"shown beyond 0 at {last.n_seeds} seeds (z {last.statistic:.2f} >= boundary {last.boundary:.2f}); "
                + ("also" if last.beyond else "not") + f" shown beyond the smallest effect of interest ({effects})")
    if c.status == DISAGREES:
        effects = ", ".join(f"{r.compare.effect:g} {r.unit}" for r in results if r.compare.effect)
        if last.futility_statistic is None:
            return "an exact count short of the effect, or the other way"
        # The statistic is the clause's least convincing comparison's z: at or under -boundary that
        # comparison's repeated confidence bound excludes 0 on the other side.
        other = last.statistic is not None and last.statistic <= -last.boundary
        which = "shown the other way" if len(results) == 1 else "a comparison shown the other way"
        return (f"no effect as large as {effects} at {last.n_seeds} seeds (z {last.futility_statistic:.2f} >= "
                f"boundary {last.boundary:.2f})" + (f"; {which} (z {last.statistic:.2f} <= -{last.boundary:.2f})"
                                                    if other else ""))
    if last.n_seeds >= looks[-1]:
        return f"the last look ({looks[-1]} seeds) reached: neither shown nor excluded"
    return f"undecided at {last.n_seeds} seeds (boundary {last.boundary:.2f}); next look at the next seeds"


def _rates(results: list[Result]) -> dict:
    out = {}
    for r in results:
        for side, picks in r.best.items():
            out.setdefault(side, sorted({lr for _, lr, _ in picks}))
    return {side: (v[0] if len(v) == 1 else v) for side, v in out.items()}


def _seeds_for(results: list[Result], n: int) -> tuple:
    """The seed ids a clause's look of `n` units reads: 0..n-1, or SWEEP_SEEDS.. for a best rate."""
    start = SWEEP_SEEDS if any(r.compare.best_lr for r in results) else 0
    return tuple(range(start, start + n))


def _needs(results: list[Result], seeds: tuple) -> list:
    """Selector dicts (axis -> value or list, "seed" -> ids) of the cells the next look reads."""
    out = []
    for r in results:
        c = r.compare
        for side in ("a", "b") if c.b is not None else ("a",):
            selector = {**c.selector(side), "seed": list(seeds)}
            if c.best_lr and r.best.get(side):
                rates = sorted({lr for _, lr, _ in r.best[side]})
                selector["lr"] = rates[0] if len(rates) == 1 else rates
            if selector not in out:
                out.append(selector)
    return out
