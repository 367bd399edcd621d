"""Which of an arm's swept rates may be its best: the rates a best-rate comparison is read at.

`best_lr = true` chooses each arm's rate on the sweep's seeds (verdict.at_best_lr) and compares
the arms on fresh seeds. The fresh seeds free the test of the winner's curse, but not the choice
of its error: on a coarse grid, when another rate of the sweep is within noise of the chosen one,
the chosen rate may not be the arm's best. So for each arm this names the rates of its sweep
that the choosing seeds cannot tell from the chosen one: the paired gap (each choosing seed's
loss at the other rate minus at the chosen rate) whose two-sided 95% t interval reaches 0 (or,
with one choosing seed, any gap under 0.05 nats). tests/ablate/claims/test_rate_choice.py
simulates the coarse grid of issue 52.

The fresh seeds can also show a choice was wrong where the choosing seeds saw no doubt: a rate
near an arm's edge of stability trains well in some seeds and poorly in others, and three lucky
choosing seeds pick it (gelu-vs-relu, ReLU: 1e-2 scored 1.97 on seeds 0-2 against 2.01 at 3e-3,
then 2.2 on the fresh seeds). `slipped_rates` names each chosen rate whose fresh seeds score
worse than another rate did on the choosing seeds (Welch's one-sided t-test at the clauses'
level).

Both kinds of rate are tested on the fresh seeds beside the chosen one, and the comparison must
be shown at every pairing (ablate/claims/best_rate_bounds.py); the clause names them.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import special, stats

from ablate.analysis.stats import ONE_SIDED_ALPHA

NEAR_BEST = ("read at every pairing of near-best rates: another swept rate is within noise of a chosen one, so the "
             "fresh seeds were tested at both")
SLIPPED = ("read at every pairing of near-best rates: a chosen rate did not hold on the fresh seeds, so the rate it "
           "slipped against was tested too")
NEAR_LEVEL = 0.95  # the gap's two-sided interval: within noise while it reaches 0
ONE_SEED_GAP = 0.05  # nats: with one choosing seed, no spread: a closer rate is within noise


def within_noise(scores: np.ndarray) -> tuple[int, list[tuple[int, float, float]]]:
    """scores: (choosing seeds, rates) of scored loss. (the chosen rate's column: the lowest
    mean, [(another column, its mean gap to the chosen, the gap's interval half-width)]) for the
    rates the seeds cannot tell from the chosen one."""
    means = np.nanmean(scores, axis=0)
    chosen = int(np.nanargmin(means))
    near = []
    for j in range(scores.shape[1]):
        if j == chosen:
            continue
        gap = scores[:, j] - scores[:, chosen]
        gap = gap[np.isfinite(gap)]
        if gap.size == 0:
            continue
        if gap.size == 1:
            if gap[0] < ONE_SEED_GAP:
                near.append((j, float(gap[0]), math.inf))
            continue
        half = float(special.stdtrit(gap.size - 1, 0.5 + NEAR_LEVEL / 2)) * float(gap.std(ddof=1)) / math.sqrt(gap.size)
        if float(gap.mean()) - half <= 0:
            near.append((j, float(gap.mean()), half))
    return chosen, near


def group_label(others: list[str], values) -> str:
    """An arm's group in words, "ax value, ax value" (values: a groupby key over `others`)."""
    return ", ".join(f"{ax} {v}" for ax, v in zip(others, values if isinstance(values, tuple) else (values,)))


def open_axes(cells: pd.DataFrame, varying: list[str]) -> list[str]:
    """The axes an arm leaves open beside seed and lr: each value of them gets its own best rate."""
    return [ax for ax in varying if ax not in ("seed", "lr") and ax in cells and cells[ax].nunique(dropna=False) > 1]


def groups_of(cells: pd.DataFrame, others: list[str]):
    """(axis values, cells) for each group of an arm's cells (`others`: the axes it leaves open,
    open_axes); the whole arm as one group when it leaves none."""
    return cells.groupby(others, dropna=False, sort=True) if others else [((), cells)]


def at_rate(group: pd.DataFrame, lr: float, leave_out=()) -> pd.DataFrame:
    """A group's cells at `lr`, but those of the seeds `leave_out` (the seeds that chose it)."""
    kept = group[~group["seed"].isin(list(leave_out))] if len(leave_out) else group
    return kept[np.isclose(kept["lr"].astype(float), lr, rtol=1e-9)]


def near_rates(cells: pd.DataFrame, others: list[str], choose_on) -> list[tuple[str, float, float, float]]:
    """[(group label, chosen lr, a rate within noise of it, their gap in nats)] for each group of
    an arm's cells (the other axes it leaves open), read on the choosing seeds `choose_on`."""
    out = []
    for values, group in groups_of(cells, others):
        choosing = group[group["seed"].isin(list(choose_on))]
        table = pd.to_numeric(choosing["scored_loss"], errors="coerce").groupby(
            [choosing["seed"], choosing["lr"].astype(float)]).mean().unstack("lr")
        if table.empty or table.shape[1] < 2 or table.isna().all().all():
            continue
        chosen, near = within_noise(table.to_numpy(dtype=float))
        label = group_label(others, values)
        rates = list(table.columns)
        out += [(label, float(rates[chosen]), float(rates[j]), gap) for j, gap, _ in near]
    return out


def near_text(side: str, near: list) -> str:
    """"a's lr 0.003 within noise of lr 0.01 (+0.012 nats on the choosing seeds): both tested"."""
    parts = [f"{what + ': ' if what else ''}lr {lr:g} within noise of lr {other:g} ({gap:+.3g} nats on the "
             f"choosing seeds)" for what, lr, other, gap in near]
    return (f"{side}'s chosen rate may not be its best, so both are tested: " + "; ".join(parts)) if parts else ""


def slipped_rates(cells: pd.DataFrame, others: list[str], choose_on, chosen: dict[str, float]) -> list[tuple]:
    """[(group label, chosen lr, another rate, the fresh seeds' mean at the chosen one, the
    choosing seeds' mean at the other)] where the fresh seeds at the chosen rate score worse than
    the choosing seeds did at the other rate, by Welch's one-sided t-test at ONE_SIDED_ALPHA.
    `chosen`: each group's rate as verdict.at_best_lr chose it, by group_label."""
    out = []
    for values, group in groups_of(cells, others):
        label = group_label(others, values)
        if label not in chosen:
            continue
        score = pd.to_numeric(group["scored_loss"], errors="coerce")
        lr = group["lr"].astype(float)
        choosing = group["seed"].isin(list(choose_on))
        fresh = score[~choosing & np.isclose(lr, chosen[label], rtol=1e-9)].dropna().to_numpy(dtype=float)
        for other in sorted(set(lr[choosing]) - {chosen[label]}):
            swept = score[choosing & np.isclose(lr, other, rtol=1e-9)].dropna().to_numpy(dtype=float)
            if fresh.size < 2 or swept.size < 2 or not (fresh.std() > 0 or swept.std() > 0):
                continue
            p = stats.ttest_ind(fresh, swept, equal_var=False, alternative="greater").pvalue
            if p < ONE_SIDED_ALPHA:
                out.append((label, chosen[label], float(other), float(fresh.mean()), float(swept.mean())))
    return out


def slipped_text(side: str, slips: list) -> str:
    """"b's chosen rate did not hold on the fresh seeds: lr 0.01 scored 2.2 there, against 2.01 at
    lr 0.003 on the choosing seeds"."""
    parts = [f"{what + ': ' if what else ''}lr {lr:g} scored {fresh:.3g} there, against {swept:.3g} at lr {other:g} on "
             "the choosing seeds" for what, lr, other, fresh, swept in slips]
    return (f"{side}'s chosen rate did not hold on the fresh seeds, so the other is tested too: "
            + "; ".join(parts)) if parts else ""
