"""`ablate reproduce NAME|all|--list`: a claim's shipped grid, its report, and its verdict.

A claim is one declaration in variants/claims/NAME.toml (what is compared, on which measure,
in which direction, at which settings, the source's own figures) over one shipped grid; one
verdict engine (ablate/analysis/claims.py) evaluates every claim. `--quick` (the default) runs
the grid's CPU scale, `--full` its [scales.gpu]. Output: runs/claims/NAME[-full]/ (report.md
with the verdict on top, plots/claim_NAME.png, verdict.json); `all` adds runs/claims/index.md.
`--seeds N` runs a fixed design of N seeds instead of the grid's own (report in seeds-N/);
`--decide` adds seeds in looks until each clause is decided (ablate/claim/looks.py; report in
decide/). The cells are shared: ablate/claim/design.py says where each design's files go.
Cells run on the grid machinery (ablate.grid.runner), on any of its backends.
"""
from __future__ import annotations

import dataclasses
import time
from importlib import resources
from pathlib import Path

from ablate.claim.looks import UNDECIDED
from ablate.cores import cpu_count
from ablate.errors import ConfigError
from ablate.variant_axes import AXES

ALL = "all"
DEFAULT_ROOT = Path("runs") / "claims"
# For the --full estimate: a bf16 GPU of the H100 class at a utilisation these small models
# reach at best. Stated with the estimate, which is a lower bound on the time.
ASSUMED_PEAK_FLOPS, ASSUMED_MFU = 990e12, 0.30
# The --quick estimates come from this machine's measured speed (ablate/bench/estimate.py: two short
# cells timed, cached for 30 minutes on this CPU), not from a fit made on
# another day's load. --quick runs QUICK_WORKERS cells at once.
QUICK_WORKERS = 2


def add_arguments(p) -> None:
    from ablate.claim.design import MAX_BUDGET_HOURS, MAX_SEEDS
    from ablate.commands.grid import add_execution_arguments

    p.add_argument("claim", nargs="?", metavar="NAME", help="a claim (see --list), `all`, or a claim file (TOML)")
    p.add_argument("--list", action="store_true", help="list the claims: source, grid, cells, estimated time")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="CPU-sized: 2 cores, under 15 minutes a claim (default)")
    size.add_argument("--full", action="store_true", help="GPU-sized: the grid's [scales.gpu]")
    design = p.add_mutually_exclusive_group()
    design.add_argument("--seeds", metavar="N", help="a fixed design of N seeds instead of the grid's own (the "
                                                     "grid's seeds, then the next ones; at most "
                                                     f"{MAX_SEEDS:,}); report in OUT/seeds-N/")
    design.add_argument("--decide", action="store_true",
                        help="add seeds in looks, only where a clause is undecided, until every clause is decided "
                             "or --budget is spent (a group-sequential test holds the error rate); report in "
                             f"OUT/decide/; exit status {UNDECIDED} when it stops before deciding (rerun to resume)")
    p.add_argument("--looks", metavar="N,N,...", help="with --decide: the seeds at each look (default 3,6,12); a "
                                                     "plan that continues one this folder's --decide read keeps "
                                                     "the past looks' boundaries and spends what alpha is left")
    p.add_argument("--budget", metavar="TIME", help="with --decide: wall time for each claim, e.g. 30m, 90s, 1h (at "
                                                   f"most {MAX_BUDGET_HOURS} h); a look whose estimate does not fit in "
                                                   "what is left is not started")
    p.add_argument("--dry-run", action="store_true", help="print the cells the design runs first and the estimate; "
                                                         "train and write nothing")
    p.add_argument("--out", type=Path, help="the cells' folder (default runs/claims/NAME[-full]; for `all`, the root)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an option in every cell")
    p.add_argument("--trust-imports", action="store_true",
                   help="run the claim's grid file's `imports` (see `ablate grid`)")
    add_execution_arguments(p)  # --backend, --workers (default: 2 on CPU, 1 with --full), the cluster options


