"""A claim file checked completely when it loads (analysis/claims.py load_claim calls
`check_data` on its TOML, then `check_claim` on what it parsed), so that nothing it declares can fail after its grid has trained: every number
finite, a rate's `than` inside (0, 1), the plot parameters tables, no more clauses than the
report has letters for, and every selector (`at`, `a`, `b`, a plot's `at`) naming an axis and
values that some cell of the claim's own grid has. Each refusal is one ClaimError naming the
file, the key and what is valid.
"""
from __future__ import annotations

import math
import string
from typing import Any

# The report names clauses (a), (b), ... (analysis/claim_report.py): a claim has at most this many.
CLAUSE_LETTERS = string.ascii_lowercase
RATE_TEST = "binary"  # a measure whose values are 0/1 outcomes: its `than` is a rate


def check_data(data: dict, where: str) -> None:
    """Refuse (ClaimError) the file's TOML (`data`) where parse_claim would trip on it or let a
    non-finite number through; `where` is the file."""
    _check_finite(data, where)
    _check_tables(data, where)


def check_claim(claim, where: str) -> None:
    """Refuse (ClaimError) the parsed Claim where it could fail after its grid has trained."""
    _check_letters(claim, where)
    _check_thans(claim, where)
    _check_against_its_grid(claim, where)


def _fail(where: str, message: str):
    from ablate.analysis.claims import ClaimError

    raise ClaimError(f"{where}: {message}")


def _check_finite(node: Any, where: str, path: str = "") -> None:
    """NaN or inf anywhere in the file: no key of a claim takes one."""
    if isinstance(node, dict):
        for key, value in node.items():
            _check_finite(value, where, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            _check_finite(value, where, f"{path}[{i}]")
    elif isinstance(node, float) and not math.isfinite(node):
        _fail(where, f"{path} = {node!r}; valid: a finite number")


def _check_tables(data: dict, where: str) -> None:
    for key in ("plot_params", "why_params"):
        if key in data and not isinstance(data[key], dict):
            _fail(where, f"{key} = {data[key]!r} must be a table ({key} = {{ split = \"AXIS\", ... }})")
        at = data.get(key, {}).get("at")
        if at is not None and not isinstance(at, dict):
            _fail(where, f"{key}.at = {at!r} must be a table of axis = value")


def _check_letters(claim, where: str) -> None:
    if len(claim.clauses) > len(CLAUSE_LETTERS):
        _fail(where, f"{len(claim.clauses)} [[clause]] tables; valid: at most {len(CLAUSE_LETTERS)} (the report "
                     f"names clauses (a) to ({CLAUSE_LETTERS[-1]})): split the claim in two")


def _check_thans(claim, where: str) -> None:
    from ablate.analysis.claim_measures import MEASURES

    for label, c in _comparisons(claim):
        if c.than is not None and MEASURES[c.measure].test == RATE_TEST and not 0 < c.than < 1:
            _fail(where, f"{label}: than = {c.than!r} for measure {c.measure!r}, a rate; valid: a number "
                         "strictly between 0 and 1")


def _comparisons(claim) -> list[tuple[str, Any]]:
    return ([(f"clause {cl.label!r}, {c.label!r}", c) for cl in claim.clauses for c in cl.compare]
            + [(f"report {c.label!r}", c) for c in claim.report])


def _check_against_its_grid(claim, where: str) -> None:
    """The claim's grid exists, and each selector's axes and values select some of its cells
    (at the grid's default scale; `reproduce --full` checks its scale again before running).
    The grid is the engine's to read, so this one check imports it."""
    from ablate.analysis.claims import check_against_grid
    from ablate.analysis.selection import SelectionError, select
    from ablate.commands.reproduce import grid_cells
    from ablate.errors import ConfigError
    from ablate.grids import find_grid, load_grid, shipped_grids

    import pandas as pd

    try:
        path = find_grid(claim.grid)
        grid = load_grid(path)
        cells = grid_cells(grid)
        # A value may name another scale's cells (mlp-ratio's width 384 at [scales.gpu]).
        every = pd.concat([cells, *[grid_cells(load_grid(path, s)) for s in grid.scales if s != grid.scale]])
    except ConfigError as e:
        _fail(where, f"grid = {claim.grid!r}: {e}; valid: a grid file or a shipped grid "
                     f"({', '.join(shipped_grids())})")
    selectors = [(f"{label}, {side}", sel) for label, c in _comparisons(claim)
                 for side, sel in (("at", c.at), ("a", c.a), ("b", c.b or {}))]
    selectors += [(f"{key}.at", params.get("at") or {}) for key, params in
                  (("plot_params", claim.plot_params), ("why_params", claim.why_params))]
    for label, selector in selectors:
        for axis, wanted in selector.items():
            for value in wanted if isinstance(wanted, list) else [wanted]:
                try:
                    hits = select(every, {axis: value}).any()
                except SelectionError:
                    _fail(where, f"{label}: axis {axis!r} is not one of grid {claim.grid!r}'s; valid: "
                                 f"{', '.join(sorted(c for c in every.columns if c != 'cell_id'))}")
                if not hits:
                    have = sorted({str(v) for v in every[_column(every, axis)]})
                    _fail(where, f"{label}: {axis} = {value!r} matches no cell of grid {claim.grid!r}; valid: "
                                 f"{', '.join(have)}")
    check_against_grid(claim, cells)


def _column(cells, axis: str) -> str:
    from ablate.analysis.selection import COLUMN_OF

    return axis if axis in cells else COLUMN_OF.get(axis, axis)
