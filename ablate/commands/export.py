"""`ablate export DIR --to tensorboard|wandb [--out OUT]`: a grid's runs (finished or still
running) into TensorBoard event files or W&B offline runs; exporting again adds only what is
new, and nothing is written into the run directories."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

from ablate.core.errors import ConfigError


def add_arguments(p) -> None:
    p.add_argument("dir", metavar="DIR", help="a grid folder (grid.json and/or cell folders) or a run directory")
    p.add_argument("--to", required=True, choices=["tensorboard", "wandb"], help="the dashboard to export to")
    p.add_argument("--out", metavar="OUT", default=None,
                   help="tensorboard: the log directory (default DIR/tensorboard); wandb: the folder wandb writes "
                        "its wandb/ folder into (default DIR). For a single run directory, beside it instead")
    p.add_argument("--project", default=None, help="wandb: the project (default: the grid's name)")


def default_out(source: Path, target: str) -> Path:
    # Never inside a run directory: a lone run's export goes beside it.
    base = source.parent if (source / "config.json").is_file() else source
    return base / "tensorboard" if target == "tensorboard" else base


def run(args) -> int:
    # lazy: keeps numpy, pandas off `ablate export --help`
    from ablate.analysis.export import ExportError, export_tensorboard, export_wandb
    from ablate.analysis.load import RunsError

    source = Path(args.dir)
    out = Path(args.out) if args.out else default_out(source, args.to)
    if args.project is not None and args.to != "wandb":
        raise ConfigError("--project applies to --to wandb only")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if args.to == "tensorboard":
                result = export_tensorboard(source, out, own_folder=args.out is None)
            else:
                result = export_wandb(source, out, args.project)
        except (ExportError, RunsError) as e:
            raise ConfigError(str(e)) from None
        except OSError as e:  # an unwritable --out, a full disk: the environment, in one line
            raise ConfigError(f"cannot write the export to {out}: {e.strerror or e}; valid: --out a folder "
                              "you can write to") from None
    warned = {str(w.message) for w in caught}
    for line in result.skipped:  # damaged files and skipped metrics lines, one line each
        if line in warned:
            print(f"ablate export: warning: {line}", file=sys.stderr)

    n_new, n_same = len(result.updated), len(result.unchanged)
    print(f"{out}: {n_new} run{'s' if n_new != 1 else ''} updated, {n_same} unchanged")
    if args.to == "tensorboard":
        print(f"view: tensorboard --logdir {out}")
    else:
        print(f"upload: wandb sync {out / 'wandb'}/offline-run-*")
    return 0
