"""The measures a claim compares, registered by name: one function per way a claim is stated.

A measure turns the cells one side of a comparison selects into one number per *pairing
key*: the cell's values on the axes that vary in the grid, minus the axes that tell the two
sides apart and minus the axes the measure itself aggregates over (`consumes`, e.g. `lr` for
LR sensitivity). The key always starts with the seed: same seed = same initial weights and
batches, so the engine (verdict.py) pairs the two sides key by key.

    @measure("my_measure", unit="nats", description="...")
    def my_measure(ctx, cells, params):        # cells: the cell_metrics rows of one key
        return float(...)                      # NaN: no value for this key

`test` names the kind of the paired values (ablate/claims/decide.py): "t" (a continuous measure) and
"binary" (0/1 outcomes, read per seed as the share of failed cells) are both tested by the exact
sign test about the median seed (a - b, against a bound, or within a non-inferiority margin);
"exact" is a deterministic count, compared without a test. `requires = {"lr": 5}` refuses, when the claim
is loaded, a comparison whose side has fewer distinct values of that axis on its grid: a measure
that cannot vary there would only ever say "cannot tell".

A measure reads the step it names or counts the key as missing, with the reason
(`raise Missing("...")`): it never falls back to another step in silence. Loss measures read
`scored_loss` (analysis/outcomes.py): a failed training run scores one way, never dropped.
Nothing here trains or imports the model; it reads what the grid wrote.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from ablate.analysis.load import Runs, layer_columns
from ablate.analysis.lr_sensitivity import DEFAULT_TOLERANCE, MIN_LRS, basin, lr_curve, per_seed_sensitivity
from ablate.analysis.outcomes import (DEAD, DEAD_RULE, DIVERGED, FAILED, FAILED_TRAINING, GRAD_FLOOR, SCORING_RULE,
                                      TRAINED, failure_kind)
from ablate.core.registry import Registry


class MeasureUnavailable(ValueError):
    """The runs lack what the measure reads (a metric that was not logged); the message says what."""


class Missing(ValueError):
    """One key has no value (a step it names was not logged, a cell did not finish): counted and named."""


@dataclass
class Context:
    """What measures read: the Runs and their cell_metrics frame, steps indexed by cell."""

    runs: Runs
    metrics: pd.DataFrame
    _by_cell: dict = field(default_factory=dict)

    def steps(self, cell_id: str) -> pd.DataFrame:
        if not self._by_cell and not self.runs.steps.empty:
            self._by_cell.update(dict(tuple(self.runs.steps.groupby("cell_id", sort=False))))
        return self._by_cell.get(cell_id, pd.DataFrame())


@dataclass(frozen=True)
class Measure:
    name: str
    fn: Callable  # (ctx, cells of one key, params) -> float
    unit: str
    test: str  # "t", "binary" or "exact"
    consumes: tuple  # axes aggregated over inside one key (not part of the pairing key)
    description: str
    per_cell: bool  # fn is called once per cell (else once per key, with all its cells)
    requires: dict  # axis -> the fewest distinct values a side needs on its grid
    higher_is_worse: bool  # for non-inferiority: which way "worse" points
    # Reads where runs stop training as the rate rises: its futility needs each arm's edge of
    # stability bracketed by the swept rates (ablate/claims/design_checks.py).
    stability: bool = False
    # The `params` keys it reads (a claim naming another is refused as it loads); None: undeclared
    # (a plugin's measure), any key passes.
    params: tuple | None = None
    # Its value is the cell's scored loss, what a best rate is chosen by: an arm at any rate scores
    # no better than at its best, so a best-rate test moves one arm's rates at a time
    # (ablate/claims/best_rate_bounds.py); else it reads every pairing of both arms' rates.
    minimised_by_best_rate: bool = False


MEASURES: Registry[Measure] = Registry("measure")
TESTS = ("t", "binary", "exact")


def measure(name: str, unit: str, description: str, test: str = "t", consumes: tuple = (),
            requires: dict | None = None, higher_is_worse: bool = True, stability: bool = False,
            params: tuple | None = (), minimised_by_best_rate: bool = False):
    """Register a measure under `name` (see the module docstring)."""
    if test not in TESTS:
        raise ValueError(f"test {test!r}; valid: {', '.join(TESTS)}")

    def register(fn):
        MEASURES.register(name, Measure(name, fn, unit, test, tuple(consumes), description, per_cell=not consumes,
                                        requires=dict(requires or {}), higher_is_worse=higher_is_worse,
                                        stability=stability, params=params,
                                        minimised_by_best_rate=minimised_by_best_rate),
                          origin=fn.__module__)
        return fn

    return register


def values_by_key(ctx: Context, cells: pd.DataFrame, key_axes: list[str], m: Measure, params: dict,
                  missing: dict | None = None) -> pd.Series:
    """{key tuple: value} for the selected cells; a key without a value goes into `missing`
    ({key: reason}) instead. key_axes start with seed."""
    out = {}
    missing = {} if missing is None else missing
    if cells.empty:
        return pd.Series(out, dtype=float)
    keys = [tuple(plain_value(v) for v in row) for row in cells[key_axes].itertuples(index=False)]
    grouped: dict[tuple, list[int]] = {}
    for position, key in enumerate(keys):
        grouped.setdefault(key, []).append(position)
    for key, positions in grouped.items():
        members = cells.iloc[positions]
        if m.per_cell:
            if len(members) > 1:  # the selection leaves an axis open: the key does not name one cell
                raise MeasureUnavailable(f"{len(members)} cells share the pairing key {key}; the comparison's "
                                         "selectors must fix every axis but the seed")
        try:
            value = m.fn(ctx, members.iloc[0], params) if m.per_cell else m.fn(ctx, members, params)
        except Missing as e:
            missing[key] = str(e)
            continue
        if value is not None and math.isfinite(value):
            out[key] = float(value)
        else:
            missing[key] = "no value"
    return pd.Series(out, dtype=float)


def plain_value(value):
    """A numpy scalar as the Python number it holds (a key, a seed id, a selector value); else as is."""
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _row_at(steps: pd.DataFrame, step: int, columns: list[str]) -> pd.Series:
    """The logged row of `step` with every column finite, or Missing naming what lacks."""
    if steps.empty or "step" not in steps:
        raise Missing("no logged steps")
    rows = steps[steps["step"].to_numpy() == step]
    if rows.empty:
        raise Missing(f"no row for step {step} in metrics.jsonl")
    row = rows.iloc[0]
    if not np.isfinite(row[columns].to_numpy(dtype=float)).all():
        raise Missing(f"step {step} has a non-finite value among {columns[0]} and its {len(columns) - 1} siblings")
    return row


def _need(columns: list[str], what: str) -> None:
    if not columns:
        raise MeasureUnavailable(f"the runs do not log {what}")


def _outcome(cell) -> str:
    """The cell's training outcome; Missing when it has none (it did not finish)."""
    outcome = str(cell.get("outcome", FAILED)) if hasattr(cell, "get") else FAILED
    if outcome == FAILED:
        raise Missing(f"cell {cell['cell_id']} did not finish (status {cell['status']})")
    return outcome


