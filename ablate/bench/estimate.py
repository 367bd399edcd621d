"""How long a grid will take on this machine: the estimate `ablate grid --dry-run`,
`ablate reproduce` and `ablate ladder` print (how, and how far to trust it:
docs/performance.md#the-time-estimate).

A fixed yardstick prices a step: BLOCK_S a block (its small ops) plus its FLOPs at FLOPS_PER_S.
One short cell of the claims' model (tiny x BLOCKS, probes on) is timed through the training
loop's own step, and its median round over the yardstick's price is this machine's factor; a
cell's estimate is the factor x its steps (its validation batches at EVAL_RATIO a step) at the
yardstick's price. The fastest and slowest rounds give the estimate's range. The factor is
cached in $ABLATE_CACHE/speed.json per thread count while the CPU and torch are the same and it
is under MAX_AGE_S old; anything else found there is measured again, with one line saying why.
"""
from __future__ import annotations

import heapq
import json
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields

from ablate.bench.timing import threads as at_threads
from ablate.core.bounded_read import UnreadableFile, read_json
from ablate.core.cores import cpu_count
from ablate.core.errors import ConfigError
from ablate.core.paths import cache_root
from ablate.core.rundir import write_json_atomic

# The yardstick, fitted to one `ablate reproduce all --quick` on a quiet 2-core machine.
BLOCK_S, FLOPS_PER_S = 3.47e-3, 51.9e9
EVAL_RATIO = 0.12  # a validation batch over a training step (the same fit)
BLOCKS, ROUNDS, STEPS, WARMUP = 12, 3, 4, 1  # the measured cell: ROUNDS rounds of STEPS steps after WARMUP
CACHE_NAME, CACHE_LIMIT, FORMAT, MAX_AGE_S = "speed.json", 1 << 16, 6, 30 * 60
SPEED_ENV = "ABLATE_SPEED"
SPEED_MODES = {"": "measure this machine", "reference": "the fixed yardstick"}


@dataclass(frozen=True)
class Speed:
    factor: float  # this machine's step over the yardstick's
    low: float  # the fastest round's step over the median's (<= 1): the estimate's range
    high: float  # the slowest round's over the median's (>= 1)
    threads: int
    machine: str
    measured_at: float | None  # None: the yardstick itself, never measured

    def step_seconds(self, cfg) -> float:
        return self.factor * (BLOCK_S * cfg.size.n_layer + step_flops(cfg) / FLOPS_PER_S)

    def cell_seconds(self, cfg) -> float:
        """A cell's steps and validation batches: an upper bound for one that diverges and stops."""
        evals = (cfg.steps - 1) // cfg.eval_every * cfg.eval_batches + cfg.final_eval_batches
        return (cfg.steps + evals * EVAL_RATIO) * self.step_seconds(cfg)

    def source(self) -> str:
        if self.measured_at is None:
            return f"the fixed reference yardstick ({SPEED_ENV}=reference), not measured on this machine"
        minutes = (time.time() - self.measured_at) / 60
        return f"this machine's speed, measured {'just now' if minutes < 1 else f'{minutes:.0f} min ago'}"

    def describe(self) -> str:
        return (f"estimated from {self.source()}, at {self.threads} thread{'s' if self.threads != 1 else ''}: "
                f"a step at {self.factor:.2f} x ({BLOCK_S * 1e3:.2f} ms a block + FLOPs at "
                f"{FLOPS_PER_S / 1e9:.1f} GFLOP/s)")

    def span(self, seconds: float) -> str:
        """' (LOW-HIGH min at its fastest and slowest round)'; '' for the yardstick."""
        if self.measured_at is None:
            return ""
        return f" ({seconds * self.low / 60:.1f}-{seconds * self.high / 60:.1f} min at its fastest and slowest round)"


def reference(threads: int = 1) -> Speed:
    return Speed(factor=1.0, low=1.0, high=1.0, threads=threads, machine="reference", measured_at=None)


