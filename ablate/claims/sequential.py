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
                compared with c_k: equivalently, p <= nominal_k = 1 - Phi(c_k). Every sampled
                kind is the exact sign test about the median seed (ablate/claims/decide.py: valid under
                the skew failed runs make); it is not exactly the Brownian motion the boundaries
                assume, and tests/ablate/claims/test_sequential.py simulates the whole loop (2 and 4
                clauses of mixed kinds, effects of interest 0.5-1.5 sd, skewed nulls, a failure
                share at its bound) to hold the family-wise false "agrees" at alpha.
    futility    "does not agree: no effect as large as X" when the test of "short of X" crosses the
                same boundary: the repeated confidence bound (Jennison & Turnbull 1989) excludes X.
                Non-binding: the efficacy boundaries ignore it, so stopping early for futility never
                raises the chance of a false "agrees".
    clauses     Holm across clauses carried to sequential boundaries (graphical Holm, Maurer &
                Bretz 2013): each clause runs at alpha / (clauses not yet rejected); a clause
                shown the claimed way (rejected, even if also found smaller than claimed) frees
                its share, and the others' boundaries at every look are recomputed at the larger
                level (a past look may then decide). A futility stop rejects nothing and frees
                nothing (Bretz et al. 2009): freeing it gave 0.061 false "agrees" for four null
                clauses. The headline conjunction runs every clause at the full alpha
                (intersection-union: no correction).
    seeds       a look of n seeds reads the first n of the grid's own seeds and then the integers
                after the largest (a best-rate clause: of those after its sweep's seeds).
    more looks  `continued` keeps the boundaries of looks already read and spends what is left
                over added looks (`decide_results(..., kept_from=(old looks, looks read))`); a
                finished plan has nothing left. `fixed_after_decide` is what a fixed design over
                seeds a plan has judged does to the error rate. `power` states, before training,
                a clause's chance of "agrees" at its effect of interest.

Nothing is stored: the decision is recomputed from the run directories at every call (the first
LOOKS[k] seeds of each clause, in seed order), so a killed and resumed `--decide` gives the same
verdict. The contract with the runner is /work/notes/45-contract.md in words and `Decision` here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from ablate.analysis.load import Runs, load_runs
from ablate.analysis.metrics import cell_metrics
from ablate.claims import decide
from ablate.claims.claim_checks import CLAUSE_LETTERS
from ablate.claims.claim_file import Claim, Clause, SWEEP_SEEDS
from ablate.claims.claim_measures import Context, MEASURES
from ablate.claims.claim_report import (SEQUENTIAL, best_rates, clause_json, estimand_of, rate_caveat, verdict_json,
                                         waiting)
from ablate.claims.spending import LOOKS, MAX_POWER_SEEDS, POWER_AT, boundaries, continued, nominal_levels, power
from ablate.claims.verdict import AGREES, CANNOT_TELL, DISAGREES, Result, SMALLER, compare, headline, run_test


# ------------------------------------------------------------------------- the boundaries


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
    shown: bool = False  # "agrees" crossed its boundary (with DISAGREES: shown the claimed way, smaller than claimed)


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
    estimand: str = ""  # what its test is about (decide.ESTIMANDS), per comparison
    waits_for: list = field(default_factory=list)  # labels of comparisons not yet shown, beside ones that are

    @property
    def seeds_used(self) -> int:
        return self.looks[-1].n_seeds if self.looks else 0

    @property
    def line(self) -> str:
        return f"({self.letter}) {self.label}: **{self.status}**: {self.why}"


def _units(results: list[Result]) -> int:
    return min((r.n_seeds for r in results), default=0)


def clause_looks(results: list[Result], level: float, looks: tuple = LOOKS,
                 kept_from: tuple | None = None) -> list[Look]:
    """The clause's looks up to and including its first decision, at one-sided `level`."""
    if results and all(r.kind == "exact" for r in results):
        return [_exact_look(results)]
    n_have, out = _units(results), []
    # kept_from (an earlier plan's looks, how many of them were read): a planned continuation
    nominal = nominal_levels(float(level), tuple(looks), kept_from)
    cs = continued(*kept_from, tuple(looks), float(level)) if kept_from else boundaries(tuple(looks), float(level))
    for k, n in enumerate(looks):
        if n > n_have:
            break
        tests = [run_test(r, nominal[k], n) for r in results]
        p_agree = None if any(t is None or t.p_value is None for t in tests) else max(t.p_value for t in tests)
        futile = [t.p_futile for t in tests if t is not None and t.p_futile is not None]
        p_futile = min(1.0, min(futile) * len(tests)) if futile else None
        shown = p_agree is not None and p_agree <= nominal[k]
        outcome = DISAGREES if p_futile is not None and p_futile <= nominal[k] else AGREES if shown else CANNOT_TELL
        decisive = max(tests, key=lambda t: -1 if t is None or t.p_value is None else t.p_value)
        beyond = all(t is not None and t.beyond(nominal[k]) for t in tests)
        out.append(Look(n, tuple(results[0].seed_ids[:n]), decide.z_of(p_agree), decide.z_of(p_futile), cs[k], nominal[k],
                        None if decisive is None else decisive.estimate, p_agree, p_futile, outcome, level, beyond,
                        shown))
        if outcome != CANNOT_TELL:
            break
    return out


def _exact_look(results: list[Result]) -> Look:
    right = all(r.exact_right() for r in results)
    return Look(results[0].n_seeds, tuple(results[0].seed_ids), None, None, math.inf, 0.0,
                results[0].test.estimate if results[0].test else None, None, None,
                (AGREES if right else DISAGREES) if all(r.test for r in results) else CANNOT_TELL, 0.0, right,
                right and all(r.test for r in results))


# ------------------------------------------------------------------------------ the claim


@dataclass
class Decision:
    claim: Claim
    clauses: list  # of ClauseDecision
    headline: str
    conjunction: bool  # every clause shown at the full alpha (the headline's "agrees")
    looks: tuple = LOOKS  # the spending plan's looks (seeds)
    kept_from: tuple | None = None  # a continuation: (the earlier plan's looks, how many were read)

    @property
    def done(self) -> bool:
        return all(c.decided or c.next_seeds is None for c in self.clauses)

    @property
    def next_cells(self) -> list:
        return [need for c in self.clauses if not c.decided for need in c.needs]

    def to_json(self) -> dict:
        """verdict.json's layout (claim_report.verdict_json), the same as a fixed design's."""
        clauses = [clause_json(c.letter, clause, c.status, c.why, c.line, c.level, c.results,
                               p_agree=c.looks[-1].p_value if c.looks else None,
                               p_futile=c.looks[-1].p_futile if c.looks else None,
                               smaller=c.status == DISAGREES and bool(c.looks) and c.looks[-1].shown,
                               seeds_used=c.seeds_used, waits_for=c.waits_for, looks=c.looks,
                               next_seeds=c.next_seeds, needs=c.needs)
                   for c, clause in zip(self.clauses, self.claim.clauses)]
        return verdict_json(self.claim, SEQUENTIAL, self.headline, self.conjunction, clauses, done=self.done,
                            looks=self.looks, continues=self.kept_from)


def decide_claim(claim: Claim, source, metrics=None, looks: tuple = LOOKS, kept_from: tuple | None = None) -> Decision:
    """The claim's sequential decision from a grid folder or loaded Runs (see the module docstring)."""
    runs = source if isinstance(source, Runs) else load_runs(Path(source))
    ctx = Context(runs, metrics if metrics is not None else cell_metrics(runs))
    results = [[compare(ctx, c, claim.alpha, claim.first_step_level) for c in clause.compare]
               for clause in claim.clauses]
    return decide_results(claim, results, looks, kept_from)


def graphical_holm(m: int, alpha: float, looks_of) -> tuple[dict, set]:
    """({clause: its looks}, the clauses rejected): each clause's path at alpha / (clauses not yet
    rejected), `looks_of(j, level)` giving clause j's looks at a level; a clause whose "agrees"
    crossed (Look.shown) passes its share on and the others are read again at the larger level,
    until nothing changes. A futility stop is not a rejection and passes nothing on."""
    rejected: set[int] = set()
    paths: dict[int, list[Look]] = {}
    while True:
        level = alpha / max(1, m - len(rejected))
        paths = {j: (paths[j] if j in rejected else looks_of(j, level)) for j in range(m)}
        newly = {j for j in range(m) if j not in rejected and paths[j] and paths[j][-1].shown}
        if not newly:
            return paths, rejected
        rejected |= newly


def decide_results(claim: Claim, results: list[list[Result]], looks: tuple = LOOKS,
                   kept_from: tuple | None = None) -> Decision:
    """Graphical Holm over the clauses' sequential paths; the conjunction at the full level.
    Only a clause whose "agrees" crossed its boundary (it may also have been found smaller than
    claimed) passes its share of alpha on; a clause stopped for futility keeps its share locked:
    futility rejects no hypothesis of the family (Bretz et al. 2009; Maurer & Bretz 2013)."""
    m = len(claim.clauses)
    paths, rejected = graphical_holm(m, claim.alpha, lambda j, level: clause_looks(results[j], level, looks, kept_from))
    levels = {j: paths[j][-1].level if paths[j] else claim.alpha / max(1, m - len(rejected)) for j in range(m)}
    clauses = [_clause_decision(j, claim.clauses[j], results[j], paths[j], levels[j], looks) for j in range(m)]
    full = [clause_looks(results[j], claim.alpha, looks, kept_from) for j in range(m)]
    conjunction = all(p and p[-1].outcome == AGREES for p in full)
    return Decision(claim, clauses, headline([c.status for c in clauses], conjunction), conjunction, tuple(looks),
                    kept_from)


def _clause_decision(j: int, clause: Clause, results: list[Result], path: list[Look], level: float,
                     looks: tuple) -> ClauseDecision:
    status = path[-1].outcome if path else CANNOT_TELL
    rates = best_rates(results)
    shown = tuple(_at_look(r, path[-1]) for r in results) if path else tuple(results)
    c = ClauseDecision(CLAUSE_LETTERS[j], clause.label, status, status != CANNOT_TELL, "", path, level, shown,
                       rates=rates,
                       estimand=estimand_of(results))
    c.waits_for = waiting(shown, path[-1].nominal_level) if path and status == CANNOT_TELL else []
    c.why = _why(c, results, looks) + rate_caveat(results)
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
                   seed_values=r.seed_values[:look.n_seeds], test=run_test(r, look.nominal_level, look.n_seeds),
                   rivals=tuple(replace(v, seed_ids=v.seed_ids[:look.n_seeds], seed_values=v.seed_values[:look.n_seeds])
                                for v in r.rivals))


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
        shown = f"shown beyond 0 at {last.n_seeds} seeds (z {last.statistic:.2f} >= boundary {last.boundary:.2f})"
        if not effects:  # a failure share is read against its bound alone: no effect beyond it to name
            return shown
        return shown + "; " + ("also" if last.beyond else "not") + f" shown beyond the smallest effect of interest ({effects})"
    if c.status == DISAGREES:
        effects = ", ".join(f"{r.compare.effect:g} {r.unit}" for r in results if r.compare.effect)
        if last.futility_statistic is None:
            return "an exact count short of the effect, or the other way"
        # The statistic is the clause's least convincing comparison's z: at or under -boundary that
        # comparison's repeated confidence bound excludes 0 on the other side.
        if last.shown:
            return (f"{SMALLER}: shown beyond 0 the claimed way at {last.n_seeds} seeds (z {last.statistic:.2f} >= "
                    f"boundary {last.boundary:.2f}), and no effect as large as {effects} (z "
                    f"{last.futility_statistic:.2f} >= boundary {last.boundary:.2f})")
        # Read over pairings of near-best rates (best_rate_bounds), a low z says only that some
        # pairing went the other way, not the arms' best rates: no such words then.
        other = (last.statistic is not None and last.statistic <= -last.boundary
                 and not any(r.rivals for r in results))
        which = "shown the other way" if len(results) == 1 else "a comparison shown the other way"
        return (f"no effect as large as {effects} at {last.n_seeds} seeds (z {last.futility_statistic:.2f} >= "
                f"boundary {last.boundary:.2f})" + (f"; {which} (z {last.statistic:.2f} <= -{last.boundary:.2f})"
                                                    if other else ""))
    wait = f"; waits for its other comparison{'s' if len(c.waits_for) > 1 else ''}: " + "; ".join(
        c.waits_for) if c.waits_for else ""
    if last.n_seeds >= looks[-1]:
        return f"the last look ({looks[-1]} seeds) reached: neither shown nor excluded{wait}"
    return f"undecided at {last.n_seeds} seeds (boundary {last.boundary:.2f}){wait}; next look at the next seeds"


