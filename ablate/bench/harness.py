"""The harness's fixed costs (start-up, memory), a profile of its step against the plain
loop's, and the GPU figures. The step comparison is in steps.py, the matmul peak and FLOPs
in flops.py, grid scaling in grid_scaling.py."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.bench.flops import flops_per_token
from ablate.bench.grid_scaling import run_seconds as _run
from ablate.bench.plain_gpt import plain_training_steps
from ablate.bench.steps import BATCH, LR, SEED, harness_options
from ablate.bench.timing import time_calls
from ablate.cell import Cell
from ablate.data import load_data
from ablate.sizes import get_size
from ablate.train import train


def startup_cost() -> dict:
    """Per-cell start-up: a cold `ablate train --steps 1` process end to end, the import
    alone, and in a warm process the build + data + first step (what a grid worker pays)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cold = _run([sys.executable, "-m", "ablate", "train", "--steps", "1", "--quiet", "--out", str(tmp / "c")], tmp)
        imports = _run([sys.executable, "-c", "import ablate.train"], tmp)
        warm = time_calls(lambda: train(Cell.from_options({"model": "tiny", "steps": 1, "batch_size": BATCH}),
                                        tmp / "warm"), repeats=1, warmup=0)[0]
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


@contextlib.contextmanager
def cpu_profile():
    """torch.profiler over the CPU, without the `USDT: ... profiler_start` and `profiler_stop`
    lines Kineto writes to the process's stderr around every profile (no setting turns them
    off); anything else written to stderr meanwhile is passed on after the profile."""
    from torch.profiler import ProfilerActivity, profile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                yield prof
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            sys.stderr.write("".join(line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                                     if not line.startswith("USDT:")))
            sys.stderr.flush()


def profile_steps(model: str = "tiny", layers: int | None = None, steps: int = 10, top: int = 15) -> str:
    """Where a step's time goes: torch.profiler's self-CPU table of the harness (probes on)
    and of the plain loop on the same model, one after the other."""
    size = get_size(model).with_layers(layers)
    tokens = load_data(None, size.tokenizer, size.vocab_size).train[0]
    options = harness_options(model, layers, steps, True, torch.get_num_threads(), "cpu")
    with tempfile.TemporaryDirectory() as tmp, cpu_profile() as harness_prof:
        train(Cell.from_options(options), Path(tmp) / "p")
    with cpu_profile() as plain_prof:
        plain_training_steps(size, tokens, steps, BATCH, LR, SEED)
    return "\n".join([
        f"harness, {model} x {size.n_layer} blocks, {steps} steps, probes on (self CPU time):",
        harness_prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top),
        "plain loop, same model and steps (self CPU time):",
        plain_prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)])


# Where a profiled step's self CPU time goes, by what an op's name says it is (first match).
CATEGORIES = (("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
              ("attention", ("scaled_dot_product", "flash_attention", "CausalAttention")),  # torch's; the CPU kernel's
              ("norms", ("layer_norm", "rms_norm")),
              ("optimizer", ("adam", "Optimizer.step")))
REST = "the rest (GELU, loss, embeddings, probes, other elementwise ops)"


@dataclass
class Breakdown:
    steps: int
    seconds: dict[str, float]  # self CPU seconds per category, REST included
    matmul_flops: float  # the dense matmul FLOPs of those steps
    peak: float  # the step-mix peak FLOP/s they are held against

    def describe(self) -> str:
        total = sum(self.seconds.values())
        share = ", ".join(f"{name} {sec / total:.0%}" for name, sec in self.seconds.items())
        rate = self.matmul_flops / self.seconds["matmul"] / self.peak
        return (f"where a harness step goes (torch.profiler, self CPU time, {self.steps} steps, probes on): {share}; "
                f"the matmuls ran at {rate:.0%} of the step-mix peak, so with every other op free a step "
                f"would reach about {rate:.0%}")


def _category(op: str) -> str:
    for name, marks in CATEGORIES:
        if op in marks or any(m.lower() in op.lower() for m in marks if not m.startswith("aten::")):
            return name
    return REST


def step_breakdown(size, peak, threads: int, steps: int = 12) -> Breakdown:
    """Profile a harness run of the default block with every probe on, bucket its ops' self
    CPU time by CATEGORIES, and hold the matmuls' own rate against `peak` (flops.Peak). The
    model build and the one final validation batch are in it too (a few percent at most)."""
    from ablate.bench.flops import step_matmuls

    options = harness_options(size.name, size.n_layer, steps, True, threads, "cpu")
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as tmp, cpu_profile() as prof:
            train(Cell.from_options(options), Path(tmp) / "p")
    finally:
        torch.set_num_threads(outer)
    seconds = {name: 0.0 for name, _ in CATEGORIES} | {REST: 0.0}
    for event in prof.key_averages():
        seconds[_category(event.key)] += event.self_cpu_time_total / 1e6
    flops = steps * sum(m.flops * m.count for m in step_matmuls(size, BATCH * size.context))
    return Breakdown(steps, seconds, flops, peak.step_mix)


def gpu_figures(steps: int = 30) -> list[dict]:
    """andrea-120m tokens/s and MFU per kernel backend, torch.compile off and on."""
    from ablate.kernels import BACKENDS

    size = get_size("andrea-120m")
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    peak = 2 * n**3 / min(time_calls(lambda: a @ a, repeats=3, calls=20, sync=torch.cuda.synchronize))
    rows = []
    for kernels in (k for k in BACKENDS if k != "cpu"):  # the GPU backends and reference
        for compiled in (False, True):
            options = {"model": "andrea-120m", "steps": steps, "batch_size": 8, "kernels": kernels,
                       "compile": compiled, "eval_every": steps, "eval_batches": 1, "checkpoint_every": steps}
            try:
                torch.cuda.reset_peak_memory_stats()
                with tempfile.TemporaryDirectory() as tmp:
                    s = train(Cell.from_options(options), Path(tmp) / "g")
                tok_s = steps * 8 * size.context / s["wall_time_s"]
                rows.append({"kernels": kernels, "compile": compiled, "tokens_per_s": tok_s,
                             "mfu": flops_per_token(size) * tok_s / peak, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30})
            except Exception as e:  # noqa: BLE001  (report a backend that cannot run, keep going)
                rows.append({"kernels": kernels, "compile": compiled, "error": str(e).splitlines()[0]})
    return rows