# ------------------------------------------------------------------------------- losses


@measure("final_val_loss", "nats", "validation loss at the end of training (summary.json final_val_loss); a "
         "failed training run (plateaued or diverged) scores the unigram entropy: " + SCORING_RULE,
         minimised_by_best_rate=True)
def final_val_loss(ctx, cell, params) -> float:
    _outcome(cell)
    return float(cell["scored_loss"])


@measure("gain_per_param", "nats per million parameters",
         "scored final val loss of the smaller setting minus the larger's, per million parameters added, between "
         "the two values of `axis` one side selects", consumes=("mlp_ratio",), params=("axis",))
def gain_per_param(ctx, cells, params) -> float:
    axis = params.get("axis", "mlp_ratio")
    done = cells[cells["outcome"] != FAILED].sort_values(axis)
    if len(done) != 2 or done[axis].nunique() != 2:
        raise Missing(f"needs one finished cell at each of two {axis} values; has {len(done)}")
    small, large = done.iloc[0], done.iloc[1]
    added = (float(large["params"]) - float(small["params"])) / 1e6
    return (float(small["scored_loss"]) - float(large["scored_loss"])) / added if added else float("nan")


@measure("params", "parameters", "the model's parameter count (config.json): exact, nothing sampled; matmul "
         "FLOPs per token are 2 per weight forward and 6 per weight in training, so they compare alike",
         test="exact")
def params(ctx, cell, params) -> float:
    return float(cell["params"])


# ------------------------------------------------------------------------- learning rate


def _sweep_curve(cells: pd.DataFrame) -> pd.DataFrame:
    if cells["lr"].nunique() < MIN_LRS:
        raise MeasureUnavailable(f"LR sensitivity needs at least {MIN_LRS} learning rates; the selection has "
                                 f"{cells['lr'].nunique()}")
    return lr_curve(cells)


