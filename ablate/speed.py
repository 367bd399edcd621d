"""This machine's training speed, measured, for the time estimates a user plans by
(`ablate reproduce --list` and its start line, `ablate grid --dry-run`, the ladder).

A cost model fitted once on another day's load was off by 2x (issue #29: 11.6 min estimated,
6 min taken). Instead a short calibration trains five small harness runs here, with the
harness's own loop (probes, logging, evaluation), at the thread count the cells will use, and
fits, per training step,

    seconds = STEP + blocks x (BLOCK + ELEM x tokens x width) + FLOPs / RATE

(STEP: embeddings, loss, optimizer and logging; BLOCK: the fixed cost of a block's many small
ops, which at these widths cost more than its FLOPs; ELEM: the part of them that grows with the
activations they pass over, a batch's tokens x the width; RATE: the rate of the FLOPs
themselves. Without ELEM, BLOCK measured at width 64 priced a width-16 ladder rung at 1.37x the
time it took, 2026-12-03), plus a
validation batch's cost relative to a training step and a cell's fixed cost (building the
model and data, the first steps' warm-up). BLOCK is the default block's; another block design
has other small ops (qk-norm's two norms a head and unpacked attention: its estimate read 0.73x
of the time taken with the default's BLOCK), so each variant an estimate needs gets its own
BLOCK, its block timed against the default's (calibrate_variants), kept with the rest.

While it measures, companion processes keep the other cores training as a grid's other
workers will (_busy_like_a_grid). Every figure is CPU time, a core's worth: under load the
scheduler hands each of three processes on two cores a full core for seconds and half of one
for the next, so wall times of a 15-s calibration read the load anywhere from nothing to twice
over (issue #29: under one other steady training, calibrations estimated qk-norm --quick at 4.3
and at 8.0 min, where it took 6 to 7 min). The share of a core its runs got (their CPU time
over their wall time) tells how much other work wanted the cores (`other`), and `contention`
turns CPU time into wall time for a grid's workers beside that work. It is cached in
$ABLATE_CACHE/speed.json and reused while it describes the machine: the same CPU, cores, torch,
thread count, within MAX_AGE_S, and as many other processes running (within LOAD_TOLERANCE;
counted now, not the lagging load average: competing_load) as when it was measured.

The machine itself is not one speed. A virtual machine's host runs it faster or slower by up to
1.5x for tens of seconds to minutes at a time, both cores together, with no steal time to show
for it (2026-12-03: one 600-step run moved between 74 and 118 ms a step in 50-step windows;
eight calibrations in 3 minutes put a claim cell's step at 72 to 116 ms). A 20-s calibration
catches one such spell; a 5-min grid lives through several (the same grid took 4 min 53 s one
day, 6 min 13 s the other). So the cache keeps the calibrations of the last HISTORY_S (at most
HISTORY_MAX), and an estimate prices steps by the median over them (`pool`), the load by the
newest alone, and says how far the fastest and slowest of them lie from it (`Speed.spread`).
"""
from __future__ import annotations

import contextlib
import heapq
import json
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

CACHE_NAME = "speed.json"
MAX_AGE_S = 30 * 60
LOAD_TOLERANCE = 1.0  # runnable processes: one more or fewer than at calibration changes a core's share
# (model, blocks, width or None: the model's): depths at tiny width give the per-block cost, a
# wider one the FLOP rate, width 16 at 12 blocks parts a block's fixed cost from what grows with
# its width (a ladder's narrow rungs); tiny x 12 is the claims' own cell, so the fit is anchored
# where most estimates are made.
POINTS = (("tiny", 1, None), ("tiny", 6, None), ("tiny", 12, None), ("small", 2, None), ("tiny", 12, 16))
VARIANT_POINT = ("tiny", 6)  # the size at which a variant's block is timed against the default's
VARIANT_ROUNDS = 15
STEPS, WARMUP, BATCH, EVAL_BATCHES = 12, 4, 16, 4
CALIBRATION_ROUNDS = 3
FORMAT = 4  # a calibration of another format (1: wall times, 2: no points, 3: no ELEM) is measured again
HISTORY_S, HISTORY_MAX = 24 * 3600, 16  # the calibrations an estimate pools (`pool`)
CLAIM_POINT = POINTS.index(("tiny", 12, None))  # the point `spread` compares: a claim cell's step


