"""`ablate` / `python -m ablate`: one parser, one handler module per command.

Handlers are imported lazily so `ablate --help` stays fast. Invalid input raises
ConfigError or VariantError, which become one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import warnings
from dataclasses import dataclass

from ablate.core.errors import ConfigError
from ablate.core.registry import Registry, RegistryError


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class Command:
    """A subcommand: a module with `add_arguments(parser)` and `run(args)`, which imports its heavy
    dependencies inside `run` so that parsing stays fast."""

    help: str
    module: str
    takes_plugins: bool  # builds or reads variants: takes `--import MODULE_OR_FILE` (ablate/engine/plugins.py)


COMMANDS: Registry[Command] = Registry("command", ConfigError)  # a plugin may register a command of its own


def _builtin(name: str, help_text: str, takes_plugins: bool = False) -> None:
    COMMANDS.register(name, Command(help_text, f"ablate.commands.{name}", takes_plugins))


_builtin("variants", "list registered variants with parameter counts", takes_plugins=True)
_builtin("train", "train one variant with one seed into a run directory", takes_plugins=True)
_builtin("grid", "run every cell of an ablation grid", takes_plugins=True)
_builtin("report", "plots and report.md for a grid or a run")
_builtin("reproduce", "reproduce a published experiment end to end", takes_plugins=True)
_builtin("ladder", "a claim at a ladder of model sizes: does it hold at scale?", takes_plugins=True)
_builtin("export", "export runs to TensorBoard or W&B (offline); again adds only what is new")
_builtin("status", "the state of a grid running anywhere: counts, steps, time left")
_builtin("kernels", "check or benchmark the kernel backends")
_builtin("bench", "measure the harness against plain PyTorch", takes_plugins=True)
IMPORT_FLAG = "--import"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `only`, the arguments of that command alone, so that `ablate
    --help` or `ablate grid ...` does not import every command's dependencies (torch)."""
    parser = OneLineParser(prog="ablate", description="Transformer block ablation harness.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.help)
        if only is None or name == only:
            module = importlib.import_module(command.module)
            module.add_arguments(p)
            if command.takes_plugins:
                p.add_argument(IMPORT_FLAG, dest="imports", action="append", default=[], metavar="MODULE_OR_FILE",
                               help="a plugin: a Python file or module that registers variants, inits, optimizers "
                                    "or schedules (repeatable)")
            p.set_defaults(run=module.run)
    return parser


def _plugins_named(command: str, argv: list[str]) -> list[str]:
    """The `--import` values in `argv`, read before the parser is built: a plugin's options (an
    optimizer's `--foo`) become flags of the command only once it is imported."""
    pre = OneLineParser(prog=f"ablate {command}", add_help=False, allow_abbrev=False)
    pre.add_argument(IMPORT_FLAG, dest="imports", action="append", default=[])
    return pre.parse_known_args(argv)[0].imports


# OSErrors the user can fix (free space, permissions, a path): exit 2 like bad input; any other
# (an I/O error of the device) is still one line, exit 1.
USER_FIXABLE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT,
                       errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG, errno.ELOOP)


def describe_os_error(e: OSError) -> str:
    """One line naming what failed and where: 'No space left on device: /runs/x/checkpoint.pt'."""
    what = e.strerror or str(e)
    paths = [p for p in (e.filename, e.filename2) if p is not None]
    return f"{what}: {' -> '.join(map(str, paths))}" if paths else what


def _one_line_warning(command: str):
    """A Python warning (a library's UserWarning) as one line on stderr, without the source
    line Python shows beneath it."""
    def show(message, category, filename, lineno, file=None, line=None):
        text = (str(message).splitlines() or [category.__name__])[0]
        print(f"ablate {command}: warning: {text}", file=sys.stderr)
    return show


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = ""  # no command given, or a bad one
    try:  # parsing imports the command's module (torch): Ctrl-C there is an interruption too
        command = _command_named(argv)
        if command and COMMANDS.get(command).takes_plugins:
            _load_plugins(_plugins_named(command, argv[1:]))  # entry points too, with no --import
        args = build_parser(only=command).parse_args(argv)
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(args.command)
            return int(args.run(args) or 0)
    except (ConfigError, RegistryError) as e:  # RegistryError: VariantError, an unknown name
        print(f"ablate{' ' + command if command else ''}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `ablate variants | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"ablate{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # the environment: a full disk, a path that cannot be created or written
        print(f"ablate{' ' + command if command else ''}: error: {describe_os_error(e)}", file=sys.stderr)
        return 2 if e.errno in USER_FIXABLE_ERRNOS else 1


def _command_named(argv: list[str]) -> str:
    """The command `argv` names, "" when none or an unknown one. A name not built in may be a
    plugin's command: the plugins named with --import are loaded first, to register it."""
    if argv and argv[0] not in COMMANDS and not argv[0].startswith("-"):
        named = _plugins_named(argv[0], argv[1:])
        if named:
            _load_plugins(named)
    return argv[0] if argv and argv[0] in COMMANDS else ""


def _load_plugins(names: list[str]) -> None:
    from ablate.engine import plugins  # lazy: importlib.metadata (entry points) stays off `ablate --help`

    plugins.load(names)


_interrupted = []  # set once a SIGINT arrived while the program ran


def _on_sigint(signum, frame) -> None:
    _interrupted.append(signum)
    if _importing(frame):  # raised here, it would land in import machinery that prints or swallows it
        print("ablate: interrupted", file=sys.stderr, flush=True)
        os._exit(130)  # as safe as the kill -9 every run folder survives
    raise KeyboardInterrupt


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def main_entry() -> None:
    # A SIGINT can land inside a library's import, which some library catches and swallows,
    # leaving a half-imported module whose next use fails with another error (numpy: "cannot load
    # module more than once per process"). Once the user has interrupted, whatever follows is the
    # interruption, not a failure of its own.
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        code = main()
    except KeyboardInterrupt:  # between the interpreter's start and main's own handlers
        print("ablate: interrupted", file=sys.stderr)
        code = 130
    except Exception:
        if not _interrupted:
            raise
        print("ablate: interrupted", file=sys.stderr)
        code = 130
    sys.exit(code)
