"""A claim's selectors checked against its own grid when the claim loads (called by
ablate/claims/run.py shipped_claims, before any cell trains): the grid exists, and every
selector (`at`, `a`, `b`, a plot's `at`) names an axis and values that some cell of it has (at any
of its scales). The rest of a claim file's checks are ablate/claims/claim_checks.py's.
"""
from __future__ import annotations

import pandas as pd

from ablate.claims.claim_checks import comparisons
from ablate.claims.claim_file import ClaimError, check_against_grid
from ablate.claims.selection import COLUMN_OF, SelectionError, select
from ablate.core.errors import ConfigError
from ablate.core.variant_axes import AXES


def _fail(where: str, message: str):
    raise ClaimError(f"{where}: {message}")


def check_claim_against_its_grid(claim, where: str) -> None:
    """The claim's grid exists, and each selector's axes and values select some of its cells
    (at the grid's default scale; `reproduce --full` checks its scale again before running).
    Raises ClaimError naming `where` (the claim's file), the key and what is valid."""
    from ablate.grid.spec import find_grid, load_grid, shipped_grids  # lazy: torch only when used

    try:
        path = find_grid(claim.grid)
        grid = load_grid(path)
        cells = grid_cells(grid)
        # A value may name another scale's cells (mlp-ratio's width 384 at [scales.gpu]).
        every = pd.concat([cells, *[grid_cells(load_grid(path, s)) for s in grid.scales if s != grid.scale]])
    except ConfigError as e:
        _fail(where, f"grid = {claim.grid!r}: {e}; valid: a grid file or a shipped grid "
                     f"({', '.join(shipped_grids())})")
    selectors = [(f"{label}, {side}", sel) for label, c in comparisons(claim)
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

    return axis if axis in cells else COLUMN_OF.get(axis, axis)


def grid_cells(grid):
    """One row per cell of a loaded grid, with the columns a claim's selectors name (as the
    analysis of its run folder will see them)."""
    rows = []
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        spec = cfg.spec
        rows.append({"cell_id": cell.id, "seed": cfg.seed, **{axis: getattr(spec, axis) for axis in AXES},
                     "lr": cfg.lr, "warmup": cfg.warmup, "init": cfg.init_name, "mlp_ratio": cfg.mlp_ratio,
                     "n_layer": cfg.size.n_layer, "width": cfg.size.d_model, "planned_steps": cfg.steps,
                     "schedule": cfg.schedule, "grad_clip": cfg.grad_clip})
    return pd.DataFrame(rows)
