"""`ablate reproduce NAME|all|--list`: the arguments, checked into a Request, and the claim run
(ablate/claims/run.py) that the Request is handed to."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ablate.claims.options import (MAX_BUDGET_HOURS, MAX_SEEDS, UNDECIDED, check_seeds_override, parse_budget,
                                   parse_looks, parse_seeds)
from ablate.commands.grid import add_execution_arguments
from ablate.core.errors import ConfigError

if TYPE_CHECKING:  # the annotation only: the module itself is imported in request_from
    from ablate.claims.plan import Request


def add_arguments(p) -> None:
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


def request_from(args) -> Request:
    """The Request of parsed arguments; every bad value refused here, before anything is read."""
    # lazy, as in every command: torch and pandas stay off `ablate reproduce --help`
    from ablate.claims.plan import Request, quick_workers
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

    looks = parse_looks(getattr(args, "looks", None))
    if looks is not None and not args.decide:
        raise ConfigError(f"--looks {args.looks} is for --decide; valid: --decide --looks {args.looks}, or no --looks")
    return Request("gpu" if args.full else "cpu", overrides, options, n_seeds, args.decide, budget, args.dry_run,
                   RUN_IMPORTS if args.trust_imports else REFUSE_IMPORTS, looks)


def run(args) -> int:
    from ablate.claims.run import ALL, default_cells, find_claim, list_claims, reproduce, run_all, shipped_claims  # lazy: as above

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
