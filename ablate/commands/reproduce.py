"""`ablate reproduce NAME|all|--list`: a claim's shipped grid, its report, and its verdict.

A claim is one declaration in variants/claims/NAME.toml (what is compared, on which measure,
in which direction, at which settings, the source's own figures) over one shipped grid; one
verdict engine (ablate/analysis/claims.py) evaluates every claim. `--quick` (the default) runs
the grid's CPU scale, `--full` its [scales.gpu]. Output: runs/claims/NAME[-full]/ (report.md
with the verdict on top, plots/claim_NAME.png, verdict.json); `all` adds runs/claims/index.md.
"""
from __future__ import annotations

import os
import time
from importlib import resources
from pathlib import Path

from ablate.errors import ConfigError

ALL = "all"
DEFAULT_ROOT = Path("runs") / "claims"
# For the --full estimate: a bf16 GPU of the H100 class at a utilisation these small models
# reach at best. Stated with the estimate, which is a lower bound on the time.
ASSUMED_PEAK_FLOPS, ASSUMED_MFU = 990e12, 0.30
# The --quick estimates come from this machine's measured speed (ablate/speed.py: a short
# calibration, cached while the machine and its load stay as they were), not from a fit made on
# another day's load. --quick runs QUICK_WORKERS cells at once.
QUICK_WORKERS = 2


def add_arguments(p) -> None:
    p.add_argument("claim", nargs="?", metavar="NAME", help="a claim (see --list), or `all`")
    p.add_argument("--list", action="store_true", help="list the claims: source, grid, cells, estimated time")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="CPU-sized: 2 cores, under 15 minutes a claim (default)")
    size.add_argument("--full", action="store_true", help="GPU-sized: the grid's [scales.gpu]")
    p.add_argument("--out", type=Path, help="output folder (default runs/claims/NAME[-full]; for `all`, the root)")
    p.add_argument("--workers", type=int, default=None, help="cells at once (default: 2 on CPU, 1 with --full); 0 = in this process")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an option in every cell")
    p.add_argument("--quiet", action="store_true")


# ------------------------------------------------------------------------------- claims


def claims_dir() -> Path:
    return Path(str(resources.files("ablate.variants") / "claims"))


def shipped_claims() -> dict:
    """Claim name -> Claim, for every variants/claims/*.toml, sorted by name."""
    from ablate.analysis.claims import ClaimError, load_claim
    from ablate.claim_grid import check_claim_against_its_grid

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
    claims = shipped_claims()
    if name not in claims:
        raise ConfigError(f"unknown claim {name!r}; valid: {', '.join([*claims, ALL])}")
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
    return min(QUICK_WORKERS, os.cpu_count() or 1)


def cell_seconds(cfg, speed=None) -> float:
    """One cell's estimated seconds alone on this machine at one worker's share of its cores
    (`speed`: an ablate.speed.Speed; default this machine's, measured)."""
    from ablate.speed import machine_speed, threads_per_worker

    return (speed or machine_speed(threads_per_worker(quick_workers()), variants=[cfg.spec.id])).cell_seconds(cfg)


def quick_seconds(grid, workers: int = QUICK_WORKERS, speed=None) -> float:
    """Estimated wall time on this machine's CPUs with `workers` cells at once: an upper bound
    where cells diverge early. `speed`: as cell_seconds."""
    from ablate.speed import grid_seconds

    return grid_seconds(grid, workers, speed=speed)


def estimate_gpu_hours(grid) -> float:
    return grid_flops(grid) / (ASSUMED_PEAK_FLOPS * ASSUMED_MFU) / 3600


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def list_claims() -> int:
    from ablate.grids import load_grid

    from ablate.speed import grid_variants, machine_speed, threads_per_worker

    claims = shipped_claims()
    grids = {name: load_grid(claim.grid) for name, claim in claims.items()}
    variants = set().union(*map(grid_variants, grids.values()))
    # measured before the table, not inside it
    speed = machine_speed(threads_per_worker(quick_workers()), variants=variants)
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


