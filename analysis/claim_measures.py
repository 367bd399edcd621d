"""The measures a claim compares, registered by name: one function per way a claim is stated.

A measure turns the cells one side of a comparison selects into one number per *pairing
key*: the cell's values on the axes that vary in the grid, minus the axes that tell the two
sides apart and minus the axes the measure itself aggregates over (`consumes`, e.g. `lr` for
LR sensitivity). The key always starts with the seed: same seed = same initial weights and
batches, so the engine (claims.py) pairs the two sides key by key.

    @measure("my_measure", unit="nats", description="...")
    def my_measure(ctx, cells, params):        # cells: the cell_metrics rows of one key
        return float(...)                      # NaN: no value for this key

`test` names how the engine tests the paired values: "t" (paired t-test on the differences,
TOST for an equivalence) or "binary" (0/1 values: exact McNemar test on discordant pairs).
Nothing here trains or imports the model; it reads what the grid wrote.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd

from ablate.analysis.load import DONE, Runs, layer_columns
from ablate.analysis.lr_sensitivity import DEFAULT_TOLERANCE, MIN_LRS, basin, lr_curve, per_seed_sensitivity


class MeasureUnavailable(ValueError):
    """The runs lack what the measure reads (a metric that was not logged); the message says what."""


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
    test: str  # "t" or "binary"
    consumes: tuple  # axes aggregated over inside one key (not part of the pairing key)
    description: str
    per_cell: bool  # fn is called once per cell (else once per key, with all its cells)


MEASURES: dict[str, Measure] = {}
TESTS = ("t", "binary")


def measure(name: str, unit: str, description: str, test: str = "t", consumes: tuple = ()):
    """Register a measure under `name` (see the module docstring)."""
    if test not in TESTS:
        raise ValueError(f"test {test!r}; valid: {', '.join(TESTS)}")

    def register(fn):
        if name in MEASURES:
            raise ValueError(f"measure {name!r} is already registered")
        MEASURES[name] = Measure(name, fn, unit, test, tuple(consumes), description, per_cell=not consumes)
        return fn

    return register


def values_by_key(ctx: Context, cells: pd.DataFrame, key_axes: list[str], m: Measure, params: dict) -> pd.Series:
    """{key tuple: value} for the selected cells, NaN values dropped. key_axes start with seed."""
    out = {}
    if cells.empty:
        return pd.Series(out, dtype=float)
    keys = [tuple(_plain(v) for v in row) for row in cells[key_axes].itertuples(index=False)]
    grouped: dict[tuple, list[int]] = {}
    for position, key in enumerate(keys):
        grouped.setdefault(key, []).append(position)
    for key, positions in grouped.items():
        members = cells.iloc[positions]
        if m.per_cell:
            if len(members) > 1:  # the selection leaves an axis open: the key does not name one cell
                raise MeasureUnavailable(f"{len(members)} cells share the pairing key {key}; the comparison's "
                                         "selectors must fix every axis but the seed")
            value = m.fn(ctx, members.iloc[0], params)
        else:
            value = m.fn(ctx, members, params)
        if value is not None and math.isfinite(value):
            out[key] = float(value)
    return pd.Series(out, dtype=float)


def _plain(value):
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _first_complete_row(steps: pd.DataFrame, columns: list[str]) -> pd.Series | None:
    if steps.empty or not columns or not set(columns) <= set(steps.columns):
        return None
    complete = steps[np.isfinite(steps[columns].to_numpy(dtype=float)).all(axis=1)]
    return complete.iloc[0] if not complete.empty else None


def _need(columns: list[str], what: str) -> None:
    if not columns:
        raise MeasureUnavailable(f"the runs do not log {what}")


# ------------------------------------------------------------------------------- losses


@measure("final_val_loss", "nats", "validation loss at the end of training (summary.json final_val_loss); "
         "diverged and failed cells have none")
def final_val_loss(ctx, cell, params) -> float:
    if cell["status"] != "completed":
        return float("nan")
    return float(cell["final_val_loss"])


@measure("gain_per_param", "nats per million parameters",
         "final val loss of the smaller setting minus the larger's, per million parameters added, between "
         "the two values of `axis` one side selects", consumes=("mlp_ratio",))
def gain_per_param(ctx, cells, params) -> float:
    axis = params.get("axis", "mlp_ratio")
    done = cells[cells["status"] == "completed"].sort_values(axis)
    if len(done) != 2 or done[axis].nunique() != 2:
        return float("nan")
    small, large = done.iloc[0], done.iloc[1]
    added = (float(large["params"]) - float(small["params"])) / 1e6
    return (float(small["final_val_loss"]) - float(large["final_val_loss"])) / added if added else float("nan")


# ------------------------------------------------------------------------- learning rate


def _sweep_curve(cells: pd.DataFrame) -> pd.DataFrame:
    if cells["lr"].nunique() < MIN_LRS:
        raise MeasureUnavailable(f"LR sensitivity needs at least {MIN_LRS} learning rates; the selection has "
                                 f"{cells['lr'].nunique()}")
    return lr_curve(cells)


@measure("lr_sensitivity", "nats", "Wortsman et al. (2023): mean over the swept lrs of min(final val loss, loss at "
         "init) minus the best (analysis/lr_sensitivity.py), per seed", consumes=("lr",))
def lr_sensitivity(ctx, cells, params) -> float:
    per_seed = per_seed_sensitivity(_sweep_curve(cells))
    return float(per_seed["lr_sensitivity"].iloc[0]) if len(per_seed) == 1 else float("nan")


@measure("basin_width", "decades of lr", "how many decades of the swept lrs around a seed's best keep its clipped "
         f"loss within `tolerance` (default {DEFAULT_TOLERANCE}) nats of that best", consumes=("lr",))
def basin_width(ctx, cells, params) -> float:
    curve = _sweep_curve(cells)
    if curve["seed"].nunique() != 1 or not np.isfinite(curve["clipped"]).all() or len(curve) < cells["lr"].nunique():
        return float("nan")
    by_lr = curve.rename(columns={"clipped": "mean_clipped"})[["lr", "mean_clipped"]].sort_values("lr")
    best = float(by_lr.loc[by_lr["mean_clipped"].idxmin(), "lr"])
    low, high, _ = basin(by_lr.reset_index(drop=True), best, float(params.get("tolerance", DEFAULT_TOLERANCE)))
    return math.log10(high / low)


# ------------------------------------------------------------------------------ gradients

GRAD_FLOOR = 1e-30  # gradient norms below this (0 included) count as this


@measure("grad_reach", "log10 ratio", "log10 of the bottom's gradient norm over the top block's "
         "(grad_norm/layer_{top}): the bottom is grad_norm/layer_0 (`from = \"layer_0\"`, default) or "
         "grad_norm/embed (`from = \"embed\"`; with tied embeddings it includes the output head's gradient); at "
         "step 0 (phase init) or the median over the later logged steps (phase train)")
def grad_reach(ctx, cell, params) -> float:
    steps = ctx.steps(cell["cell_id"])
    layers = layer_columns(steps, "grad_norm")
    bottom = "grad_norm/embed" if params.get("from", "layer_0") == "embed" else (layers[0] if layers else None)
    _need(layers if bottom in steps else [], "grad_norm/embed and grad_norm/layer_{i}")
    # A gradient that underflowed to 0 is the strongest evidence of loss, not a missing value.
    low = np.maximum(steps[bottom].to_numpy(dtype=float), GRAD_FLOOR)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.log10(low / steps[layers[-1]].to_numpy(dtype=float))
    ok = np.isfinite(ratio)
    if params.get("phase", "init") == "init":
        at_zero = ok & (steps["step"].to_numpy() == 0)
        return float(ratio[at_zero][0]) if at_zero.any() else float("nan")
    later = ok & (steps["step"].to_numpy() > 0)
    return float(np.median(ratio[later])) if later.any() else float("nan")


@measure("grad_spread", "log10 max/min", "log10 of the max/min ratio of the per-layer gradient norms at a phase "
         "(init, mid or end: analysis/metrics.py)")
def grad_spread(ctx, cell, params) -> float:
    column = f"grad_ratio_{params.get('phase', 'end')}"
    if column not in cell:
        raise MeasureUnavailable("the runs do not log grad_norm/layer_{i}")
    value = float(cell[column])
    return math.log10(value) if value > 0 else float("nan")


@measure("init_grad_slope", "log10 per layer", "least-squares slope of log10 grad_norm/layer_{i}/<part> against "
         "the layer index at the first logged step (Xiong et al. 2020: rising for post-LN, flat for pre-LN)")
def init_grad_slope(ctx, cell, params) -> float:
    steps = ctx.steps(cell["cell_id"])
    part = params.get("part", "mlp")
    columns = layer_columns(steps, "grad_norm") if part == "block" else sorted(
        (c for c in steps.columns if str(c).startswith("grad_norm/layer_") and str(c).endswith(f"/{part}")),
        key=lambda c: int(str(c).split("/")[1].split("_")[1]))
    _need(columns, f"grad_norm/layer_{{i}}/{part}")
    row = _first_complete_row(steps, columns)
    if row is None:
        return float("nan")
    values = row[columns].to_numpy(dtype=float)
    if len(values) < 2 or (values <= 0).any():
        return float("nan")
    return float(np.polyfit(np.arange(len(values)), np.log10(values), 1)[0])


# ------------------------------------------------------------------------ inside a block


@measure("block_change", "relative change", "mean over layers of block_change/layer_{i} = RMS(block output - block "
         "input) / RMS(block input) at the first probe step (step 0)")
def block_change(ctx, cell, params) -> float:
    steps = ctx.steps(cell["cell_id"])
    columns = layer_columns(steps, "block_change")
    _need(columns, "block_change/layer_{i} (the probe of the relative change through a block)")
    row = _first_complete_row(steps, columns)
    return float(row[columns].to_numpy(dtype=float).mean()) if row is not None else float("nan")


@measure("attn_logit_max", "log10 logit", "log10 of the largest attn_logit_max/layer_{i} over layers and logged "
         "steps (diverged cells: up to their divergence)")
def attn_logit_max(ctx, cell, params) -> float:
    if cell["status"] not in DONE:
        return float("nan")
    steps = ctx.steps(cell["cell_id"])
    columns = layer_columns(steps, "attn_logit_max")
    _need(columns, "attn_logit_max/layer_{i} (the stability probes)")
    values = steps[columns].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    return math.log10(values.max()) if values.size and values.max() > 0 else float("nan")


# ------------------------------------------------------------------------------ stability


@measure("diverged", "diverged (0/1)", "1 when the run diverged (summary.json status), 0 when it completed",
         test="binary")
def diverged(ctx, cell, params) -> float:
    return {"diverged": 1.0, "completed": 0.0}.get(cell["status"], float("nan"))


def first_nonfinite_step(ctx: Context, cell_id: str) -> int | None:
    """The first logged step whose loss or total gradient norm is not finite (null), or None."""
    steps = ctx.steps(cell_id)
    columns = [c for c in ("loss", "grad_norm") if c in steps]
    if steps.empty or not columns:
        return None
    bad = ~np.isfinite(steps[columns].to_numpy(dtype=float)).all(axis=1)
    return int(steps["step"].to_numpy()[bad][0]) if bad.any() else None
