"""A dry run: the cells a grid would train, each one's status in its folder, and the estimated
wall time on this machine (estimate.py), printed; nothing trained or written."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from ablate.bench.estimate import grid_seconds, grid_speed
from ablate.core.rundir import PENDING
from ablate.grid.state import cell_status


def estimate_line(grid, workers: int) -> str:
    """The grid's estimated wall time on this machine with local workers (ablate/bench/estimate.py)."""
    workers = max(1, min(workers, len(grid.cells)))
    speed = grid_speed(grid, workers)
    seconds = grid_seconds(grid, workers, speed=speed)
    return (f"estimated time: about {seconds / 60:.1f} min{speed.span(seconds)} with {workers} local "
            f"worker{'s' if workers != 1 else ''} (--workers), {speed.describe()}; cells that diverge stop early, "
            "so less")


def dry_run(grid, out: Path, workers: int = 1) -> int:
    print(f"grid {grid.name} ({grid.source}), scale {grid.scale}, out {out}")
    collapsed = len(grid.duplicates)
    print(f"{len(grid.cells)} cells ({grid.combinations} crossings, {collapsed} duplicate"
          f"{'s' if collapsed != 1 else ''} collapsed), {grid.total_steps:,} steps in total")
    print(f"cell ids: variant id{''.join(f', {k}' for k in grid.id_keys)}, seed")
    if grid.overrides:
        print("--set: " + ", ".join(f"{k}={v}" for k, v in grid.overrides.items()))
    print(f"  {'status':<10}{'model':<12}{'layers':>6}{'steps':>7}  cell")
    present = set(os.listdir(out)) if out.is_dir() else set()  # one listing, not a stat per cell
    lines = []
    for cell in grid.cells:
        cfg = cell.setting
        status = cell_status(out, cell.id) if cell.id in present else PENDING
        lines.append(f"  {status:<10}{cfg.model:<12}{cfg.size.n_layer:>6}{cfg.steps:>7}  {cell.id}\n")
    sys.stdout.write("".join(lines))
    if grid.duplicates:
        print("duplicates (train the same config as the cell shown, so they run once):")
        for described, kept in grid.duplicates:
            print(f"  {described}  ->  {kept}")
    if grid.refused:
        print("crossings the variant rules refuse (dropped):")
        for line in grid.refused:
            print(f"  {line}")
    if grid.scale == "cpu":  # other scales are sized for GPUs: no CPU estimate
        print(estimate_line(grid, workers))
    print(f"total: {len(grid.cells)} cells, {grid.total_steps:,} steps")
    return 0