def run(args) -> int:
    if args.list:
        return list_claims()
    if not args.claim:
        raise ConfigError(f"missing NAME; valid: {', '.join([*shipped_claims(), ALL, '--list'])}")
    if args.workers is not None and args.workers < 0:
        raise ConfigError(f"--workers {args.workers} must be 0 (in this process) or more")
    from ablate.grids import parse_overrides

    overrides = parse_overrides(args.set)
    scale = "gpu" if args.full else "cpu"
    if args.claim == ALL:
        return run_all(args, overrides, scale)
    claim = find_claim(args.claim)
    out = args.out or DEFAULT_ROOT / (claim.name if scale == "cpu" else f"{claim.name}-full")
    status, _ = reproduce(claim, out, scale, overrides, args)
    return status


def _plan(claim, out: Path, scale: str, overrides: dict):
    """The loaded grid, refused before anything is written if it or --out is bad."""
    from ablate.grid_runner import check_grid
    from ablate.grids import load_grid

    grid = load_grid(claim.grid, scale, overrides)
    check_grid(grid, out)
    check_claim_grid(claim, grid)
    return grid


def grid_cells(grid):
    """One row per cell of a loaded grid, with the columns a claim's selectors name (as the
    analysis of its run folder will see them)."""
    import pandas as pd

    rows = []
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        spec = cfg.spec
        rows.append({"cell_id": cell.id, "seed": cfg.seed, "norm": spec.norm, "norm_type": spec.norm_type,
                     "act": spec.act, "mlp": spec.mlp, "residual": spec.residual, "qk_norm": spec.qk_norm,
                     "lr": cfg.lr, "warmup": cfg.warmup, "init": cfg.init_name, "mlp_ratio": cfg.mlp_ratio,
                     "n_layer": cfg.size.n_layer, "width": cfg.size.d_model, "planned_steps": cfg.steps})
    return pd.DataFrame(rows)


def check_claim_grid(claim, grid) -> None:
    """Refuse a claim whose comparisons its grid cannot feed (analysis.claims.check_against_grid)."""
    from ablate.analysis.claims import ClaimError, check_against_grid

    try:
        check_against_grid(claim, grid_cells(grid))
    except ClaimError as e:
        raise ConfigError(str(e)) from None


def reproduce(claim, out: Path, scale: str, overrides: dict, args, grid=None):
    """Run the claim's grid (ablate.grid_runner, local workers), then write its report and
    verdict. Returns (exit status, Verdict or None)."""
    from ablate.analysis.claim_report import clause_line, write_claim_report
    from ablate.grid_runner import GridRunOptions, run_grid

    grid = grid or _plan(claim, out, scale, overrides)
    workers = args.workers if args.workers is not None else (1 if scale == "gpu" else quick_workers())
    print(f"{claim.name}: grid {grid.name}, {len(grid.cells)} cells, {grid.total_steps:,} steps, {workers} "
          f"worker(s) -> {out}", flush=True)
    if scale == "gpu":
        print(f"estimated GPU time: {estimate_gpu_hours(grid):.2f} GPU-hours at least ({ASSUMED_MFU:.0%} of a "
              f"{ASSUMED_PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 GPU; small models reach less, so expect more)", flush=True)
    else:
        from ablate.speed import grid_speed

        speed = grid_speed(grid, workers)
        seconds = quick_seconds(grid, max(1, workers), speed)
        print(f"estimated time: about {_minutes(seconds)}{speed.span(seconds)} with {max(1, workers)} "
              "cell(s) at once (this machine's speed, measured)", flush=True)
    t0 = time.time()
    status = run_grid(grid, out, GridRunOptions(workers=workers, quiet=args.quiet))
    if status == 2:
        return status, None
    report, verdict = write_claim_report(claim, out)
    print(f"{claim.name}: {verdict.text()} ({time.time() - t0:.0f} s); report: {report}", flush=True)
    for i, clause in enumerate(verdict.clauses):
        print(f"  {clause_line(i, clause)}", flush=True)
    return status, verdict


def run_all(args, overrides: dict, scale: str) -> int:
    from ablate.analysis.claim_report import write_index

    claims = shipped_claims()
    root = args.out or DEFAULT_ROOT
    suffix = "" if scale == "cpu" else "-full"
    planned = [(claim, root / f"{claim.name}{suffix}") for claim in claims.values()]
    grids = [_plan(claim, out, scale, overrides) for claim, out in planned]  # every one checked first
    worst, entries = 0, []
    for (claim, out), grid in zip(planned, grids):
        status, verdict = reproduce(claim, out, scale, overrides, args, grid)
        worst = max(worst, status)
        entries.append((claim, out, verdict))
    index = write_index(entries, root / f"index{suffix}.md")
    print(f"index: {index}")
    return worst
