"""One verdict engine for every claim: a declaration (analysis/claims.py) + a grid's run
directory -> a verdict per clause and a headline, with the numbers. Nothing here trains or
imports the model: it reads what the grid wrote.

The rules it applies, with their references, are stated once, in analysis/claims.py's docstring.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.analysis import decide
from ablate.analysis.cpu_forms import mix_note
from ablate.analysis.claim_measures import MEASURES, Context, Measure, MeasureUnavailable, values_by_key
from ablate.analysis.claims import NON_INFERIORITY, Claim, Clause, Compare
from ablate.analysis.load import Runs, load_runs
from ablate.analysis.metrics import cell_metrics
from ablate.analysis.outcomes import OUTCOMES
from ablate.analysis.selection import COLUMN_OF, SelectionError, select
from ablate.analysis.stats import adjust_p_values
from ablate.rundir import DIVERGED

AGREES, DISAGREES, CANNOT_TELL = "agrees", "does not agree", "cannot tell"
CORRECTION = "holm"  # across clauses: a family of separately reported results


def agrees_in_part(k: int, n: int) -> str:
    return f"agrees in part ({k} of {n} clauses)"


# ------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Result:
    """One comparison: what it paired, its test, and what stood beside it."""

    compare: Compare
    unit: str
    keys: tuple = ()  # the paired units (key tuples, seed first)
    a: tuple = ()  # the values per unit
    b: tuple = ()
    test: decide.Test | None = None
    outcomes: dict = field(default_factory=dict)  # side -> {outcome: count} of the cells it used
    best: dict = field(default_factory=dict)  # side -> [(what, best lr, at the edge)]
    missing: dict = field(default_factory=dict)  # side -> {key: reason}
    seeds_needed: int | None = None  # to resolve the declared smallest effect
    note: str = ""  # why there is no test

    @property
    def n_pairs(self) -> int:
        return len(self.keys)

    @property
    def seeds(self) -> tuple:
        return tuple(sorted({k[0] for k in self.keys}, key=str))

    @property
    def mean_a(self) -> float | None:
        return float(np.mean(self.a)) if self.a else None

    @property
    def mean_b(self) -> float | None:
        return float(np.mean(self.b)) if self.b else None

    @property
    def diff(self) -> float | None:
        return float(np.mean(np.subtract(self.a, self.b))) if self.a else None

    @property
    def edge(self) -> bool:
        return any(at_edge for picks in self.best.values() for _, _, at_edge in picks)

    def direction(self) -> tuple[str | None, float | None]:
        """(RIGHT/WRONG/None, p) for the clause: an exact count decides with certainty."""
        t = self.test
        if t is None:
            return None, None
        if MEASURES[self.compare.measure].test == "exact":
            big_enough = abs(t.estimate) >= (self.compare.effect or 0.0) * abs(self.mean_b or 0.0)
            return (decide.RIGHT, 0.0) if t.side == decide.RIGHT and big_enough else (decide.WRONG, 0.0)
        return (t.side, t.p_value) if t.side is not None and t.p_value is not None else (None, None)


@dataclass(frozen=True)
class ClauseResult:
    clause: Clause
    results: tuple  # of Result
    side: str | None  # which way the clause's decisive p-value points
    p_value: float | None  # the clause's p-value (intersection-union, or Bonferroni against)
    p_adjusted: float | None = None
    outcome: str = CANNOT_TELL


@dataclass
class Verdict:
    claim: Claim
    clauses: list  # of ClauseResult
    reported: list  # of Result
    outcome: str  # AGREES, DISAGREES, CANNOT_TELL or agrees_in_part(k, n)
    notes: list = field(default_factory=list)  # what the reader must know beside it (cells on mixed CPU forms)

    def text(self) -> str:
        return self.outcome

    @property
    def results(self) -> list:
        return [r for c in self.clauses for r in c.results]


# ------------------------------------------------------------------------------ the engine


def evaluate(claim: Claim, source: str | Path | Runs, metrics: pd.DataFrame | None = None) -> Verdict:
    """The claim's verdict from a grid folder (or loaded Runs, with their cell_metrics)."""
    runs = source if isinstance(source, Runs) else load_runs(source)
    ctx = Context(runs, metrics if metrics is not None else cell_metrics(runs))
    alpha_power = claim.alpha / len(claim.clauses)
    clauses = [_clause(clause, [compare(ctx, c, claim.alpha, alpha_power) for c in clause.compare])
               for clause in claim.clauses]
    adjusted = adjust_p_values([c.p_value for c in clauses], CORRECTION)
    clauses = [_decided(c, p, claim.alpha) for c, p in zip(clauses, adjusted)]
    reported = [compare(ctx, c, claim.alpha, claim.alpha) for c in claim.report]
    notes = [note for note in [mix_note(runs.cells)] if note]
    return Verdict(claim, clauses, reported, headline([c.outcome for c in clauses]), notes)


