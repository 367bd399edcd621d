"""What flushing subnormals to zero (option flush_denormal) saves on the shipped claim grids'
unstable cells, in lockstep: two copies of one cell, same seed, same batches, train step for
step in one process, one with subnormals flushed and one without, the setting switched in
every torch thread before each step (ablate.fpmode). Steps a few milliseconds apart see the
same machine, so the ratio of their summed times is the setting's, not the load's."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

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
    from ablate.grids import load_grid

    grid = load_grid(grid_name)
    for cell in grid.cells:
        if all(cell.axes.get(k) == v for k, v in axes.items()):
            return cell
    raise LookupError(f"{grid_name} has no cell with {axes}")


def lockstep_pair(cell, steps: int | None = None, threads: int = 1) -> Pair:
    from ablate.train import make_optimizer, plan_run

    plan = plan_run(cell)
    cfg, size, data = plan.cfg, plan.size, plan.data
    steps = min(steps or cfg.steps, cfg.steps)
    copies = []
    for _ in range(2):
        torch.manual_seed(cfg.seed)
        from ablate.model import build_model

        model = build_model(cfg.spec, size, plan.ops, plan.device, init=cfg.init_name)
        copies.append((model, make_optimizer(model, cfg)))
    from ablate.lr import lr_at

    times: list[list[float]] = [[], []]
    last = [float("nan")] * 2
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for step in range(steps):
            x, y = data.batch("train", step, cfg.seed, cfg.batch_size, cfg.context, plan.device)
            for i in (step % 2, 1 - step % 2):  # take turns to go first
                model, opt = copies[i]
                fpmode.set_flush_denormal(i == 0)
                t0 = time.perf_counter()
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, cfg)
                loss = model(x, y)[1]
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                last[i] = loss.item()
                times[i].append(time.perf_counter() - t0)
    finally:
        fpmode.set_flush_denormal(False)
        torch.set_num_threads(outer)
    return Pair(cell.id, steps, times[0], times[1], (last[0], last[1]))


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
