"""`ablate train`: one variant, one seed, one run directory."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

from ablate.config import OPTION_NAMES, TrainConfig
from ablate.errors import ConfigError
from ablate.grids import parse_overrides

# Options whose value is part of the run's identity: when given on the command line they
# appear in the cell id, so `--lr 1e-3` and `--lr 3e-3` land in different directories.
ID_OPTIONS = ("model", "layers", "steps", "lr", "warmup", "schedule", "min_lr_ratio", "batch_size",
              "seq_len", "weight_decay", "beta1", "beta2", "grad_clip", "diverge_factor")
HELP = {
    "variant": "preset, id or axis=value,...", "model": "size: tiny, small, medium, andrea-120m",
    "layers": "override the size's number of blocks", "seq_len": "context length (default: the size's)",
    "lr": "peak learning rate", "warmup": "linear warmup steps",
    "data": "text file, folder of text files, or llm.c .bin shard(s); default: the stdlib's sources",
    "kernels": "reference, triton, cuda or auto", "grad_clip": "clip the gradient norm (0 = off)",
    "probes": "log per-layer metrics (true/false)", "log_every": "log metrics every N steps",
}


def add_option_flags(p, skip=()) -> None:
    """One --flag per training option; values stay strings until `resolve` checks them."""
    for name in OPTION_NAMES:
        if name in skip:
            continue
        default = TrainConfig.__dataclass_fields__[name].default
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, metavar="X",
                       help=HELP.get(name, name.replace("_", " ")) + ("" if default is None else f" (default {default})"))
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
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))  # TOML is UTF-8 by definition
    except FileNotFoundError:
        raise ConfigError(f"config file {name} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {name} is a folder; valid: a TOML file") from None
    except OSError as e:
        raise ConfigError(f"config file {name} cannot be read ({e.strerror}); valid: a readable TOML file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {name} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                          f"{e.start}); valid: a UTF-8 TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {name} is not valid TOML: {e}") from None


def add_arguments(p) -> None:
    add_option_flags(p)
    p.add_argument("--out", type=Path, default=Path("runs/train"), help="output root (default runs/train)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args) -> int:
    from ablate.cell import Cell, run_cell
    from ablate.rundir import CHECKPOINT, check_out_path

    options, given = collect_options(args)
    cell = Cell.from_options(options, id_keys=[k for k in ID_OPTIONS if k in given])
    run_dir = args.out / cell.id
    check_out_path(args.out, run_dir)
    # run_cell checks the data, device and kernels, and any run already in run_dir, before it
    # writes anything.
    try:
        result = run_cell(cell, args.out, retries=0, quiet=args.quiet)
    except KeyboardInterrupt as e:
        from ablate.train import Interrupted

        if isinstance(e, Interrupted):  # stopped between steps, after writing a checkpoint
            print(f"ablate train: {e}", file=sys.stderr)
            return 130
        if (run_dir / CHECKPOINT).exists():  # stopped before training got going again
            print(f"ablate train: interrupted; {run_dir} keeps its checkpoint: rerun the same command to resume",
                  file=sys.stderr)
            return 130
        raise
    s = result.summary or {}
    if result.outcome == "busy":
        print(f"{run_dir} is being trained by another process; nothing to do", file=sys.stderr)
        return 1
    if result.outcome == "skipped":
        print(f"{run_dir} already finished ({s['status']}); nothing to do")
    elif s["status"] == "failed":
        print(f"{run_dir}: failed: {s['error']}", file=sys.stderr)
        return 1
    else:
        val = s["final_val_loss"]
        detail = (f"final loss {s['final_loss']:.4f}, val loss {val:.4f}" if s["status"] == "completed"
                  else f"diverged at step {s['diverged_at_step']}")
        print(f"{run_dir}: {s['status']} after {s['steps']} steps in {s['wall_time_s']:.1f}s, {detail}")
    return 0
