"""How long a grid will take on this machine: the estimate `ablate grid --dry-run`,
`ablate reproduce` and `ablate ladder` print.

A training step costs its blocks' small ops (norms, GELU, residual adds, the probes: a fixed
cost a block, whatever its FLOPs, and at these widths most of the time) plus its FLOPs at the
machine's rate:

    step seconds = BLOCK x blocks + FLOPs / RATE

Two short cells of the claims' own model (tiny, 12 blocks), at its width and at width 16, are
timed through the training loop's own step (ablate.train.train_step, probes on) at the thread
count a grid's workers get, taking turns for ROUNDS rounds; each cell's step is the median round,
and the two give BLOCK and RATE. A cell's estimate is then its steps (its validation batches at
EVAL_RATIO of a step) plus the fixed cost of building it. The fastest and slowest round say how
far the machine's own speed moved while it was measured: the estimate's range.

The figures are cached in $ABLATE_CACHE/speed.json for MAX_AGE_S per thread count and CPU;
whatever else is found there (another format, a damaged field, a FIFO) is measured again with
one line saying why. ABLATE_SPEED=reference prices with a fixed yardstick instead (the test
suite's: no measuring, no cache).
"""
from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields

CACHE_NAME = "speed.json"
CACHE_LIMIT = 1 << 16  # bytes: a few calibrations are a few hundred
FORMAT = 5  # any other format is measured again
MAX_AGE_S = 30 * 60
BLOCKS, WIDTHS = 12, (64, 16)  # the calibration's cells: tiny x 12 at its width and a narrow one
ROUNDS, STEPS, WARMUP = 3, 4, 1  # rounds of STEPS timed steps of each cell, after WARMUP untimed
EVAL_RATIO = 0.12  # a validation batch over a training step (the yardstick's fit)
SPEED_ENV = "ABLATE_SPEED"
SPEED_MODES = {"": "unset: measure this machine", "reference": "the fixed yardstick"}


@dataclass(frozen=True)
class Speed:
    block_s: float  # a block's small ops, a step
    flops_per_s: float  # the rate of a step's FLOPs
    cell_s: float  # a cell's fixed cost: its plan, data and model built
    low: float  # the fastest round's step over the median's (<= 1): the range of the estimate
    high: float  # the slowest round's over the median's (>= 1)
    threads: int
    machine: str
    measured_at: float | None  # None: the yardstick, never measured

    def step_seconds(self, cfg) -> float:
        return self.block_s * cfg.size.n_layer + step_flops(cfg) / self.flops_per_s

    def cell_seconds(self, cfg) -> float:
        """A cell's seconds: its steps, its validation batches, its build. A cell that diverges
        stops early, so this is an upper bound for those."""
        evals = (cfg.steps - 1) // cfg.eval_every * cfg.eval_batches + cfg.final_eval_batches
        return self.cell_s + (cfg.steps + evals * EVAL_RATIO) * self.step_seconds(cfg)

    def source(self) -> str:
        if self.measured_at is None:
            return f"the fixed reference yardstick ({SPEED_ENV}=reference), not measured on this machine"
        minutes = (time.time() - self.measured_at) / 60
        return f"this machine's speed, measured {'just now' if minutes < 1 else f'{minutes:.0f} min ago'}"

    def describe(self) -> str:
        return (f"estimated from {self.source()}, at {self.threads} thread{'s' if self.threads != 1 else ''}: "
                f"{self.block_s * 1e3:.2f} ms a block a step + FLOPs at {self.flops_per_s / 1e9:.1f} GFLOP/s, "
                f"{self.cell_s:.1f} s a cell")

    def span(self, seconds: float) -> str:
        """' (LOW-HIGH min at the fastest and slowest of its rounds)'; '' for the yardstick."""
        if self.measured_at is None:
            return ""
        return f" ({seconds * self.low / 60:.1f}-{seconds * self.high / 60:.1f} min at its fastest and slowest round)"


def reference(threads: int = 1) -> Speed:
    """A fixed yardstick, not this machine: the claims' size budgets (tests) use it, where a
    measurement would make them depend on the day's load. From a fit to the 229 cells of one
    `ablate reproduce all --quick` on this project's 2-core machine with nothing else running
    (RATE as fitted; BLOCK with the fit's per-step cost folded in at the claims' tiny x 12)."""
    return Speed(block_s=3.47e-3, flops_per_s=51.9e9, cell_s=0.0, low=1.0, high=1.0, threads=threads,
                 machine="reference", measured_at=None)


_FLOPS: dict = {}


