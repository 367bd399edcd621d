"""One verdict engine for every claim: a declaration (ablate/claims/claim_file.py) + a grid's run
directory -> a verdict per clause and a headline, with the numbers. Nothing here trains or
imports the model: it reads what the grid wrote.

The rules it applies, with their references, are stated once, in ablate/claims/claim_file.py's docstring.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.analysis.cpu_forms import mix_note
from ablate.analysis.load import Runs, load_runs
from ablate.analysis.metrics import cell_metrics
from ablate.analysis.outcomes import FAILED, OUTCOMES
from ablate.analysis.stats import ONE_SIDED_ALPHA, adjust_p_values
from ablate.claims import decide
from ablate.claims.claim_file import Claim, Clause, Compare, NON_INFERIORITY, SWEEP_SEEDS
from ablate.claims.claim_measures import (COUNTS_DIVERGED, Context, MEASURES, Measure, MeasureUnavailable,
                                          first_nonfinite_step, plain_value, values_by_key)
from ablate.claims.design_checks import judged
from ablate.claims.best_rate_bounds import (MAX_PAIRINGS, Rival, candidates, chosen_rates, common_seeds, fresh_at,
                                           keep_seeds, moved_rates, n_pairings, pairings, worst_of)
from ablate.claims.rate_choice import at_rate, group_label, groups_of, near_rates, open_axes, slipped_rates
from ablate.claims.selection import COLUMN_OF, SelectionError, select
from ablate.core.rundir import DIVERGED

AGREES, DISAGREES, CANNOT_TELL = "agrees", "does not agree", "cannot tell"
STATUSES = (AGREES, DISAGREES, CANNOT_TELL)
AGREES_IN_PART = "agrees in part"
CORRECTION = "holm"  # across clauses: a family of separately reported results


def headline(outcomes: list[str], conjunction: bool | None = None) -> str:
    """Every clause's outcome counted: "agrees (n of n)", "agrees in part (k agree, m do not, r
    cannot tell)", "does not agree (m of n[, r cannot tell])", "cannot tell (n of n)".
    `conjunction`: whether every clause is shown at the full level (the intersection-union test of
    the whole statement); it says "agrees" even where Holm leaves single clauses undecided."""
    n, k, m = len(outcomes), outcomes.count(AGREES), outcomes.count(DISAGREES)
    r = n - k - m
    if k == n or (conjunction and not m):
        return f"{AGREES} ({n} of {n})" + ("" if k == n else f"; one by one after Holm, {k} of {n}")
    if k:
        return f"{AGREES_IN_PART} ({k} agree, {m} do not, {r} cannot tell)"
    if m:
        return f"{DISAGREES} ({m} of {n}" + (f", {r} cannot tell)" if r else ")")
    return f"{CANNOT_TELL} ({n} of {n})"


def headline_status(text: str) -> str:
    """AGREES, AGREES_IN_PART, DISAGREES or CANNOT_TELL: the headline without its counts."""
    return next(s for s in (AGREES_IN_PART, AGREES, DISAGREES, CANNOT_TELL) if text.startswith(s))


# ------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Result:
    """One comparison: what it paired, its seeds' values, its test, and what stood beside it."""
    compare: Compare
    unit: str
    keys: tuple = ()  # the paired cells' keys (key tuples, seed first)
    a: tuple = ()  # the values per key
    b: tuple = ()
    test: decide.Test | None = None
    outcomes: dict = field(default_factory=dict)  # side -> {outcome: count} of the cells it used
    best: dict = field(default_factory=dict)  # side -> [(what, best lr, at the edge)]
    missing: dict = field(default_factory=dict)  # side -> {key: reason}
    seeds_needed: int | None = None  # to resolve the declared smallest effect
    seeds_needed_upper: int | None = None  # the same at the spread's upper confidence bound
    note: str = ""  # why there is no test
    seed_ids: tuple = ()  # the test's units: seeds, in order
    seed_values: tuple = ()  # each seed's value of a - b (its cells' mean)
    spread: tuple | None = None  # (sd, df) pooled across comparable cells
    sweep_seeds: tuple = ()  # best rate: the seeds that chose the rates (not tested)
    near: dict = field(default_factory=dict)  # side -> [(what, chosen lr, a rate within noise, gap)] (rate_choice)
    slips: dict = field(default_factory=dict)  # side -> [(what, chosen lr, other lr, fresh mean, its mean)] (rate_choice)
    candidates: dict = field(default_factory=dict)  # side -> (best_rate_bounds.Candidates, ...)
    rivals: tuple = ()  # of best_rate_bounds.Rival: the other pairings of near-best rates, on the same seeds

    @property
    def n_pairs(self) -> int:
        return len(self.keys)

    @property
    def seeds(self) -> tuple:
        return tuple(self.seed_ids) if self.seed_ids else tuple(sorted({k[0] for k in self.keys}, key=str))

    @property
    def n_seeds(self) -> int:
        return len(self.seed_ids)

    @property
    def mean_a(self) -> float | None:
        return float(np.mean(self.a)) if self.a else None

    @property
    def mean_b(self) -> float | None:
        return float(np.mean(self.b)) if self.b else None

    @property
    def diff(self) -> float | None:
        return float(np.mean(self.seed_values)) if self.seed_values else None

    @property
    def edge(self) -> bool:
        return any(at_edge for picks in self.best.values() for _, _, at_edge in picks)

    @property
    def kind(self) -> str:
        return MEASURES[self.compare.measure].test

    def exact_right(self) -> bool:
        """An exact count: whether it points the claimed way by at least the effect (a fraction of b)."""
        t = self.test
        return bool(t and t.side == decide.RIGHT and
                    abs(t.estimate) >= (self.compare.effect or 0.0) * abs(self.mean_b or 0.0))


