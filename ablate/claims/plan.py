"""A claim's design before it runs: the Request (what was asked of every claim), the design's
first grid checked against the claim, its estimated time (this machine's measured speed, or a
GPU lower bound) and each clause's power, printed before anything trains."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ablate.bench.estimate import grid_seconds, grid_speed
from ablate.claims.claim_file import ClaimError, check_against_grid
from ablate.claims.design import design_grid
from ablate.claims.selectors import grid_cells
from ablate.claims.sequential import plan_power_lines
from ablate.core.cores import cpu_count
from ablate.core.errors import ConfigError


# For the --full estimate: a bf16 GPU of the H100 class at a utilisation these small models
# reach at best. Stated with the estimate, which is a lower bound on the time.
ASSUMED_PEAK_FLOPS, ASSUMED_MFU = 990e12, 0.30


# The --quick estimates come from this machine's measured speed (ablate/bench/estimate.py: two short
# cells timed, cached for 30 minutes on this CPU), not from a fit made on
# another day's load. --quick runs QUICK_WORKERS cells at once.
QUICK_WORKERS = 2


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
    looks: tuple | None = None  # --looks, with --decide (None: spending.LOOKS)


def _flops(cfg) -> float:
    from ablate.engine.model import build_model  # lazy: torch only when used

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


def quick_seconds(grid, workers: int = QUICK_WORKERS, speed=None) -> float:
    """Estimated wall time on this machine's CPUs with `workers` cells at once: an upper bound
    where cells diverge early. `speed`: an ablate.bench.estimate.Speed (default this machine's,
    measured)."""
    return grid_seconds(grid, workers, speed=speed)


def estimate_gpu_hours(grid) -> float:
    return grid_flops(grid) / (ASSUMED_PEAK_FLOPS * ASSUMED_MFU) / 3600


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def plan_design(claim, cells: Path, req: Request):
    """The loaded grid of the design's first cells, refused before anything is written if it or
    --out is bad."""
    from ablate.grid.runner import check_grid  # lazy: torch only when used

    grid = design_grid(claim, req.scale, req.overrides, None if req.decide else req.n_seeds,
                       imports_policy=req.imports_policy)
    check_grid(grid, cells)
    notes = check_claim_grid(claim, grid)
    if not req.decide:  # --decide adds the seeds a clause needs
        for note in notes:
            print(f"{claim.name}: {note}", flush=True)
    return grid


def check_claim_grid(claim, grid) -> list[str]:
    """Refuse a claim whose comparisons its grid cannot feed (analysis.claims.check_against_grid);
    returns its notes on the clauses the grid's seeds cannot decide."""
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

    return grid_seconds(grid, workers_of(req))


def print_plan(claim, grid, cells: Path, req: Request) -> None:
    """The design's first cells, where they run, and (but for a dry run, which prints its own)
    their estimated time."""
    workers = workers_of(req)
    where = f"{workers} worker(s)" if req.options.backend == "local" else f"--backend {req.options.backend}"
    print(f"{claim.name}: grid {grid.name}, {len(grid.cells)} cells, {grid.total_steps:,} steps, {where} "
          f"-> {cells}", flush=True)

    print("\n".join(plan_power_lines(claim, grid, req.decide and (req.looks or True))), flush=True)
    if req.dry_run:
        return
    if req.scale == "gpu":
        print(f"estimated GPU time: {estimate_gpu_hours(grid):.2f} GPU-hours at least ({ASSUMED_MFU:.0%} of a "
              f"{ASSUMED_PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 GPU; small models reach less, so expect more)", flush=True)
    elif req.options.backend == "local":
        speed = grid_speed(grid, workers)
        seconds = quick_seconds(grid, workers, speed)
        print(f"estimated time: about {minutes(seconds)}{speed.span(seconds)} with {workers} "
              f"cell(s) at once ({speed.source()})", flush=True)