@measure("lr_sensitivity", "nats", "Wortsman et al. (2023): mean over the swept lrs of min(scored loss, loss at "
         "init) minus the best (analysis/lr_sensitivity.py), per seed", consumes=("lr",), requires={"lr": MIN_LRS})
def lr_sensitivity(ctx, cells, params) -> float:
    per_seed = per_seed_sensitivity(_sweep_curve(cells))
    if len(per_seed) != 1:
        raise Missing("not every swept lr has a result")
    return float(per_seed["lr_sensitivity"].iloc[0])


# A basin measured in decades needs rates finer than the tolerance's reach: on 3 or 4 rates half
# a decade apart it is 0 for nearly every seed on both sides, a measure that cannot vary.
@measure("basin_width", "decades of lr", "how many decades of the swept lrs around a seed's best keep its clipped "
         f"loss within `tolerance` (default {DEFAULT_TOLERANCE}) nats of that best", consumes=("lr",),
         requires={"lr": 5}, higher_is_worse=False, params=("tolerance",))
def basin_width(ctx, cells, params) -> float:
    curve = _sweep_curve(cells)
    if curve["seed"].nunique() != 1 or not np.isfinite(curve["clipped"]).all() or len(curve) < cells["lr"].nunique():
        raise Missing("not every swept lr has a result")
    by_lr = curve.rename(columns={"clipped": "mean_clipped"})[["lr", "mean_clipped"]].sort_values("lr")
    best = float(by_lr.loc[by_lr["mean_clipped"].idxmin(), "lr"])
    low, high, _ = basin(by_lr.reset_index(drop=True), best, float(params.get("tolerance", DEFAULT_TOLERANCE)))
    return math.log10(high / low)


# ------------------------------------------------------------------------------ gradients

EARLY_STEPS = 20  # "the first steps": steps 1 to this, unless a comparison says `until`


REACH_PARAMS = ("from", "phase", "until")  # what _reach and _reach_at read


def _reach(steps: pd.DataFrame, params) -> tuple[np.ndarray, np.ndarray]:
    """(steps, log10 of the bottom's gradient norm over the top block's) for each logged step."""
    layers = layer_columns(steps, "grad_norm")
    bottom = "grad_norm/embed" if params.get("from", "layer_0") == "embed" else (layers[0] if layers else None)
    _need(layers if bottom in steps else [], "grad_norm/embed and grad_norm/layer_{i}")
    # A gradient that underflowed to 0 is the strongest evidence of loss, not a missing value.
    low = np.maximum(steps[bottom].to_numpy(dtype=float), GRAD_FLOOR)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log10(low / steps[layers[-1]].to_numpy(dtype=float))
    return steps["step"].to_numpy(), ratio


def _reach_at(steps: pd.DataFrame, params) -> float:
    step, ratio = _reach(steps, params)
    ok = np.isfinite(ratio)
    phase = params.get("phase", "init")
    if phase == "init":
        at_zero = ok & (step == 0)
        if not at_zero.any():
            raise Missing("no finite gradient norms at step 0")
        return float(ratio[at_zero][0])
    until = int(params.get("until", EARLY_STEPS)) if phase == "early" else np.inf
    window = ok & (step > 0) & (step <= until)
    if not window.any():
        raise Missing(f"no finite gradient norms in steps 1-{until}")
    return float(np.median(ratio[window]))


@measure("grad_reach", "log10 ratio", "log10 of the bottom's gradient norm over the top block's "
         "(grad_norm/layer_{top}): the bottom is grad_norm/layer_0 (`from = \"layer_0\"`, default) or "
         "grad_norm/embed (`from = \"embed\"`; with tied embeddings it includes the output head's gradient); at "
         f"step 0 (phase init), the median over steps 1-{EARLY_STEPS} (phase early; `until` sets the end) or over "
         "every later logged step (phase train)", higher_is_worse=False, params=REACH_PARAMS)
def grad_reach(ctx, cell, params) -> float:
    return _reach_at(ctx.steps(cell["cell_id"]), params)


@measure("grad_imbalance", "log10 ratio", "|log10| of the first block's gradient norm over the top block's: how far "
         "the gradient departs from even across depth, whether it explodes or vanishes at the bottom (phases as "
         "grad_reach)", params=REACH_PARAMS)
def grad_imbalance(ctx, cell, params) -> float:
    return abs(_reach_at(ctx.steps(cell["cell_id"]), params))


