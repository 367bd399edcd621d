"""A best-rate comparison read against every rate either arm could be best at.

`best_lr = true` chooses each arm's rate on the sweep's seeds and tests on fresh seeds. On a
coarse grid the choice can be wrong: when another swept rate is within noise of the chosen one,
the arm compared at its chosen rate may sit above its best, and "a at its best beats b at its
best" is then decided by b's bad luck (issue 52 measured 0.048-0.093 false "agrees" at 0.025).

So the comparison is an intersection-union test (Berger 1982) over pairings of CANDIDATE rates:
each arm's (each group's, where the arm leaves an axis open) chosen rate, every rate the choosing
seeds cannot tell from it (rate_choice.within_noise), and every rate a chosen one slipped against
on the fresh seeds (rate_choice.slipped_rates). The fresh seeds train at all of them. Where the
measure is the scored loss the rates were chosen by (Measure.minimised_by_best_rate), an arm at
its chosen rate scores no better than at its best, so only the other arm's candidates matter:
"a's best is lower" is shown when a at its chosen rate beats b at EVERY candidate of b (one of
them is b's best), and "short of the effect" when a at every candidate of a falls short against
b at its chosen rate. The interval's high end is the highest over the pairings that move b, its
low end the lowest over those that move a. For any other measure every pairing of both arms'
candidates is read for both. Whichever pairing holds the arms' true best rates had to pass its
own test, so a wrong verdict about the best rates stays within the level as long as each true
best rate is a candidate; a rate outside them was worse than the chosen one by a 95% interval on
the choosing seeds, and tests/ablate/claims/test_best_rate_bounds.py simulates the whole look
sequence on the issue's coarse grids to show the error held. Candidates added on the fresh
seeds' evidence (a slip) only add pairings, and the largest p over more pairings is never
smaller, so they cannot raise the error either.

Where no rate is within noise of a chosen one, there is one pairing and the test is the plain
comparison at the chosen rates.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from ablate.analysis.stats import Interval
from ablate.claims.claim_measures import plain_value
from ablate.claims.rate_choice import at_rate, group_label, groups_of
from ablate.claims.selection import COLUMN_OF

MAX_PAIRINGS = 64  # more pairings than this and the design is too coarse to read: cannot tell
_AXIS_OF = {column: key for key, column in COLUMN_OF.items()}  # a metrics column -> the grid's axis name


@dataclass(frozen=True)
class Candidates:
    """One group of an arm's cells (the values of the axes it leaves open) and the rates it may be
    best at, the chosen one first."""
    label: str
    selector: dict  # the group's axis values, as a look's selector names them
    rates: tuple


LOW, HIGH, BOTH = "low", "high", "both"  # which end of the interval a pairing bounds


@dataclass(frozen=True)
class Rival:
    """A pairing other than the chosen rates: where it differs, its seeds' values of a - b, and
    which end of the comparison's interval it bounds (LOW: it moves a; HIGH: it moves b)."""
    rates: tuple  # ((side, group label, lr), ...) for the groups not at their chosen rate
    seed_ids: tuple
    seed_values: tuple
    bounds: str = BOTH

    @property
    def text(self) -> str:
        return ", ".join(f"{side}{' ' + what if what else ''} at lr {lr:g}" for side, what, lr in self.rates)


def candidates(cells: pd.DataFrame, others: list[str], picks: list, near: list, slips: list) -> tuple:
    """Each group's Candidates: its chosen rate (picks, from verdict.at_best_lr), the rates near
    it (rate_choice.near_rates) and those it slipped against (rate_choice.slipped_rates)."""
    chosen = {what: lr for what, lr, _ in picks}
    extra: dict[str, list] = {}
    for what, _, other, *_ in [*near, *slips]:
        extra.setdefault(what, []).append(float(other))
    out = []
    for values, _ in groups_of(cells, others):
        label = group_label(others, values)
        if label not in chosen:
            continue
        values = values if isinstance(values, tuple) else (values,)
        selector = {_AXIS_OF.get(ax, ax): plain_value(v) for ax, v in zip(others, values)}
        rates = (chosen[label], *sorted(set(extra.get(label, [])) - {chosen[label]}))
        out.append(Candidates(label, selector, rates))
    return tuple(out)


def chosen_rates(cands: dict) -> dict:
    """{(side, group label): its chosen rate}: the main comparison's pairing."""
    return {(side, g.label): g.rates[0] for side, groups in cands.items() for g in groups}


