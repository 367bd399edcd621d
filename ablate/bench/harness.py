"""Measurements of the harness's own cost. Every figure is a ratio or a time measured in
this one process and run, with A/B runs interleaved so that machine noise hits both."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.bench.plain_gpt import plain_training_steps
from ablate.cell import Cell
from ablate.data import load_data
from ablate.sizes import get_size
from ablate.train import train

BATCH, LR, SEED = 16, 1e-3, 0


@dataclass
class StepComparison:
    model: str
    steps: int
    tokens_per_step: int
    plain_s: list[float]
    probes_on_s: list[float]
    probes_off_s: list[float]

    def tok_s(self, times: list[float]) -> float:
        return self.steps * self.tokens_per_step / statistics.median(times)

    @property
    def ratio_on(self) -> float:
        """Harness with every probe on, tokens/s relative to the plain loop (median of pairs)."""
        return statistics.median(p / h for p, h in zip(self.plain_s, self.probes_on_s))

    @property
    def ratio_off(self) -> float:
        return statistics.median(p / h for p, h in zip(self.plain_s, self.probes_off_s))

    @property
    def probe_overhead(self) -> float:
        """Extra step time with probes logged every step versus never (paired, median)."""
        return statistics.median(on / off - 1 for on, off in zip(self.probes_on_s, self.probes_off_s))


def _harness_seconds(model: str, steps: int, probes: bool, device: str) -> float:
    options = {"model": model, "steps": steps, "batch_size": BATCH, "lr": LR, "seed": SEED,
               "eval_batches": 1, "eval_every": steps, "checkpoint_every": steps, "probes": probes,
               "device": device, "schedule": "constant"}
    with tempfile.TemporaryDirectory() as tmp:
        summary = train(Cell.from_options(options), Path(tmp) / "cell")
    return summary["wall_time_s"]


def _plain_seconds(model: str, steps: int, device: str) -> float:
    size = get_size(model)
    data = load_data(None, size.tokenizer, size.vocab_size)
    return plain_training_steps(size, data, steps, BATCH, LR, SEED, device)


def compare_steps(model: str = "tiny", steps: int = 60, repeats: int = 5, device: str = "cpu") -> StepComparison:
    """Interleaved A/B/C: plain loop, harness with probes, harness without, `repeats` times.
    Each harness time is the wall clock of its training loop (logging and the final
    one-batch validation included); the plain loop also ends with one validation batch."""
    size = get_size(model)
    _harness_seconds(model, 3, True, device)  # warm caches and the allocator once
    result = StepComparison(model, steps, BATCH * size.context, [], [], [])
    for r in range(repeats):
        order = [("plain", None), ("on", True), ("off", False)]
        order = order[r % 3:] + order[: r % 3]  # rotate which goes first
        for kind, probes in order:
            if kind == "plain":
                result.plain_s.append(_plain_seconds(model, steps, device))
            else:
                (result.probes_on_s if probes else result.probes_off_s).append(_harness_seconds(model, steps, probes, device))
    return result


def _run(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
    return time.perf_counter() - t0


GRID_TOML = """name = "bench"
[base]
model = "tiny"
steps = {steps}
batch_size = 16
eval_every = {steps}
[axes]
norm = ["pre", "post"]
seed = [0, 1, 2]
"""


def grid_throughput(steps: int = 40) -> dict:
    """Wall time of a 6-cell tiny grid with 1 and 2 workers, interleaved twice."""
    times: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        grid = Path(tmp) / "bench.toml"
        grid.write_text(GRID_TOML.format(steps=steps))
        for rep in range(2):
            for workers in ((1, 2) if rep == 0 else (2, 1)):
                out = Path(tmp) / f"w{workers}-{rep}"
                times[workers].append(_run([sys.executable, "-m", "ablate", "grid", str(grid), "--out", str(out),
                                            "--workers", str(workers), "--quiet"], Path(tmp)))
    n = 6
    w1, w2 = statistics.median(times[1]), statistics.median(times[2])
    return {"cells": n, "steps": steps, "workers1_s": w1, "workers2_s": w2,
            "cells_per_hour_1": n / w1 * 3600, "cells_per_hour_2": n / w2 * 3600, "speedup": w1 / w2}


def startup_cost() -> dict:
    """Per-cell start-up: a cold `ablate train --steps 1` process end to end, the import
    alone, and in a warm process the build + data + first step (what a grid worker pays)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cold = _run([sys.executable, "-m", "ablate", "train", "--steps", "1", "--quiet", "--out", str(tmp / "c")], tmp)
        imports = _run([sys.executable, "-c", "import ablate.train"], tmp)
        t0 = time.perf_counter()
        train(Cell.from_options({"model": "tiny", "steps": 1, "batch_size": BATCH}), tmp / "warm")
        warm = time.perf_counter() - t0
    return {"cold_process_s": cold, "import_s": imports, "warm_cell_s": warm}


def peak_memory_tiny_cell(steps: int = 20) -> float:
    """Peak resident memory (MiB) of a process training one tiny cell."""
    code = (
        "import resource, subprocess, sys, tempfile\n"
        "d = tempfile.mkdtemp()\n"
        f"subprocess.run([sys.executable, '-m', 'ablate', 'train', '--steps', '{steps}', '--quiet', '--out', d], check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[-1]) / 1024


def profile_tiny_step(steps: int = 8, top: int = 15) -> str:
    """Where a tiny step's time goes: torch.profiler over a short harness run."""
    from torch.profiler import ProfilerActivity, profile

    with tempfile.TemporaryDirectory() as tmp, profile(activities=[ProfilerActivity.CPU]) as prof:
        train(Cell.from_options({"model": "tiny", "steps": steps, "batch_size": BATCH, "eval_every": steps}), Path(tmp) / "p")
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def gpu_figures(steps: int = 30) -> list[dict]:
    """andrea-120m tokens/s and MFU per kernel backend, torch.compile off and on."""
    from ablate.kernels import BACKENDS

    size = get_size("andrea-120m")
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
    peak = 20 * 2 * n**3 / (time.perf_counter() - t0)
    rows = []
    for kernels in BACKENDS:
        for compiled in (False, True):
            options = {"model": "andrea-120m", "steps": steps, "batch_size": 8, "kernels": kernels,
                       "compile": compiled, "eval_every": steps, "eval_batches": 1, "checkpoint_every": steps}
            try:
                torch.cuda.reset_peak_memory_stats()
                with tempfile.TemporaryDirectory() as tmp:
                    s = train(Cell.from_options(options), Path(tmp) / "g")
                params = 92_331_264
                tok_s = steps * 8 * size.context / s["wall_time_s"]
                rows.append({"kernels": kernels, "compile": compiled, "tokens_per_s": tok_s,
                             "mfu": 6 * params * tok_s / peak, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30})
            except Exception as e:  # noqa: BLE001  (report a backend that cannot run, keep going)
                rows.append({"kernels": kernels, "compile": compiled, "error": str(e).splitlines()[0]})
    return rows


def threads_note() -> str:
    return f"{torch.get_num_threads()} torch threads, {os.cpu_count()} cores"
