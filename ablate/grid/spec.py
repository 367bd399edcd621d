"""Grid files: TOML that expands into the cells of an ablation (the grid file format: docs/grids.md).

    name = "prenorm-wins"             # defaults to the file's stem
    description = "one line for `ablate grid --list`"
    [base]                            # any option of `ablate train` (ablate/engine/config.py), and variant axes
    model = "tiny"
    [axes]                            # lists, crossed with each other
    norm = ["pre", "post"]
    seed = [0, 1, 2]
    [[include]]                       # extra cells: base + this entry (list values are crossed
    norm = "sandwich"                 #   within the entry; [axes] and [[exclude]] do not apply)
    seed = [0, 1, 2]
    [[exclude]]                       # drop every crossed cell that matches all the given keys
    norm = "post"
    [scales.gpu]                      # `--scale gpu`: base merged (its keys leave [axes]), axes
    base = { model = "medium" }       #   merged key by key, include/exclude replaced when given
    axes = { seed = [0, 1, 2, 3, 4] }

The default scale is `cpu`: the top level of the file (plus a [scales.cpu] table if present).
Cells that resolve to the same training config and the same variant spec run once (an `act`
crossed with a gated MLP, whose gate fixes its own activation, is the common case). A crossing
that the variant rules refuse (e.g. `deepnorm` without residual) is dropped and reported.
"""
from __future__ import annotations

import itertools
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

from ablate.core.bounded_read import UnreadableFile, kind_of, read_toml
from ablate.core.errors import ConfigError
from ablate.core.rundir import identity
from ablate.engine import plugins
from ablate.engine.cell import Cell, check_id_fits
from ablate.engine.config import (EXECUTION_KEYS, OPTIONS, OPTION_NAMES, TrainConfig, coerce_option, group_id, resolve,
                                  with_seed)
from ablate.variants import AXES, VariantError, parse_variant

TOP_KEYS = ("name", "description", "imports", "base", "axes", "include", "exclude", "scales")
SCALE_KEYS = ("description", "base", "axes", "include", "exclude")
DEFAULT_SCALE = "cpu"
# Options that never make two cells different runs: how a cell executes (ablate/engine/config.py roles;
# the scheduler sets `threads` per worker).
NOT_IDENTITY = EXECUTION_KEYS
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class _Resolver:
    """`resolve`, memoised on everything but the seed, for grids of many seeds: a million-seed
    grid resolves one config per distinct setting, not a million. Sound because the seed enters
    no check across options (config._check), and each seed value was checked alone when the
    file was read (coerce_option): a cell's config is its seedless one with its seed set."""

    def __init__(self):
        self._memo: dict[tuple, TrainConfig] = {}
        self._axes: dict[int, dict] = {}

    def base(self, options: Mapping[str, Any], strict: bool = True) -> TrainConfig:
        """The config of `options` with the seed left at its default (ConfigError if invalid)."""
        rest = dict(options)
        rest.pop("seed", None)
        key = (strict, frozenset(rest.items()))  # each option's values have one type (coerce_option)
        cfg = self._memo.get(key)
        if cfg is None:
            cfg = self._memo[key] = resolve(rest, strict)
        return cfg

    def axes(self, cfg: TrainConfig) -> dict[str, Any]:
        """cfg.spec.axes(), once per config (it copies the spec)."""
        if id(cfg) not in self._axes:
            self._axes[id(cfg)] = cfg.spec.axes()
        return self._axes[id(cfg)]


class CellConfigs(Mapping):
    """cell id -> its resolved TrainConfig, stored as (config without the seed, seed) so that a
    grid of a million seeds holds one config per distinct setting; `distinct()` lists those."""
    def __init__(self):
        self._of: dict[str, tuple[TrainConfig, int]] = {}

    def add(self, cell_id: str, cfg: TrainConfig, seed: int) -> None:
        self._of[cell_id] = (cfg, seed)

    def __getitem__(self, cell_id: str) -> TrainConfig:
        return with_seed(*self._of[cell_id])

    def __iter__(self):
        return iter(self._of)

    def __len__(self) -> int:
        return len(self._of)

    def setting(self, cell_id: str) -> TrainConfig:
        """The cell's config but for its seed (cheaper than configs[cell_id])."""
        return self._of[cell_id][0]

    def distinct(self) -> list[TrainConfig]:
        """One config per distinct setting (seeds aside)."""
        return list({id(cfg): cfg for cfg, _ in self._of.values()}.values())