def pairings(cands: dict, monotone: bool) -> list[tuple[dict, str]]:
    """Every pairing of candidate rates but the chosen one, [({(side, group label): lr}, which
    end it bounds)]: with `monotone`, those that move one side alone; else every product."""
    chosen = chosen_rates(cands)
    moves = [(side, LOW if side == "a" else HIGH) for side in cands] if monotone else [(None, BOTH)]
    out = []
    for moving, end in moves:
        slots = [((side, g.label), g.rates if moving in (None, side) else g.rates[:1])
                 for side, groups in cands.items() for g in groups]
        for combo in itertools.product(*[rates for _, rates in slots]):
            pairing = {slot: lr for (slot, _), lr in zip(slots, combo)}
            if pairing != chosen:
                out.append((pairing, end))
    return out


def n_pairings(cands: dict, monotone: bool) -> int:
    """How many pairings `pairings` reads, the chosen one included, without listing them."""
    sizes = {side: int(np.prod([len(g.rates) for g in groups] or [1])) for side, groups in cands.items()}
    if monotone:
        return 1 + sum(n - 1 for n in sizes.values())
    return int(np.prod(list(sizes.values()) or [1]))


def fresh_at(cells: pd.DataFrame, others: list[str], sweep, side: str, pairing: dict) -> pd.DataFrame:
    """The side's fresh cells (seeds outside the sweep) at the pairing's rate for each group."""
    kept = []
    for values, group in groups_of(cells, others):
        lr = pairing.get((side, group_label(others, values)))
        if lr is not None:
            kept.append(at_rate(group, lr, sweep))
    return pd.concat(kept) if kept else cells.iloc[0:0]


def moved_rates(pairing: dict, chosen: dict) -> tuple:
    """((side, group label, lr), ...) where `pairing` leaves the chosen rates (chosen_rates)."""
    return tuple((side, what, lr) for (side, what), lr in pairing.items() if lr != chosen[(side, what)])


def common_seeds(seeds, rivals: list[Rival]) -> set:
    """The seeds every pairing has: a look reads the same seeds at every pairing (a rate the look
    asked for and not yet trained holds the look back)."""
    have = set(seeds)
    for r in rivals:
        have &= set(r.seed_ids)
    return have


def keep_seeds(rival: Rival, seeds: list) -> Rival:
    value = dict(zip(rival.seed_ids, rival.seed_values))
    return replace(rival, seed_ids=tuple(seeds), seed_values=tuple(value[s] for s in seeds))


def worst_of(tests: list, ends: list, higher: bool):
    """One test from the main comparison's and its rivals' (decide.Test on the same seeds; `ends`:
    which end of the interval each rival bounds): the interval from the lowest low of the
    pairings that bound the low end to the highest high of those that bound the high end, each
    p the largest over the pairings that bound its side (a claim of "a higher" is shown by the
    low end, "lower" by the high end; futility by the other), the estimate the chosen rates'."""
    main = tests[0]
    if main is None or len(tests) == 1:
        return main
    low = [main] + [t for t, end in zip(tests[1:], ends) if end in (LOW, BOTH)]
    high = [main] + [t for t, end in zip(tests[1:], ends) if end in (HIGH, BOTH)]
    shows, short = (low, high) if higher else (high, low)

    def largest(group, name):  # a pairing with no test (every seed tied) shows nothing: its p counts as 1
        if getattr(main, name) is None:
            return None
        return max(1.0 if t is None or getattr(t, name) is None else getattr(t, name) for t in group)

    interval = main.interval
    if interval is not None and all(t is not None and t.interval is not None for t in tests):
        interval = Interval(min(t.interval.low for t in low), max(t.interval.high for t in high),
                            interval.confidence)
    return replace(main, interval=interval, p_value=largest(shows, "p_value"), p_beyond=largest(shows, "p_beyond"),
                   p_futile=largest(short, "p_futile"),
                   detail=f"{main.detail}; read against {len(tests) - 1} other pairing"
                          f"{'s' if len(tests) > 2 else ''} of near-best rates, each p the largest")


def rivals_text(rivals: tuple) -> str:
    """"also read with b at lr 0.003 (and 1 more pairing): every pairing must show it"."""
    if not rivals:
        return ""
    more = len(rivals) - 1
    return (f"also read with {rivals[0].text}" + (f" and {more} more pairing{'s' if more > 1 else ''}" if more else "")
            + ": a rate within noise of a chosen one, so the clause needs every pairing shown")