@dataclass(frozen=True)
class ClauseResult:
    clause: Clause
    results: tuple  # of Result
    side: str | None  # RIGHT when the clause's decisive p is for "agrees", WRONG for "does not agree"
    p_value: float | None  # the clause's decisive p-value (the module docstring of claim_file.py)
    p_adjusted: float | None = None
    outcome: str = CANNOT_TELL
    why: str = ""  # the reason in words: shown beyond 0 / beyond the effect / no effect as large as X
    p_agree: float | None = None  # the intersection-union p of "agrees"
    p_futile: float | None = None  # the p of "no effect as large as the claim needs"
    level: float | None = None  # the nominal one-sided level it was read at
    shown: bool = False  # shown beyond 0 the claimed way after Holm (with DISAGREES: smaller than claimed)

    @property
    def decided(self) -> bool:
        return self.outcome != CANNOT_TELL


@dataclass
class Verdict:
    claim: Claim
    clauses: list  # of ClauseResult
    reported: list  # of Result
    outcome: str  # the headline (headline())
    notes: list = field(default_factory=list)  # what the reader must know beside it (cells on mixed CPU forms)

    def text(self) -> str:
        return self.outcome

    @property
    def status(self) -> str:
        return headline_status(self.outcome)

    @property
    def results(self) -> list:
        return [r for c in self.clauses for r in c.results]


# ------------------------------------------------------------------------------ the engine


def evaluate(claim: Claim, source: str | Path | Runs, metrics: pd.DataFrame | None = None) -> Verdict:
    """The claim's verdict from a grid folder (or loaded Runs, with their cell_metrics): one look
    at the seeds it has (a fixed design), every test at the claim's one-sided level."""
    runs = source if isinstance(source, Runs) else load_runs(source)
    ctx = Context(runs, metrics if metrics is not None else cell_metrics(runs))
    results = [[compare(ctx, c, claim.alpha, claim.first_step_level) for c in clause.compare]
               for clause in claim.clauses]
    clauses = decide_clauses(claim, results, [claim.alpha] * len(claim.clauses))
    reported = [compare(ctx, c, claim.alpha, claim.alpha) for c in claim.report]
    notes = [note for note in [mix_note(runs.cells)] if note]
    return Verdict(claim, clauses, reported, headline([c.outcome for c in clauses], conjunction(clauses, claim.alpha)),
                   notes)


def conjunction(clauses: list, level: float) -> bool:
    """The whole statement shown (intersection-union, Berger 1982): every clause shown at `level`."""
    return all(c.p_agree is not None and c.p_agree <= level for c in clauses)