@dataclass
class Speed:
    step_s: float  # per training step, whatever the depth
    block_s: float  # per block per training step, beyond its FLOPs
    flops_per_s: float  # the rate of a step's FLOPs
    eval_ratio: float  # one validation batch / one training step of the same shape
    cell_s: float  # per cell: build, data, warm-up
    threads: int
    load: float  # runnable processes besides it when it was measured (competing_load): when to measure again
    measured_at: float
    machine: str
    calibration_s: float = 0.0
    companions: int = 0  # processes that kept the other cores busy while it was measured (_busy_like_a_grid)
    variant_block_s: dict[str, float] = field(default_factory=dict)  # variant id -> its BLOCK (else block_s)
    other: float = 0.0  # cores' worth of other work that wanted the CPU while it measured (_other_demand)
    format: int = 1  # what a cache entry without the field was; calibrate writes FORMAT
    points_s: list[float] = field(default_factory=list)  # a step's CPU seconds at each of POINTS (the fit's input)
    variant_extra_s: dict[str, float] = field(default_factory=dict)  # variant id -> its block over the default's
    calibrations: int = 1  # how many calibrations the figures pool (`pool`)
    # the fastest and slowest pooled calibration's claim-cell step over the pooled one's
    spread: list[float] = field(default_factory=lambda: [1.0, 1.0])
    elem_s: float = 0.0  # per block per token per channel of width: the small ops' part that grows with them

    def step_seconds(self, flops: float, blocks: int, variant: str | None, elements: float) -> float:
        """A step's seconds: `elements` are its blocks' activations, blocks x tokens x width
        (block_elements; required, so that no caller prices a step without its ELEM part)."""
        return (self.step_s + self.variant_block_s.get(variant, self.block_s) * blocks + self.elem_s * elements
                + flops / self.flops_per_s)

    def cell_seconds(self, cfg, flops: float | None = None) -> float:
        """One cell's seconds at this speed: its steps, its evaluations, its fixed cost. A cell
        that diverges stops early, so this is an upper bound for those."""
        flops = step_flops(cfg) if flops is None else flops
        step = self.step_seconds(flops, cfg.size.n_layer, cfg.spec.id, block_elements(cfg))
        evals = (cfg.steps - 1) // cfg.eval_every * cfg.eval_batches + cfg.final_eval_batches
        return self.cell_s + cfg.steps * step + evals * self.eval_ratio * step

    def describe(self) -> str:
        when = (f"calibrated on this machine {_ago(self.measured_at)}" if self.calibrations < 2 else
                f"the median of {self.calibrations} calibrations on this machine in the last "
                f"{HISTORY_S // 3600} h (the newest {_ago(self.measured_at)})")
        return (f"{when} at {self.threads} thread{'s' if self.threads != 1 else ''}, other work wanting "
                f"{self.other:.1f} cores: per step {self.step_s * 1e3:.1f} ms + {self.block_s * 1e3:.1f} ms a "
                f"block + {self.elem_s * 1e9:.1f} ns per activation in a block + FLOPs at "
                f"{self.flops_per_s / 1e9:.1f} GFLOP/s, {self.cell_s:.1f} s a cell")

    def span(self, seconds: float) -> str:
        """' (LOW-HIGH min at the fastest and slowest of N calibrations)' for an estimate of
        `seconds`: how far this machine's own speed has moved it; '' with one calibration."""
        if self.calibrations < 2:
            return ""
        low, high = (seconds * r / 60 for r in self.spread)
        return f" ({low:.1f}-{high:.1f} min at the fastest and slowest of its {self.calibrations} calibrations)"


def _ago(t: float) -> str:
    minutes = (time.time() - t) / 60
    return "just now" if minutes < 1 else f"{minutes:.0f} min ago"