@dataclasses.dataclass(frozen=True)
class Request:
    """What was asked of every claim: its scale and overrides, the design, and how cells run."""

    scale: str
    overrides: dict
    options: object  # ablate.grid.runner.GridRunOptions
    n_seeds: int | None = None  # --seeds N
    decide: bool = False
    budget: float | None = None  # seconds, with --decide
    dry_run: bool = False
    imports_policy: str | None = None  # ablate.grid.spec's: RUN_IMPORTS with --trust-imports; None: its default
    looks: tuple | None = None  # --looks, with --decide (None: analysis.sequential.LOOKS)


# ------------------------------------------------------------------------------- claims


def claims_dir() -> Path:
    return Path(str(resources.files("ablate.variants") / "claims"))


def shipped_claims() -> dict:
    """Claim name -> Claim, for every variants/claims/*.toml, sorted by name."""
    from ablate.analysis.claims import ClaimError, load_claim
    from ablate.claim.selectors import check_claim_against_its_grid

    out = {}
    for path in sorted(claims_dir().glob("*.toml")):
        try:
            claim = load_claim(path)
            check_claim_against_its_grid(claim, str(path))
        except ClaimError as e:
            raise ConfigError(str(e)) from None
        if claim.name != path.stem:
            raise ConfigError(f"{path}: name {claim.name!r} differs from the file name {path.stem!r}")
        out[claim.name] = claim
    return out


def find_claim(name: str):
    """A shipped claim by name, or a claim file (a path ending in .toml)."""
    if name.endswith(".toml"):
        from ablate.analysis.claims import ClaimError, load_claim

        if not Path(name).exists():  # a FIFO, a device or a folder is load_claim's to refuse, for what it is
            raise ConfigError(f"claim file {name!r} does not exist; valid: a claim TOML file or a shipped claim "
                              f"({', '.join(shipped_claims())})")
        try:
            return load_claim(name)
        except ClaimError as e:
            raise ConfigError(str(e)) from None
    claims = shipped_claims()
    if name not in claims:
        raise ConfigError(f"unknown claim {name!r}; valid: {', '.join([*claims, ALL])}, or a claim file (TOML)")
    return claims[name]


# ----------------------------------------------------------------------------- estimates


def _flops(cfg) -> float:
    from ablate.model import build_model

    params = sum(p.numel() for p in build_model(cfg.spec, cfg.size, device="meta").parameters())
    return 6.0 * params * cfg.steps * cfg.batch_size * cfg.context


def grid_flops(grid) -> float:
    cache: dict[int, float] = {}
    total = 0.0
    for cell in grid.cells:
        cfg = grid.configs.setting(cell.id)
        if id(cfg) not in cache:
            cache[id(cfg)] = _flops(cfg)
        total += cache[id(cfg)]
    return total


def quick_workers() -> int:
    return min(QUICK_WORKERS, cpu_count())  # the cores this process may use (taskset, SLURM)


def cell_seconds(cfg, speed=None) -> float:
    """One cell's estimated seconds alone on this machine at one worker's share of its cores
    (`speed`: an ablate.bench.estimate.Speed; default this machine's, measured)."""
    from ablate.bench.estimate import machine_speed, threads_per_worker

    return (speed or machine_speed(threads_per_worker(quick_workers()))).cell_seconds(cfg)


def quick_seconds(grid, workers: int = QUICK_WORKERS, speed=None) -> float:
    """Estimated wall time on this machine's CPUs with `workers` cells at once: an upper bound
    where cells diverge early. `speed`: as cell_seconds."""
    from ablate.bench.estimate import grid_seconds

    return grid_seconds(grid, workers, speed=speed)


