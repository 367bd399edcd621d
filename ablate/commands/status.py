"""`ablate status DIR [--watch]`: the state of a grid running anywhere, from grid.json and the
run directories alone (ablate/grid/status.py), printed once or refreshed until Ctrl-C."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ablate.core.counts import amount
from ablate.core.errors import ConfigError
from ablate.grid.status import report

MAX_INTERVAL_S = 24 * 3600  # `--interval`: a day between refreshes; more overflows time.sleep (inf, 1e10)


def add_arguments(p) -> None:
    p.add_argument("dir", metavar="DIR", help="a grid folder (grid.json and/or cell folders) or a run directory")
    p.add_argument("--watch", action="store_true", help="refresh until interrupted (Ctrl-C)")
    p.add_argument("--interval", type=amount(0, MAX_INTERVAL_S), default=10.0, metavar="S",
                   help="seconds between refreshes (default 10)")


def run(args) -> int:
    root = Path(args.dir)
    if not args.interval > 0:
        raise ConfigError(f"--interval {args.interval} must be above 0")
    while True:
        text = report(root)
        if not args.watch:
            print(text)
            return 0
        clear = "\033[H\033[J" if sys.stdout.isatty() else ""
        print(f"{clear}{time.strftime('%H:%M:%S')}  {text}", flush=True)
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return 0