@dataclass
class Grid:
    """A grid file expanded at one scale: its cells, ready to run."""
    name: str
    source: str  # the file it came from
    description: str
    scale: str
    scales: list[str]  # every scale the file offers
    base: dict[str, Any]  # [base] after the scale and --set overrides
    axes: dict[str, list]  # crossed axes after the scale
    include: list[dict]
    exclude: list[dict]
    overrides: dict[str, Any]  # --set / --kernels, applied to every cell
    cells: list[Cell] = field(default_factory=list)
    combinations: int = 0  # cells before duplicates collapsed
    duplicates: list[tuple[str, str]] = field(default_factory=list)  # (dropped options, kept id)
    refused: list[str] = field(default_factory=list)  # one line per dropped contradictory crossing
    id_keys: tuple[str, ...] = ()
    configs: CellConfigs = field(default_factory=CellConfigs)  # cell id -> resolved config

    @property
    def total_steps(self) -> int:
        return sum(self.configs.setting(c.id).steps for c in self.cells)

    def record(self) -> dict[str, Any]:
        """What grid.json says about the grid itself (the statuses are added on writing)."""
        return {
            "name": self.name, "source": self.source, "scale": self.scale, "description": self.description,
            "base": self.base, "axes": self.axes, "include": self.include, "exclude": self.exclude,
            "overrides": self.overrides, "id_keys": list(self.id_keys),
            "cells": [{"id": c.id, "group": c.group, "options": c.options} for c in self.cells],
        }


# --------------------------------------------------------------------------------- finding


def shipped_dir() -> Path:
    return Path(str(resources.files("ablate.variants") / "grids"))


def shipped_grids() -> dict[str, Path]:
    """Shipped grid name -> file, sorted by name."""
    return {p.stem: p for p in sorted(shipped_dir().glob("*.toml"))}


def find_grid(grid: str) -> Path:
    """A TOML path, or the name of a shipped grid."""
    path = Path(grid)
    if path.suffix == ".toml" or path.exists() or "/" in grid:
        if not path.is_file():
            what = ("is a folder, not a file" if path.is_dir() else "does not exist" if not path.exists()
                    else f"is {kind_of(path.stat().st_mode)}")  # a FIFO, a device: there, and no file
            raise ConfigError(f"grid file {grid!r} {what}; valid: a TOML file or a shipped grid "
                              f"({', '.join(shipped_grids())})")
        return path
    shipped = shipped_grids()
    if grid not in shipped:
        raise ConfigError(f"unknown grid {grid!r}; valid: a TOML file or a shipped grid ({', '.join(shipped)})")
    return shipped[grid]


# --------------------------------------------------------------------------------- parsing


