"""`ablate ladder CLAIM... | GRID | all`: the arguments, checked into a LadderRequest, and the
ladders (ablate/ladder/run.py) it is handed to."""
from __future__ import annotations

from pathlib import Path

from ablate.claims.options import MAX_SEEDS, check_seeds_override, parse_seeds
from ablate.commands.grid import add_execution_arguments
from ablate.core.errors import ConfigError
from ablate.ladder.rungs import CPU_WIDTHS, MAX_RUNGS, parse_widths


def add_arguments(p) -> None:
    p.add_argument("names", nargs="+", metavar="CLAIM|GRID",
                   help="claims (see `ablate reproduce --list`), `all`, or one grid file with two arms")
    p.add_argument("--widths", default=",".join(str(w) for w in CPU_WIDTHS),
                   help=f"the rungs' widths (d_model) on the CPU, 3 to {MAX_RUNGS} (default %(default)s)")
    p.add_argument("--full", action="store_true",
                   help="GPU-sized: the grid's [scales.gpu] at widths 192 and 384 (medium) and ANDREA-120M")
    p.add_argument("--backtest", action="store_true",
                   help="also train a held-out rung at twice the widest width, after freezing the plan and the "
                        "predictions the fitted rungs make for it, and score them (backtest.md)")
    p.add_argument("--seeds", metavar="N", help="every rung at N seeds (the grid's own, then the next ones; at most "
                                                 f"{MAX_SEEDS:,}) instead of the grid's own, so each rung's verdicts "
                                                 "can decide")
    p.add_argument("--dry-run", action="store_true", help="print the rungs, their rates, cells and estimated time; "
                                                         "train and write nothing")
    p.add_argument("--out", type=Path, help="output root (default runs/ladders; a claim's ladder in NAME[-full]/)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override an option in every cell")
    p.add_argument("--trust-imports", action="store_true", help="run a grid file's `imports` (see `ablate grid`)")
    add_execution_arguments(p)


def run(args) -> int:
    # lazy, as in every command: torch and pandas stay off `ablate ladder --help`
    from ablate.claims.plan import quick_workers
    from ablate.grid.runner import GridRunOptions
    from ablate.grid.spec import REFUSE_IMPORTS, RUN_IMPORTS, parse_overrides
    from ablate.ladder.run import DEFAULT_ROOT, LadderRequest, run_ladders

    if args.backtest and getattr(args, "no_wait", False):
        raise ConfigError("--backtest scores a finished ladder and --no-wait leaves its rungs unfinished; valid: "
                          "--backtest on a run that waits (rerun without --no-wait once the cells have run)")
    local = args.backend == "local"
    if args.workers is None and local:  # another backend refuses --workers: leave it unset there
        args.workers = 1 if args.full else quick_workers()
    options = GridRunOptions.from_args(args)
    workers = args.workers if local else quick_workers()  # the estimate's cells at once
    overrides = parse_overrides(args.set)
    n_seeds = parse_seeds(args.seeds)
    if n_seeds is not None:
        check_seeds_override(overrides, f"--seeds {n_seeds}")
    widths = parse_widths(args.widths)
    if len(widths) > MAX_RUNGS:
        raise ConfigError(f"--widths: {len(widths)} widths; valid: 3 to {MAX_RUNGS} rungs, e.g. 16,32,64")
    return run_ladders(LadderRequest(args.names, widths, args.full, args.backtest, n_seeds, overrides, options,
                                     workers, args.out or DEFAULT_ROOT,
                                     RUN_IMPORTS if args.trust_imports else REFUSE_IMPORTS, args.dry_run, args.quiet))
