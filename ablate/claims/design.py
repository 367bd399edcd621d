"""A claim's design: which of its grid's cells run, at which seeds, and where its verdict goes.

A claim's cells live in one grid folder per scale (runs/claims/NAME[-full]/): a cell's id does
not depend on the design, so seeds 0-2 of `--seeds 6` are the quick run's own cells, trained
once. Each design writes its verdict in a folder of its own and reads only its own cells:

    the grid's own seeds (--quick, --full)   runs/claims/NAME[-full]/           (as always)
    --seeds N                                runs/claims/NAME[-full]/seeds-N/
    --decide                                 runs/claims/NAME[-full]/decide/

The seeds of a design of N seeds are the grid's own seeds, then the next integers after the
largest of them: the first N of that sequence, so a larger design extends a smaller one.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ablate.claims.selection import SelectionError, select
from ablate.claims.selectors import grid_cells
from ablate.core.errors import ConfigError

DECIDE_DIR = "decide"


def seeds_dir(n: int) -> str:
    return f"seeds-{n}"


def own_seeds(grid) -> list[int]:
    """The seeds the grid file gives its cells, in the order they first appear."""
    return list(dict.fromkeys(grid.configs[c.id].seed for c in grid.cells))


def seed_sequence(own: list[int], n: int) -> list[int]:
    """The first `n` seeds of a design: the grid's own, then the integers after the largest."""
    seeds = list(own[:n])
    nxt = max(own, default=-1) + 1
    while len(seeds) < n:
        seeds.append(nxt)
        nxt += 1
    return seeds


def design_grid(claim, scale: str, overrides: dict, n_seeds: int | None = None, seeds: list[int] | None = None,
                imports_policy: str | None = None):
    """The claim's grid at `scale` with every setting at `n_seeds` seeds (seed_sequence), or at
    the given `seeds`; the grid's own seeds when neither is given. `imports_policy`: the grid
    file's imports (ablate.grid.spec; None: its default, refused unless imported)."""
    from ablate.grid.spec import REFUSE_IMPORTS, load_grid  # lazy: torch only when used

    policy = imports_policy or REFUSE_IMPORTS
    if n_seeds is None and seeds is None:
        return load_grid(claim.grid, scale, overrides, policy)
    if seeds is None:
        seeds = seed_sequence(own_seeds(load_grid(claim.grid, scale, overrides, policy)), n_seeds)
    return load_grid(claim.grid, scale, overrides, policy, seeds=sorted(set(seeds)))


def subset(grid, cell_ids):
    """The grid with only the cells `cell_ids` (in the grid's order): what one look runs. The
    cells keep their ids, so they train into, and resume from, the same folders."""
    keep = set(cell_ids)
    return dataclasses.replace(grid, cells=[c for c in grid.cells if c.id in keep])


def selected_ids(grid, selectors: list[dict]) -> list[str]:
    """The ids of the grid's cells that any of `selectors` (axis -> value or list of values,
    `seed` included) names, in the grid's order."""
    frame = grid_cells(grid)
    mask = frame["cell_id"].map(lambda _: False).astype(bool)
    for selector in selectors:
        try:
            mask |= select(frame, selector)
        except SelectionError as e:
            raise ConfigError(f"grid {grid.name}: {e}") from None
    return list(frame.loc[mask, "cell_id"])


def design_out(cells: Path, n_seeds: int | None, decide: bool) -> Path:
    """Where a design's report and verdict go (see the module docstring)."""
    if decide:
        return cells / DECIDE_DIR
    return cells / seeds_dir(n_seeds) if n_seeds is not None else cells