def decide_clauses(claim: Claim, results: list[list[Result]], levels: list[float]) -> list[ClauseResult]:
    """Each clause from its comparisons (intersection-union within), then Holm across clauses on
    "agrees" alone: a clause agrees when its p of "agrees" is within Holm's step level of `levels`
    (each clause's nominal level at this look; the full level in a fixed design). Only a clause
    shown the claimed way passes its share of alpha on: "no effect as large as X" (futility) is
    read at the level the clause holds once the shown clauses' shares have passed to it, and
    frees nothing (Bretz et al. 2009, Stat. Med. 28, 586-604)."""
    clauses = [_clause(clause, rs) for clause, rs in zip(claim.clauses, results)]
    # Holm on the clause's p scaled to the full level: p * (alpha / nominal) keeps one ordering
    # when looks give clauses different nominal levels (in a fixed design the scale is 1).
    scale = [claim.alpha / lv for lv in levels]
    scaled = [None if c.p_agree is None else min(1.0, c.p_agree * f) for c, f in zip(clauses, scale)]
    adjusted = adjust_p_values(scaled, CORRECTION)
    shown = [p is not None and p <= claim.alpha for p in adjusted]
    out = []
    for j, (c, f, lv) in enumerate(zip(clauses, scale, levels)):
        holding = max(1, len(clauses) - sum(shown) + shown[j])  # clauses sharing alpha with this one
        futile = None if c.p_futile is None else min(1.0, c.p_futile * f * holding)
        out.append(_decided(c, adjusted[j], futile, shown[j], claim.alpha, lv))
    return out


def _clause(clause: Clause, results: list[Result]) -> ClauseResult:
    """Intersection-union within the clause: it agrees when every comparison is shown (p: the
    largest of theirs); it does not agree when any one is futile (p: the smallest futility p
    times the number of comparisons, Bonferroni). The decisive p is the smaller of the two."""
    if all(r.kind == "exact" for r in results) and all(r.test is not None for r in results):
        right = all(r.exact_right() for r in results)
        return ClauseResult(clause, tuple(results), decide.RIGHT if right else decide.WRONG, 0.0, p_agree=0.0 if right
                            else None, p_futile=None if right else 0.0)
    p_agree = _intersection([_p_shown(r) for r in results])
    futile = [p for p in (_p_futile(r) for r in results) if p is not None]
    p_futile = min(1.0, min(futile) * len(results)) if futile else None
    if p_agree is None and p_futile is None:
        return ClauseResult(clause, tuple(results), None, None)
    if p_futile is None or (p_agree is not None and p_agree < p_futile):
        return ClauseResult(clause, tuple(results), decide.RIGHT, p_agree, p_agree=p_agree, p_futile=p_futile)
    return ClauseResult(clause, tuple(results), decide.WRONG, p_futile, p_agree=p_agree, p_futile=p_futile)


def _intersection(ps: list) -> float | None:
    return None if any(p is None for p in ps) else max(ps)


def _p_shown(r: Result) -> float | None:
    if r.kind == "exact":
        return 0.0 if r.exact_right() else None
    return r.test.p_value if r.test is not None else None


def _p_futile(r: Result) -> float | None:
    if r.kind == "exact":
        return None if r.test is None or r.exact_right() else 0.0
    return r.test.p_futile if r.test is not None else None


def _decided(c: ClauseResult, p_agree: float | None, p_futile: float | None, shown: bool, alpha: float,
             level: float) -> ClauseResult:
    """The clause's outcome from its Holm-adjusted p of "agrees" and its p of "no effect as large"
    at the level it holds. Shown the claimed way and short of the effect: "does not agree", worded
    "agrees in direction, smaller than claimed" (the direction is a rejection; the size is not)."""
    futile = p_futile is not None and p_futile <= alpha
    if futile:
        return replace(c, p_adjusted=p_futile, outcome=DISAGREES, level=level, why=_futile_why(c, shown, level),
                       shown=shown)
    if shown:
        return replace(c, p_adjusted=p_agree, outcome=AGREES, level=level, why=_agree_why(c, level), shown=True)
    p = p_agree if c.side == decide.RIGHT or p_futile is None else p_futile
    return replace(c, p_adjusted=p, outcome=CANNOT_TELL, level=level, why=_undecided_why(c))


def _effects(c: ClauseResult) -> str:
    return ", ".join(f"{r.compare.effect:g} {r.unit}" for r in c.results if r.compare.effect)


def _agree_why(c: ClauseResult, level: float) -> str:
    if all(r.kind == "exact" for r in c.results):
        return "an exact count, at least the smallest effect of interest the claimed way"
    beyond = all(r.test is not None and r.test.beyond(level) for r in c.results)
    if not _effects(c):  # a failure share is read against its bound alone: no effect beyond it to name
        return "shown beyond 0"
    return ("shown beyond 0 and beyond the smallest effect of interest (" + _effects(c) + ")" if beyond else
            "shown beyond 0; not shown beyond the smallest effect of interest (" + _effects(c) + ")")


