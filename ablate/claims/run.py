"""`ablate reproduce NAME|all|--list`: a claim's shipped grid, its report, and its verdict.

A claim is one declaration in variants/claims/NAME.toml (what is compared, on which measure,
in which direction, at which settings, the source's own figures) over one shipped grid; one
verdict engine (ablate/claims/verdict.py) evaluates every claim. `--quick` (the default) runs
the grid's CPU scale, `--full` its [scales.gpu]. Output: runs/claims/NAME[-full]/ (report.md
with the verdict on top, plots/claim_NAME.png, verdict.json); `all` adds runs/claims/index.md.
`--seeds N` runs a fixed design of N seeds instead of the grid's own (report in seeds-N/);
`--decide` adds seeds in looks until each clause is decided (ablate/claims/looks.py; report in
decide/). The cells are shared: ablate/claims/design.py says where each design's files go.
Cells run on the grid machinery (ablate.grid.runner), on any of its backends.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from importlib import resources
from pathlib import Path

from ablate.backends import backend_class
from ablate.bench.estimate import machine_speed, threads_per_worker
from ablate.claims.claim_file import ClaimError, load_claim
from ablate.claims.claim_report import clause_line, write_claim_report, write_index
from ablate.claims.design import DECIDE_DIR, design_out, own_seeds
from ablate.claims.lock import claim_lock, claim_locks
from ablate.claims.looks import plan_looks, run_decide, unfinished, write_decision_index
from ablate.claims.options import UNDECIDED
from ablate.claims.plan import (ASSUMED_MFU, ASSUMED_PEAK_FLOPS, Request, estimate_gpu_hours, minutes, plan_design,
                                print_plan, quick_seconds, quick_workers, workers_of)
from ablate.claims.selectors import check_claim_against_its_grid
from ablate.core.errors import ConfigError

ALL = "all"
DEFAULT_ROOT = Path("runs") / "claims"


# ------------------------------------------------------------------------------- claims


def claims_dir() -> Path:
    return Path(str(resources.files("ablate.variants") / "claims"))


def shipped_claims() -> dict:
    """Claim name -> Claim, for every variants/claims/*.toml, sorted by name."""
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


def list_claims() -> int:
    from ablate.grid.spec import load_grid  # lazy: torch only when used

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
        print(f"  {name:<18}{claim.grid:<26}{len(cpu.cells):>6}{minutes(seconds):>13}"
              f"{(len(gpu.cells) if gpu else '-'):>10}{full:>12}  {claim.source}")
    print(f"all --quick: about {minutes(total)}{speed.span(total)} with {quick_workers()} cells at once, "
          f"{speed.describe()}; diverged "
          "cells stop early, so less. --full: GPU-hours at least, at "
          f"{ASSUMED_MFU:.0%} of a {ASSUMED_PEAK_FLOPS / 1e12:.0f} TFLOP/s bf16 GPU.")
    return 0


# ------------------------------------------------------------------------------ running


def decided_plan(folder: Path) -> tuple | bool:
    """The looks of the plan a --decide judged `folder` with (its verdict.json), True where that
    file is there but names none readable, False where there is none."""
    return plan_looks(folder) if (folder / "verdict.json").is_file() else False


def default_cells(claim, scale: str, root: Path = DEFAULT_ROOT) -> Path:
    return root / (claim.name if scale == "cpu" else f"{claim.name}-full")


def reproduce(claim, cells: Path, req: Request, grid=None):
    """Run the claim's design on the grid machinery into the grid folder `cells`, then write its
    report and verdict. Returns (exit status, Verdict or None); with --decide, (exit status,
    the sequential Decision or None). Once the inputs and the backend are checked (nothing
    written before), the run holds the folder's claim lock to its end (ablate/claims/lock.py);
    a dry run, which writes nothing, takes none."""
    grid = grid or plan_design(claim, cells, req)
    if req.dry_run:
        return _reproduce(claim, cells, req, grid)
    check_backend(grid, cells, req)
    with claim_lock(cells):
        return _reproduce(claim, cells, req, grid)


def check_backend(grid, cells: Path, req: Request) -> None:
    """The backend can run here (its library, sbatch, the local devices): ConfigError if not."""
    backend_class(req.options.backend)(req.options, grid, cells).check()


def _reproduce(claim, cells: Path, req: Request, grid):
    if req.decide:
        return run_decide(claim, cells, req, grid)
    from ablate.grid.runner import run_grid  # lazy: torch only when used

    out = design_out(cells, req.n_seeds, decide=False)
    print_plan(claim, grid, cells, req)
    if req.dry_run:
        from ablate.bench.dry_run import dry_run  # lazy: torch only when used

        dry_run(grid, cells, workers_of(req))
        print(f"report and verdict -> {out}")
        return 0, None
    t0 = time.time()
    status = run_grid(grid, cells, req.options)
    if status == 2:
        return status, None

    left = unfinished(cells, [c.id for c in grid.cells]) if status == 0 else []  # not waited for, or busy
    if left:  # a verdict on some of the design's cells would read as the design's
        print(f"{claim.name}: {len(left)} of {len(grid.cells)} cells not finished (e.g. {left[0]}): no verdict "
              "until they are; rerun to resume", flush=True)
        return UNDECIDED, None
    out.mkdir(parents=True, exist_ok=True)

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
    """Every claim's lock (ablate/claims/lock.py), taken before the first claim runs and once every
    backend is checked, so a refusal comes before anything is written; none for a dry run."""
    if req.dry_run:
        return nullcontext()
    for (_, cells), grid in zip(planned, grids):
        check_backend(grid, cells, req)
    return claim_locks([cells for _, cells in planned])


def run_all(root: Path | None, req: Request) -> int:
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
        index = write_decision_index(entries, root / f"index{suffix}-decide.md")
    else:
        design = f"-seeds-{req.n_seeds}" if req.n_seeds else ""
        index = write_index(entries, root / f"index{suffix}{design}.md")
    print(f"index: {index}")
    return worst