def estimate_gpu_hours(grid) -> float:
    return grid_flops(grid) / (ASSUMED_PEAK_FLOPS * ASSUMED_MFU) / 3600


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def list_claims() -> int:
    from ablate.grid.spec import load_grid

    from ablate.bench.estimate import machine_speed, threads_per_worker

    claims = shipped_claims()
    grids = {name: load_grid(claim.grid) for name, claim in claims.items()}
    # measured before the table, not inside it
    speed = machine_speed(threads_per_worker(quick_workers()))
    print("claims (ablate reproduce NAME [--quick|--full]; `all` runs every one):")
    print(f"  {'name':<18}{'grid':<26}{'cells':>6}{'quick (CPU)':>13}{'gpu cells':>10}{'full (GPU)':>12}  source")
    total = 0.0
    for name, claim in claims.items():
        cpu = grids[name]
        gpu = load_grid(claim.grid, "gpu") if "gpu" in cpu.scales else None
        seconds = quick_seconds(cpu, quick_workers(), speed)
        total += seconds
        full = f"{estimate_gpu_hours(gpu):.2f} h" if gpu else "-"
        print(f"  {name:<18}{claim.grid:<26}{len(cpu.cells):>6}{_minutes(seconds):>13}"
              f"{(len(gpu.cells) if gpu else '-'):>10}{full:>12}  {claim.source}")
    print(f"all --quick: about {_minutes(total)}{speed.span(total)} with {quick_workers()} cells at once, "
          f"{speed.describe()}; diverged "
          "cells stop early, so less. --full: GPU-hours at least, at "
          f"{ASSUMED_MFU:.0%} of a {ASSUMED_PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 GPU.")
    return 0


# ------------------------------------------------------------------------------ running


def request_from(args) -> Request:
    """The Request of parsed arguments; every bad value refused here, before anything is read."""
    from ablate.claim.design import check_seeds_override, parse_budget, parse_seeds
    from ablate.grid.runner import GridRunOptions
    from ablate.grid.spec import REFUSE_IMPORTS, RUN_IMPORTS, parse_overrides

    n_seeds, budget = parse_seeds(args.seeds), parse_budget(args.budget)
    if budget is not None and not args.decide:
        raise ConfigError(f"--budget {args.budget} is for --decide; valid: --decide --budget {args.budget}, "
                          "or no --budget")
    if args.workers is None and args.backend == "local":
        args.workers = 1 if args.full else quick_workers()
    options = GridRunOptions.from_args(args)  # contradictory execution flags refused here
    overrides = parse_overrides(args.set)
    if n_seeds is not None or args.decide:
        check_seeds_override(overrides, "--decide" if args.decide else f"--seeds {n_seeds}")
    from ablate.claim.looks import parse_looks

    looks = parse_looks(getattr(args, "looks", None))
    if looks is not None and not args.decide:
        raise ConfigError(f"--looks {args.looks} is for --decide; valid: --decide --looks {args.looks}, or no --looks")
    return Request("gpu" if args.full else "cpu", overrides, options, n_seeds, args.decide, budget, args.dry_run,
                   RUN_IMPORTS if args.trust_imports else REFUSE_IMPORTS, looks)


def run(args) -> int:
    if args.list:
        return list_claims()
    if not args.claim:
        raise ConfigError(f"missing NAME; valid: {', '.join([*shipped_claims(), ALL, '--list'])}")
    req = request_from(args)
    if args.claim == ALL:
        return run_all(args.out, req)
    claim = find_claim(args.claim)
    status, _ = reproduce(claim, args.out or default_cells(claim, req.scale), req)
    return status


def decided_plan(folder: Path) -> tuple | bool:
    """The looks of the plan a --decide judged `folder` with (its verdict.json), True where that
    file is there but names none readable, False where there is none."""
    from ablate.claim.looks import plan_looks

    return plan_looks(folder) if (folder / "verdict.json").is_file() else False


def default_cells(claim, scale: str, root: Path = DEFAULT_ROOT) -> Path:
    return root / (claim.name if scale == "cpu" else f"{claim.name}-full")


def plan_design(claim, cells: Path, req: Request):
    """The loaded grid of the design's first cells, refused before anything is written if it or
    --out is bad."""
    from ablate.claim.design import design_grid
    from ablate.grid.runner import check_grid

    grid = design_grid(claim, req.scale, req.overrides, None if req.decide else req.n_seeds,
                       imports_policy=req.imports_policy)
    check_grid(grid, cells)
    notes = check_claim_grid(claim, grid)
    if not req.decide:  # --decide adds the seeds a clause needs
        for note in notes:
            print(f"{claim.name}: {note}", flush=True)
    return grid


