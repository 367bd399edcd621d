"""The harness's fixed costs (`startup`, `memory`), where its step's time goes (`profile`, and the
breakdown under the steps part's FLOP/s table), and the GPU figures (`gpu`)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ablate.bench.flops import flops_per_token, step_matmuls
from ablate.bench.grid_scaling import process_seconds
from ablate.bench.plain_gpt import PlainLoop
from ablate.bench.steps import BATCH, LR, SEED, harness_options
from ablate.bench.timing import cuda_events, header, once, row, time_calls
from ablate.engine.cell import Cell
from ablate.engine.data import load_data
from ablate.engine.sizes import get_size
from ablate.engine.train import train
from ablate.kernels import BACKENDS


def startup_cost() -> str:
    """A cold `ablate train --steps 1` process end to end, the import alone, and in a warm process
    the build + data + first step (what a grid worker pays a cell)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cold = process_seconds([sys.executable, "-m", "ablate", "train", "--steps", "1", "--quiet", "--out",
                                str(tmp / "c")], tmp)
        imports = process_seconds([sys.executable, "-c", "import ablate.engine.train"], tmp)
        warm = once(lambda: train(Cell.from_options({"model": "tiny", "steps": 1, "batch_size": BATCH}), tmp / "warm"))
    return (f"start-up per cell: cold process (start + import + build + data + 1 step) {cold:.2f}s; "
            f"import alone {imports:.2f}s; in a warm worker (build + data + 1 step) {warm:.2f}s")


def peak_memory(steps: int = 20) -> str:
    """The peak resident memory of a process training one tiny cell."""
    code = ("import resource, subprocess, sys, tempfile\n"
            f"subprocess.run([sys.executable, '-m', 'ablate', 'train', '--steps', '{steps}', '--quiet', '--out', "
            "tempfile.mkdtemp()], check=True)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return (f"peak resident memory of a tiny cell: {int(out.split()[-1]) / 1024:.0f} MiB "
            "(the corpus is memory-mapped, never loaded into Python objects)")


@contextlib.contextmanager
def cpu_profile():
    """torch.profiler over the CPU, without the `USDT: ... profiler_start` and `profiler_stop`
    lines Kineto writes to the process's stderr around every profile (no setting turns them
    off); anything else written to stderr meanwhile is passed on after the profile."""
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


def _profiled_harness(options: dict):
    with tempfile.TemporaryDirectory() as tmp, cpu_profile() as prof:
        train(Cell.from_options(options), Path(tmp) / "p")
    return prof


def profile_steps(model: str, layers: int | None, steps: int = 10, top: int = 15) -> str:
    """torch.profiler's self-CPU tables of the harness (probes on), then of the plain loop on the
    same model."""
    size = get_size(model).with_layers(layers)
    harness = _profiled_harness(harness_options(model, layers, steps, True, torch.get_num_threads()))
    loop = PlainLoop(size, load_data(None, size.tokenizer, size.vocab_size).train[0], BATCH, LR, SEED)
    with cpu_profile() as plain:
        for _ in range(steps):
            loop.step()
    return "\n".join([f"harness, {model} x {size.n_layer} blocks, {steps} steps, probes on (self CPU time):",
                      harness.key_averages().table(sort_by="self_cpu_time_total", row_limit=top),
                      "plain loop, same model and steps (self CPU time):",
                      plain.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)])


# Where a profiled step's self CPU time goes, by what an op's name says it is (first match).
CATEGORIES = (("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
              ("attention", ("scaled_dot_product", "flash_attention", "CausalAttention")),  # torch's; the CPU kernel's
              ("norms", ("layer_norm", "rms_norm")),
              ("optimizer", ("adam", "Optimizer.step")))
REST = "the rest (GELU, loss, embeddings, probes, other elementwise ops)"


def category(op: str) -> str:
    for name, marks in CATEGORIES:
        if op in marks or any(m.lower() in op.lower() for m in marks if not m.startswith("aten::")):
            return name
    return REST


def describe_breakdown(steps: int, seconds: dict[str, float], matmul_flops: float, peak: float) -> str:
    """`seconds`: self CPU seconds per category, REST included; `matmul_flops`: the dense matmul
    FLOPs of those steps; `peak`: the step-mix FLOP/s they are held against."""
    share = ", ".join(f"{name} {sec / sum(seconds.values()):.0%}" for name, sec in seconds.items())
    rate = matmul_flops / seconds["matmul"] / peak
    return (f"where a harness step goes (torch.profiler, self CPU time, {steps} steps, probes on): {share}; "
            f"the matmuls ran at {rate:.0%} of the step-mix peak, so with every other op free a step "
            f"would reach about {rate:.0%}")


def step_breakdown(size, peak, threads: int, steps: int = 12) -> str:
    """A profiled harness run of the default block, probes on, its ops' self CPU time by
    CATEGORIES, its matmuls' rate held against `peak` (flops.Peak). The model build and the one
    final validation batch are in it too (a few percent at most)."""
    prof = _profiled_harness(harness_options(size.name, size.n_layer, steps, True, threads))
    seconds = {name: 0.0 for name, _ in CATEGORIES} | {REST: 0.0}
    for event in prof.key_averages():
        seconds[category(event.key)] += event.self_cpu_time_total / 1e6
    flops = steps * sum(m.flops * m.count for m in step_matmuls(size, BATCH * size.context))
    return describe_breakdown(steps, seconds, flops, peak.step_mix)


def gpu_figures(steps: int = 30, batch: int = 8):
    """Lines: andrea-120m's tokens/s, MFU and peak memory per kernel backend, torch.compile off and on."""
    if not torch.cuda.is_available():
        yield "gpu: no CUDA device here; skipped"
        return
    size, n = get_size("andrea-120m"), 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    peak = 2 * n**3 / min(time_calls(lambda: a @ a, repeats=3, calls=20, clock=cuda_events()))
    yield (f"andrea-120m, {steps} steps of batch {batch}; MFU against a bfloat16 {n}^3 matmul at "
           f"{peak / 1e12:.0f} TFLOP/s")
    yield header("kernels", "compile", "tokens/s", "MFU", "peak memory GiB")
    for kernels in (k for k in BACKENDS if k != "cpu"):  # the GPU backends and reference
        for compiled in (False, True):
            options = {"model": "andrea-120m", "steps": steps, "batch_size": batch, "kernels": kernels,
                       "compile": compiled, "eval_every": steps, "eval_batches": 1, "checkpoint_every": steps}
            try:
                torch.cuda.reset_peak_memory_stats()
                with tempfile.TemporaryDirectory() as tmp:
                    seconds = train(Cell.from_options(options), Path(tmp) / "g")["wall_time_s"]
                tok_s = steps * batch * size.context / seconds
                yield row(kernels, compiled, f"{tok_s:,.0f}", f"{flops_per_token(size) * tok_s / peak:.1%}",
                          f"{torch.cuda.max_memory_allocated() / 2**30:.1f}")
            except Exception as e:  # noqa: BLE001  (report a backend that cannot run, keep going)
                yield row(kernels, compiled, f"error: {(str(e) or type(e).__name__).splitlines()[0]}", "", "")
