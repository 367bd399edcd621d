"""What flushing subnormals to zero (option flush_denormal) saves on the shipped claim grids'
unstable cells, in lockstep: two copies of one cell, same seed, same batches, train step for
step in one process, one with subnormals flushed and one without, the setting switched in
every torch thread before each step (ablate.fpmode). Steps a few milliseconds apart see the
same machine, so the ratio of their summed times is the setting's, not the load's
(bench/lockstep.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ablate import fpmode

# (grid, the cell's axis values): cells that go unstable, and a healthy one for contrast.
CELLS = (("claim-prenorm-wins", {"norm": "post", "warmup": 0, "lr": 3e-2, "seed": 0}),
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
    from ablate.grid.spec import load_grid

    grid = load_grid(grid_name)
    for cell in grid.cells:
        if all(cell.axes.get(k) == v for k, v in axes.items()):
            return cell
    raise LookupError(f"{grid_name} has no cell with {axes}")


def lockstep_pair(cell, steps: int | None = None, threads: int = 1) -> Pair:
    """The cell twice through the training loop's own step, copy 0 flushing subnormals and copy
    1 keeping them, the setting switched in every torch thread before each step."""
    from ablate.bench.lockstep import build_copy, steps_in_turn, threads_and_flushing
    from ablate.train import plan_run

    plan = plan_run(cell)
    steps = min(steps or plan.cfg.steps, plan.cfg.steps)
    with threads_and_flushing(threads):
        seconds, losses = steps_in_turn(plan, [build_copy(plan), build_copy(plan)], 0, steps,
                                        before=lambda i: fpmode.set_flush_denormal(i == 0))
    return Pair(cell.id, steps, seconds[0], seconds[1], (losses[0][-1], losses[1][-1]))


def describe(pairs: list[Pair]) -> str:
    lines = ["flush_denormal in lockstep (the same cell twice in one process, step for step; kept / flushed "
             "time, >1 = flushing is faster):",
             "| cell | steps | flushed s | kept s | kept / flushed | second half | last loss flushed / kept |",
             "|---|---|---|---|---|---|---|"]
    for p in pairs:
        lines.append(f"| {p.cell} | {p.steps} | {sum(p.flushed_s):.1f} | {sum(p.kept_s):.1f} | {p.ratio():.2f}x "
                     f"| {p.ratio(p.steps // 2):.2f}x | {p.losses[0]:.4f} / {p.losses[1]:.4f} |")
    return "\n".join(lines)


def subnormal_pairs(steps: int | None = None, threads: int = 1) -> list[Pair]:
    return [lockstep_pair(find_cell(grid, axes), steps, threads) for grid, axes in CELLS]