def grid_cells(grid):
    """One row per cell of a loaded grid, with the columns a claim's selectors name (as the
    analysis of its run folder will see them)."""
    import pandas as pd

    rows = []
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        spec = cfg.spec
        rows.append({"cell_id": cell.id, "seed": cfg.seed, **{axis: getattr(spec, axis) for axis in AXES},
                     "lr": cfg.lr, "warmup": cfg.warmup, "init": cfg.init_name, "mlp_ratio": cfg.mlp_ratio,
                     "n_layer": cfg.size.n_layer, "width": cfg.size.d_model, "planned_steps": cfg.steps,
                     "schedule": cfg.schedule, "grad_clip": cfg.grad_clip})
    return pd.DataFrame(rows)


def check_claim_grid(claim, grid) -> list[str]:
    """Refuse a claim whose comparisons its grid cannot feed (analysis.claims.check_against_grid);
    returns its notes on the clauses the grid's seeds cannot decide."""
    from ablate.analysis.claims import ClaimError, check_against_grid

    try:
        return check_against_grid(claim, grid_cells(grid))
    except ClaimError as e:
        raise ConfigError(str(e)) from None


def workers_of(req: Request) -> int:
    """Cells at once, for the estimates: the local workers, else one worker's share."""
    return max(1, req.options.workers or 1) if req.options.backend == "local" else quick_workers()


def look_seconds(grid, req: Request) -> float:
    """Estimated wall time of exactly `grid`'s cells (ablate/bench/estimate.py; on a GPU scale the
    lower bound below): the one place a design's time is estimated."""
    if req.scale == "gpu":
        return estimate_gpu_hours(grid) * 3600
    from ablate.bench.estimate import grid_seconds

    return grid_seconds(grid, workers_of(req))


def print_plan(claim, grid, cells: Path, req: Request) -> None:
    """The design's first cells, where they run, and (but for a dry run, which prints its own)
    their estimated time."""
    workers = workers_of(req)
    where = f"{workers} worker(s)" if req.options.backend == "local" else f"--backend {req.options.backend}"
    print(f"{claim.name}: grid {grid.name}, {len(grid.cells)} cells, {grid.total_steps:,} steps, {where} "
          f"-> {cells}", flush=True)
    from ablate.analysis.sequential import plan_power_lines  # each clause's power before training

    print("\n".join(plan_power_lines(claim, grid, req.decide and (req.looks or True))), flush=True)
    if req.dry_run:
        return
    if req.scale == "gpu":
        print(f"estimated GPU time: {estimate_gpu_hours(grid):.2f} GPU-hours at least ({ASSUMED_MFU:.0%} of a "
              f"{ASSUMED_PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 GPU; small models reach less, so expect more)", flush=True)
    elif req.options.backend == "local":
        from ablate.bench.estimate import grid_speed

        speed = grid_speed(grid, workers)
        seconds = quick_seconds(grid, workers, speed)
        print(f"estimated time: about {_minutes(seconds)}{speed.span(seconds)} with {workers} "
              f"cell(s) at once ({speed.source()})", flush=True)


def reproduce(claim, cells: Path, req: Request, grid=None):
    """Run the claim's design on the grid machinery into the grid folder `cells`, then write its
    report and verdict. Returns (exit status, Verdict or None); with --decide, (exit status,
    the sequential Decision or None). Once the inputs and the backend are checked (nothing
    written before), the run holds the folder's claim lock to its end (ablate/claim/lock.py);
    a dry run, which writes nothing, takes none."""
    from ablate.claim.lock import claim_lock

    grid = grid or plan_design(claim, cells, req)
    if req.dry_run:
        return _reproduce(claim, cells, req, grid)
    check_backend(grid, cells, req)
    with claim_lock(cells):
        return _reproduce(claim, cells, req, grid)