_FLOPS: dict = {}


def step_flops(cfg) -> float:
    """Training FLOPs of one step: 6 x parameters x tokens plus attention's 6 x blocks x
    context x width a token (ablate.bench.flops' formula, on the variant's own parameters)."""
    key = (cfg.spec, cfg.size, cfg.context, cfg.batch_size)
    if key not in _FLOPS:
        import torch  # lazy: torch only when used

        from ablate.engine.model import build_model  # lazy: torch only when used

        size = cfg.size
        # A small model is built on the CPU in milliseconds; meta (whose first use imports
        # torch._dynamo, seconds) only where the weights would be large.
        rough = 12 * size.n_layer * size.d_model ** 2 + size.vocab_size * size.d_model
        with torch.random.fork_rng(devices=[]):  # the caller's RNG left as it was
            model = build_model(cfg.spec, size, device="cpu" if rough < 20e6 else "meta")
        params = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("wpe."))
        _FLOPS[key] = cfg.batch_size * cfg.context * (6 * params + 6 * size.n_layer * cfg.context * size.d_model)
    return _FLOPS[key]


def calibrate(threads: int = 1) -> Speed:
    """Time the claims' cell at `threads` threads (a few seconds on a quiet machine)."""
    from ablate.bench.lockstep import build_copy, plan_cell, steps_in_turn  # lazy: torch only when used

    with at_threads(threads):
        plan = plan_cell({"model": "tiny", "layers": BLOCKS, "threads": threads})
        seconds, _ = steps_in_turn(plan, [build_copy(plan, probed=True)], 0, WARMUP + ROUNDS * STEPS)
    steps = seconds[0][WARMUP:]
    rounds = [sum(steps[i:i + STEPS]) / STEPS for i in range(0, len(steps), STEPS)]
    median = statistics.median(rounds)
    return Speed(factor=median / reference().step_seconds(plan.cfg), low=min(rounds) / median,
                 high=max(rounds) / median, threads=threads, machine=machine(), measured_at=time.time())


def machine() -> str:
    """What a measurement is valid for: the CPU (ablate.core.provenance's reading), its cores, torch."""
    import torch  # lazy: torch only when used

    from ablate.core.provenance import cpuinfo  # lazy: torch only when used

    # The machine's count, not cores.cpu_count(): this names the hardware a cached speed was measured on
    # (its threads are recorded beside it), so a taskset or SLURM share of it keeps the cache.
    return f"{cpuinfo('model name') or platform.machine()} | {os.cpu_count()} cores | torch {torch.__version__}"