SMALLER = "agrees in direction, smaller than claimed"


def _futile_why(c: ClauseResult, shown: bool = False, level: float | None = None) -> str:
    if all(r.kind == "exact" for r in c.results):
        return "an exact count short of the smallest effect of interest, or the other way"
    r = next(r for r in c.results if _p_futile(r) is not None and _p_futile(r) == min(
        p for p in map(_p_futile, c.results) if p is not None))
    if r.compare.expect in NON_INFERIORITY:
        return f"worse by the margin ({r.compare.margin:g} {r.unit}) or more"
    shown_wrong = r.test is not None and r.test.interval is not None and (
        r.test.interval.high < 0 if r.compare.higher else r.test.interval.low > 0)
    if shown:
        return (f"{SMALLER}: shown beyond 0 the claimed way, and no effect as large as {r.compare.effect:g} "
                f"{r.unit}")
    return f"no effect as large as {r.compare.effect:g} {r.unit}" + ("; shown the other way" if shown_wrong else "")


def _undecided_why(c: ClauseResult) -> str:
    notes = [r.note for r in c.results if r.test is None and r.note]
    level = c.level or ONE_SIDED_ALPHA
    floor = [r for r in c.results if r.kind != "exact" and r.keys and r.n_seeds < decide.sign_test_min_seeds(level)]
    if floor:
        notes.insert(0, f"cannot decide with {floor[0].n_seeds} seeds; needs at least "
                        f"{decide.sign_test_min_seeds(level)} at its level {level:.3g} (a sign test's smallest p "
                        f"at n seeds is 1/2^n)")
    return "; ".join(notes) if notes else "neither shown nor excluded at the seeds it has"


def compare(ctx: Context, c: Compare, alpha: float, alpha_power: float) -> Result:
    """One comparison: the sides' cells, each at its best rate if asked (chosen on the sweep's
    seeds, tested on fresh ones, read against every near-best rate: best_rate_bounds), paired
    cell by cell, reduced to one value per seed; its test."""
    m: Measure = MEASURES[c.measure]
    metrics = ctx.metrics
    try:
        sides = {"a": metrics[select(metrics, c.selector("a"))]}
        if c.b is not None:
            sides["b"] = metrics[select(metrics, c.selector("b"))]
        arms = {}  # side -> (all its cells, the axes it leaves open): what the rival pairings read
        best, sweep, near, slips, cands = {}, (), {}, {}, {}
        if c.best_lr:
            sweep = sweep_seeds(sides)
            for side, cells in list(sides.items()):
                others = open_axes(cells, ctx.runs.varying_axes)
                arms[side] = (cells, others)
                near[side] = near_rates(cells, others, sweep)
                sides[side], best[side] = at_best_lr(cells, ctx.runs.varying_axes, choose_on=sweep)
                slips[side] = slipped_rates(cells, others, sweep, {what: lr for what, lr, _ in best[side]})
                cands[side] = candidates(cells, others, best[side], near[side], slips[side])
        key_axes = pairing_axes(ctx.runs, c, m, *sides.values())
        missing = {side: {} for side in sides}
        a, b, keys = _paired(ctx, c, m, sides, key_axes, missing)
        rivals = _rivals(ctx, c, m, arms, cands, sweep, key_axes) if c.best_lr else ()
    except (MeasureUnavailable, SelectionError) as e:
        return Result(c, m.unit, note=str(e))
    # Cells that only take a step to be read at initialisation have no training outcome to tell.
    outcomes = {side: dict(Counter(cells["outcome"])) for side, cells in sides.items()
                if "outcome" in cells and not (pd.to_numeric(cells.get("planned_steps"), errors="coerce") <= 1).all()}
    base = Result(c, m.unit, tuple(keys), tuple(a[keys]), tuple(b[keys]), None, outcomes, best, missing,
                  sweep_seeds=tuple(sweep), near={side: v for side, v in near.items() if v},
                  slips={side: v for side, v in slips.items() if v}, candidates=cands)
    if rivals is None:
        return _replace(base, note=f"cannot tell from this design: over {MAX_PAIRINGS} pairings of near-best rates "
                                   f"({n_pairings(cands, m.minimised_by_best_rate)}); a finer or narrower rate sweep would tell them apart")
    if rivals:  # every pairing reads the same seeds (best_rate_bounds.common_seeds)
        kept = common_seeds((k[0] for k in keys), rivals)
        keys = [k for k in keys if k[0] in kept]
        base = _replace(base, keys=tuple(keys), a=tuple(a[keys]), b=tuple(b[keys]))
    if not keys:
        none = ("no fresh seeds (seeds beyond the sweep's, at the chosen rates): cannot tell on the seeds that "
                "chose the rates" if c.best_lr else
                "no unit has a value on both sides" if c.b is not None else "no cell has a value")
        return _replace(base, note=none)
    seeds, per = decide.per_seed(keys, base.a, base.b)
    spread = decide.pooled_sd(_by_design(keys, base.a, base.b))
    seed_ids = _seed_ids(seeds)
    result = _replace(base, seed_ids=seed_ids, seed_values=tuple(per), spread=spread,
                      rivals=tuple(keep_seeds(r, list(seed_ids)) for r in rivals))
    test = run_test(result, alpha)
    note = "; ".join(x for x in ("" if test is not None else "no seed to test", _nonfinite_note(ctx, m, sides)) if x)

    return judged(ctx, sides, _replace(result, test=test, seeds_needed=seeds_needed(result, alpha_power),
                                       seeds_needed_upper=seeds_needed(result, alpha_power, upper=True), note=note))


