"""`ablate reproduce prenorm-wins`: the shipped grid, the report, and a verdict on top."""
from __future__ import annotations

from pathlib import Path

from ablate.errors import ConfigError

EXPERIMENTS = {"prenorm-wins": "prenorm-wins"}  # experiment -> shipped grid
# For the --full estimate: a bf16 GPU of the H100 class at a utilisation these small models
# reach at best. Stated with the estimate, which is a lower bound on the time.
ASSUMED_PEAK_FLOPS, ASSUMED_MFU = 990e12, 0.30


def add_arguments(p) -> None:
    p.add_argument("experiment", metavar="EXPERIMENT", help=f"one of: {', '.join(EXPERIMENTS)}")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="CPU-sized: 2 cores, under 15 minutes (default)")
    size.add_argument("--full", action="store_true", help="GPU-sized: wider, longer, 5 seeds, depths 6/12/24")
    p.add_argument("--out", type=Path, help="output folder (default runs/prenorm-wins[-full])")
    p.add_argument("--workers", type=int, default=None, help="cells at once (default: 2 on CPU, one per GPU)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an option in every cell")
    p.add_argument("--quiet", action="store_true")


def estimate_gpu_hours(grid) -> float:
    from ablate.model import build_model

    flops = 0.0
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        params = sum(p.numel() for p in build_model(cfg.spec, cfg.size, device="meta").parameters())
        flops += 6 * params * cfg.steps * cfg.batch_size * cfg.context
    return flops / (ASSUMED_PEAK_FLOPS * ASSUMED_MFU) / 3600


def run(args) -> int:
    import os

    from ablate.cli import main as cli_main
    from ablate.commands.grid import check_out
    from ablate.grids import load_grid, parse_overrides

    if args.experiment not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {args.experiment!r}; valid: {', '.join(EXPERIMENTS)}")
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers {args.workers} must be at least 1")
    scale = "gpu" if args.full else "cpu"
    name = EXPERIMENTS[args.experiment]
    grid = load_grid(name, scale, parse_overrides(args.set))  # validates before anything runs
    out = args.out or Path("runs") / (name if scale == "cpu" else f"{name}-full")
    check_out(grid, out)  # before the plan is printed
    workers = args.workers or (1 if scale == "gpu" else min(2, os.cpu_count() or 1))
    total = grid.total_steps
    print(f"{args.experiment}: {len(grid.cells)} cells, {total:,} steps in total, {workers} worker(s) -> {out}")
    if scale == "gpu":
        hours = estimate_gpu_hours(grid)
        print(f"estimated GPU time: {hours:.1f} GPU-hours at least ({ASSUMED_MFU:.0%} of a {ASSUMED_PEAK_FLOPS / 1e12:.0f} "
              "TFLOP/s bf16 GPU; small models reach less, so expect more)")
    argv = ["grid", name, "--scale", scale, "--out", str(out), "--workers", str(workers)]
    for item in args.set:
        argv += ["--set", item]
    if args.quiet:
        argv.append("--quiet")
    status = cli_main(argv)
    if status == 2:
        return status
    report = write(out)
    print(f"report: {report}")
    return status


def write(out: Path) -> Path:
    """report.md with the verdict section on top, plus the experiment's own plots."""
    from ablate.analysis.analyse import analyse
    from ablate.analysis.prenorm import setting_verdicts
    from ablate.analysis.prenorm_report import verdict_section, write_prenorm_plots
    from ablate.analysis.report import write_report

    analysis = analyse(out)
    verdicts = setting_verdicts(analysis.metrics)  # once, for the section and the plots
    section = verdict_section(analysis, verdicts=verdicts)
    write_prenorm_plots(analysis, out / "plots", verdicts)
    path = write_report(out, preamble_sections=[section], analysis=analysis)
    for line in section.splitlines():
        if line.startswith("- At "):
            print(line[2:].replace("**", ""))
    return path