def step_flops(cfg) -> float:
    """Training FLOPs of one step: 6 x parameters x tokens plus attention's 6 x blocks x
    context x width a token (ablate.bench.flops' formula, on the variant's own parameters)."""
    key = (cfg.spec, cfg.size, cfg.context, cfg.batch_size)
    if key not in _FLOPS:
        import torch

        from ablate.model import build_model

        size = cfg.size
        # Only the parameter count is wanted: a small model is built on the CPU in milliseconds;
        # meta (whose first use imports torch._dynamo, seconds) only where weights would be large.
        rough = 12 * size.n_layer * size.d_model ** 2 + size.vocab_size * size.d_model
        with torch.random.fork_rng(devices=[]):  # the caller's RNG left as it was
            model = build_model(cfg.spec, size, device="cpu" if rough < 20e6 else "meta")
        params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("wpe."))
        _FLOPS[key] = cfg.batch_size * cfg.context * (6 * params + 6 * size.n_layer * cfg.context * size.d_model)
    return _FLOPS[key]


def _stepper(width: int, threads: int):
    """(one training step of tiny x BLOCKS at `width` as a callable, its config, seconds to build it)."""
    from ablate import fpmode
    from ablate.bench.lockstep import build_copy
    from ablate.cell import Cell
    from ablate.train import plan_run, train_step

    start = time.perf_counter()
    plan = plan_run(Cell.from_options({"model": "tiny", "layers": BLOCKS, "width": width, "threads": threads}))
    fpmode.apply(plan.cfg.flush_denormal)
    model, opt, probes = build_copy(plan, probed=True)
    built, cfg, steps = time.perf_counter() - start, plan.cfg, itertools.count()

    def step():
        i = next(steps)
        x, y = plan.data.batch("train", i, cfg.seed, cfg.batch_size, cfg.context, plan.device)
        train_step(plan, model, model, opt, probes, i, x, y)

    return step, cfg, built


def calibrate(threads: int = 1) -> Speed:
    """Measure BLOCK and RATE from the two WIDTHS' cells (a few seconds on a quiet machine).
    A cell's fixed cost is the quicker build of the two: the first pays the imports, once a
    process as a grid's worker does."""
    from ablate.bench.lockstep import threads_and_flushing
    from ablate.bench.timing import interleaved

    with threads_and_flushing(threads):
        cells = {width: _stepper(width, threads) for width in WIDTHS}
        rounds = interleaved({w: fn for w, (fn, _, _) in cells.items()}, ROUNDS, STEPS, WARMUP)
    wide, narrow = (statistics.median(rounds[w]) for w in WIDTHS)
    flops = [step_flops(cells[w][1]) for w in WIDTHS]
    per_flop = max((wide - narrow) / (flops[0] - flops[1]), 1e-15)  # noise could make it negative
    block_s = max(0.0, (wide - flops[0] * per_flop) / BLOCKS)
    return Speed(block_s=block_s, flops_per_s=1 / per_flop, cell_s=min(c[2] for c in cells.values()),
                 low=min(rounds[WIDTHS[0]]) / wide, high=max(rounds[WIDTHS[0]]) / wide, threads=threads,
                 machine=machine(), measured_at=time.time())


def machine() -> str:
    """What a calibration is valid for: the CPU (ablate.provenance's reading), its cores, torch."""
    import platform

    import torch

    from ablate.provenance import cpuinfo

    cpu = cpuinfo("model name") or platform.machine()
    return f"{cpu} | {os.cpu_count()} cores | torch {torch.__version__}"