def headline(outcomes: list[str]) -> str:
    k, n = outcomes.count(AGREES), len(outcomes)
    if k == n:
        return AGREES
    if k:
        return agrees_in_part(k, n)
    return DISAGREES if DISAGREES in outcomes else CANNOT_TELL


def _clause(clause: Clause, results: list[Result]) -> ClauseResult:
    """Intersection-union within the clause (see the module docstring)."""
    directions = [r.direction() for r in results]
    if all(side == decide.RIGHT for side, _ in directions):
        return ClauseResult(clause, tuple(results), decide.RIGHT, max(p for _, p in directions))
    against = [p for side, p in directions if side == decide.WRONG]
    if against:
        return ClauseResult(clause, tuple(results), decide.WRONG, min(1.0, min(against) * len(results)))
    return ClauseResult(clause, tuple(results), None, None)


def _decided(c: ClauseResult, p_adjusted: float | None, alpha: float) -> ClauseResult:
    from dataclasses import replace

    if p_adjusted is None or p_adjusted >= alpha:
        return replace(c, p_adjusted=p_adjusted, outcome=CANNOT_TELL)
    return replace(c, p_adjusted=p_adjusted, outcome=AGREES if c.side == decide.RIGHT else DISAGREES)


def compare(ctx: Context, c: Compare, alpha: float, alpha_power: float) -> Result:
    """One comparison: the sides' cells, each at its best rate if asked, paired; its test."""
    m: Measure = MEASURES[c.measure]
    metrics = ctx.metrics
    try:
        sides = {"a": metrics[select(metrics, c.selector("a"))]}
        if c.b is not None:
            sides["b"] = metrics[select(metrics, c.selector("b"))]
        best = {}
        if c.best_lr:
            for side in list(sides):
                sides[side], best[side] = at_best_lr(sides[side], ctx.runs.varying_axes)
        key_axes = pairing_axes(ctx.runs, c, m, *sides.values())
        missing = {side: {} for side in sides}
        values = {side: values_by_key(ctx, cells, key_axes, m, c.params, missing[side])
                  for side, cells in sides.items()}
    except (MeasureUnavailable, SelectionError) as e:
        return Result(c, m.unit, note=str(e))
    a = values["a"]
    b = values["b"] if c.b is not None else pd.Series({k: c.than for k in a.index}, dtype=float)
    keys = [k for k in a.index if k in b.index]
    # Cells that only take a step to be read at initialisation have no training outcome to tell.
    outcomes = {side: dict(Counter(cells["outcome"])) for side, cells in sides.items()
                if "outcome" in cells and not (pd.to_numeric(cells.get("planned_steps"), errors="coerce") <= 1).all()}
    base = Result(c, m.unit, tuple(keys), tuple(a[keys]), tuple(b[keys]), None, outcomes, best, missing)
    if not keys:
        return _replace(base, note="no unit has a value on both sides" if c.b is not None else "no cell has a value")
    va, vb = np.asarray(base.a, dtype=float), np.asarray(base.b, dtype=float)
    test = _test(m, c, va, vb, alpha)
    units_per_seed = len(keys) / max(1, len({k[0] for k in keys}))
    note = "; ".join(x for x in ("" if test is not None else "the differences do not vary: no test",
                                 _nonfinite_note(ctx, m, sides)) if x)
    return _replace(base, test=test, seeds_needed=_seeds_needed(m, c, va - vb, alpha_power, units_per_seed),
                    note=note)


