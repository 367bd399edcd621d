"""Selecting a grid's cells by axis values, as claims and their plots name them
(`{norm = "post", lr = 1e-2}`): one rule for every reader of a claim declaration."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

# Selector keys that name a cell_metrics column of another name.
COLUMN_OF = {"layers": "n_layer", "steps": "planned_steps", "width": "d_model"}


class SelectionError(ValueError):
    """A selector names an axis the runs do not have."""


def select(frame: pd.DataFrame, selector: dict) -> pd.Series:
    """Boolean mask of the rows whose columns hold the selector's values (a list: any of them;
    numbers compare with a relative tolerance, so 3e-3 finds 0.003)."""
    mask = pd.Series(True, index=frame.index)
    for key, wanted in selector.items():
        column = COLUMN_OF.get(key, key) if key not in frame else key
        if column not in frame:
            raise SelectionError(f"the runs have no axis {key!r} to select on")
        values = wanted if isinstance(wanted, list) else [wanted]
        mask &= frame[column].map(lambda v: any(_same(v, w) for w in values))
    return mask


def _same(value, wanted) -> bool:
    if isinstance(wanted, bool) or isinstance(value, (bool, np.bool_)):
        return isinstance(value, (bool, np.bool_)) and bool(value) == wanted
    if isinstance(wanted, (int, float)):
        try:
            return math.isclose(float(value), float(wanted), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return str(value) == str(wanted)
