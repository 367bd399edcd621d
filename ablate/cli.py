"""`ablate` / `python -m ablate`: one parser, one handler module per command.

Handlers are imported lazily so `ablate --help` stays fast. Invalid input raises
ConfigError or VariantError, which become one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ablate.errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


# Each command is a module in ablate/commands/ with `add_arguments(parser)` and `run(args)`;
# the modules import their heavy dependencies inside `run`, so parsing stays fast.
COMMANDS = {
    "variants": "list registered variants with parameter counts",
    "train": "train one variant with one seed into a run directory",
    "grid": "run every cell of an ablation grid",
    "report": "plots and report.md for a grid or a run",
    "reproduce": "reproduce a published experiment end to end",
    "kernels": "check or benchmark the kernel backends",
    "bench": "measure the harness against plain PyTorch",
}


def _command_module(name: str):
    return importlib.import_module(f"ablate.commands.{name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only`, the arguments of that command alone, so that `ablate
    --help` or `ablate grid ...` does not import every command's dependencies (torch)."""
    parser = OneLineParser(prog="ablate", description="Transformer block ablation harness.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, help_text in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or name == only:
            module = _command_module(name)
            module.add_arguments(p)
            p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = argv[0] if argv and argv[0] in COMMANDS else ""  # "": no command given, or a bad one
    args = build_parser(only=command).parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except ConfigError as e:
        print(f"ablate {args.command}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ablate variants | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"ablate {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from ablate.variants.registry import VariantError  # imported by then: only a command raises it

        if isinstance(e, VariantError):
            print(f"ablate {args.command}: error: {e}", file=sys.stderr)
            return 2
        raise


def main_entry() -> None:
    sys.exit(main())
