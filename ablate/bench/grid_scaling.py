"""Grid scaling as efficiency: how close N workers come to N cells at once for free.

ideal = (time of one cell alone, one worker, 1 thread) x cells / workers
efficiency = ideal / actual time of the grid of `cells` such cells on `workers` workers

Both are whole `ablate grid` processes (start-up, imports and data included), so the grid
is compared with what running its cells one by one on one core would cost, rather than
with one many-threaded worker, which mostly measures how well one cell uses its threads.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ablate.bench.timing import time_calls

GRID_TOML = """name = "bench-scaling"
[base]
model = "tiny"
layers = {layers}
steps = {steps}
batch_size = 16
eval_every = {steps}
eval_batches = 1
[axes]
seed = {seeds}
"""


def run_seconds(cmd: list[str], cwd: Path) -> float:
    def run():
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")

    return time_calls(run, repeats=1, warmup=0)[0]


@dataclass
class Scaling:
    cells: int
    workers: int
    layers: int
    steps: int
    alone_s: list[float]  # one cell, one worker, 1 thread, per repeat
    grid_s: list[float]  # the grid, per repeat

    def efficiencies(self) -> list[float]:
        """Per interleaved pair: ideal / actual."""
        return [a * self.cells / self.workers / g for a, g in zip(self.alone_s, self.grid_s)]


def grid_scaling(workers: int | None = None, cells_per_worker: int = 2, layers: int = 12, steps: int = 100,
                 repeats: int = 2) -> Scaling:
    workers = workers or os.cpu_count() or 1
    cells = workers * cells_per_worker
    result = Scaling(cells, workers, layers, steps, [], [])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        alone, grid = tmp / "alone.toml", tmp / "grid.toml"
        alone.write_text(GRID_TOML.format(layers=layers, steps=steps, seeds=[0]))
        grid.write_text(GRID_TOML.format(layers=layers, steps=steps, seeds=list(range(cells))))
        ablate = [sys.executable, "-m", "ablate", "grid"]
        for r in range(repeats):
            order = ("alone", "grid") if r % 2 == 0 else ("grid", "alone")
            for kind in order:
                out = tmp / f"{kind}-{r}"
                if kind == "alone":
                    cmd = ablate + [str(alone), "--out", str(out), "--workers", "1", "--set", "threads=1", "--quiet"]
                    result.alone_s.append(run_seconds(cmd, tmp))
                else:
                    cmd = ablate + [str(grid), "--out", str(out), "--workers", str(workers), "--quiet"]
                    result.grid_s.append(run_seconds(cmd, tmp))
    return result


def describe(s: Scaling) -> str:
    eff = s.efficiencies()
    ideal = statistics.median(s.alone_s) * s.cells / s.workers
    return (f"grid scaling: {s.cells} tiny cells ({s.layers} blocks, {s.steps} steps) on {s.workers} workers took "
            f"{statistics.median(s.grid_s):.1f}s; one such cell alone on 1 thread {statistics.median(s.alone_s):.1f}s, "
            f"so ideal {ideal:.1f}s (alone x {s.cells} cells / {s.workers} workers); efficiency ideal / actual "
            f"{statistics.median(eff):.2f} [{min(eff):.2f}..{max(eff):.2f} over {len(eff)} interleaved pairs]")