def _number(value, low: float = 0.0, above: bool = False) -> bool:
    """A JSON number (not a boolean), finite, at least `low` (over it where `above`)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > low if above else value >= low))


# Each field of a cached calibration: whether a value is valid, and what is.
_CHECKS = {
    "block_s": (_number, "a finite number >= 0"),
    "cell_s": (_number, "a finite number >= 0"),
    "flops_per_s": (lambda v: _number(v, above=True), "a finite number > 0"),
    "low": (lambda v: _number(v, above=True) and v <= 1, "a number in (0, 1]"),
    "high": (lambda v: _number(v, 1.0), "a finite number >= 1"),
    "threads": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number >= 1"),
    "machine": (lambda v: isinstance(v, str), "a string"),
    "measured_at": (lambda v: _number(v, above=True) and v <= time.time() + 60, "a time in the past (seconds)"),
    "format": (lambda v: v == FORMAT, f"{FORMAT}, this version's (another is measured again)"),
}
assert set(_CHECKS) == {f.name for f in fields(Speed)} | {"format"}


def _problem(entry) -> str | None:
    """Why a cached calibration cannot be used (None: it can)."""
    if not isinstance(entry, dict):
        return f"a calibration is a JSON {type(entry).__name__}, not an object"
    for name, (valid, what) in _CHECKS.items():
        if name not in entry:
            return f"a calibration has no {name}"
        if not valid(entry[name]):
            return f"{name} is {json.dumps(entry[name])[:40]}; valid: {what}"
    unknown = sorted(set(entry) - set(_CHECKS))
    return f"a calibration has an unknown field {unknown[0]!r}" if unknown else None


def _cache_path():
    from ablate.data import cache_root

    return cache_root() / CACHE_NAME


def _read_cache() -> tuple[dict, str | None]:
    """The cache's calibrations by thread count, and why the file cannot be used (None: it can,
    or there is none). Whatever is at its name is checked: a FIFO is not waited on, a device not
    read (open_regular), nothing over CACHE_LIMIT."""
    from ablate.rundir import open_regular

    try:
        with open_regular(_cache_path()) as f:
            text = f.read(CACHE_LIMIT + 1)
    except FileNotFoundError:
        return {}, None
    except OSError as e:
        return {}, f"cannot read it: {e.strerror or e}"
    if len(text) > CACHE_LIMIT:
        return {}, f"it is over {CACHE_LIMIT} bytes"
    try:
        entries = json.loads(text)
    except ValueError:  # UnicodeDecodeError among them
        return {}, "it is not JSON"
    if not isinstance(entries, dict):
        return {}, f"it holds a JSON {type(entries).__name__}, not an object"
    return entries, None


def _cached(threads: int) -> tuple[Speed | None, str | None]:
    """The cached calibration at `threads` threads if it still describes this machine (its CPU
    and torch, under MAX_AGE_S old); and why the cache is unusable, where it is."""
    entries, problem = _read_cache()
    if problem or str(threads) not in entries:
        return None, problem
    entry = entries[str(threads)]
    problem = _problem(entry)
    if problem:
        return None, problem
    speed = Speed(**{k: v for k, v in entry.items() if k != "format"})
    fresh = speed.machine == machine() and time.time() - speed.measured_at < MAX_AGE_S
    return (speed if fresh else None), None


def _store(speed: Speed) -> None:
    """Write `speed` as the cache's entry for its thread count, atomically (a link at the
    file's name is replaced, never followed); an unwritable cache is measured again next time."""
    from ablate.rundir import write_json_atomic

    entries, _ = _read_cache()
    entries[str(speed.threads)] = {**asdict(speed), "format": FORMAT}
    try:
        _cache_path().parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(_cache_path(), entries)
    except (OSError, ValueError):
        pass


def speed_mode() -> str:
    """$ABLATE_SPEED, checked: a value it does not know is refused, never taken as 'measure'."""
    from ablate.errors import ConfigError

    mode = os.environ.get(SPEED_ENV, "")
    if mode not in SPEED_MODES:
        raise ConfigError(f"{SPEED_ENV}={mode[:40]!r} is not a speed source; valid: "
                          + ", ".join(f"{k or 'unset'} ({v.split(': ')[-1]})" for k, v in SPEED_MODES.items()))
    return mode


def machine_speed(threads: int = 1, quiet: bool = False) -> Speed:
    """This machine's speed at `threads` threads: cached, or measured now (and cached); the
    yardstick where $ABLATE_SPEED is `reference`."""
    if speed_mode() == "reference":
        return reference(threads)
    speed, problem = _cached(threads)
    if speed is None:
        if not quiet or problem:
            why = f"the speed cache {_cache_path()} is unusable ({problem}), so measure again: " if problem else ""
            print(f"ablate: {why}measuring this machine's training speed at {threads} thread"
                  f"{'s' if threads != 1 else ''} for the estimate (seconds; cached)", file=sys.stderr, flush=True)
        speed = calibrate(threads)
        _store(speed)
    return speed


def threads_per_worker(workers: int) -> int:
    """A local worker's torch threads: its share of the cores (ablate.backends.local)."""
    from ablate.cores import cpu_count

    return max(1, cpu_count() // max(1, workers))


def grid_speed(grid, workers: int) -> Speed:
    """This machine's speed for `grid` with `workers` local cells at once, at their threads."""
    return machine_speed(threads_per_worker(max(1, min(workers, len(grid.cells)))))


def grid_seconds(grid, workers: int, threads: int | None = None, speed: Speed | None = None) -> float:
    """A grid's estimated wall time with `workers` cells at once, each at `threads` threads
    (default: the cores shared among the workers)."""
    from ablate.cores import cpu_count

    workers = max(1, min(workers, len(grid.cells)))
    threads = threads or threads_per_worker(workers)
    speed = speed or machine_speed(threads)
    free = [0.0] * workers  # the workers take the cells in grid order, each the next as it frees up
    costs: dict[int, float] = {}  # per setting (shared by its seeds)
    for cell in grid.cells:
        cfg = grid.configs.setting(cell.id)
        heapq.heapreplace(free, free[0] + costs.setdefault(id(cfg), speed.cell_seconds(cfg)))
    return max(free) * max(1.0, workers * threads / cpu_count())  # more threads than cores: they share
