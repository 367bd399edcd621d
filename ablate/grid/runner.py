"""Running a grid: every cell of it trained exactly once, on one backend (local, ray, slurm).

`run_grid(grid, out, GridRunOptions(...))` is what `ablate grid` and `ablate reproduce`
call. It refuses bad input before anything is written (an --out holding another grid or
runs of other settings, a backend that cannot run here), records grid.json, hands each
unfinished cell to the backend with its CellResources (the thread count the grid's first run
gave it, kept however many cells are left: the count changes a CPU run's bits), and keeps
grid.json current while the cells train.

Exit status, as `ablate grid` returns it: 0 when every cell ended completed or diverged (or
runs in another process), 1 when a cell failed or ended without a result, 2 for invalid input.
"""
from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

from ablate.backends import BACKENDS, backend_class
from ablate.backends.base import CellFn, RunResult
from ablate.core.errors import ConfigError
from ablate.core.rundir import FAILED, FINISHED, PENDING, RUNNING, SUMMARY, check_out_path, read_json
from ablate.core.timefmt import fmt_time
from ablate.engine.cell import CellResources
from ablate.engine.pack import STACK_AUTO, STACK_DEFAULT, parse_stack
from ablate.engine.pack_run import dispatch
from ablate.grid import state as grid_state
from ablate.grid.progress import Progress
from ablate.grid.spec import DEFAULT_SCALE, Grid, load_grid