def _number(value, low: float = 0.0, above: bool = False) -> bool:
    """A JSON number (not a boolean), finite, at least `low` (over it where `above`)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (value > low if above else value >= low))


# Each field of a cached measurement: whether a value is valid, and what is.
_CHECKS = {
    "factor": (lambda v: _number(v, above=True), "a finite number > 0"),
    "low": (lambda v: _number(v, above=True) and v <= 1, "a number in (0, 1]"),
    "high": (lambda v: _number(v, 1.0), "a finite number >= 1"),
    "threads": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number >= 1"),
    "machine": (lambda v: isinstance(v, str), "a string"),
    "measured_at": (lambda v: _number(v, above=True) and v <= time.time() + 60, "a time in the past (seconds)"),
    "format": (lambda v: v == FORMAT, f"{FORMAT}, this version's (another is measured again)"),
}
assert set(_CHECKS) == {f.name for f in fields(Speed)} | {"format"}


def _problem(entry) -> str | None:
    """Why a cached measurement cannot be used (None: it can)."""
    if not isinstance(entry, dict):
        return f"a measurement is a JSON {type(entry).__name__}, not an object"
    for name, (valid, what) in _CHECKS.items():
        if name not in entry:
            return f"a measurement has no {name}"
        if not valid(entry[name]):
            return f"{name} is {json.dumps(entry[name])[:40]}; valid: {what}"
    unknown = sorted(set(entry) - set(_CHECKS))
    return f"a measurement has an unknown field {unknown[0]!r}" if unknown else None


def _cache_path():

    return cache_root() / CACHE_NAME


def _read_cache() -> tuple[dict, str | None]:
    """The cache's entries by thread count, and why the file cannot be used (None: it can, or
    there is none). A FIFO is not waited on, a device not read, nor a large file, nor one nested
    thousands deep (ablate/core/bounded_read.py)."""
    try:
        return read_json(_cache_path(), top=dict, limit=CACHE_LIMIT), None
    except FileNotFoundError:
        return {}, None
    except UnreadableFile as e:
        return {}, f"it {e.why}" if e.why.startswith(("holds", "nested")) else f"it cannot be read: {e.why}"
    except OSError as e:
        return {}, f"cannot read it: {e.strerror or e}"


def _cached(threads: int) -> tuple[Speed | None, str | None]:
    """The cached speed at `threads` threads if it still describes this machine; and why the
    cache is unusable, where it is."""
    entries, problem = _read_cache()
    if problem or str(threads) not in entries:
        return None, problem
    problem = _problem(entries[str(threads)])
    if problem:
        return None, problem
    speed = Speed(**{k: v for k, v in entries[str(threads)].items() if k != "format"})
    fresh = speed.machine == machine() and time.time() - speed.measured_at < MAX_AGE_S
    return (speed if fresh else None), None


def _store(speed: Speed) -> None:
    """The cache's entry for its thread count, written atomically (a link at the file's name is
    replaced, never followed); an unwritable cache is measured again next time."""
    entries, _ = _read_cache()
    entries[str(speed.threads)] = {**asdict(speed), "format": FORMAT}
    try:
        _cache_path().parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(_cache_path(), entries)
    except (OSError, ValueError):
        pass


def machine_speed(threads: int = 1) -> Speed:
    """This machine's speed at `threads` threads: cached, or measured now (and cached); the
    yardstick where $ABLATE_SPEED is `reference`, and a value it does not know refused."""
    mode = os.environ.get(SPEED_ENV, "")
    if mode not in SPEED_MODES:
        raise ConfigError(f"{SPEED_ENV}={mode[:40]!r} is not a speed source; valid: "
                          + ", ".join(f"{k or 'unset'} ({v})" for k, v in SPEED_MODES.items()))
    if mode == "reference":
        return reference(threads)
    speed, problem = _cached(threads)
    if speed is None:
        why = f"the speed cache {_cache_path()} is unusable ({problem}), so measure again: " if problem else ""
        print(f"ablate: {why}measuring this machine's training speed at {threads} thread"
              f"{'s' if threads != 1 else ''} for the estimate (seconds; cached)", file=sys.stderr, flush=True)
        speed = calibrate(threads)
        _store(speed)
    return speed


def threads_per_worker(workers: int) -> int:
    """A local worker's torch threads: its share of the cores (ablate.backends.local)."""
    return max(1, cpu_count() // max(1, workers))


def grid_speed(grid, workers: int) -> Speed:
    """This machine's speed for `grid` with `workers` local cells at once, at their threads."""
    return machine_speed(threads_per_worker(max(1, min(workers, len(grid.cells)))))


def grid_seconds(grid, workers: int, speed: Speed | None = None) -> float:
    """A grid's estimated wall time with `workers` cells at once, each at its share of the cores."""
    workers = max(1, min(workers, len(grid.cells)))
    speed = speed or grid_speed(grid, workers)
    free = [0.0] * workers  # the workers take the cells in grid order, each the next as it frees up
    costs: dict[int, float] = {}  # per setting (shared by its seeds)
    for cell in grid.cells:
        cfg = grid.configs.setting(cell.id)
        heapq.heapreplace(free, free[0] + costs.setdefault(id(cfg), speed.cell_seconds(cfg)))
    return max(free) * max(1.0, workers / cpu_count())  # more workers than cores: they share
