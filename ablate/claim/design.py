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
import re
from pathlib import Path

from ablate.counts import shown
from ablate.errors import ConfigError

DECIDE_DIR = "decide"
MIN_SEEDS = 2  # fewer leaves no spread over seeds: no test at all
MAX_SEEDS = 10_000  # `--seeds` of reproduce and ladder: far past any design; a larger number is a typo
MAX_BUDGET_HOURS = 24 * 7 * 4  # `--budget`: four weeks of wall time
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smh])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def seeds_dir(n: int) -> str:
    return f"seeds-{n}"


def parse_seeds(text: str | None) -> int | None:
    """`--seeds N`: a whole number of seeds, at least MIN_SEEDS; ConfigError otherwise."""
    if text is None:
        return None
    try:
        n = int(str(text).strip())
    except ValueError:
        n = None
    if n is None or not MIN_SEEDS <= n <= MAX_SEEDS:  # refused before any list of seeds is built
        raise ConfigError(f"--seeds {shown(text)} is not a number of seeds; valid: a whole number in "
                          f"{MIN_SEEDS}..{MAX_SEEDS}")
    return n


def parse_budget(text: str | None) -> float | None:
    """`--budget 30m` (also 90s, 1h, 1.5h) in seconds; ConfigError otherwise."""
    if text is None:
        return None
    found = _DURATION.match(str(text))
    seconds = float(found.group(1)) * _UNIT_SECONDS[found.group(2)] if found else 0.0
    if not 0 < seconds <= MAX_BUDGET_HOURS * 3600:  # a 400-digit number reads as inf: refused too
        raise ConfigError(f"--budget {shown(text)} is not a duration; valid: a positive number with a unit s, m or "
                          f"h, up to {MAX_BUDGET_HOURS}h, e.g. 90s, 30m, 1.5h")
    return seconds


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
    from ablate.grid.spec import REFUSE_IMPORTS, load_grid

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
    from ablate.analysis.selection import SelectionError, select
    from ablate.commands.reproduce import grid_cells

    frame = grid_cells(grid)
    mask = frame["cell_id"].map(lambda _: False).astype(bool)
    for selector in selectors:
        try:
            mask |= select(frame, selector)
        except SelectionError as e:
            raise ConfigError(f"grid {grid.name}: {e}") from None
    return list(frame.loc[mask, "cell_id"])


def check_seeds_override(overrides: dict, flag: str) -> None:
    """A design of several seeds and `--set seed=S` contradict each other."""
    if "seed" in overrides:
        raise ConfigError(f"--set seed={overrides['seed']} and {flag} contradict each other; valid: one of them")


def design_out(cells: Path, n_seeds: int | None, decide: bool) -> Path:
    """Where a design's report and verdict go (see the module docstring)."""
    if decide:
        return cells / DECIDE_DIR
    return cells / seeds_dir(n_seeds) if n_seeds is not None else cells
