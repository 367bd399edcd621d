"""`ablate grid GRID`: run every cell of an ablation grid, each exactly once.

GRID is a TOML file or a shipped grid name (`ablate grid --list`). Cells run in local worker
processes (default), as Ray tasks, or as a SLURM job array; every way calls the same
idempotent cell function, so a rerun skips finished cells and resumes the others.
Exit status: 0 when every cell ended completed or diverged (or runs in another process),
1 when a cell failed or ended without a result, 2 for invalid input (nothing written).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ablate.backends import BACKENDS
from ablate.errors import ConfigError


def add_arguments(p) -> None:
    p.add_argument("grid", nargs="?", metavar="GRID", help="a grid file (TOML) or a shipped grid name (see --list)")
    p.add_argument("--list", action="store_true", help="list the shipped grids and exit")
    p.add_argument("--dry-run", action="store_true", help="print the cells and total steps; train and write nothing")
    p.add_argument("--out", type=Path, help="output folder (default runs/<grid name>, runs/<name>-<scale> for other scales)")
    p.add_argument("--scale", default="cpu", help="the grid file's scale: cpu (default) or one of its [scales.*], e.g. gpu")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an option in every cell, e.g. --set steps=5 (repeatable)")
    p.add_argument("--kernels", metavar="K", help="kernel backend for every cell: reference, triton, cuda or auto")
    p.add_argument("--backend", choices=BACKENDS, default="local", help="where cells run (default local)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="local: cells at once, each in its own process (default: one per GPU x --cells-per-gpu, "
                        "else 1); 0 = in this process")
    p.add_argument("--cells-per-gpu", type=int, default=1, metavar="N", help="local: workers sharing one GPU (default 1)")
    p.add_argument("--cpus-per-cell", type=float, metavar="N",
                   help="ray/slurm: CPUs reserved per cell, also its torch threads (ray default 1)")
    p.add_argument("--retries", type=int, default=1, metavar="N", help="retries of a failing cell before it is recorded failed (default 1)")
    p.add_argument("--quiet", action="store_true", help="no progress bars; still a line per cell and a summary")
    ray = p.add_argument_group("ray backend")
    ray.add_argument("--address", help="Ray cluster address (auto = the running cluster; default: start a local Ray)")
    ray.add_argument("--gpus-per-cell", type=float, metavar="F",
                     help="GPUs per cell, a fraction packs small cells (default 1 when the cluster has GPUs, else 0)")
    slurm = p.add_argument_group("slurm backend (submitit)")
    slurm.add_argument("--partition", help="SLURM partition")
    slurm.add_argument("--time", type=int, default=60, metavar="MIN", help="time limit per array task in minutes (default 60)")
    slurm.add_argument("--gpus-per-job", type=int, metavar="N", help="GPUs per array task (default 0 at --scale cpu, else 1)")
    slurm.add_argument("--slurm-folder", type=Path, help="submitit's logs and pickles (default OUT/.submitit)")
    slurm.add_argument("--array-parallelism", type=int, metavar="N", help="array tasks running at once (SLURM's %%N)")
    slurm.add_argument("--slurm-cluster", choices=("slurm", "local", "debug"), default="slurm",
                       help="submitit executor: slurm (default), or local processes / in-process for testing")
    slurm.add_argument("--no-wait", action="store_true", help="submit and exit; rerun later to follow up")


def _check_args(args) -> None:
    def need(ok, message):
        if not ok:
            raise ConfigError(message)

    need(args.workers is None or args.workers >= 0, f"--workers {args.workers} must be 0 or more")
    need(args.cells_per_gpu >= 1, f"--cells-per-gpu {args.cells_per_gpu} must be at least 1")
    need(args.retries >= 0, f"--retries {args.retries} must be 0 or more")
    need(args.cpus_per_cell is None or args.cpus_per_cell > 0, f"--cpus-per-cell {args.cpus_per_cell} must be positive")
    need(args.gpus_per_cell is None or args.gpus_per_cell >= 0, f"--gpus-per-cell {args.gpus_per_cell} must be 0 or more")
    need(args.time >= 1, f"--time {args.time} must be at least 1 minute")
    need(args.gpus_per_job is None or args.gpus_per_job >= 0, f"--gpus-per-job {args.gpus_per_job} must be 0 or more")
    need(args.array_parallelism is None or args.array_parallelism >= 1,
         f"--array-parallelism {args.array_parallelism} must be at least 1")
    if args.backend != "local":
        need(args.workers is None, f"--workers is for --backend local; valid with {args.backend}: --cpus-per-cell, "
             + ("--gpus-per-cell" if args.backend == "ray" else "--gpus-per-job, --array-parallelism"))


def list_grids() -> int:
    from ablate.grids import load_grid, shipped_grids

    rows = []
    for name in shipped_grids():
        cpu = load_grid(name)
        gpu = load_grid(name, "gpu") if "gpu" in cpu.scales else None
        rows.append((name, len(cpu.cells), cpu.total_steps, len(gpu.cells) if gpu else None,
                     gpu.total_steps if gpu else None, cpu.description))
    print("shipped grids (ablate grid NAME; --scale gpu for the GPU-sized version):")
    width = max(len(r[0]) for r in rows) + 2
    print(f"  {'name':<{width}}{'cells':>6}{'steps':>9}{'gpu cells':>11}{'gpu steps':>11}  description")
    for name, cells, steps, gcells, gsteps, desc in rows:
        g1 = f"{gcells:>11}" if gcells is not None else f"{'-':>11}"
        g2 = f"{gsteps:>11,}" if gsteps is not None else f"{'-':>11}"
        print(f"  {name:<{width}}{cells:>6}{steps:>9,}{g1}{g2}  {desc}")
    return 0


def dry_run(grid, out: Path) -> int:
    from ablate.scheduler import cell_status

    print(f"grid {grid.name} ({grid.source}), scale {grid.scale}, out {out}")
    collapsed = len(grid.duplicates)
    print(f"{len(grid.cells)} cells ({grid.combinations} crossings, {collapsed} duplicate"
          f"{'s' if collapsed != 1 else ''} collapsed), {grid.total_steps:,} steps in total")
    print(f"cell ids: variant id{''.join(f', {k}' for k in grid.id_keys)}, seed")
    if grid.overrides:
        print("--set: " + ", ".join(f"{k}={v}" for k, v in grid.overrides.items()))
    print(f"  {'status':<10}{'model':<12}{'layers':>6}{'steps':>7}  cell")
    for cell in grid.cells:
        cfg = grid.configs.setting(cell.id)
        status = cell_status(out, cell.id) if out.exists() else "pending"
        print(f"  {status:<10}{cfg.model:<12}{cfg.size.n_layer:>6}{cfg.steps:>7}  {cell.id}")
    if grid.duplicates:
        print(f"duplicates (train the same config as the cell shown, so they run once):")
        for described, kept in grid.duplicates:
            print(f"  {described}  ->  {kept}")
    if grid.refused:
        print("crossings the variant rules refuse (dropped):")
        for line in grid.refused:
            print(f"  {line}")
    print(f"total: {len(grid.cells)} cells, {grid.total_steps:,} steps")
    return 0


def _preload_data(grid) -> None:
    """Tokenise each distinct corpus once, here, before any worker starts (BPE is trained
    once, not by every worker), and refuse bad data before anything is written."""
    from ablate.data import load_data

    seen = set()
    for cfg in grid.configs.distinct():
        key = (cfg.data, cfg.size.tokenizer, cfg.size.vocab_size)
        if key not in seen:
            seen.add(key)
            load_data(*key)


def check_out(grid, out: Path) -> None:
    """Refuse, before anything is written, an --out that is a file or that holds another grid:
    two grids in one folder would overwrite each other's grid.json, and a report on the folder
    would pair cells trained under different settings."""
    from ablate.rundir import check_out_path, read_json

    check_out_path(out, out)
    grid_json = out / "grid.json"
    if grid_json.is_file():
        try:
            held = read_json(grid_json).get("name")
        except (OSError, ValueError, AttributeError):
            held = None  # a damaged grid.json is rewritten by the run
        if held and held != grid.name:
            raise ConfigError(f"--out {out} holds grid {held!r} (its grid.json); grid {grid.name!r} needs "
                              "another --out")


def check_local_devices(grid) -> None:
    """With local workers, a device or kernel backend this machine lacks is an input error for
    the whole grid (exit 2, nothing written), not a refusal per cell. (Ray and SLURM cells run
    elsewhere, so their machines decide.)"""
    from ablate.kernels import get_backend
    from ablate.train import pick_device

    seen = set()
    for cfg in grid.configs.distinct():
        key = (cfg.device, cfg.kernels)
        if key in seen:
            continue
        seen.add(key)
        device = pick_device(cfg)
        if cfg.kernels in ("triton", "cuda"):  # `auto` always resolves to something that runs
            get_backend(cfg.kernels, str(device))  # as the cell's own plan_run will


def run(args) -> int:
    if args.list:
        return list_grids()
    from ablate.grids import DEFAULT_SCALE, load_grid, parse_overrides, shipped_grids

    if not args.grid:
        raise ConfigError(f"missing GRID; valid: a grid file (TOML) or a shipped grid ({', '.join(shipped_grids())})")
    _check_args(args)
    overrides = parse_overrides(args.set)
    if args.kernels is not None:
        from ablate.kernels import CHOICES

        if args.kernels not in CHOICES:
            raise ConfigError(f"--kernels {args.kernels!r} is not a kernel backend; valid: {', '.join(CHOICES)}")
        overrides.update(parse_overrides([f"kernels={args.kernels}"]))
    grid = load_grid(args.grid, args.scale, overrides)
    out = args.out or Path("runs") / (grid.name if args.scale == DEFAULT_SCALE else f"{grid.name}-{args.scale}")

    from ablate import scheduler

    check_out(grid, out)
    scheduler.check_existing_runs(grid.cells, out)
    if args.dry_run:
        return dry_run(grid, out)
    if args.backend == "local":
        check_local_devices(grid)
    if args.backend == "ray":
        from ablate.backends.ray_backend import import_ray

        import_ray()
    elif args.backend == "slurm":
        from ablate.backends.slurm_backend import import_submitit

        import_submitit()
    else:
        _preload_data(grid)
    return execute(grid, out, args)


def execute(grid, out: Path, args, cell_fn=None) -> int:
    """Run `grid` into `out` with the parsed command-line `args` (tests call this with a
    `cell_fn` in place of run_cell). Returns the exit status."""
    from ablate import scheduler

    record = grid.record()
    backend = args.backend
    # Connect to Ray / check for SLURM before anything is written: a bad address or a
    # machine without sbatch is an input error (exit 2), not a half-started grid.
    session = executor = None
    finished, todo = scheduler.order_for_dispatch(grid.cells, out)
    if backend == "ray" and todo:
        from ablate.backends.ray_backend import prepare

        session = prepare(args.address, args.gpus_per_cell, args.cpus_per_cell or 1.0)
    elif backend == "slurm" and todo:
        from ablate.backends.slurm_backend import make_executor

        gpus_per_job = args.gpus_per_job if args.gpus_per_job is not None else (0 if grid.scale == "cpu" else 1)
        executor = make_executor(Path(args.slurm_folder or out / ".submitit").resolve(), cluster=args.slurm_cluster,
                                 partition=args.partition, time_min=args.time, gpus_per_job=gpus_per_job,
                                 cpus_per_cell=args.cpus_per_cell, name=f"ablate-{grid.name}",
                                 array_parallelism=args.array_parallelism)
    # A cell trains with the thread count the grid's first run gave it (recorded in grid.json),
    # however many cells are left: the count changes a CPU run's bits.
    recorded = scheduler.recorded_threads(out)

    def pin_threads(cells, threads):
        return [scheduler.with_threads(c, recorded.get(c.id, threads)) for c in cells]

    gpus: list[str] = []
    workers = 0
    if backend == "local":
        wants_gpu = any(grid.configs.setting(c.id).device != "cpu" for c in todo)
        gpus = scheduler.visible_gpus() if wants_gpu and todo else []
        workers = args.workers if args.workers is not None else (len(gpus) * args.cells_per_gpu if gpus else 1)
        todo = pin_threads(todo, max(1, scheduler.cpu_count() // max(min(workers, len(todo)), 1)))
        n = min(workers, len(todo))
        where = f"{n} worker{'s' if n != 1 else ''}" if workers else "this process"
        per_cell = sorted({c.options.get("threads") or 1 for c in todo})
        where += (f" on GPUs {','.join(gpus)}" if gpus else
                  f", {per_cell[0]} thread{'s' if per_cell[0] != 1 else ''} each" if len(per_cell) == 1 else
                  f", {'/'.join(map(str, per_cell))} threads as recorded per cell" if per_cell else "")
    elif backend == "ray":
        cpus = args.cpus_per_cell or 1.0
        todo = pin_threads(todo, max(1, int(cpus)))
        where = f"Ray ({args.address or 'local'})"
    else:
        if args.cpus_per_cell or recorded:
            todo = pin_threads(todo, max(1, int(args.cpus_per_cell)) if args.cpus_per_cell else None)
        where = f"submitit {args.slurm_cluster}"
    threads_of = {**recorded, **{c.id: c.options.get("threads") for c in todo}}
    for entry in record["cells"]:
        if threads_of.get(entry["id"]) is not None:
            entry["threads"] = threads_of[entry["id"]]
    out.mkdir(parents=True, exist_ok=True)
    grid_json = scheduler.GridJson(out, record)
    grid_json.write()
    t0 = time.time()

    def note(text):
        print(text, flush=True)

    retried = sum(1 for c in todo if (out / c.id / "summary.json").exists())  # failed before: tried again
    plan = (f"{len(todo)} to run on {where}" + (f" ({retried} failed before, tried again)" if retried else "")
            if todo else "nothing to run")
    note(f"grid {grid.name}: {len(grid.cells)} cell{'s' if len(grid.cells) != 1 else ''}, {grid.total_steps:,} steps; "
         f"{len(finished)} already finished, "
         f"{plan} -> {out}")
    slots = min(workers, len(todo)) if backend == "local" else 0
    progress = scheduler.Progress(grid.name, len(todo), slots, quiet=args.quiet)
    last_write, dirty, changed = [0.0], [False], set()

    def on_change(idle: bool = False, cell_id: str | None = None):
        """A cell started or ended (cell_id: which one, when the backend knows), or with idle,
        nothing happened: update grid.json at most twice a second, re-deriving the cells that
        changed; a change inside that window is written on the next idle call."""
        if not idle:
            dirty[0] = True
            changed.add(cell_id)  # None: some cell, unknown which: a full pass
        if dirty[0] and time.time() - last_write[0] > 0.5:
            last_write[0], dirty[0] = time.time(), False
            ids = None if None in changed else set(changed)
            changed.clear()
            grid_json.write(ids)

    result = None
    interrupted = False
    try:
        if not todo:
            result = scheduler.RunResult({}, [], [])
        elif backend == "local":
            result = scheduler.run_local(todo, out, workers=workers, retries=args.retries, progress=progress,
                                         on_change=on_change, cell_fn=cell_fn, gpus=gpus,
                                         cells_per_gpu=args.cells_per_gpu)
            # A cell that was busy (another process held it) and is now free but unfinished (that
            # process stopped) is trained here: this grid never ends with a cell nobody trains.
            for _ in range(3):
                again = [c for c in todo if result.outcomes.get(c.id) == "busy"
                         and scheduler.cell_status(out, c.id) == "pending"]
                if not again:
                    break
                print(f"grid {grid.name}: {len(again)} cell{'s' if len(again) != 1 else ''} another process "
                      f"held and left unfinished: training {'them' if len(again) != 1 else 'it'} here", flush=True)
                more = scheduler.run_local(again, out, workers=workers, retries=args.retries, on_change=on_change,
                                           progress=scheduler.Progress(grid.name, len(again), min(workers, len(again)),
                                                                       quiet=args.quiet),
                                           cell_fn=cell_fn, gpus=gpus, cells_per_gpu=args.cells_per_gpu)
                result.outcomes.update(more.outcomes)
                result.refused += more.refused
                result.errors += more.errors
        elif backend == "ray":
            from ablate.backends.ray_backend import run_ray

            result = run_ray(todo, out, retries=args.retries, cpus_per_cell=args.cpus_per_cell or 1.0,
                             progress=progress, record=record, on_change=on_change, session=session)
        else:
            from ablate.backends.slurm_backend import run_slurm

            result = run_slurm(todo, out, retries=args.retries, cluster=args.slurm_cluster,
                               wait=not args.no_wait, progress=progress, record=record,
                               on_change=on_change, executor=executor)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        grid_json.write()
        state = grid_json.state()
        if interrupted:
            print(_summary_line(grid, out, state, time.time() - t0, "interrupted; rerun to resume"), flush=True)
    if backend == "slurm" and args.no_wait:
        note(f"not waiting: rerun this command without --no-wait later to wait for the jobs and collect the "
             f"results (it submits only cells that no queued job holds; `squeue --me` shows them)")
        return 0
    counts = state["counts"]
    extra = []
    running = counts.get("running", 0)  # as it is now, not as it was when a cell was found busy
    if running:
        extra.append(f"{running} cell{'s are' if running != 1 else ' is'} running in another process; "
                     "rerun later to check them")
    # Pending now: no summary and nobody holds it. Never reported as success.
    unfinished = [c["id"] for c in state["cells"] if c["status"] == "pending"]
    if unfinished:
        extra.append(f"{len(unfinished)} cell{'s' if len(unfinished) != 1 else ''} left unfinished "
                     f"(e.g. {unfinished[0]}); rerun to train {'them' if len(unfinished) != 1 else 'it'}")
    print(_summary_line(grid, out, state, time.time() - t0, "; ".join(extra)), flush=True)
    if result.refused:
        print(f"ablate grid: error: {result.refused[0]}", file=sys.stderr)
        return 2
    if counts.get("failed") or result.errors or unfinished:
        return 1
    return 0


def grid_args(**options):
    """The parsed-arguments object `execute` takes, from keyword options named like the flags
    (workers=2, backend="ray", quiet=True, ...), for callers such as `ablate reproduce`."""
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    for key, value in options.items():
        if not hasattr(args, key):
            raise TypeError(f"unknown grid option {key!r}")
        setattr(args, key, value)
    _check_args(args)
    return args


def run_grid(grid, out: Path | None = None, *, scale: str = "cpu", overrides: dict | None = None, **options) -> int:
    """Expand and run a grid (a name, a TOML path or a loaded Grid) as `ablate grid` would, and
    return its exit status; ConfigError for invalid input. Options as in grid_args."""
    from ablate import scheduler
    from ablate.grids import DEFAULT_SCALE, Grid, load_grid

    if not isinstance(grid, Grid):
        grid = load_grid(grid, scale, overrides)
    out = Path(out) if out is not None else Path("runs") / (grid.name if grid.scale == DEFAULT_SCALE else f"{grid.name}-{grid.scale}")
    args = grid_args(**options)
    check_out(grid, out)
    scheduler.check_existing_runs(grid.cells, out)
    if args.backend == "local":
        check_local_devices(grid)
        _preload_data(grid)
    return execute(grid, out, args)


def _summary_line(grid, out: Path, state: dict, seconds: float, extra: str = "") -> str:
    from ablate.timefmt import fmt_time

    counts = state["counts"]
    order = ("completed", "diverged", "failed", "running", "pending")
    parts = [f"{counts[k]} {'running elsewhere' if k == 'running' else k}" for k in order if counts.get(k)]
    line = f"grid {grid.name}: {len(grid.cells)} cell{'s' if len(grid.cells) != 1 else ''}: {', '.join(parts)} ({fmt_time(seconds)}) -> {out / 'grid.json'}"
    return line + (f"; {extra}" if extra else "")