def _fail(source: str, where: str, message: str) -> ConfigError:
    message = " ".join(str(message).split())  # always one line
    return ConfigError(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def _check_key(source: str, where: str, key: str) -> None:
    if key not in OPTION_NAMES:
        raise _fail(source, where, f"unknown key {key!r}; valid: {', '.join(OPTION_NAMES)}")


def _scalar(source: str, where: str, key: str, value: Any) -> Any:
    """Coerce one value to its option's type, naming file, table and key when it is wrong."""
    if isinstance(value, (dict, list)) or not isinstance(value, (str, int, float, bool)):
        raise _fail(source, where, f"{key} = {value!r} is not a single value; valid: a string, number or boolean")
    try:
        return coerce_option(key, value)
    except ConfigError as e:
        raise _fail(source, where, str(e)) from None


def _table(source: str, where: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise _fail(source, where, f"must be a table of key = value, not {type(value).__name__}")
    return value


def _options(source: str, where: str, table: Any) -> dict[str, Any]:
    table = _table(source, where, table)
    out = {}
    for key, value in table.items():
        _check_key(source, where, key)
        out[key] = _scalar(source, where, key, value)
    return out


def _axes(source: str, where: str, table: Any) -> dict[str, list]:
    table = _table(source, where, table)
    out = {}
    for key, values in table.items():
        _check_key(source, where, key)
        if not isinstance(values, list):
            raise _fail(source, where, f"{key} must be a list of values, e.g. {key} = [{values!r}]")
        if not values:
            raise _fail(source, where, f"{key} = [] leaves the grid empty; valid: a list of one or more values")
        if key in NOT_IDENTITY and len(values) > 1:
            raise _fail(source, where, f"{key} is an execution setting (how a cell runs, not what it trains), so it "
                                       f"cannot be an axis; valid: set it in [base] or with --set / --{key}")
        out[key] = [_scalar(source, where, key, v) for v in values]
    return out


def _entries(source: str, where: str, value: Any, lists: bool) -> list[dict]:
    """[[include]] or [[exclude]]: a list of tables; include values may be lists (crossed)."""
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list):
        raise _fail(source, where, f"must be a list of tables ([[{where.strip('[]')}]]), not {type(value).__name__}")
    out = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        entry = _table(source, at, entry)
        if not entry:
            raise _fail(source, at, f"is empty; valid keys: {', '.join(OPTION_NAMES)}")
        parsed = {}
        for key, v in entry.items():
            _check_key(source, at, key)
            if lists and isinstance(v, list):
                if not v:
                    raise _fail(source, at, f"{key} = [] is empty; valid: a value or a list of one or more")
                parsed[key] = [_scalar(source, at, key, x) for x in v]
            else:
                parsed[key] = _scalar(source, at, key, v)
        out.append(parsed)
    return out


# What reading a grid file does with its `imports` (code): run them (the user consented), list
# them without running any (a dry run), or refuse unless each was named with --import.
RUN_IMPORTS, LIST_IMPORTS, REFUSE_IMPORTS = "run", "list", "refuse"


def _grid_imports(source: str, imports: list[str], base: Path, policy: str) -> None:
    """Name every import with its sha256 (and what its source registers) on stderr before any
    runs; run them only with the user's consent: `policy` RUN_IMPORTS (--trust-imports), or
    every one already imported from the command line (--import)."""
    described = plugins.describe(imports, base)
    consented = policy == RUN_IMPORTS or all(d["imported"] for d in described)
    for d in described:
        registers = f"; registers {', '.join(d['registers'])}" if d["registers"] else ""
        state = "" if consented else ", not run"
        print(f"{source}: imports {d['file'] or d['name']} ({d['sha256'] or 'no file found'}{registers}{state})",
              file=sys.stderr)
    if consented:
        plugins.load(imports, base=base)
    elif policy == REFUSE_IMPORTS:
        named = " ".join(f"--import {d['file'] or d['name']}" for d in described)
        raise _fail(source, "imports", "a grid file's imports are code and run only with your consent; valid: "
                                       f"--trust-imports, or {named}")


def read_grid_file(path: Path, imports_policy: str = REFUSE_IMPORTS) -> dict[str, Any]:
    source = str(path)
    try:  # bounded: a FIFO is refused at once, /dev/zero never read, deep nesting caught
        data = read_toml(path)
    except UnreadableFile as e:
        raise _fail(source, "", e.why) from None
    except OSError as e:
        raise ConfigError(f"{source}: cannot read: {e.strerror}") from None
    for key in data:
        if key not in TOP_KEYS:
            raise _fail(source, "", f"unknown key {key!r}; valid: {', '.join(TOP_KEYS)}")
    imports = data.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise _fail(source, "imports", f"{imports!r} is not a list of strings; valid: imports = [\"my_blocks.py\"]")
    # Before any value is checked: the grid may name what its plugins register. Files are
    # relative to the grid file, so the grid runs from any folder.
    _grid_imports(source, imports, Path(path).resolve().parent, imports_policy)
    if not set(data) - {"name", "description", "imports"}:  # an empty file would train one default cell
        raise _fail(source, "", "defines no cells (no [base], [axes] or [[include]]); valid: a grid file as in "
                                "`ablate grid --help` or docs/grids.md, e.g. [axes] norm = [\"pre\", \"post\"]")
    if "name" in data:
        name = data["name"]
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise _fail(source, "name", f"{name!r} is not a valid grid name; valid: letters, digits and . _ + - "
                                        "(it names a folder)")
    else:
        name = derived_name(Path(path))
    description = data.get("description", "")
    if not isinstance(description, str):
        raise _fail(source, "description", "must be a string")
    scales = _table(source, "[scales]", data.get("scales", {}))
    for scale, table in scales.items():
        table = _table(source, f"[scales.{scale}]", table)
        for key in table:
            if key not in SCALE_KEYS:
                raise _fail(source, f"[scales.{scale}]", f"unknown key {key!r}; valid: {', '.join(SCALE_KEYS)}")
    return {"source": source, "name": name, "description": description, "scales": scales, **data}


def derived_name(path: Path) -> str:
    """A grid without a `name` is named after its file: `my grid.toml` -> `my-grid`."""
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", path.stem).strip("-.")
    if not _NAME_RE.match(name):
        raise ConfigError(f"{path}: the file name {path.name!r} gives no grid name (the grid has no `name` key); "
                          "valid: a `name = \"...\"` line of letters, digits and . _ + -, or a file name with some")
    return name


# --------------------------------------------------------------------------------- expanding


def _effective(cfg: TrainConfig, key: str) -> Any:
    """The value that decides what a cell trains (a gated MLP's `act` is None, `layers`
    is the depth the model really has, and so on)."""
    if key in AXES:
        return cfg.spec.axes()[key]
    if key == "variant":
        return cfg.spec.id
    if key == "layers":
        return cfg.size.n_layer
    if key == "width":
        return cfg.size.d_model
    if key == "seq_len":
        return cfg.context
    return getattr(cfg, key)


# Two cells of a grid are the same run when ablate.core.rundir.identity says so (as it says whether a
# run folder holds the run asked for), over every option but the execution ones; the variant
# axes are compared as the variant they make.
def grid_compared() -> dict:
    """Worked out when asked: a plugin's component options join OPTIONS when it is imported."""
    return {k: OPTIONS[k].default for k in OPTION_NAMES if k not in AXES + NOT_IDENTITY}


def _identity(cfg: TrainConfig) -> tuple:
    """The identity of `cfg`'s run, from the config.json fields it would write, resolved as far
    as a grid can without reading data (data is compared by its option, not its fingerprint)."""
    compared = grid_compared()
    record = {"train": {k: _effective(cfg, k) for k in compared}, "variant": {"id": cfg.spec.id},
              "model": {"n_layer": cfg.size.n_layer, "d_model": cfg.size.d_model, "init": cfg.init}, "data": {"fingerprint": cfg.data},
              "dtype": cfg.dtype}
    return tuple(identity(record, compared).items())


def _matches(cfg: TrainConfig, entry: Mapping[str, Any], seed: int) -> bool:
    """Whether the crossing (`cfg` without its seed, and `seed`) matches an [[exclude]] entry."""
    for key, value in entry.items():
        if key == "seed":
            if seed != value:
                return False
        elif key == "variant":
            try:
                if parse_variant(str(value)) != cfg.spec:
                    return False
            except VariantError:
                return False
        elif key in ("layers", "width", "seq_len"):
            if value is not None and _effective(cfg, key) != value:
                return False
        elif _effective(cfg, key) != value:
            return False
    return True


def _cross(table: Mapping[str, Any]) -> list[dict]:
    """Every combination of the list-valued entries of `table` (scalars held fixed)."""
    keys = list(table)
    lists = [table[k] if isinstance(table[k], list) else [table[k]] for k in keys]
    return [dict(zip(keys, combo)) for combo in itertools.product(*lists)]


def _apply_scale(raw: dict, scale: str) -> dict:
    source = raw["source"]
    valid = sorted({DEFAULT_SCALE, *raw["scales"]})
    if scale not in valid:
        raise _fail(source, "scale", f"unknown scale {scale!r}; valid: {', '.join(valid)}")
    base = _options(source, "[base]", raw.get("base", {}))
    axes = _axes(source, "[axes]", raw.get("axes", {}))
    include = _entries(source, "[[include]]", raw.get("include", []), lists=True)
    exclude = _entries(source, "[[exclude]]", raw.get("exclude", []), lists=False)
    description = raw["description"]
    for name, other in raw["scales"].items():  # every scale is checked, not only the one asked for
        where = f"[scales.{name}]"
        _options(source, f"{where}.base", other.get("base", {}))
        _axes(source, f"{where}.axes", other.get("axes", {}))
        _entries(source, f"{where}.include", other.get("include", []), lists=True)
        _entries(source, f"{where}.exclude", other.get("exclude", []), lists=False)
    table = raw["scales"].get(scale)
    if table:
        where = f"[scales.{scale}]"
        s_base = _options(source, f"{where}.base", table.get("base", {}))
        s_axes = _axes(source, f"{where}.axes", table.get("axes", {}))
        base.update(s_base)
        axes = {k: v for k, v in axes.items() if k not in s_base}  # a fixed value leaves the axes
        axes.update(s_axes)
        if "include" in table:
            include = _entries(source, f"{where}.include", table["include"], lists=True)
        if "exclude" in table:
            exclude = _entries(source, f"{where}.exclude", table["exclude"], lists=False)
        if "description" in table:
            description = str(table["description"])
    return {"base": base, "axes": axes, "include": include, "exclude": exclude, "description": description}


def parse_overrides(items: list[str] | Mapping[str, Any]) -> dict[str, Any]:
    """`--set key=value` items into typed options."""
    pairs = items.items() if isinstance(items, Mapping) else []
    if not isinstance(items, Mapping):
        pairs = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--set {item!r} is not KEY=VALUE; valid keys: {', '.join(OPTION_NAMES)}")
            pairs.append((key.strip(), value.strip()))
    out = {}
    for key, value in pairs:
        if key not in OPTION_NAMES:
            raise ConfigError(f"--set: unknown key {key!r}; valid: {', '.join(OPTION_NAMES)}")
        try:
            out[key] = coerce_option(key, value)
        except ConfigError as e:
            raise ConfigError(f"--set: {e}") from None
    return out


def load_grid(grid: str | Path, scale: str = DEFAULT_SCALE, overrides: Mapping[str, Any] | None = None,
              imports_policy: str = REFUSE_IMPORTS, seeds: list[int] | None = None) -> Grid:
    """Read, validate and expand a grid file (or shipped grid name) at `scale`. `overrides`
    (already typed, see parse_overrides) replace the value of their keys in every cell.
    `imports_policy`: what to do with the file's imports (see _grid_imports). `seeds`: every
    setting at these seeds instead of the file's (a design of another size: the cells' ids are
    the same as the file's at the seeds they share)."""
    path = find_grid(str(grid)) if not isinstance(grid, Path) else grid
    raw = read_grid_file(path, imports_policy)
    parts = _apply_scale(raw, scale)
    if seeds is not None:
        parts = _with_seeds(parts, seeds)
    overrides = dict(overrides or {})
    resolver = _Resolver()
    _check_tables(raw["source"], parts, overrides, resolver)
    candidates, refused = _crossings(parts, resolver)
    combinations = len(candidates)
    kept, duplicates = _collapse(candidates, parts["base"], overrides, resolver, refused)
    del candidates  # a grid of a million seeds: its crossings are not kept beside its cells
    if not kept:
        exclude, include = parts["exclude"], parts["include"]
        why = f" ({len(refused)} crossings refused, e.g. {refused[0]})" if refused else (
            " (every crossing is excluded)" if exclude and not include else "")
        raise _fail(raw["source"], "", f"the grid has no cells{why}; valid: [axes] lists of values, [[exclude]] that "
                                       "leave some cells")
    cells, configs, id_keys = _name_cells(raw, kept, resolver)
    return Grid(
        name=raw["name"], source=raw["source"], description=parts["description"], scale=scale,
        scales=sorted({DEFAULT_SCALE, *raw["scales"]}), base={**parts["base"], **overrides}, axes=parts["axes"],
        include=parts["include"], exclude=parts["exclude"], overrides=overrides, cells=cells,
        combinations=combinations, duplicates=[(d, cells[k].id) for d, k in duplicates], refused=refused,
        id_keys=id_keys, configs=configs,
    )


def _with_seeds(parts: dict, seeds: list[int]) -> dict:
    """The scale's tables with every setting at `seeds`: the seed axis replaced (added where the
    file fixes one seed) and every [[include]] entry's seeds replaced; an [[exclude]] that names
    a seed keeps naming it."""
    seeds = [coerce_option("seed", s) for s in seeds]
    base = {k: v for k, v in parts["base"].items() if k != "seed"}
    include = [{**entry, "seed": list(seeds)} for entry in parts["include"]]
    return {**parts, "base": base, "axes": {**parts["axes"], "seed": list(seeds)}, "include": include}


def _check_tables(source: str, parts: dict, overrides: dict[str, Any], resolver: _Resolver) -> None:
    """Each table's values alone must make a valid config, so an error names its table and key.
    [base] and --set apply to every cell, so a variant axis that their block would ignore is
    refused as in `ablate train`; the axes, includes and excludes are crossings (strict=False),
    where such an axis collapses the crossing instead."""
    base = parts["base"]
    try:
        resolve(base)
    except ConfigError as e:
        raise _fail(source, "[base]", str(e)) from None
    for key, values in parts["axes"].items():
        for value in values if key != "seed" else values[:1]:  # a seed was checked alone (coerce_option)
            try:
                resolver.base({**base, key: value}, strict=False)
            except ConfigError as e:
                raise _fail(source, "[axes]", str(e)) from None
    for i, entry in enumerate(parts["include"]):
        for combo in _cross(entry):
            try:
                resolver.base({**base, **combo}, strict=False)
            except ConfigError as e:
                raise _fail(source, f"[[include]][{i}]", str(e)) from None
    for i, entry in enumerate(parts["exclude"]):
        for key, value in entry.items():
            try:
                resolver.base({**base, key: value}, strict=False)
            except ConfigError as e:
                raise _fail(source, f"[[exclude]][{i}]", str(e)) from None
    try:
        resolve({**base, **overrides})
    except ConfigError as e:
        raise ConfigError(f"--set: {' '.join(str(e).split())}") from None


def _crossings(parts: dict, resolver: _Resolver) -> tuple[list[dict], list[str]]:
    """(the cells' options, the crossings refused): the axes crossed, excluded and contradictory
    crossings dropped, the includes added."""
    base, axes, exclude = parts["base"], parts["axes"], parts["exclude"]
    candidates: list[dict] = []
    refused: list[str] = []
    keys = list(axes)
    not_seed = [i for i, k in enumerate(keys) if k != "seed"]
    # A crossing's config depends on its values but the seed: resolved once per setting, so a
    # grid of a million seeds resolves (and refuses) each setting once, not per seed.
    setting_of: dict[tuple, Any] = {}
    for combo in itertools.product(*(axes[k] for k in keys)):
        options = {**base, **dict(zip(keys, combo))}
        setting = tuple(combo[i] for i in not_seed)
        cfg = setting_of.get(setting)
        if cfg is None:
            try:
                cfg = setting_of[setting] = resolver.base(options, strict=False)
            except ConfigError as e:
                cfg = setting_of[setting] = f"{' '.join(str(e).split())}"
        if isinstance(cfg, str):
            refused.append(f"{_describe(dict(zip(keys, combo)))}: {cfg}")
            continue
        if exclude and any(_matches(cfg, entry, options.get("seed", cfg.seed)) for entry in exclude):
            continue
        candidates.append(options)
    for entry in parts["include"]:
        candidates.extend({**base, **combo} for combo in _cross(entry))
    return candidates, refused


def _collapse(candidates: list[dict], base: dict, overrides: dict, resolver: _Resolver,
              refused: list[str]) -> tuple[list[tuple[dict, TrainConfig, int]], list[tuple[str, int]]]:
    """Apply --set, resolve, and collapse cells that train the same thing. Returns the cells
    kept as (options, config without its seed, seed), and the duplicates dropped as (their
    options, the index of the kept cell they train as); a crossing an override contradicts is
    added to `refused`."""
    kept: list[tuple[dict, TrainConfig, int]] = []
    seen: dict[tuple, int] = {}
    duplicates: list[tuple[str, int]] = []
    identities: dict[int, tuple] = {}  # id(config without seed) -> _identity of it
    # The options but the seed -> (the options as resolved, but the seed; their config): the
    # same for every seed of a setting, so worked out once per setting.
    settled: dict[frozenset, tuple[dict, TrainConfig]] = {}
    for given in candidates:
        options = {**given, **overrides}
        key = frozenset((k, v) for k, v in options.items() if k != "seed")
        if key in settled:
            rest, cfg = settled[key]
            options = {**rest, "seed": options["seed"]} if "seed" in options else rest
        else:
            try:
                cfg = resolver.base(options, strict=False)
            except ConfigError as e:  # an override contradicting a crossing
                refused.append(f"{_describe(_diff(options, base))}: {' '.join(str(e).split())}")
                continue
            options, cfg = _settle(options, cfg, resolver)
            settled[key] = ({k: v for k, v in options.items() if k != "seed"}, cfg)
        seed = options.get("seed", cfg.seed)
        if id(cfg) not in identities:
            identities[id(cfg)] = _identity(cfg)
        ident = (identities[id(cfg)], seed)
        if ident in seen:
            duplicates.append((_describe(_diff({**given, **overrides}, base)), seen[ident]))
            continue
        seen[ident] = len(kept)
        kept.append((options, cfg, seed))
    return kept, duplicates


def _settle(options: dict, cfg: TrainConfig, resolver: _Resolver) -> tuple[dict, TrainConfig]:
    """The options of a crossing as they resolve, and their config without the seed (`cfg`:
    the options resolved leniently, as a crossing)."""
    # Record the axes as they resolve: a gated MLP's `act` is None, not the crossed value.
    spec_axes = resolver.axes(cfg)
    if any(k in options and options[k] != spec_axes[k] for k in AXES):
        options = {**options, **{k: spec_axes[k] for k in AXES if k in options}}
        cfg = resolver.base(options, strict=False)
    try:
        resolver.base(options)  # as one run: how the cell is resolved again when it trains
    except ConfigError:  # an axis written in `variant` (act=relu) that the crossing dropped
        options = {**options, "variant": cfg.spec.id}
        cfg = resolver.base(options, strict=False)  # the cell's config names the block it trains
    return options, cfg


def _name_cells(raw: dict, kept: list[tuple[dict, TrainConfig, int]],
                resolver: _Resolver) -> tuple[list[Cell], CellConfigs, tuple[str, ...]]:
    """The cells, named by what varies across them (the variant id, those options, the seed);
    their configs; and the options that name them."""
    source = raw["source"]
    distinct = list({id(cfg): cfg for _, cfg, _ in kept}.values())
    varying_options = tuple(
        k for k in OPTION_NAMES
        if k not in AXES and k not in ("variant", "seed") + NOT_IDENTITY
        and len({getattr(cfg, k) for cfg in distinct}) > 1  # as given: a model axis alone does not name `layers`
    )
    varying_axes = tuple(k for k in AXES if len({resolver.axes(cfg)[k] for cfg in distinct}) > 1)
    named_by = (f"the variant, the seed and the options that vary in the grid "
                f"({', '.join((*varying_axes, *varying_options)) or 'none'}); valid: fewer axes "
                "(split the grid, or fix some of these options in [base])")
    setting_axes: dict[int, tuple] = {}  # id(config without seed) -> (the cell's axes but its seed, group)
    requested = plugins.requested()  # the plugins behind every cell's values, the same for all
    cells: list[Cell] = []
    configs = CellConfigs()
    ids: set[str] = set()
    for options, base_cfg, seed in kept:
        if id(base_cfg) not in setting_axes:
            shared = {k: resolver.axes(base_cfg)[k] for k in varying_axes}
            shared.update({k: _effective(base_cfg, k) for k in varying_options})
            setting_axes[id(base_cfg)] = (shared, group_id(base_cfg, varying_options, keep_defaults=True))
        shared, group = setting_axes[id(base_cfg)]
        # Named by every option that varies in the grid, default values included: a train run
        # leaves `warmup=0` out of its id, but a grid crossing warmup 0 and 100 names both.
        cell = Cell.from_options(options, id_keys=varying_options, axes=shared, grid=raw["name"],
                                 keep_defaults=True, cfg=base_cfg, group=group, seed=seed, plugins=requested)
        if "/" in cell.id or cell.id.startswith("."):
            raise _fail(source, "", f"cell id {cell.id!r} is not a folder name (an option that varies has a "
                                    "'/' in its value); valid: vary options whose values have no '/'")
        try:
            check_id_fits(cell.id, named_by)
        except ConfigError as e:
            raise _fail(source, "", str(e)) from None
        if cell.id in ids:  # cannot happen: every difference is in the id
            raise _fail(source, "", f"two different cells share the id {cell.id!r}")
        ids.add(cell.id)
        cells.append(cell)
        configs.add(cell.id, base_cfg, seed)
    return cells, configs, varying_options


def _describe(options: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in options.items()) or "base"


def _diff(options: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k not in base or base[k] != v}
