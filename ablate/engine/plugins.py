"""Plugins: a researcher's own variants, inits, optimizers or schedules, from a file or module of
their own, without touching the package.

A plugin is a Python file (`--import my_blocks.py`) or an importable module (`--import
mylab.blocks`) that registers values when imported, through the same `Registry.register` as the
built-ins (ablate/core/registry.py): variants, inits, optimizers and schedules in `ablate.variants`
(an optimizer or schedule with `options=` of its own, which become flags), kernel backends,
run backends, CLI commands, claim measures and plot kinds. Named with `--import`, a plugin is
loaded before the command line is parsed, so its options and commands are there. Three ways to
name one, all loaded the same way:

    ablate train --import my_blocks.py --variant act=mish ...   (repeatable, on every command
                                                                 that builds or reads variants)
    imports = ["my_blocks.py"]                                  (in a grid file; relative to it)
    [project.entry-points."ablate.engine.plugins"] name = "pkg.module" (an installed package: always loaded)

Every process that trains a cell (grid workers, Ray tasks, SLURM jobs) imports the same plugins
first: a cell carries the list. config.json records each with its file's sha256, so a run says
exactly which code defined it.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

from ablate.core.bounded_read import kind_of
from ablate.core.errors import ConfigError

ENTRY_POINT_GROUP = "ablate.engine.plugins"
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
    if not Path(path).is_file():  # a FIFO or a device is there, but is no file to import
        what = f"is {kind_of(Path(path).stat().st_mode)}" if Path(path).exists() else "does not exist"
        raise ConfigError(f"plugin {path!r} {what}; valid: a Python file or an importable module name")
    # A stable module name per file, so that pickled objects from it resolve in every worker.
    module_name = "ablate_plugin_" + Path(path).stem.replace("-", "_") + "_" + hashlib.sha1(path.encode()).hexdigest()[:8]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None:  # Python imports a file by its suffix: `m.txt` has no loader
        raise ConfigError(f"plugin {path!r} is not a Python file; valid: a file whose name ends in .py, or an "
                          "importable module name")
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


def _module_file(name: str) -> str | None:
    """The file a module name would import, found without running any of its code (not
    importlib.util.find_spec, which imports a dotted name's parent packages)."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__file__", None)
    spec, path = None, None
    for part in name.split("."):
        spec = importlib.machinery.PathFinder.find_spec(part, path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec.origin if spec is not None and spec.has_location else None


def _registrations(path: str | None) -> list[str]:
    """What a plugin file registers, read from its source without running it: every
    `REGISTRY.register("name")` call with a literal name ("ACTIVATIONS 'mish'")."""
    try:
        tree = ast.parse(Path(path).read_bytes()) if path else None
    except (OSError, SyntaxError, ValueError):
        return []
    found = []
    for node in ast.walk(tree) if tree is not None else ():
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.append(f"{ast.unparse(node.func.value)} {node.args[0].value!r}")
    return found


def describe(names, base: str | Path | None = None) -> list[dict]:
    """Each plugin as it would be loaded, without loading it: its canonical name, file, sha256,
    what it registers (as far as its source says), and whether the user already imported it
    (`--import`: their consent to run it)."""
    out = []
    for given in names or ():
        name = canonical(given, base)
        path = name if _is_file(name) else _module_file(name)
        out.append({"name": name, "file": path, "sha256": _sha256(path), "registers": _registrations(path),
                    "imported": name in requested()})
    return out


def load_entry_points() -> None:
    """Import every installed package's `ablate.engine.plugins` entry point, once per process."""
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