def _paired(ctx: Context, c: Compare, m: Measure, sides: dict, key_axes: list[str], missing: dict) -> tuple:
    """(a's values, b's values (or `than`), the keys both have): each side's cells measured by key."""
    values = {side: values_by_key(ctx, cells, key_axes, m, c.params, missing[side]) for side, cells in sides.items()}
    a = values["a"]
    b = values["b"] if c.b is not None else pd.Series({k: c.than for k in a.index}, dtype=float)
    return a, b, [k for k in a.index if k in b.index]


def _seed_ids(seeds) -> tuple:
    """Plain Python seed ids (numpy's integers as ints) for the units of a test."""
    return tuple(plain_value(s) for s in seeds)


def _rivals(ctx: Context, c: Compare, m: Measure, arms: dict, cands: dict, sweep, key_axes) -> tuple | None:
    """The comparison at every other pairing of near-best rates (best_rate_bounds), each as its
    seeds' values of a - b; None when there are more than MAX_PAIRINGS. `arms`: side -> (its
    cells, the axes it leaves open)."""
    if n_pairings(cands, m.minimised_by_best_rate) > MAX_PAIRINGS:
        return None
    out, chosen = [], chosen_rates(cands)
    for pairing, end in pairings(cands, m.minimised_by_best_rate):
        at = {side: fresh_at(cells, others, sweep, side, pairing) for side, (cells, others) in arms.items()}
        a, b, keys = _paired(ctx, c, m, at, key_axes, {side: {} for side in at})
        seeds, per = decide.per_seed(keys, tuple(a[keys]), tuple(b[keys]))
        out.append(Rival(moved_rates(pairing, chosen), _seed_ids(seeds), tuple(per), end))
    return tuple(out)


def run_test(r: Result, level: float, n: int | None = None) -> decide.Test | None:
    """The comparison's test at a nominal one-sided `level` on its first `n` seeds (all by
    default); a best-rate comparison's is the worst over its pairings of near-best rates."""
    tests = [_test(r.compare, r.seed_values, level, n)] + [_test(r.compare, v.seed_values, level, n) for v in r.rivals]
    return worst_of(tests, [v.bounds for v in r.rivals], r.compare.higher)


def _test(c: Compare, seed_values, level: float, n: int | None) -> decide.Test | None:
    m = MEASURES[c.measure]
    d = np.asarray(seed_values[:n] if n is not None else seed_values, dtype=float)
    if d.size == 0:
        return None
    if m.test == "exact":
        return decide.exact(d, c.higher)
    # Every sampled measure is read by the exact sign test over seeds: its estimand is the median
    # seed (decide.ESTIMANDS), valid however skewed the seeds' values (decide's docstring).
    if c.expect in NON_INFERIORITY:
        return decide.sign_test(d, c.higher, c.effect, level, margin=c.margin,
                                higher_is_worse=c.expect == "not_higher")
    return decide.sign_test(d, c.higher, c.effect, level)


def _by_design(keys, a, b) -> list:
    """a - b grouped by design point (the key without its seed): the comparable cells."""
    groups: dict = {}
    for key, x, y in zip(keys, a, b):
        groups.setdefault(tuple(key[1:]), []).append(float(x) - float(y))
    return [np.asarray(v) for v in groups.values()]


