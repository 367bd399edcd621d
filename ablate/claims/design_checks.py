"""Futility only where the design could have shown the effect (issue 52, docs/claims.md "Designs
that can show the effect").

"Does not agree: no effect as large as X" says the effect is absent where the sentence lives. A
stability measure (claim_measures: `stability=True`: failed, diverged, dead, the largest stable
rate) read over a sweep of learning rates can only show an effect where the swept rates straddle
each arm's edge of stability closely: a grid of 1e-3 (everything trains) and 1e-2 (everything
dies) holds no cell where warmup could rescue post-norm, so "no effect" there is the grid's, not
the architecture's. The check, per side of a comparison and per arm in it (the side's cells
split by every varying axis but the seed and the rate):

    located   the arm's edge of stability, read per seed from below (claim_measures.stable_edge),
              lies inside the swept rates (the arm trains at the lowest and fails somewhere
              above) between two rates at most MAX_GAP_DECADES apart
    passes    in at least half of the arm's seeds its edge is located

A comparison whose side selects a single rate names its condition itself and is not checked. A
best-rate comparison (`best_lr`) is checked for the same reason in its own terms
(`best_rate_lacks`): a side whose rate, chosen on the sweep's seeds, is an end of its sweep may
have its best rate beyond it, so no effect there is not no effect at its best.
When an arm fails the check, the comparison keeps every test of "agrees" (an effect shown is
shown) but loses its futility: its smallest effect of interest is set aside, so it can only say
"cannot tell from this design", with what the design lacks in its note, and no count of seeds
(more seeds of the same design do not show what its rates cannot).

The decision code calls `judged` once, on each comparison's result (ablate/claims/verdict.py compare).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from ablate.analysis.outcomes import FAILED, TRAINED
from ablate.claims.claim_measures import MEASURES, stable_edge

DESIGN_PREFIX = "cannot tell from this design"
# The design rule's rate spacing near an edge (docs/claims.md): about half a decade, the wider
# step of a 1-3-10 ladder (3e-3 to 1e-2 is 0.52 decades) included.
MAX_GAP_DECADES = math.log10(10 / 3)
LOCATED_SHARE = 0.5  # an arm passes when its edge is located in at least this share of its seeds
_SLACK = 1e-9  # a ladder's 10/3 step written in decimals passes


def judged(ctx, sides: dict, result):
    """`result` (a verdict.Result) as its design allows: unchanged, or without its futility and
    with a note naming what the design lacks."""
    lacking = lacks(ctx, result.compare, sides) or best_rate_lacks(result)
    if not lacking or result.test is None:
        return result
    note = "; ".join(x for x in (f"{DESIGN_PREFIX}: {lacking}", result.note) if x)
    return replace(result, compare=replace(result.compare, effect=None), test=replace(result.test, p_futile=None),
                   seeds_needed=None, seeds_needed_upper=None, note=note)


def lacks(ctx, c, sides: dict) -> str | None:
    """What the design lacks for comparison `c` to show its effect, in words; None when it passes
    or the check does not apply (not a stability measure, non-inferiority, no effect declared)."""
    m = MEASURES[c.measure]
    if not m.stability or c.effect is None or c.margin is not None:
        return None
    varying = [a for a in getattr(ctx.runs, "varying_axes", []) if a not in ("seed", "lr")]
    problems = []
    for side, cells in sides.items():
        cells = cells[cells["outcome"] != FAILED] if "outcome" in cells else cells
        if cells.empty or "lr" not in cells or cells["lr"].nunique() < 2:
            continue
        for arm, arm_cells in _arms(cells, varying):
            problem = arm_problem(arm_cells)
            if problem:
                problems.append(f"side {side}{arm}: {problem}")
    return "; ".join(problems) or None


def _arms(cells: pd.DataFrame, varying: list[str]):
    axes = [a for a in varying if a in cells and cells[a].nunique() > 1]
    if not axes:
        yield "", cells
        return
    for values, arm in cells.groupby(axes, sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        yield " (" + ", ".join(f"{a}={_plain(v)}" for a, v in zip(axes, values)) + ")", arm


def best_rate_lacks(result) -> str | None:
    """What a best-rate comparison's design lacks to say "no effect at the arms' best rates": a
    side whose chosen rate is an end of its sweep (on the sweep's seeds) may have its best rate
    beyond it, so its loss there is not its best and an effect could hide past the end."""
    if not result.compare.best_lr or (result.compare.effect is None and result.compare.margin is None):
        return None
    ends = [f"side {side}{' (' + what + ')' if what else ''}: its chosen rate {lr:g} is an end of its sweep (its best "
            "rate may lie beyond it)" for side, picks in sorted(result.best.items()) for what, lr, edge in picks if edge]
    return "; ".join(ends) or None


def arm_problem(cells: pd.DataFrame) -> str | None:
    """Why one arm's edge of stability is not located by its cells (seed, lr, outcome), or None."""
    rates = sorted(float(r) for r in cells["lr"].unique())
    where = {"inside": 0, "coarse": [], "above": 0, "below": 0}
    seeds = list(cells.groupby("seed", sort=True))
    for _, seed_cells in seeds:
        seed_cells = seed_cells.drop_duplicates("lr")
        edge, place = stable_edge(seed_cells["lr"].astype(float).tolist(),
                                  (seed_cells["outcome"] == TRAINED).tolist())
        if place != "inside":
            where[place] += 1
            continue
        above = min(float(r) for r in seed_cells["lr"] if math.log10(float(r)) > edge)
        gap = math.log10(above) - edge
        if gap <= MAX_GAP_DECADES + _SLACK:
            where["inside"] += 1
        else:
            where["coarse"].append((10 ** edge, above, gap))
    n = len(seeds)
    if n == 0 or where["inside"] >= LOCATED_SHARE * n:
        return None
    parts = []
    if where["above"]:
        parts.append(f"trains at every swept rate up to {rates[-1]:g} in {where['above']} of {n} seeds (its edge of "
                     "stability lies above the sweep)")
    if where["below"]:
        parts.append(f"fails at the lowest swept rate {rates[0]:g} in {where['below']} of {n} seeds "
                     "(its edge lies below the sweep)")
    if where["coarse"]:
        low, high, gap = where["coarse"][0]
        parts.append(f"its edge lies between {low:g} and {high:g} in {len(where['coarse'])} of {n} seeds, "
                     f"{gap:.2f} decades apart (the design rule: at most {MAX_GAP_DECADES:.2f}, a 1-3-10 ladder's step)")
    return "; ".join(parts)


def _plain(value):
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return int(value)
    return value.item() if hasattr(value, "item") else value
