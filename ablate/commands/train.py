"""`ablate train`: one variant, one seed, one run directory."""
from __future__ import annotations

import sys
from pathlib import Path

from ablate.core.bounded_read import UnreadableFile, read_toml
from ablate.core.errors import ConfigError
from ablate.core.rundir import (CELL_BUSY, CELL_SKIPPED, CHECKPOINT, COMPLETED, FAILED, STOPPED_DEAD, SUMMARY, check_out_path,
                                read_json)
from ablate.engine.cell import Cell, check_id_fits, finished_status, run_cell
from ablate.engine.config import EXECUTION, EXPERIMENT, OBSERVATION, OPTIONS, OPTION_NAMES, TRAIN_ID_OPTIONS
from ablate.grid.spec import parse_overrides
from ablate.variants import AXES

ROLE_TITLES = {EXPERIMENT: "experiment options (define the run; named in its folder when given)",
               OBSERVATION: "what is logged", EXECUTION: "how it executes (never changes the experiment)"}


def add_option_flags(p, skip=()) -> None:
    """One --flag per declared option (ablate/engine/config.py), grouped by role; values stay strings
    until `resolve` checks them."""
    groups = {role: p.add_argument_group(title) for role, title in ROLE_TITLES.items()}
    for name, o in OPTIONS.items():
        if name in skip:
            continue
        extra = f" (default {o.default})" if o.default is not None else ""
        if o.choices is not None and name not in AXES:
            extra += f"; one of {', '.join(map(str, o.choices()))}"
        groups[o.role].add_argument(o.flag, dest=name, default=None, metavar="X", help=o.help + extra)
    p.add_argument("--config", type=Path, help="TOML file of options; flags override it")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="set any option")


def collect_options(args) -> tuple[dict, set[str]]:
    """Options from --config, then flags, then --set; and the names given explicitly."""
    options: dict = {}
    if args.config is not None:
        options.update(_read_config_file(args.config))
    options.update({k: getattr(args, k) for k in OPTION_NAMES if getattr(args, k, None) is not None})
    options.update(parse_overrides(args.set))
    return options, set(options)


def _read_config_file(path: Path) -> dict:
    name = repr(str(path))
    try:  # bounded: a FIFO is refused at once, /dev/zero never read, deep nesting caught
        return read_toml(path)
    except FileNotFoundError:
        raise ConfigError(f"config file {name} does not exist") from None
    except UnreadableFile as e:
        raise ConfigError(f"config file {name} cannot be read ({e.why}); valid: a UTF-8 TOML file") from None


def add_arguments(p) -> None:
    add_option_flags(p)
    p.add_argument("--out", type=Path, default=Path("runs/train"), help="output root (default runs/train)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    options, given = collect_options(args)
    id_keys = [k for k in TRAIN_ID_OPTIONS if k in given]
    cell = Cell.from_options(options, id_keys=id_keys)
    check_id_fits(cell.id, f"the variant, the seed and the options given ({', '.join(id_keys)}); "
                           "valid: fewer of these options, or shorter values")
    run_dir = args.out / cell.id
    check_out_path(args.out, run_dir)
    if finished_status(run_dir) == FAILED:  # tried again: say so, and what the last try said
        try:
            error = read_json(run_dir / SUMMARY).get("error")
        except (OSError, ValueError, AttributeError):
            error = "its summary.json cannot be read"
        print(f"{run_dir} failed before ({error}); trying again", file=sys.stderr)
    # run_cell checks the data, device and kernels, and any run already in run_dir, before it
    # writes anything.
    try:
        result = run_cell(cell, args.out, retries=0, quiet=args.quiet)
    except KeyboardInterrupt as e:
        from ablate.engine.train import Interrupted  # lazy: torch stays off `ablate train --help`

        if isinstance(e, Interrupted):  # stopped between steps, after writing a checkpoint
            print(f"ablate train: {e}", file=sys.stderr)
            return 130
        if (run_dir / CHECKPOINT).exists():  # stopped before training got going again
            print(f"ablate train: interrupted; {run_dir} keeps its checkpoint: rerun the same command to resume",
                  file=sys.stderr)
            return 130
        raise
    s = result.summary or {}
    if result.outcome == CELL_BUSY:
        print(f"{run_dir} is being trained by another process; nothing to do", file=sys.stderr)
        return 1
    if s.get("status") == FAILED:  # never exit 0 over a failed run, also one failed by another process
        print(f"{run_dir}: failed: {s['error']}", file=sys.stderr)
        return 1
    if result.outcome == CELL_SKIPPED:
        print(f"{run_dir} already finished ({s['status']}); nothing to do")
    else:
        val = s["final_val_loss"]
        detail = (f"final loss {s['final_loss']:.4f}, val loss {val:.4f}" if s["status"] == COMPLETED
                  else f"diverged at step {s['diverged_at_step']}")
        if s.get(STOPPED_DEAD) is not None:
            detail += f" (stopped dead at step {s[STOPPED_DEAD]}: stop_dead)"
        print(f"{run_dir}: {s['status']} after {s['steps']} steps in {s['wall_time_s']:.1f}s, {detail}")
    return 0