def check_backend(grid, cells: Path, req: Request) -> None:
    """The backend can run here (its library, sbatch, the local devices): ConfigError if not."""
    from ablate.backends import backend_class

    backend_class(req.options.backend)(req.options, grid, cells).check()


def _reproduce(claim, cells: Path, req: Request, grid):
    if req.decide:
        from ablate.claim.looks import run_decide

        return run_decide(claim, cells, req, grid)
    from ablate.analysis.claim_report import clause_line, write_claim_report
    from ablate.claim.design import design_out
    from ablate.grid.runner import run_grid

    out = design_out(cells, req.n_seeds, decide=False)
    print_plan(claim, grid, cells, req)
    if req.dry_run:
        from ablate.commands.grid import dry_run

        dry_run(grid, cells, workers_of(req))
        print(f"report and verdict -> {out}")
        return 0, None
    t0 = time.time()
    status = run_grid(grid, cells, req.options)
    if status == 2:
        return status, None
    from ablate.claim.looks import unfinished

    left = unfinished(cells, [c.id for c in grid.cells]) if status == 0 else []  # not waited for, or busy
    if left:  # a verdict on some of the design's cells would read as the design's
        print(f"{claim.name}: {len(left)} of {len(grid.cells)} cells not finished (e.g. {left[0]}): no verdict "
              "until they are; rerun to resume", flush=True)
        return UNDECIDED, None
    out.mkdir(parents=True, exist_ok=True)
    from ablate.claim.design import own_seeds

    from ablate.claim.design import DECIDE_DIR  # a --decide judged these seeds: the verdict says what this does

    report, verdict = write_claim_report(claim, out, cells=cells if out != cells else None, seeds=own_seeds(grid),
                                         decided_before=decided_plan(cells / DECIDE_DIR))
    print(f"{claim.name}: {verdict.text()} ({time.time() - t0:.0f} s); report: {report}", flush=True)
    for i, clause in enumerate(verdict.clauses):
        print(f"  {clause_line(i, clause)}", flush=True)
    for note in verdict.notes:
        print(f"  note: {note}", flush=True)
    return status, verdict


# `all`'s exit status: the worst of its claims' in this order (an input refused, then a claim
# not decided, then a failed cell).
EXIT_RANK = (0, 1, UNDECIDED, 2)


def _all_locked(planned, grids, req: Request):
    """Every claim's lock (ablate/claim/lock.py), taken before the first claim runs and once every
    backend is checked, so a refusal comes before anything is written; none for a dry run."""
    from contextlib import nullcontext

    from ablate.claim.lock import claim_locks

    if req.dry_run:
        return nullcontext()
    for (_, cells), grid in zip(planned, grids):
        check_backend(grid, cells, req)
    return claim_locks([cells for _, cells in planned])


def run_all(root: Path | None, req: Request) -> int:
    from ablate.analysis.claim_report import write_index
    from ablate.claim.design import design_out

    claims = shipped_claims()
    root = root or DEFAULT_ROOT
    planned = [(claim, default_cells(claim, req.scale, root)) for claim in claims.values()]
    grids = [plan_design(claim, cells, req) for claim, cells in planned]  # every one checked first
    worst, entries = 0, []
    with _all_locked(planned, grids, req):
        for (claim, cells), grid in zip(planned, grids):
            status, verdict = reproduce(claim, cells, req, grid)
            worst = max(worst, status, key=EXIT_RANK.index)
            entries.append((claim, design_out(cells, req.n_seeds, req.decide), verdict))
    if req.dry_run:
        return worst
    suffix = "" if req.scale == "cpu" else "-full"
    if req.decide:
        from ablate.claim.looks import write_decision_index

        index = write_decision_index(entries, root / f"index{suffix}-decide.md")
    else:
        design = f"-seeds-{req.n_seeds}" if req.n_seeds else ""
        index = write_index(entries, root / f"index{suffix}{design}.md")
    print(f"index: {index}")
    return worst