def machine() -> str:
    """What a calibration is valid for: the CPU, its cores, torch, Python."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu} | {os.cpu_count()} cores | torch {torch.__version__} | python {platform.python_version()}"


LOAD_SAMPLES, LOAD_SAMPLE_GAP_S = 20, 0.01


def competing_load() -> float:
    """Processes competing for the cores now, besides this one. On Linux: the runnable tasks of
    /proc/loadavg (its 4th field, which counts this process too) less one, averaged over
    LOAD_SAMPLES readings LOAD_SAMPLE_GAP_S apart. Not the load average: it lags by a minute, so
    just after a grid's workers stop it still counts them, and a calibration made then was taken
    as made under load (estimates 2-3x too long, 2026-12-02). Elsewhere the 1-minute load
    average less one."""
    readings = []
    for i in range(LOAD_SAMPLES):
        try:
            with open("/proc/loadavg") as f:
                readings.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            break
        if i + 1 < LOAD_SAMPLES:
            time.sleep(LOAD_SAMPLE_GAP_S)
    if readings:
        return max(0.0, sum(readings) / len(readings) - 1)
    return max(0.0, os.getloadavg()[0] - 1) if hasattr(os, "getloadavg") else 0.0


def contention(speed: Speed, workers: int, threads: int) -> float:
    """Wall seconds per CPU second of each of `workers` cells (of `threads` threads): the cores'
    fair share among the grid's threads and the other work the calibration found. 1 on a quiet
    machine with a thread per core."""
    from ablate.cores import cpu_count

    return max(1.0, (speed.other + workers * threads) / cpu_count())


def reference(threads: int = 1) -> Speed:
    """A fixed yardstick, not an estimate of this machine: the claims' size budgets (tests) use
    it, where a measurement would make the budget depend on the load of the day. Fitted
    (non-negative least squares on this module's formula: steps x (STEP + BLOCK x blocks + FLOPs / RATE)
    + evaluations) to the 229 completed cells of one `ablate reproduce all --quick` on this
    project's 2-core machine with nothing else running, 2 workers of 1 thread (2026-12-02, 43 min
    13 s): median error 7% a cell, each claim's total within 12% of its measured wall time. The
    yardstick before it, fitted while other work shared the cores, read about 2x high."""
    return Speed(step_s=1.82e-3, block_s=3.32e-3, flops_per_s=51.9e9, eval_ratio=0.12, cell_s=0.0,
                 threads=threads, load=0.0, measured_at=0.0, machine="reference")


_FLOPS: dict = {}


def step_flops(cfg) -> float:
    """Training FLOPs of one step: 6 x matmul parameters x tokens, plus attention's
    6 x blocks x context x d_model per token (ablate.bench.flops' formula, on the variant's own
    parameters)."""
    key = (cfg.spec, cfg.size, cfg.context, cfg.batch_size)
    if key not in _FLOPS:
        import torch

        from ablate.model import build_model

        size = cfg.size
        # Only the parameter count is wanted. A small model is built on the CPU in milliseconds;
        # on the meta device, torch's first init call imports torch._dynamo (about 3 s of every
        # dry run), so meta is kept for sizes whose weights would take real memory and time.
        rough = 12 * size.n_layer * size.d_model ** 2 + size.vocab_size * size.d_model
        with torch.random.fork_rng(devices=[]):  # the weights' draws leave the caller's RNG as it was
            model = build_model(cfg.spec, size, device="cpu" if rough < 20e6 else "meta")
        params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("wpe."))
        _FLOPS[key] = cfg.batch_size * cfg.context * (6 * params + 6 * size.n_layer * cfg.context * size.d_model)
    return _FLOPS[key]


def block_elements(cfg) -> float:
    """A step's activations through its blocks: blocks x a batch's tokens x the width (ELEM's unit)."""
    return cfg.size.n_layer * cfg.batch_size * cfg.context * cfg.size.d_model


def _timed_run(model: str, blocks: int, threads: int, out: Path, variant: str | None = None,
               width: int | None = None) -> tuple[float, float, float, float, object]:
    """One calibration run (of the default block, or `variant`): (mean step seconds after
    warm-up, one validation batch's seconds, fixed seconds, all three in CPU time a thread; the
    share of its threads' cores the run got; its config). The share is the run's CPU time over
    its wall time and threads: a step's wall times scaled by it are its CPU time, without
    timing every step twice."""
    from ablate.cell import Cell
    from ablate.rundir import METRICS
    from ablate.train import train

    options = {**_size_options(model, blocks, width), "steps": STEPS, "schedule": "constant",
               "eval_every": STEPS, "eval_batches": 1, "final_eval_batches": EVAL_BATCHES,
               "checkpoint_every": STEPS, "threads": threads, **_variant_option(variant)}
    cell = Cell.from_options(options)
    run_dir = out / f"{model}x{blocks}{f'w{width}' if width else ''}{'-' + variant if variant else ''}"
    c0, t0 = time.process_time(), time.perf_counter()
    train(cell, run_dir)
    total, cpu = time.perf_counter() - t0, time.process_time() - c0
    share = min(1.0, cpu / (total * threads))
    times = [json.loads(line)["time_s"] for line in (run_dir / METRICS).read_text().splitlines()]
    step = (times[-2] - times[WARMUP - 1]) / (STEPS - 1 - WARMUP)
    # The last row is written after the final evaluation: its span less a step is the evaluation.
    evaluation = max(0.0, times[-1] - times[-2] - step) / EVAL_BATCHES
    fixed = max(0.0, total - times[-1] + times[WARMUP - 1] - WARMUP * step)  # before and after the loop, and warm-up
    return step * share, evaluation * share, fixed * share, share, cell.config


COMPANION_START_S = 60.0


@contextlib.contextmanager
def _busy_like_a_grid(threads: int):
    """The other cores kept busy while this process measures, as a grid's other workers keep
    them: a process per other worker (cores // threads - 1) training the calibration's runs
    over and over. A core runs slower when its neighbours work (shared caches, memory, clock):
    measured alone, a 2-worker grid's cells took 1.15-1.35x the estimate (2026-12-02); a
    calibration run beside one such companion took 1.0-1.6x, 1.2x on average, its time alone.
    Yields the companions' processes. Their runs go to a folder of this process's, removed after
    them (a killed process cleans nothing up)."""
    import subprocess

    from ablate.cores import cpu_count

    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "ablate.speed", "--companion", str(threads), tmp]
        companions = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                      for _ in range(max(0, cpu_count() // max(1, threads) - 1))]
        try:
            for process in companions:  # each says "ready" once it trains (its imports take seconds)
                _wait_ready(process)
            yield companions
        finally:
            for process in companions:
                process.kill()
                process.wait()


def _wait_ready(process) -> None:
    import select

    ready, _, _ = select.select([process.stdout], [], [], COMPANION_START_S)
    if ready:
        process.stdout.readline()


def _companion(threads: int, folder: Path) -> None:
    """A companion's loop (python -m ablate.speed --companion THREADS FOLDER): the calibration's
    runs, each in its own folder under FOLDER, until killed or until the process that started it
    is gone."""
    import shutil

    import torch

    torch.set_num_threads(threads)
    parent = os.getppid()
    for i in range(1 << 30):
        model, blocks, width = POINTS[i % len(POINTS)]
        out = folder / f"{os.getpid()}-{i}"
        _timed_run(model, blocks, threads, out, width=width)
        shutil.rmtree(out, ignore_errors=True)
        if i == 0:
            print("ready", flush=True)
        if os.getppid() != parent:
            return


def calibrate(threads: int = 1) -> Speed:
    """Measure (about 20 s on a quiet 2-core machine; longer under load): the POINTS in
    CALIBRATION_ROUNDS rounds, each point's step the median of its rounds, fitted (_fit). One
    round gave rates from 52 to 95 GFLOP/s within a quarter of an hour (2026-12-02): five
    one-round calibrations in a row estimated the same all --quick at 27.9-40.3 min, five of
    three rounds at 30.5-37.0 (34.0 taken)."""
    import numpy as np

    load = competing_load()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, _busy_like_a_grid(threads) as companions:
        rounds = [[_timed_run(model, blocks, threads, Path(tmp) / f"round{r}", width=width)
                   for model, blocks, width in POINTS] for r in range(CALIBRATION_ROUNDS)]
    runs = [run for one in rounds for run in one]
    b = np.array([np.median([one[i][0] for one in rounds]) for i in range(len(POINTS))])
    step_s, block_s, elem_s, per_flop = _fit(_point_matrix(), b)
    return Speed(step_s=step_s, block_s=block_s, elem_s=elem_s, flops_per_s=1.0 / max(per_flop, 1e-15),
                 eval_ratio=float(np.median([e / s for s, e, *_ in runs])),
                 cell_s=float(np.median([f for _, _, f, *_ in runs])), threads=threads, load=load,
                 measured_at=time.time(), machine=machine(), calibration_s=time.perf_counter() - t0,
                 companions=len(companions), format=FORMAT, points_s=[float(v) for v in b],
                 other=_other_demand(float(np.median([share for *_, share, _ in runs])), threads, len(companions)))


def _point_matrix():
    """[1, blocks, block elements, FLOPs] of each of POINTS: the fit's design matrix."""
    import numpy as np

    from ablate.config import resolve

    configs = [resolve(_size_options(*point)) for point in POINTS]
    return np.array([[1.0, cfg.size.n_layer, block_elements(cfg), step_flops(cfg)] for cfg in configs])


def pool(history: list[Speed]) -> Speed:
    """One speed from the calibrations in `history` (oldest first): each point's step the median
    over them, fitted again (_fit); the evaluation ratio, fixed cost and each variant's block
    difference their medians; the load (`other`, `load`) the newest's, since it is the load now.
    `spread`: the fastest and slowest calibration's claim-cell step over the pooled one's."""
    import dataclasses

    import numpy as np

    newest = history[-1]
    full = [s for s in history if len(s.points_s) == len(POINTS)]
    if len(full) < 2:
        return newest
    points = np.median(np.array([s.points_s for s in full]), axis=0)
    step_s, block_s, elem_s, per_flop = _fit(_point_matrix(), points)
    extras = {v: float(np.median([s.variant_extra_s[v] for s in full if v in s.variant_extra_s]))
              for v in set().union(*(s.variant_extra_s for s in full))}
    claim = [s.points_s[CLAIM_POINT] / points[CLAIM_POINT] for s in full]
    return dataclasses.replace(
        newest, step_s=step_s, block_s=block_s, elem_s=elem_s, flops_per_s=1.0 / max(per_flop, 1e-15),
        eval_ratio=float(np.median([s.eval_ratio for s in full])), cell_s=float(np.median([s.cell_s for s in full])),
        variant_extra_s=extras, variant_block_s=_variant_blocks(block_s, extras),
        points_s=[float(v) for v in points], calibrations=len(full),
        spread=[float(min(claim)), float(max(claim))])


def _fit(a, b) -> tuple[float, ...]:
    """Non-negative least squares of the step times `b` on the columns of `a` (_point_matrix: 1,
    blocks, block elements, FLOPs), each point's error relative to its time (a short step counts
    as much as a long one). No part of a step costs less than nothing: where noise would make one
    negative it is 0 and the others fit without it. (An exact solve of three points, dropped for
    one rate for everything when a part came out negative, estimated prenorm-wins at 7.0 min under
    a load where the calibration a minute before had said 10.1, 2026-12-03.)"""
    import numpy as np
    from scipy.optimize import nnls

    scale = np.abs(a).max(axis=0)  # columns of like size: seconds, blocks, elements and FLOPs differ by 1e9
    x, _ = nnls(a / scale / b[:, None], np.ones(len(b)))
    return tuple(float(v) for v in x / scale)


def _other_demand(share: float, threads: int, companions: int) -> float:
    """Cores' worth of other work that wanted the CPU while the calibration's runs got `share`
    of a core a thread: with the calibration's own (companions + 1) x threads threads, the
    scheduler's fair share is cores / (all the threads wanting a core). 0 when they had their
    cores to themselves."""
    from ablate.cores import cpu_count

    return max(0.0, cpu_count() / max(share, 1e-3) - (companions + 1) * threads) if share < 1.0 else 0.0


def _block_seconds(variants: list[str | None], threads: int) -> dict[str | None, float]:
    """Median CPU seconds (a thread's) of one block's forward and backward at VARIANT_POINT's
    width and the calibration's batch, per variant id (None: the default block), the variants
    taking turns round after round so that the machine's load falls on each alike."""
    import torch

    from ablate.config import resolve
    from ablate.kernels import get_backend
    from ablate.model import Block

    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            cfgs = {v: resolve(_point_options(v)) for v in variants}
            blocks = {v: Block(cfg.spec, cfg.size, get_backend("cpu")) for v, cfg in cfgs.items()}
            size = cfgs[variants[0]].size
            x = torch.randn(BATCH, size.context, size.d_model, requires_grad=True)
            grad = torch.randn(BATCH, size.context, size.d_model)
            times: dict[str | None, list[float]] = {v: [] for v in variants}
            for _ in range(VARIANT_ROUNDS):
                for v, block in blocks.items():
                    t0 = time.process_time()
                    block(x).backward(grad)
                    times[v].append((time.process_time() - t0) / threads)
    finally:
        torch.set_num_threads(outer)
    return {v: float(sorted(t)[len(t) // 2]) for v, t in times.items()}


def _variant_option(variant: str | None) -> dict:
    """The option naming `variant` (None: the default block, named by no option)."""
    return {"variant": variant} if variant else {}


def _size_options(model: str, blocks: int, width: int | None = None) -> dict:
    """The options of a calibration point's model at the calibration's batch (width None: the model's)."""
    return {"model": model, "layers": blocks, "batch_size": BATCH, **({"width": width} if width else {})}


def _point_options(variant: str | None) -> dict:
    return {**_size_options(*VARIANT_POINT), **_variant_option(variant)}


def _variant_blocks(block_s: float, extras: dict[str, float]) -> dict[str, float]:
    """Each variant's BLOCK: the default's plus its block's difference, never below nothing."""
    return {v: max(0.0, block_s + extra) for v, extra in extras.items()}


def calibrate_variants(speed: Speed, variants) -> bool:
    """Measure the BLOCK of each of `variants` (ids) that `speed` lacks, into it: the default's
    BLOCK plus the difference of their blocks' times beyond their FLOPs, the blocks timed taking
    turns (_block_seconds; well under a second each). Whole calibration runs, one after the
    other, differed by 15% from run to run under the same load, more than most variants differ.
    Whether any was measured."""
    from ablate.config import resolve
    from ablate.variants import DEFAULTS, make_variant

    default = make_variant(**DEFAULTS).id
    missing = sorted(set(variants) - set(speed.variant_extra_s) - {default})
    if not missing:
        return False
    with _busy_like_a_grid(speed.threads):
        seconds = _block_seconds([None, *missing], speed.threads)
    blocks, base_flops = VARIANT_POINT[1], step_flops(resolve(_point_options(None)))
    for variant in missing:
        flops = step_flops(resolve(_point_options(variant))) - base_flops  # all blocks': a step's
        speed.variant_extra_s[variant] = seconds[variant] - seconds[None] - flops / blocks / speed.flops_per_s
    speed.variant_block_s = _variant_blocks(speed.block_s, speed.variant_extra_s)
    return True


def _cache_path() -> Path:
    from ablate.data import cache_root

    return cache_root() / CACHE_NAME


def _history(threads: int) -> list[Speed]:
    """The cached calibrations at `threads` threads that describe this machine (its CPU, torch,
    FORMAT) and are under HISTORY_S old, oldest first; [] for a missing or damaged cache."""
    try:
        entries = json.loads(_cache_path().read_text()).get(str(threads))
    except (OSError, ValueError, AttributeError):
        return []
    history = []
    for entry in entries if isinstance(entries, list) else []:  # a dict: one entry of format 2 or older
        try:
            speed = Speed(**entry)
        except TypeError:
            continue
        if speed.machine == machine() and speed.format == FORMAT and time.time() - speed.measured_at < HISTORY_S:
            history.append(speed)
    return sorted(history, key=lambda s: s.measured_at)[-HISTORY_MAX:]


def _fresh(speed: Speed) -> bool:
    """Whether a calibration still describes the machine now: young enough, under the same load."""
    return time.time() - speed.measured_at < MAX_AGE_S and abs(competing_load() - speed.load) <= LOAD_TOLERANCE


def _store(history: list[Speed]) -> None:
    """Write `history` as the cache's entry for its thread count, the others kept, atomically
    (write_json_atomic: a link at the file's name is replaced, never followed)."""
    from ablate.rundir import write_json_atomic

    path = _cache_path()
    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
        entries = entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        entries = {}
    entries[str(history[-1].threads)] = [asdict(s) for s in history[-HISTORY_MAX:]]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, entries)
    except (OSError, ValueError):
        pass  # an unwritable cache (or a figure JSON cannot hold): measured again next time, nothing lost


# ABLATE_SPEED=reference: estimates from the fixed yardstick (`reference`), never measured. For
# scripted runs whose estimates need not fit the day's load: the test suite sets it, so that
# its child processes neither spend seconds calibrating nor write to the user's cache.
SPEED_ENV = "ABLATE_SPEED"


def machine_speed(threads: int = 1, quiet: bool = False, variants=()) -> Speed:
    """This machine's speed pooled over its recent calibrations (`pool`): the cached ones, and a
    new one (cached) when the newest no longer describes the machine (_fresh), with the BLOCK of
    each of `variants` (ids) measured; the reference yardstick where $ABLATE_SPEED is `reference`."""
    if os.environ.get(SPEED_ENV) == "reference":
        return reference(threads)
    history, measured = _history(threads), False
    if not history or not _fresh(history[-1]):
        if not quiet:
            print(f"ablate: measuring this machine's training speed at {threads} thread"
                  f"{'s' if threads != 1 else ''} for the estimate (seconds on a quiet machine, longer under "
                  "load; cached)", file=sys.stderr, flush=True)
        history, measured = [*history, calibrate(threads)], True
    if calibrate_variants(history[-1], variants) or measured:
        _store(history)
    return pool(history)


def grid_variants(grid) -> set[str]:
    """The ids of the block designs a grid's cells train."""
    return {grid.configs.setting(cell.id).spec.id for cell in grid.cells}


def threads_per_worker(workers: int) -> int:
    """A local worker's torch threads: its share of the cores (ablate.backends.local)."""
    from ablate.cores import cpu_count

    return max(1, cpu_count() // max(1, workers))


def grid_speed(grid, workers: int) -> Speed:
    """This machine's speed for `grid` with `workers` local cells at once: at their threads, with
    the blocks of its variants measured."""
    return machine_speed(threads_per_worker(max(1, min(workers, len(grid.cells)))), variants=grid_variants(grid))


def grid_seconds(grid, workers: int, threads: int | None = None, speed: Speed | None = None) -> float:
    """A grid's estimated wall time with `workers` cells at once, each at `threads` threads
    (default: the cores shared among the workers), on this machine as it is now."""
    workers = max(1, min(workers, len(grid.cells)))
    threads = threads or threads_per_worker(workers)
    speed = speed or machine_speed(threads, variants=grid_variants(grid))
    # The workers take the cells in grid order, each the next one as it frees up.
    free = [0.0] * workers
    costs: dict[int, float] = {}  # per setting (shared by its seeds)
    for cell in grid.cells:
        cfg = grid.configs.setting(cell.id)
        seconds = costs.setdefault(id(cfg), speed.cell_seconds(cfg))
        heapq.heapreplace(free, free[0] + seconds)
    return max(free) * contention(speed, workers, threads)


if __name__ == "__main__" and sys.argv[1:2] == ["--companion"]:
    _companion(int(sys.argv[2]), Path(sys.argv[3]))
