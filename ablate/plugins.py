"""Plugins: a researcher's own variants, inits, optimizers or schedules, from a file or module of
their own, without touching the package.

A plugin is a Python file (`--import my_blocks.py`) or an importable module (`--import
mylab.blocks`) that registers values in the registries of `ablate.variants` when imported. Three
ways to name one, all loaded the same way:

    ablate train --import my_blocks.py --variant act=mish ...   (repeatable, on every command
                                                                 that builds or reads variants)
    imports = ["my_blocks.py"]                                  (in a grid file; relative to it)
    [project.entry-points."ablate.plugins"] name = "pkg.module" (an installed package: always loaded)

Every process that trains a cell (grid workers, Ray tasks, SLURM jobs) imports the same plugins
first: a cell carries the list. config.json records each with its file's sha256, so a run says
exactly which code defined it.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from ablate.errors import ConfigError

ENTRY_POINT_GROUP = "ablate.plugins"
_LOADED: dict[str, dict] = {}  # plugin name as given (a file made absolute) -> its record
_ENTRY_POINTS_DONE = [False]


def _sha256(path: str | None) -> str | None:
    if not path or not Path(path).is_file():
        return None
    return "sha256:" + hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _is_file(name: str) -> bool:
    return name.endswith(".py") or "/" in name or Path(name).is_file()


def canonical(name: str, base: str | Path | None = None) -> str:
    """A file as an absolute path (relative to `base`, e.g. a grid file's folder, or the working
    directory), a module name as it is: the name every process of a grid loads."""
    if _is_file(name):
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = Path(base or ".") / path
        return str(path.resolve())
    return name


def _import_file(path: str):
    if not Path(path).is_file():
        raise ConfigError(f"plugin {path!r} does not exist; valid: a Python file or an importable module name")
    # A stable module name per file, so that pickled objects from it resolve in every worker.
    module_name = "ablate_plugin_" + Path(path).stem.replace("-", "_") + "_" + hashlib.sha1(path.encode()).hexdigest()[:8]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load(names, base: str | Path | None = None) -> list[str]:
    """Import each plugin once (files made absolute against `base`); returns their canonical
    names. A plugin that fails to import is a ConfigError naming it, in one line."""
    load_entry_points()
    out = []
    for given in names or ():
        name = canonical(given, base)
        if name not in _LOADED:
            try:
                module = _import_file(name) if _is_file(name) else importlib.import_module(name)
            except (ConfigError, KeyboardInterrupt):
                raise
            except BaseException as e:  # noqa: BLE001  (whatever the plugin raised, SystemExit too, is the user's to fix)
                message = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                raise ConfigError(f"plugin {given!r} failed to import ({message}); valid: a file or module that "
                                  "imports cleanly") from None
            path = getattr(module, "__file__", None)
            _LOADED[name] = {"name": name, "module": module.__name__, "file": path, "sha256": _sha256(path),
                             "source": "import"}
        out.append(name)
    return out


def load_entry_points() -> None:
    """Import every installed package's `ablate.plugins` entry point, once per process."""
    if _ENTRY_POINTS_DONE[0]:
        return
    _ENTRY_POINTS_DONE[0] = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            module = ep.load()
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"plugin entry point {ep.name!r} ({ep.value}) failed to import "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
        path = getattr(module, "__file__", None)
        _LOADED[f"entry-point:{ep.name}"] = {"name": ep.value, "module": getattr(module, "__name__", ep.value),
                                             "file": path, "sha256": _sha256(path), "source": "entry point"}


def requested() -> tuple[str, ...]:
    """The plugins imported in this process by name (entry points load everywhere on their own)."""
    return tuple(name for name, rec in _LOADED.items() if rec["source"] == "import")


def records() -> list[dict]:
    """What config.json records: every plugin this process imported, with its file's hash."""
    return [dict(rec) for rec in _LOADED.values()]