def seeds_needed(r: Result, level: float, upper: bool = False) -> int | None:
    """About how many seeds would resolve the clause's smallest effect of interest: for a
    continuous measure, the sign test's one-sided power 0.8 at `level` for a median shift of the
    effect, seeds spread normally by the spread pooled across comparable cells (with `upper`, by
    that spread's upper confidence bound, decide.SPREAD_UPPER_LEVEL); for a failure share, the
    fewest seeds at which the sign test can reach `level` at all; none for an exact count."""
    c = r.compare
    if r.kind == "exact" or not c.effect:
        return None
    if r.kind == "binary":
        return None if upper else decide.sign_test_min_seeds(level)
    if r.spread is None:
        return None
    sd = decide.sd_upper_bound(*r.spread) if upper else r.spread[0]
    n = decide.sign_seeds_for(c.effect, sd, level)
    return None if n is None else max(decide.sign_test_min_seeds(level), n)


def _nonfinite_note(ctx: Context, m: Measure, sides: dict) -> str:
    """For failure measures: when each side's diverged runs first went non-finite."""
    if m.name not in COUNTS_DIVERGED:
        return ""

    parts = []
    for side, cells in sides.items():
        steps = [s for s in (first_nonfinite_step(ctx, cid) for cid in cells.loc[cells["status"] == DIVERGED,
                                                                                  "cell_id"]) if s is not None]
        if steps:
            parts.append(f"{side}: first non-finite value at step {int(np.median(steps))} (median; "
                         f"{min(steps)}-{max(steps)})")
    return "; ".join(parts)


def _replace(r: Result, **changes) -> Result:
    return replace(r, **changes)


def pairing_axes(runs: Runs, c: Compare, m: Measure, *sides: pd.DataFrame) -> list[str]:
    """seed, then every axis that varies within a side (so its cells must pair value for value),
    but those that tell a from b, that the measure consumes, or that best_lr chose. An axis
    constant on each side goes with the split (norm_type is null for norm=none, act for a
    gated MLP)."""
    drop = {COLUMN_OF.get(k, k) for k in c.split_keys} | set(c.split_keys) | set(m.consumes)
    if c.best_lr:
        drop.add("lr")
    within = [ax for ax in runs.varying_axes if ax not in drop and ax in sides[0]
              and any(side[ax].nunique(dropna=False) > 1 for side in sides if not side.empty)]
    return ["seed", *within]


def sweep_seeds(sides: dict) -> tuple:
    """The seeds that choose a best-rate comparison's rates: the lowest SWEEP_SEEDS seeds present."""
    seeds = sorted(set().union(*(set(cells["seed"].tolist()) for cells in sides.values() if "seed" in cells)))
    return tuple(seeds[:SWEEP_SEEDS])


def at_best_lr(cells: pd.DataFrame, varying: list[str], choose_on=None) -> tuple[pd.DataFrame, list]:
    """The cells at each group's best lr (lowest mean scored loss over seeds), and
    [(the group's other axis values, its best lr, whether that lr is an end of its sweep)].
    With `choose_on` (seeds), the rate is chosen on those seeds' cells alone and the cells kept
    are the OTHER seeds' at that rate: fresh seeds, free of the winner's curse of testing on the
    seeds that chose (tests/ablate/claims/test_decide.py)."""
    others = open_axes(cells, varying)
    kept, picks = [], []
    for values, group in groups_of(cells, others):
        choosing = group if choose_on is None else group[group["seed"].isin(list(choose_on))]
        scores = pd.to_numeric(choosing["scored_loss"], errors="coerce").groupby(choosing["lr"].astype(float)).mean()
        if scores.dropna().empty:
            continue
        lr = float(scores.idxmin())
        rates = sorted(scores.index)
        picks.append((group_label(others, values), lr, lr in (rates[0], rates[-1])))
        kept.append(at_rate(group, lr, () if choose_on is None else choose_on))
    return (pd.concat(kept) if kept else cells.iloc[0:0]), picks


def outcome_counts(counts: dict) -> str:
    """"6 trained, 2 plateaued, 1 diverged" (and any that did not finish)."""
    words = [f"{counts[o]} {o}" for o in (*OUTCOMES, FAILED) if counts.get(o)]
    return ", ".join(words) or "no cells"