def _seeds_for(results: list[Result], n: int) -> tuple:
    """The seed ids a clause's look of `n` units reads: the seeds present in ascending order (the
    grid's own first: a design's seeds are its grid's, then the integers after the largest,
    ablate/claims/design.py), then the integers after the largest present; for a best rate, the
    same without the seeds that chose the rates. Whatever the grid's own seeds are."""
    sweep = {s for r in results for s in r.sweep_seeds}
    present = sorted({s for r in results for s in r.seed_ids} | sweep)
    fresh = [s for s in present if s not in sweep]
    following = max(present, default=-1) + 1
    while len(fresh) < n:
        fresh.append(following)
        following += 1
    return tuple(fresh[:n])


def _needs(results: list[Result], seeds: tuple) -> list:
    """Selector dicts (axis -> value or list, "seed" -> ids) of the cells the next look reads."""
    out = []
    for r in results:
        c = r.compare
        for side in ("a", "b") if c.b is not None else ("a",):
            selector = {**c.selector(side), "seed": list(seeds)}
            # A best rate: each group at its near-best rates (best_rate_bounds), the chosen first.
            groups = r.candidates.get(side, ()) if c.best_lr else ()
            for group in groups or [None]:
                need = dict(selector) if group is None else {**selector, **group.selector, "lr": (
                    group.rates[0] if len(group.rates) == 1 else sorted(group.rates))}
                if need not in out:
                    out.append(need)
    return out