@dataclasses.dataclass(frozen=True)
class GridRunOptions:
    """How a grid runs, apart from what it trains: none of these changes a result. One field
    per `ablate grid` flag of the same name; contradictions are refused when it is made."""

    backend: str = "local"
    workers: int | None = None  # local: cells at once, each in its own process; 0 = in this process
    cells_per_gpu: int = 1  # local: workers sharing one GPU
    cpus_per_cell: float | None = None  # ray/slurm: CPUs reserved per cell, also its torch threads
    retries: int = 1  # retries of a failing cell before it is recorded failed
    quiet: bool = False  # no progress bars
    address: str | None = None  # ray: cluster address (None: a local Ray)
    gpus_per_cell: float | None = None  # ray: GPUs per cell (None: 1 when the cluster has GPUs, else 0)
    partition: str | None = None  # slurm
    time: int = 60  # slurm: minutes per array task
    gpus_per_job: int | None = None  # slurm (None: 0 at the cpu scale, else 1)
    slurm_folder: Path | None = None  # slurm: submitit's logs (None: OUT/.submitit)
    array_parallelism: int | None = None  # slurm: array tasks running at once
    slurm_cluster: str = "slurm"  # slurm: submitit executor (local, debug: for tests)
    no_wait: bool = False  # slurm: submit and return
    stack: int | str = STACK_DEFAULT  # local: most seeds trained as one stacked model (ablate/engine/pack.py); 1 = off

    def __post_init__(self):
        def need(ok, message):
            if not ok:
                raise ConfigError(message)

        need(self.backend in BACKENDS, f"unknown backend {self.backend!r}; valid: {', '.join(BACKENDS)}")
        need(self.workers is None or self.workers >= 0, f"--workers {self.workers} must be 0 or more")
        need(self.cells_per_gpu >= 1, f"--cells-per-gpu {self.cells_per_gpu} must be at least 1")
        need(self.retries >= 0, f"--retries {self.retries} must be 0 or more")
        need(self.cpus_per_cell is None or self.cpus_per_cell > 0, f"--cpus-per-cell {self.cpus_per_cell} must be positive")
        need(self.gpus_per_cell is None or self.gpus_per_cell >= 0, f"--gpus-per-cell {self.gpus_per_cell} must be 0 or more")
        need(self.time >= 1, f"--time {self.time} must be at least 1 minute")
        need(self.gpus_per_job is None or self.gpus_per_job >= 0, f"--gpus-per-job {self.gpus_per_job} must be 0 or more")
        need(self.array_parallelism is None or self.array_parallelism >= 1,
             f"--array-parallelism {self.array_parallelism} must be at least 1")
        stack = parse_stack(self.stack)  # ConfigError naming a bad value
        need(self.backend == "local" or stack in (STACK_AUTO, 1),
             f"--stack {self.stack} is for --backend local; valid with {self.backend}: --stack 1 or auto")
        if self.backend != "local":
            need(self.workers is None, f"--workers is for --backend local; valid with {self.backend}: --cpus-per-cell, "
                 + ("--gpus-per-cell" if self.backend == "ray" else "--gpus-per-job, --array-parallelism"))

    @classmethod
    def from_args(cls, args) -> "GridRunOptions":
        """From parsed `ablate grid` arguments (flags named like the fields)."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def default_out(grid) -> Path:

    return Path("runs") / (grid.name if grid.scale == DEFAULT_SCALE else f"{grid.name}-{grid.scale}")


def check_out(grid, out: Path) -> None:
    """Refuse, before anything is written, an --out that is a file or that holds another grid:
    two grids in one folder would overwrite each other's grid.json, and a report on the folder
    would pair cells trained under different settings."""
    check_out_path(out, out)
    grid_json = out / grid_state.GRID_JSON
    if grid_json.is_file():
        try:
            held = read_json(grid_json).get("name")
        except (OSError, ValueError, AttributeError):
            held = None  # a damaged grid.json is rewritten by the run
        if held and held != grid.name:
            raise ConfigError(f"--out {out} holds grid {held!r} (its grid.json); grid {grid.name!r} needs "
                              "another --out")


def check_grid(grid, out: Path) -> None:
    """Everything that refuses a grid on any backend, before anything is written (also what a
    dry run checks)."""
    check_out(grid, out)
    grid_state.check_existing_runs(grid.cells, out)


def run_grid(grid, out: Path | None = None, options: GridRunOptions | None = None, *, scale: str = "cpu",
             overrides: dict | None = None, cell_fn: CellFn | None = None) -> int:
    """Expand (a grid name or TOML path; or take a loaded Grid) and run a grid into `out`
    (default runs/NAME[-SCALE]); returns the exit status; ConfigError for invalid input.
    `cell_fn` replaces run_cell (tests)."""
    if not isinstance(grid, Grid):
        grid = load_grid(grid, scale, overrides)
    out = Path(out) if out is not None else default_out(grid)
    options = options or GridRunOptions()
    check_grid(grid, out)
    backend = backend_class(options.backend)(options, grid, out)
    backend.check()
    return run_checked_grid(grid, out, options, cell_fn=cell_fn, backend=backend)


def run_checked_grid(grid, out: Path, options: GridRunOptions, cell_fn: CellFn | None = None, backend=None) -> int:
    """Run the checked `grid` into `out` on its backend; returns the exit status."""
    backend = backend or backend_class(options.backend)(options, grid, out)
    record = grid.record()
    finished, todo = grid_state.order_for_dispatch(grid.cells, out)
    if todo:
        backend.prepare(todo)  # connect, check resources: a ConfigError here has written nothing
    recorded = grid_state.recorded_threads(out)
    default = backend.threads_per_cell(todo) if todo else None
    executions = {c.id: CellResources(recorded.get(c.id, default)) for c in todo}
    threads_of = {**recorded, **{c.id: executions[c.id].threads_for(c) for c in todo}}
    for entry in record["cells"]:
        if threads_of.get(entry["id"]) is not None:
            entry["threads"] = threads_of[entry["id"]]
    out.mkdir(parents=True, exist_ok=True)
    grid_json = grid_state.GridJson(out, record)
    grid_json.write()
    t0 = time.time()

    retried = sum(1 for c in todo if (out / c.id / SUMMARY).exists())  # failed before: tried again
    packs = 0
    if todo and options.backend == "local":  # cells of a pack reach the backend as one (ablate/engine/pack.py)
        dispatched, cell_fn, packs = dispatch(todo, executions, options.stack, cell_fn)
    plan = (f"{len(todo)} to run on {backend.describe(todo, executions)}"
            + (f", seeds stacked in {packs} pack{'s' if packs != 1 else ''}" if packs else "")
            + (f" ({retried} failed before, tried again)" if retried else "") if todo else "nothing to run")
    todo = dispatched if packs else todo
    print(f"grid {grid.name}: {_cells(len(grid.cells))}, {grid.total_steps:,} steps; {len(finished)} already finished, "
          f"{plan} -> {out}", flush=True)
    progress = Progress(grid.name, len(todo), backend.slots(todo) if todo else 0, quiet=options.quiet)
    on_change = _throttled(grid_json)
    interrupted = False
    try:
        result = backend.run(todo, executions, progress, record, on_change, cell_fn) if todo else RunResult({}, [], [])
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        grid_json.write()
        state = grid_json.state()
        if interrupted:
            print(summary_line(grid, out, state, time.time() - t0, "interrupted; rerun to resume"), flush=True)
    if todo and backend.detached:
        print("not waiting: rerun this command without --no-wait later to wait for the jobs and collect the "
              "results (it submits only cells that no queued job holds; `squeue --me` shows them)", flush=True)
        return 0
    counts = state["counts"]
    extra = []
    running = counts.get(RUNNING, 0)  # as it is now, not as it was when a cell was found busy
    if running:
        extra.append(f"{running} cell{'s are' if running != 1 else ' is'} running in another process; "
                     "rerun later to check them")
    # Pending now: no summary and nobody holds it. Never reported as success.
    unfinished = [c["id"] for c in state["cells"] if c["status"] == PENDING]
    if unfinished:
        extra.append(f"{_cells(len(unfinished))} left unfinished (e.g. {unfinished[0]}); rerun to train "
                     f"{'them' if len(unfinished) != 1 else 'it'}")
    print(summary_line(grid, out, state, time.time() - t0, "; ".join(extra)), flush=True)
    if result.refused:
        print(f"ablate grid: error: {result.refused[0]}", file=sys.stderr)
        return 2
    if counts.get(FAILED) or result.errors or unfinished:
        return 1
    return 0


def _throttled(grid_json: grid_state.GridJson):
    """on_change for the backends: a cell started or ended (cell_id: which one, when the backend
    knows), or with idle, nothing happened. grid.json is updated at most twice a second,
    re-deriving the cells that changed; a change inside that window is written on the next
    idle call."""
    last_write, dirty, changed = [0.0], [False], set()

    def on_change(idle: bool = False, cell_id: str | None = None):
        if not idle:
            dirty[0] = True
            changed.add(cell_id)  # None: some cell, unknown which: a full pass
        if dirty[0] and time.time() - last_write[0] > 0.5:
            last_write[0], dirty[0] = time.time(), False
            ids = None if None in changed else set(changed)
            changed.clear()
            grid_json.write(ids)

    return on_change


def _cells(n: int) -> str:
    return f"{n} cell{'s' if n != 1 else ''}"


def summary_line(grid, out: Path, state: dict, seconds: float, extra: str = "") -> str:
    counts = state["counts"]
    order = (*FINISHED, RUNNING, PENDING)
    parts = [f"{counts[k]} {'running elsewhere' if k == RUNNING else k}" for k in order if counts.get(k)]
    line = f"grid {grid.name}: {_cells(len(grid.cells))}: {', '.join(parts)} ({fmt_time(seconds)}) -> {out / grid_state.GRID_JSON}"
    return line + (f"; {extra}" if extra else "")
