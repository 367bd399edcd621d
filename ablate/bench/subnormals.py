"""What flushing subnormals to zero (option flush_denormal) saves on the shipped claim grids'
unstable cells (`ablate bench --only subnormals`): two copies of one cell in lockstep
(bench/lockstep.py), one with subnormals flushed and one without, the setting switched in every
torch thread before each step (ablate.engine.fpmode)."""
from __future__ import annotations

from dataclasses import dataclass

from ablate.bench.lockstep import build_copy, steps_in_turn
from ablate.bench.timing import header, row, threads as at_threads
from ablate.engine import fpmode
from ablate.engine.train import plan_run
from ablate.grid.spec import load_grid

# (grid, the cell's axis values): cells that go unstable, and a healthy one for contrast.
CELLS = (("claim-prenorm-wins", {"norm": "post", "warmup": 0, "lr": 1e-2, "seed": 0}),
         ("claim-norm-stability", {"norm": "none", "lr": 3e-2, "seed": 0}),
         ("claim-prenorm-wins", {"norm": "pre", "warmup": 0, "lr": 1e-3, "seed": 0}))


@dataclass
class Pair:
    cell: str
    steps: int
    flushed_s: list[float]
    kept_s: list[float]
    losses: tuple[float, float]  # the last step's loss, flushed and kept

    def ratio(self, start: int = 0) -> float:
        """Kept time over flushed time (>1: flushing is faster), from step `start` on."""
        return sum(self.kept_s[start:]) / sum(self.flushed_s[start:])


def find_cell(grid_name: str, axes: dict):

    for cell in load_grid(grid_name).cells:
        if all(cell.axes.get(k) == v for k, v in axes.items()):
            return cell
    raise LookupError(f"{grid_name} has no cell with {axes}")


def lockstep_pair(cell, steps: int | None = None, threads: int = 1) -> Pair:
    """The cell twice for `steps` steps (at most its own), copy 0 flushing subnormals, copy 1 not."""
    plan = plan_run(cell)
    steps = min(steps or plan.cfg.steps, plan.cfg.steps)
    with at_threads(threads):
        seconds, losses = steps_in_turn(plan, [build_copy(plan), build_copy(plan)], 0, steps,
                                        before=lambda i: fpmode.set_flush_denormal(i == 0))
    return Pair(cell.id, steps, seconds[0], seconds[1], (losses[0][-1], losses[1][-1]))


def describe(pairs: list[Pair]) -> str:
    return "\n".join([
        "flush_denormal in lockstep (the same cell twice in one process, step for step; kept / flushed "
        "time, >1 = flushing is faster):",
        header("cell", "steps", "flushed s", "kept s", "kept / flushed", "second half", "last loss flushed / kept"),
        *(row(p.cell, p.steps, f"{sum(p.flushed_s):.1f}", f"{sum(p.kept_s):.1f}", f"{p.ratio():.2f}x",
              f"{p.ratio(p.steps // 2):.2f}x", f"{p.losses[0]:.4f} / {p.losses[1]:.4f}") for p in pairs)])


def report(steps: int | None = None, threads: int = 1) -> str:
    return describe([lockstep_pair(find_cell(grid, axes), steps, threads) for grid, axes in CELLS])