# ------------------------------------------------------------------- power, before training


def power_lines(claim: Claim, looks: tuple) -> list[str]:
    """Before training: each clause's test, its estimand, its seed plan and its power at
    POWER_AT (at Holm's first step, alpha / clauses, and at the full alpha once the others are
    shown); a clause of several comparisons needs every one shown, so its power is at most this."""
    m, lines = len(claim.clauses), []
    plan = ("looks at " + ", ".join(map(str, looks)) + " seeds") if len(looks) > 1 else f"{looks[0]} seeds"
    for j, clause in enumerate(claim.clauses):
        kinds = [MEASURES[c.measure].test for c in clause.compare]
        fresh = " fresh" if any(c.best_lr for c in clause.compare) else ""
        head = f"  ({CLAUSE_LETTERS[j]}) {clause.label}: "
        if all(k == "exact" for k in kinds):
            lines.append(head + "an exact count: decided at any seeds, no power to state")
            continue
        what = "; ".join(dict.fromkeys(decide.ESTIMANDS[k] for k in kinds if k != "exact"))
        if looks[-1] > MAX_POWER_SEEDS:  # --looks 3,10000 took hours here: the exact power grows as n^3
            lines.append(head + f"exact sign test of {what}, {plan}{fresh}; power not computed past "
                         f"{MAX_POWER_SEEDS} seeds")
            continue
        first = [power(e, claim.alpha / m, looks) for e in POWER_AT]
        full = [power(e, claim.alpha, looks) for e in POWER_AT]
        if not any(full):
            lines.append(head + f"exact sign test of {what}, {plan}{fresh}: cannot decide at so few seeds (its "
                         f"smallest p, 1/2^n, is over one-sided {claim.alpha:g}): power 0; it describes")
            continue
        lines.append(head + f"exact sign test of {what}, {plan}{fresh}; power when the true effect equals the effect "
                     f"of interest at {' / '.join(f'{e:g}' for e in POWER_AT)} sd of the seeds' spread: "
                     f"{' / '.join(f'{p:.2f}' for p in first)} at one-sided {claim.alpha / m:.3g} (Holm's first step), "
                     f"{' / '.join(f'{p:.2f}' for p in full)} at {claim.alpha:g}")
    return lines


def plan_power_lines(claim: Claim, grid, decide_looks) -> list[str]:
    """`ablate reproduce` prints these before training (and with --dry-run): the seed plan is
    `decide_looks` under --decide (True: LOOKS), else one look at the grid's seeds (less the
    sweep's for a best rate)."""
    seeds = len({grid.configs[c.id].seed for c in grid.cells})
    if decide_looks:
        looks = LOOKS if decide_looks is True else tuple(decide_looks)
    else:
        fresh = seeds - SWEEP_SEEDS if any(c.best_lr for c in claim.compare) else seeds
        if fresh < 1:
            return [f"{claim.name}: power: no fresh seed to test at {seeds} seeds"]
        looks = (fresh,)
    return [f"{claim.name}: each clause's test, seed plan and power:", *power_lines(claim, looks)]
