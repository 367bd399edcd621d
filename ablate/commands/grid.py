"""`ablate grid GRID`: run every cell of an ablation grid, each exactly once.

GRID is a TOML file or a shipped grid name (`ablate grid --list`). Cells run in local worker
processes (default), as Ray tasks, or as a SLURM job array; every way calls the same
idempotent cell function, so a rerun skips finished cells and resumes the others.
The running itself is the library's (ablate.grid.runner); this module is the command line.
Exit status: 0 when every cell ended completed or diverged (or runs in another process),
1 when a cell failed or ended without a result, 2 for invalid input (nothing written).
"""
from __future__ import annotations

from pathlib import Path

from ablate.backends import BACKENDS
from ablate.core.bounded_read import read_toml
from ablate.core.counts import amount, count
from ablate.core.errors import ConfigError
from ablate.engine.pack import STACK_DEFAULT


def add_arguments(p) -> None:
    p.add_argument("grid", nargs="?", metavar="GRID", help="a grid file (TOML) or a shipped grid name (see --list)")
    p.add_argument("--list", action="store_true", help="list the shipped grids and exit")
    p.add_argument("--dry-run", action="store_true", help="print the cells and total steps; train and write nothing")
    p.add_argument("--out", type=Path, help="output folder (default runs/<grid name>, runs/<name>-<scale> for other scales)")
    p.add_argument("--scale", default="cpu", help="the grid file's scale: cpu (default) or one of its [scales.*], e.g. gpu")
    p.add_argument("--trust-imports", action="store_true",
                   help="run the grid file's `imports` (code: without this, or each named with --import, they "
                        "are listed with their sha256 and refused; --dry-run lists them without running them)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override an option in every cell, e.g. --set steps=5 (repeatable)")
    p.add_argument("--kernels", metavar="K", help="kernel backend for every cell: reference, cpu, triton, cuda or auto")
    add_execution_arguments(p)


# The ceilings of the execution counts, far past any machine or cluster (a larger value is a typo,
# refused as the arguments are parsed); their lower bounds are GridRunOptions'.
MAX_WORKERS, MAX_CELLS_PER_GPU, MAX_RETRIES, MAX_CPUS_PER_CELL, MAX_GPUS = 1024, 64, 100, 1024, 64
MAX_TIME_MIN, MAX_ARRAY_PARALLELISM = 30 * 24 * 60, 100_000  # 30 days a task


def add_execution_arguments(p) -> None:
    """The flags of GridRunOptions (ablate.grid.runner), one per field: where and how cells run."""
    p.add_argument("--backend", choices=BACKENDS, default="local", help="where cells run (default local)")
    p.add_argument("--workers", type=count(0, MAX_WORKERS), metavar="N",
                   help="local: cells at once, each in its own process (default: one per GPU x --cells-per-gpu, "
                        "else 1); 0 = in this process")
    p.add_argument("--cells-per-gpu", type=count(1, MAX_CELLS_PER_GPU), default=1, metavar="N",
                   help="local: workers sharing one GPU (default 1)")
    p.add_argument("--cpus-per-cell", type=amount(0, MAX_CPUS_PER_CELL), metavar="N",
                   help="ray/slurm: CPUs reserved per cell, also its torch threads (ray default 1)")
    p.add_argument("--retries", type=count(0, MAX_RETRIES), default=1, metavar="N",
                   help="retries of a failing cell before it is recorded failed (default 1)")

    p.add_argument("--stack", default=STACK_DEFAULT, metavar="K",
                   help="local: train up to K cells that differ only in seed (lr, warmup) as one stacked model; "
                        f"auto (default {STACK_DEFAULT}): as many as fit on a CUDA device, 1 on a CPU; 1 = off "
                        "(docs/performance.md)")
    p.add_argument("--quiet", action="store_true", help="no progress bars; still a line per cell and a summary")
    ray = p.add_argument_group("ray backend")
    ray.add_argument("--address", help="Ray cluster address (auto = the running cluster; default: start a local Ray)")
    ray.add_argument("--gpus-per-cell", type=amount(0, MAX_GPUS), metavar="F",
                     help="GPUs per cell, a fraction packs small cells (default 1 when the cluster has GPUs, else 0)")
    slurm = p.add_argument_group("slurm backend (submitit)")
    slurm.add_argument("--partition", help="SLURM partition")
    slurm.add_argument("--time", type=count(1, MAX_TIME_MIN), default=60, metavar="MIN",
                       help="time limit per array task in minutes (default 60)")
    slurm.add_argument("--gpus-per-job", type=count(0, MAX_GPUS), metavar="N",
                       help="GPUs per array task (default 0 at --scale cpu, else 1)")
    slurm.add_argument("--slurm-folder", type=Path, help="submitit's logs and pickles (default OUT/.submitit)")
    slurm.add_argument("--array-parallelism", type=count(1, MAX_ARRAY_PARALLELISM), metavar="N",
                       help="array tasks running at once (SLURM's %%N)")
    slurm.add_argument("--slurm-cluster", choices=("slurm", "local", "debug"), default="slurm",
                       help="submitit executor: slurm (default), or local processes / in-process for testing")
    slurm.add_argument("--no-wait", action="store_true", help="submit and exit; rerun later to follow up")


def list_grids() -> int:
    from ablate.grid.spec import load_grid, shipped_grids  # lazy: keeps torch off `ablate grid --help`

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


def _load(args, overrides):
    """The grid, its imports run only with the user's consent; a dry run without it runs none."""
    # lazy: keeps torch off `ablate grid --help`
    from ablate.grid.spec import LIST_IMPORTS, REFUSE_IMPORTS, RUN_IMPORTS, load_grid
    from ablate.variants import VariantError

    if args.trust_imports or not args.dry_run:
        return load_grid(args.grid, args.scale, overrides, RUN_IMPORTS if args.trust_imports else REFUSE_IMPORTS)
    try:
        return load_grid(args.grid, args.scale, overrides, LIST_IMPORTS)
    except (ConfigError, VariantError) as e:
        if not _has_imports(args.grid):
            raise
        raise ConfigError(f"{e}; the grid file's imports were not run (--trust-imports runs them)") from None


def _has_imports(grid: str) -> bool:
    try:
        return bool(read_toml(Path(grid)).get("imports"))
    except (OSError, ValueError):  # a shipped grid's name, or a file the error was about (UnreadableFile)
        return False


def run(args) -> int:
    if args.list:
        return list_grids()
    # lazy: keeps torch off `ablate grid --help`
    from ablate.grid.runner import GridRunOptions, check_grid, default_out, run_grid
    from ablate.grid.spec import parse_overrides, shipped_grids

    if not args.grid:
        raise ConfigError(f"missing GRID; valid: a grid file (TOML) or a shipped grid ({', '.join(shipped_grids())})")
    options = GridRunOptions.from_args(args)  # contradictory flags refused before the grid is read
    overrides = parse_overrides(args.set)
    if args.kernels is not None:
        from ablate.kernels import CHOICES  # lazy: keeps torch off `ablate grid --help`

        if args.kernels not in CHOICES:
            raise ConfigError(f"--kernels {args.kernels!r} is not a kernel backend; valid: {', '.join(CHOICES)}")
        overrides.update(parse_overrides([f"kernels={args.kernels}"]))
    grid = _load(args, overrides)
    out = args.out or default_out(grid)
    if args.dry_run:
        check_grid(grid, out)
        from ablate.bench.dry_run import dry_run  # the estimate's timing code (torch): off `ablate grid --help`

        return dry_run(grid, out, args.workers or 1)
    return run_grid(grid, out, options)