def _nonfinite_note(ctx: Context, m: Measure, sides: dict) -> str:
    """For failure measures: when each side's diverged runs first went non-finite."""
    if m.name not in ("diverged", "failed"):
        return ""
    from ablate.analysis.claim_measures import first_nonfinite_step

    parts = []
    for side, cells in sides.items():
        steps = [s for s in (first_nonfinite_step(ctx, cid) for cid in cells.loc[cells["status"] == DIVERGED,
                                                                                  "cell_id"]) if s is not None]
        if steps:
            parts.append(f"{side}: first non-finite value at step {int(np.median(steps))} (median; "
                         f"{min(steps)}-{max(steps)})")
    return "; ".join(parts)


def _replace(r: Result, **changes) -> Result:
    from dataclasses import replace

    return replace(r, **changes)


def _test(m: Measure, c: Compare, va: np.ndarray, vb: np.ndarray, alpha: float) -> decide.Test | None:
    if m.test == "exact":
        return decide.exact(va - vb, c.higher)
    if m.test == "binary":
        return decide.binomial_rate(va, c.than, c.higher, alpha) if c.b is None else decide.mcnemar(va, vb, c.higher,
                                                                                                   alpha)
    if c.expect in NON_INFERIORITY:
        return decide.not_worse(va - vb, c.margin, c.expect == "not_higher", alpha)
    return decide.paired_t(va - vb, c.higher, alpha, "paired t-test" if c.b is not None else "one-sample t-test")


def _seeds_needed(m: Measure, c: Compare, d: np.ndarray, alpha: float, units_per_seed: float) -> int | None:
    if not c.effect or m.test == "exact" or (m.test == "binary" and c.b is None):
        return None
    units = decide.mcnemar_pairs_for(c.effect, alpha) if m.test == "binary" else decide.t_seeds_for(c.effect, d, alpha)
    return None if units is None else max(2, math.ceil(units / units_per_seed))


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


def at_best_lr(cells: pd.DataFrame, varying: list[str]) -> tuple[pd.DataFrame, list]:
    """The cells at each group's best lr (lowest mean scored loss over seeds), and
    [(the group's other axis values, its best lr, whether that lr is an end of its sweep)]."""
    others = [ax for ax in varying if ax not in ("seed", "lr") and ax in cells and cells[ax].nunique(dropna=False) > 1]
    kept, picks = [], []
    for values, group in (cells.groupby(others, dropna=False, sort=True) if others else [((), cells)]):
        scores = pd.to_numeric(group["scored_loss"], errors="coerce").groupby(group["lr"].astype(float)).mean()
        if scores.dropna().empty:
            continue
        lr = float(scores.idxmin())
        rates = sorted(scores.index)
        label = ", ".join(f"{ax} {v}" for ax, v in zip(others, values if isinstance(values, tuple) else (values,)))
        picks.append((label, lr, lr in (rates[0], rates[-1])))
        kept.append(group[np.isclose(group["lr"].astype(float), lr, rtol=1e-9)])
    return (pd.concat(kept) if kept else cells.iloc[0:0]), picks


def outcome_counts(counts: dict) -> str:
    """"6 trained, 2 plateaued, 1 diverged" (and any that did not finish)."""
    words = [f"{counts[o]} {o}" for o in (*OUTCOMES, "failed") if counts.get(o)]
    return ", ".join(words) or "no cells"
