"""`ablate report DIR [--baseline GROUP|VARIANT] [--correction bh|holm]`: plots, report.md and
summary.csv for a grid folder (finished or still running) or a single run directory, written
into DIR."""
from __future__ import annotations

import sys
import warnings
from dataclasses import replace

from ablate.core.errors import ConfigError


def add_arguments(p) -> None:
    p.add_argument("dir", metavar="DIR", help="a grid folder (grid.json and/or cell folders) or a run directory")
    p.add_argument("--baseline", metavar="GROUP", default=None,
                   help="group (or variant id, compared at matching options) that every other group is compared "
                        "with (default: the default block's variant when it ran, else the first group)")
    p.add_argument("--last-k", type=int, default=None, metavar="K",
                   help="final loss = mean of the last K logged steps (default 10)")
    p.add_argument("--spike-z", type=float, default=None, metavar="Z",
                   help="a loss spike is Z robust standard deviations above the running median (default 5)")
    p.add_argument("--correction", default=None, metavar="METHOD",
                   help="multiple-testing correction over the report's p-values: bh (Benjamini-Hochberg, "
                        "the default) or holm")
    p.add_argument("--basin-tolerance", type=float, default=None, metavar="NATS",
                   help="the learning-rate basin is the lrs within NATS of the best loss (default 0.1)")


def run(args) -> int:
    # analysis (pandas, scipy, matplotlib) is imported here so `ablate --help` stays fast.
    from ablate.analysis.analyse import Settings, analyse
    from ablate.analysis.load import RunsError
    from ablate.analysis.report import write_report
    from ablate.analysis.stats import CORRECTIONS

    settings = Settings()
    if args.last_k is not None:
        if args.last_k < 1:
            raise ConfigError(f"--last-k {args.last_k} must be at least 1")
        settings = replace(settings, last_k=args.last_k)
    if args.spike_z is not None:
        if not args.spike_z > 0:
            raise ConfigError(f"--spike-z {args.spike_z} must be above 0")
        settings = replace(settings, spike_z=args.spike_z)
    if args.correction is not None:
        if args.correction not in CORRECTIONS:
            raise ConfigError(f"--correction {args.correction!r}; valid: {', '.join(CORRECTIONS)}")
        settings = replace(settings, correction=args.correction)
    if args.basin_tolerance is not None:
        if not args.basin_tolerance >= 0:
            raise ConfigError(f"--basin-tolerance {args.basin_tolerance} must be 0 or more (nats)")
        settings = replace(settings, basin_tolerance=args.basin_tolerance)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            analysis = analyse(args.dir, args.baseline, settings)
        except RunsError as e:
            raise ConfigError(str(e)) from None
        skipped = analysis.runs.skipped
        if analysis.metrics.empty and skipped:  # cells exist, none readable: not "no cells started"
            more = f" and {len(skipped) - 1} more" if len(skipped) > 1 else ""
            raise ConfigError(f"{args.dir}: no cell can be read ({skipped[0]}{more}); valid: a grid folder or run "
                              "directory with a readable cell (remove or rerun the damaged one)")
        path = write_report(args.dir, analysis=analysis, settings=settings)
    for w in caught:  # e.g. a metrics line cut by a crash: one line each, not a traceback
        if issubclass(w.category, UserWarning):
            print(f"ablate report: warning: {w.message}", file=sys.stderr)

    cells = analysis.metrics
    counts = cells["status"].value_counts().to_dict() if not cells.empty else {}
    status = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no cells started"
    groups = len(analysis.groups)
    print(f"{path} ({groups} group{'s' if groups != 1 else ''}; {status})")
    return 0
