"""Short labels for plots: a group named by the axes that vary, `post, lr 1e-2, warmup 50`.

A cell id names every axis (`post.layernorm.gelu.dense.res__init=gpt2__lr=0.01__steps=200__
warmup=50__seed=0`); in a plot only the axes that tell the drawn groups apart say anything, and
the full id is too wide for a panel title or a legend. The full id stays in the CSVs.

    short_labels(cells, axes, by="group") -> {group: "post, lr 1e-2, warmup 50"}

Every plot title, legend entry and axis label that names a group gets it from here.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from ablate.analysis.load import VARIANT_AXES

# A variant axis's value is shown alone (`post`) when it names itself; these never do.
NOT_SELF_NAMING = ("none", "true", "false")
# Axis columns shown under a shorter or clearer name than their cells_metrics column.
AXIS_NAMES = {"planned_steps": "steps", "n_layer": "layers"}


def short_labels(cells: pd.DataFrame, axes: Iterable[str], by: str = "group", constant: bool = False) -> dict:
    """{value of `by`: label} for the rows of `cells`, naming each by those of `axes` that take
    more than one value across `cells` (seed never: seeds are averaged or drawn alike). A
    variant axis's value stands alone when it names itself (`post`, `swiglu`), any other as
    `axis value` (`lr 1e-2`, `residual false`). With no axis varying, the label is "all cells".
    `constant`: name every one of `axes`, varying or not (a panel's title names its facet value
    even when one panel is drawn)."""
    varying = [a for a in dict.fromkeys(axes) if a in cells and a != "seed"
               and (constant or cells[a].nunique(dropna=False) > 1)]
    formats = {a: _formatter(cells[a]) for a in varying}
    clashes = _shared_values(cells, [a for a in varying if a in VARIANT_AXES])
    labels = {}
    for key, row in cells.drop_duplicates(by).set_index(by, drop=False).iterrows():
        labels[key] = label_of({a: row[a] for a in varying}, formats, clashes)
    return labels


def label_of(values: Mapping, formats: Mapping | None = None, clashes: Iterable[str] = ()) -> str:
    """`post, lr 1e-2` for {norm: post, lr: 0.01}, in the given order. `formats`: a function per
    axis that spells its values (default: format_value); `clashes`: values that more than one
    axis takes, shown with their axis's name."""
    formats = formats or {}
    parts = []
    for axis, value in values.items():
        text = formats.get(axis, format_value)(value)
        self_naming = (axis in VARIANT_AXES and isinstance(value, str) and text not in NOT_SELF_NAMING
                       and text not in clashes)
        parts.append(text if self_naming else f"{AXIS_NAMES.get(axis, axis)} {text}")
    return ", ".join(parts) or "all cells"


def format_value(value, exponent: bool | None = None) -> str:
    """A value as a label shows it: 0.01 -> 1e-2, 3e-4 -> 3e-4, 50.0 -> 50, True -> true, None ->
    none. `exponent`: force (True) or refuse (False) the 1e-2 form; None: use it below 0.1."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    try:
        number = float(value)
    except (TypeError, ValueError):  # a word: pre, gpt2
        return str(value)
    if number.is_integer() and abs(number) < 1e5:
        return str(int(number))
    if exponent is None:
        exponent = abs(number) < 0.1 or abs(number) >= 1e5
    if not exponent:
        return f"{number:g}"
    mantissa, power = f"{number:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(power)}"


def _formatter(column: pd.Series):
    """One spelling per axis: if any of its numbers needs the 1e-2 form, all get it (lr 1e-1,
    1e-2, 3e-2 rather than 0.1, 1e-2, 3e-2)."""
    numbers = [v for v in column.dropna().unique()
               if isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))
               and not float(v).is_integer()]
    exponent = any(abs(float(v)) < 0.1 for v in numbers)
    return lambda value: format_value(value, exponent=True if exponent else None)


def _shared_values(cells: pd.DataFrame, axes: list[str]) -> set[str]:
    """Values that two of these axes both take (layernorm as norm_type and as qk_norm)."""
    seen: dict[str, str] = {}
    shared = set()
    for axis in axes:
        for value in cells[axis].unique():
            text = format_value(value)
            if seen.setdefault(text, axis) != axis:
                shared.add(text)
    return shared
