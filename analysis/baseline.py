"""Which group each group is compared with.

A baseline is named either by a group id (every group is compared with that one group) or by
a variant id (each group is compared with that variant's group at the same option settings,
e.g. post-norm at lr=3e-3 against pre-norm at lr=3e-3: like for like when a grid crosses
variants with options). Without a name: the default block's variant when it ran, else the
first group.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ablate.analysis.load import DEFAULT_VARIANT_ID, RunsError


class UnknownBaseline(RunsError):
    pass


@dataclass(frozen=True)
class Baseline:
    name: str  # a group id or a variant id
    kind: str  # "group" or "variant"
    reason: str  # why this one: "chosen", "the default block", "the first group"
    of: dict  # group -> its baseline group, or None when no baseline ran at its settings

    def describe(self) -> str:
        what = (f"group `{self.name}`" if self.kind == "group"
                else f"variant `{self.name}` at the same option settings")
        return f"{what} ({self.reason})"


def _sort_key(value):
    # Axis values may be missing (NaN) for [[include]] cells; sort those last.
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return (1, "")
    return (0, value) if isinstance(value, (int, float)) else (0.5, str(value))


def option_key(cells: pd.DataFrame, group: str, option_axes) -> tuple:
    first = cells[cells["group"] == group].iloc[0]
    return tuple(first[a] if a in first else None for a in option_axes)


def resolve_baseline(cells: pd.DataFrame, option_axes=(), baseline: str | None = None) -> Baseline:
    """Raises UnknownBaseline naming the valid groups and variants when `baseline` is neither."""
    groups = list(cells["group"].unique())
    variants = sorted(cells["variant_id"].dropna().unique())
    if baseline is None:
        if DEFAULT_VARIANT_ID in variants:
            baseline, kind, reason = DEFAULT_VARIANT_ID, "variant", "the default block"
        elif groups:
            baseline, kind, reason = sorted(groups)[0], "group", "the first group"
        else:
            return Baseline("", "group", "no cells", {})
    elif baseline in groups:
        kind, reason = "group", "chosen"
    elif baseline in variants:
        kind, reason = "variant", "chosen"
    else:
        raise UnknownBaseline(f"unknown baseline {baseline!r}; valid: a group ({', '.join(sorted(groups))}) "
                              f"or a variant ({', '.join(variants)})")
    if kind == "group":
        return Baseline(baseline, kind, reason, {g: baseline for g in groups})
    by_setting = {option_key(cells, g, option_axes): g
                  for g in groups if cells[cells["group"] == g]["variant_id"].iloc[0] == baseline}
    return Baseline(baseline, kind, reason, {g: by_setting.get(option_key(cells, g, option_axes)) for g in groups})


def order_groups(cells: pd.DataFrame, baseline: Baseline, option_axes=()) -> list[str]:
    """A fixed baseline group first; otherwise by option setting with each setting's
    baseline first; then by id."""
    def key(group):
        setting = tuple(_sort_key(v) for v in option_key(cells, group, option_axes))
        if baseline.kind == "group":
            return (group != baseline.name, setting, group)
        return (setting, baseline.of.get(group) != group, group)
    return sorted(cells["group"].unique(), key=key)