@measure("grad_spread", "log10 max/min", "log10 of the max/min ratio of the per-layer gradient norms at a phase "
         "(init, mid or end: analysis/metrics.py)", params=("phase",))
def grad_spread(ctx, cell, params) -> float:
    column = f"grad_ratio_{params.get('phase', 'end')}"
    if column not in cell:
        raise MeasureUnavailable("the runs do not log grad_norm/layer_{i}")
    value = float(cell[column])
    return math.log10(value) if value > 0 else float("nan")


@measure("init_grad_slope", "log10 per layer", "least-squares slope of log10 grad_norm/layer_{i}/<part> against "
         "the layer index at step 0 (Xiong et al. 2020: rising for post-LN, flat for pre-LN)", params=("part",))
def init_grad_slope(ctx, cell, params) -> float:
    steps = ctx.steps(cell["cell_id"])
    part = params.get("part", "mlp")
    columns = layer_columns(steps, "grad_norm") if part == "block" else sorted(
        (c for c in steps.columns if str(c).startswith("grad_norm/layer_") and str(c).endswith(f"/{part}")),
        key=lambda c: int(str(c).split("/")[1].split("_")[1]))
    _need(columns, f"grad_norm/layer_{{i}}/{part}")
    values = _row_at(steps, 0, columns)[columns].to_numpy(dtype=float)
    if len(values) < 2 or (values <= 0).any():
        raise Missing("a zero gradient norm at step 0")
    return float(np.polyfit(np.arange(len(values)), np.log10(values), 1)[0])


# ------------------------------------------------------------------------ inside a block


@measure("block_change", "relative change", "mean over layers of block_change/layer_{i} = RMS(block output - block "
         "input) / RMS(block input) at step 0")
def block_change(ctx, cell, params) -> float:
    steps = ctx.steps(cell["cell_id"])
    # Whether the runs log it is the grid's question, not this cell's: a cell whose rows were
    # unreadable is missing a value, not proof that nothing logs the probe.
    columns = layer_columns(ctx.runs.steps, "block_change")
    _need(columns, "block_change/layer_{i} (the probe of the relative change through a block)")
    if not set(columns) <= set(steps.columns):
        raise Missing(f"cell {cell['cell_id']} has no readable block_change row")
    return float(_row_at(steps, 0, columns)[columns].to_numpy(dtype=float).mean())


@measure("attn_logit_max", "log10 logit", "log10 of the largest attn_logit_max/layer_{i} over layers and logged "
         "steps (diverged cells: up to their divergence)")
def attn_logit_max(ctx, cell, params) -> float:
    _outcome(cell)
    steps = ctx.steps(cell["cell_id"])
    columns = layer_columns(steps, "attn_logit_max")
    _need(columns, "attn_logit_max/layer_{i} (the stability probes)")
    values = steps[columns].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    return math.log10(values.max()) if values.size and values.max() > 0 else float("nan")


@measure("act_rms_growth", "log10 ratio", "log10 of the largest act_norm/layer_{i} at the last logged step whose "
         "values are all finite (before the first non-finite one) over the largest at step 0")
def act_rms_growth(ctx, cell, params) -> float:
    steps = ctx.steps(cell["cell_id"])
    columns = layer_columns(steps, "act_norm")
    _need(columns, "act_norm/layer_{i}")
    start = float(_row_at(steps, 0, columns)[columns].max())
    values = steps[columns].to_numpy(dtype=float)
    finite = np.isfinite(values).all(axis=1)
    bad = np.flatnonzero(~finite)
    last = (bad[0] - 1) if bad.size else len(values) - 1
    if last < 0 or not finite[last] or start <= 0:
        raise Missing("no finite activation RMS before the first non-finite value")
    return math.log10(float(values[last].max()) / start)


# ------------------------------------------------------------------------------ stability


# The measures that count diverged runs (a claim's comparison of them notes when those runs went non-finite).
DIVERGED_MEASURE, FAILED_MEASURE = "diverged", "failed"
COUNTS_DIVERGED = (DIVERGED_MEASURE, FAILED_MEASURE)


@measure(DIVERGED_MEASURE, "share diverged", "1 when the run diverged (a non-finite or exploding loss), 0 when it "
         "completed (trained or plateaued)", test="binary", stability=True)
def diverged(ctx, cell, params) -> float:
    return 1.0 if _outcome(cell) == DIVERGED else 0.0


@measure(FAILED_MEASURE, "share failed", "1 when the training run failed (plateaued on the unigram entropy or "
         "diverged: analysis/outcomes.py), 0 when it trained", test="binary", stability=True)
