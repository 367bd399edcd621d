"""Grid scaling as an efficiency (`ablate bench --only grid`): how close N workers come to N
cells at once for free.

    ideal = (one cell alone, one worker, 1 thread) x cells / workers;  efficiency = ideal / actual

Both are whole `ablate grid` processes (start-up, imports and data included), so the grid is
held against its cells run one by one on one core, not against one many-threaded worker, which
mostly measures how well one cell uses its threads.
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ablate.bench.timing import once, spread
from ablate.core.cores import cpu_count

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


def process_seconds(cmd: list[str], cwd: Path) -> float:
    """Wall seconds of the process `cmd`, which must succeed."""
    def run():
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")

    return once(run)


@dataclass
class Scaling:
    cells: int
    workers: int
    layers: int
    steps: int
    alone_s: list[float]  # one cell, one worker, 1 thread, per repeat
    grid_s: list[float]  # the grid, per repeat

    def describe(self) -> str:
        ideal = [a * self.cells / self.workers for a in self.alone_s]
        efficiency = [i / g for i, g in zip(ideal, self.grid_s)]
        return (f"grid scaling: {self.cells} tiny cells ({self.layers} blocks, {self.steps} steps) on {self.workers} "
                f"workers took {statistics.median(self.grid_s):.1f}s; one such cell alone on 1 thread "
                f"{statistics.median(self.alone_s):.1f}s, so ideal {statistics.median(ideal):.1f}s (alone x "
                f"{self.cells} cells / {self.workers} workers); efficiency ideal / actual {spread(efficiency, '.2f')} "
                f"over {len(efficiency)} interleaved pairs")


def grid_scaling(workers: int | None = None, cells_per_worker: int = 2, layers: int = 12, steps: int = 100,
                 repeats: int = 2) -> Scaling:
    workers = workers or cpu_count()
    result = Scaling(workers * cells_per_worker, workers, layers, steps, [], [])
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        runs = {"alone": (tmp / "alone.toml", [0], ["--workers", "1", "--set", "threads=1"], result.alone_s),
                "grid": (tmp / "grid.toml", list(range(result.cells)), ["--workers", str(workers)], result.grid_s)}
        for toml, seeds, _, _ in runs.values():
            toml.write_text(GRID_TOML.format(layers=layers, steps=steps, seeds=seeds))
        for r in range(repeats):
            for kind in ("alone", "grid") if r % 2 == 0 else ("grid", "alone"):
                toml, _, flags, times = runs[kind]
                times.append(process_seconds([sys.executable, "-m", "ablate", "grid", str(toml), "--out",
                                              str(tmp / f"{kind}-{r}"), *flags, "--quiet"], tmp))
    return result