def failed(ctx, cell, params) -> float:
    return 1.0 if _outcome(cell) in FAILED_TRAINING else 0.0


@measure("dead", "share dead", "1 when the training run is dead (analysis/outcomes.py: " + DEAD_RULE + "), 0 when "
         "it trained, is slow or diverged", test="binary", stability=True)
def dead(ctx, cell, params) -> float:
    outcome = _outcome(cell)
    return 1.0 if failure_kind(outcome, ctx.steps(cell["cell_id"])) == DEAD else 0.0


def first_nonfinite_step(ctx: Context, cell_id: str) -> int | None:
    """The first logged step whose loss or total gradient norm is not finite (null), or None."""
    steps = ctx.steps(cell_id)
    columns = [c for c in ("loss", "grad_norm") if c in steps]
    if steps.empty or not columns:
        return None
    bad = ~np.isfinite(steps[columns].to_numpy(dtype=float)).all(axis=1)
    return int(steps["step"].to_numpy()[bad][0]) if bad.any() else None


# ------------------------------------------------------------------ largest stable rate

MIN_LADDER = 3  # rates a ladder needs for an edge to lie between two of them


def stable_edge(rates, trained) -> tuple[float, str]:
    """(log10 of the largest stable rate, where it lies) from one seed's ladder: `rates` and
    whether the run trained at each. Wortsman et al. 2023's largest rate at which the run trains,
    read from below: the largest rate under the lowest rate where it fails, so a lucky run above
    a failure does not count. Censored ends are scored, never dropped: a run that trains at every
    rate scores the top rate ("above": its edge is at or beyond it); one that fails at the lowest
    scores one ladder step under it ("below"). Otherwise "inside"."""
    order = np.argsort(np.asarray(rates, dtype=float))
    logs = np.log10(np.asarray(rates, dtype=float)[order])
    ok = np.asarray(trained, dtype=bool)[order]
    if ok.all():
        return float(logs[-1]), "above"
    first_fail = int(np.argmin(ok))
    if first_fail == 0:
        return float(2 * logs[0] - logs[1]), "below"
    return float(logs[first_fail - 1]), "inside"


def _ladder(cells: pd.DataFrame) -> tuple[list, list]:
    """One seed's (rates, trained) over the cells of a key; Missing if its ladder is short or a rate has no result."""
    if cells["lr"].nunique() < MIN_LADDER:
        # One seed's cells, not the grid's: the claim's load refuses a side with too few rates
        # (`requires`), so here the seed's ladder is unfinished (a look killed mid-way): this key
        # only is missing, not the whole comparison.
        raise Missing(f"the largest stable rate needs a ladder of at least {MIN_LADDER} learning rates; the seed has "
                      f"{cells['lr'].nunique()}")
    if cells["lr"].duplicated().any():
        raise MeasureUnavailable("several cells share a learning rate in one key: the comparison's selectors must fix "
                                 "every axis but the seed and the rate")
    if (cells["outcome"] == FAILED).any():
        raise Missing("a rate of the ladder did not finish")
    return cells["lr"].astype(float).tolist(), (cells["outcome"] == TRAINED).tolist()


@measure("largest_stable_lr", "log10 lr", "Wortsman et al. (2023): log10 of the largest rate of the swept ladder at "
         "which the seed's run trains, read from below (the rate under the lowest one where it fails); a run that "
         "trains at every rate scores the top rate, one that fails at the lowest one ladder step under it",
         consumes=("lr",), requires={"lr": MIN_LADDER}, higher_is_worse=False, stability=True)
def largest_stable_lr(ctx, cells, params) -> float:
    return stable_edge(*_ladder(cells))[0]


@measure("warmup_lr_gain", "log10 lr", "log10 of the factor by which warmup raises the seed's largest stable rate "
         "(largest_stable_lr with the longest warmup the key has, minus without warmup)", consumes=("lr", "warmup"),
         requires={"lr": MIN_LADDER, "warmup": 2}, higher_is_worse=False, stability=True)
def warmup_lr_gain(ctx, cells, params) -> float:
    warmups = sorted(cells["warmup"].astype(int).unique())
    if len(warmups) < 2 or warmups[0] != 0:
        raise Missing(f"needs cells without warmup and with it; has warmups {warmups}")
    with_, without = (cells[cells["warmup"].astype(int) == w] for w in (warmups[-1], 0))
    return stable_edge(*_ladder(with_))[0] - stable_edge(*_ladder(without))[0]
