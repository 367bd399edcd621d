"""Run directories -> tidy pandas frames.

Reads only the files the training engine writes (config.json, metrics.jsonl, summary.json,
grid.json; see docs/run-directory.md), by the names, status words and identity keys ablate/core/rundir.py
declares (standard library only: analysis imports nothing else of the engine). It tolerates what a live, crashed or damaged grid leaves
behind: a cell without summary.json is reported as `running`, an unreadable metrics line is
skipped with a warning (the rows after it are kept), a cell whose config.json or summary.json
does not parse is left out and named in `Runs.skipped`, and grid.json cells without a folder
yet are listed as pending.
"""
from __future__ import annotations

import json
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Collection, Iterator

import pandas as pd

from ablate.analysis.cpu_forms import FORM_KEYS
from ablate.core.bounded_read import (LINE_BYTES, LISTING_BYTES, STATE_BYTES, UnreadableFile, parse_json, read_json,
                                      sized_lines)
# Re-exported for the rest of analysis (DONE, FINISHED, SETTING_KEYS, SUMMARY).
from ablate.core.rundir import (CONFIG, DONE, FINISHED, GRID_JSON, METRICS, RUNNING, SETTING_KEYS, SUMMARY,  # noqa: F401
                                identity_keys, summary_status)
from ablate.core.probe_registry import layer_keys
from ablate.core.variant_axes import AXES, VALUE_BEFORE_IT_EXISTED

# The axes of a block variant (ablate/core/variant_axes.py; docs/variants.md); config.json's `variant` holds one value for each.
VARIANT_AXES = AXES  # declared once, in ablate/core/variant_axes.py (standard library only)
# Run directories written before an axis existed trained with what is now its default.
AXIS_VALUE_BEFORE_IT_EXISTED = VALUE_BEFORE_IT_EXISTED
# The default block: the baseline a report compares against when none is named.
DEFAULT_VARIANT_ID = "pre.layernorm.gelu.dense.res"
_SEED_SUFFIX = re.compile(r"__seed=[^_]+$")

# Cells are compared only at equal settings: the training options that define the run besides
# the variant and the seed (rundir.identity_keys: config.json's `identity_keys`, or SETTING_KEYS
# for a run directory written before it listed them). An option that varies across the folder
# without being a grid axis (two grids or a stray `ablate train` sharing one --out) becomes an
# option axis, so a baseline is never paired with a cell trained differently.
# Handled apart from the settings: the variant by its axes, the seed as the pairing key.
NOT_SETTINGS = ("seed", "variant", *VARIANT_AXES)


def setting_keys(config: dict[str, Any]) -> tuple[str, ...]:
    """The `train` options that define this run, besides its variant and seed."""
    return tuple(k for k in identity_keys(config) if k not in NOT_SETTINGS)


class RunsError(ValueError):
    """The path given is not something `load_runs` can read; the message says what is valid."""


@dataclass
class Runs:
    """Everything read from one grid folder or one run directory.

    `cells`: one row per cell (config, summary and the axes as columns).
    `steps`: one row per cell x logged step (every metrics.jsonl key as a column; null -> NaN).
    """

    root: Path
    kind: str  # "grid": a folder of cell folders; "run": a single run directory
    cells: pd.DataFrame
    steps: pd.DataFrame
    grid: dict[str, Any] | None = None  # grid.json, when there is one
    pending: list[str] = field(default_factory=list)  # grid.json cells with no folder yet
    skipped: list[str] = field(default_factory=list)  # what was not read, and why (one line each)
    axis_columns: list[str] = field(default_factory=list)  # every axis present as a column

    @property
    def name(self) -> str:
        if self.kind == "run" and not self.cells.empty:
            return str(self.cells["cell_id"].iloc[0])
        if self.grid and self.grid.get("name"):
            return str(self.grid["name"])
        names = self.cells["grid"].dropna().unique() if "grid" in self.cells else []
        if len(names) == 1:
            return str(names[0])
        return self.root.name

    @property
    def groups(self) -> list[str]:
        return list(self.cells["group"].unique())

    @property
    def varying_axes(self) -> list[str]:
        """Axis columns (seed excluded) that take more than one value across the cells."""
        return [c for c in self.axis_columns if c != "seed" and self.cells[c].nunique(dropna=False) > 1]

    @property
    def option_axes(self) -> list[str]:
        """Varying axes that are training or model options rather than variant axes."""
        return [c for c in self.varying_axes if c not in VARIANT_AXES]

    def layer_count(self) -> int:
        """Number of layers with per-layer metrics (0 when trained with probes = false)."""
        return len(layer_columns(self.steps, "grad_norm"))


def layer_columns(frame: pd.DataFrame, metric: str) -> list[str]:
    """`metric/layer_{i}` columns (the whole-layer ones, not /attn, /mlp, /norm) by layer."""
    return layer_keys(frame.columns, metric)


class DamagedFile(ValueError):
    """A run file that exists but cannot be read as what the engine writes."""


@dataclass
class Scan:
    """What a folder holds, before any cell is read: see `scan_runs`."""

    root: Path
    kind: str  # "grid" or "run"
    grid: dict[str, Any] | None
    cell_dirs: list[Path]  # folders with a config.json (for a run: the run directory itself)
    pending: list[str]  # grid.json cells with no folder yet
    skipped: list[str]


@dataclass
class RunFiles:
    """One run directory's files as the engine wrote them (metrics: valid rows, file order)."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any] | None  # None: not finished
    rows: list[dict[str, Any]]

    @property
    def cell_id(self) -> str:
        return str(self.config.get("cell_id") or self.path.name)

    @property
    def group(self) -> str:
        return str(self.config.get("group") or _SEED_SUFFIX.sub("", self.cell_id))

    @property
    def status(self) -> str:
        """ablate.core.rundir's word for the run: its summary's status, or running without one."""
        return summary_status(self.summary) or RUNNING


def load_runs(path: str | Path, seeds: Collection[int] | None = None, listed_only: bool = False) -> Runs:
    """Read a grid folder (grid.json and/or cell folders with config.json, finished or not)
    or a single run directory (config.json directly inside). Raises RunsError otherwise.
    `seeds`: only the cells of these seeds (a design within a grid folder that holds more).
    `listed_only`: only the cells the folder's readable grid.json lists (a ladder's rung whose
    sweep moved keeps the earlier sweep's cell folders beside its own: they are not its grid's)."""
    scan = scan_runs(path)
    if listed_only and scan.grid is not None:
        listed = set(grid_cell_ids(scan.grid))
        others = [p for p in scan.cell_dirs if p.name not in listed]
        if others:
            scan.skipped.append(f"{len(others)} cell folder(s) that grid.json does not list (another sweep's), "
                                f"left out: {', '.join(p.name for p in others[:3])}{', ...' if len(others) > 3 else ''}")
            scan.cell_dirs = [p for p in scan.cell_dirs if p.name in listed]
    records, steps = [], []
    for cell_dir in scan.cell_dirs:
        files = read_run_files(cell_dir, scan.skipped)
        if files is not None:
            rec, st = _cell_frames(files)
            if seeds is not None and rec["seed"] not in seeds:
                continue
            records.append(rec)
            steps.append(st)
    return _assemble(scan.root, scan.kind, records, steps, scan.grid, scan.pending, scan.skipped)


def scan_runs(path: str | Path) -> Scan:
    """Find the run directories of a grid folder or a run directory, and read grid.json.
    A damaged grid.json is named in `skipped` (its pending cells are then unknown)."""
    root = Path(path)
    if not root.exists():
        raise RunsError(f"{str(path)!r} does not exist; valid: a grid folder or a run directory")
    if not root.is_dir():
        raise RunsError(f"{str(path)!r} is not a folder; valid: a grid folder or a run directory")

    skipped: list[str] = []
    if (root / CONFIG).is_file():
        return Scan(root, "run", None, [root], [], skipped)

    grid = None
    if (root / GRID_JSON).is_file():
        try:
            grid = read_json_object(root / GRID_JSON)
        except DamagedFile as e:
            _skip(skipped, f"{GRID_JSON}: {e}; pending cells are not listed")
    cell_dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / CONFIG).is_file())
    if grid is None and not cell_dirs:
        why = "grid.json is unreadable and no" if skipped else "no config.json, no grid.json, no"
        raise RunsError(f"{str(path)!r} is not a run or grid folder ({why} cell folders); "
                        "valid: a grid folder or a run directory")
    listed = grid_cell_ids(grid)
    present = {p.name for p in cell_dirs}
    pending = [cid for cid in listed if cid not in present]
    for p in sorted(p for p in root.iterdir() if p.is_dir() and p.name in listed and not (p / CONFIG).is_file()):
        skipped.append(f"{p.name}: folder has no config.json yet (not started)")
    return Scan(root, "grid", grid, cell_dirs, pending, skipped)


def grid_cell_ids(grid: dict[str, Any] | None) -> list[str]:
    """The cell ids grid.json lists (entries that are not {id: ...} are ignored)."""
    cells = (grid or {}).get("cells")
    if not isinstance(cells, list):
        return []
    return [c["id"] for c in cells if isinstance(c, dict) and isinstance(c.get("id"), str)]


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; DamagedFile (with the reason) for anything else."""
    limit = LISTING_BYTES if path.name == GRID_JSON else STATE_BYTES
    try:  # bounded: a FIFO, a device, a huge, nested or non-finite file is damaged, never a hang or a crash
        return read_json(path, top=dict, limit=limit)
    except UnreadableFile as e:
        raise DamagedFile(f"unreadable ({e.why})") from None
    except OSError as e:
        reason = ": ".join([type(e).__name__, *str(e).splitlines()[:1]])
        raise DamagedFile(f"unreadable ({reason})") from None


def read_run_files(cell_dir: Path, skipped: list[str], rows: bool = True) -> RunFiles | None:
    """config.json, summary.json and the valid rows of metrics.jsonl of one run directory (no
    rows with rows=False: a caller that streams them, analysis/metrics_index.py); None (with one
    line in `skipped`) when config.json or summary.json is damaged."""
    name = cell_dir.name
    try:
        config = read_json_object(cell_dir / CONFIG)
        name = str(config.get("cell_id") or name)
    except DamagedFile as e:
        _skip(skipped, f"{name}: {CONFIG} {e}; cell left out")
        return None
    summary = None
    if (cell_dir / SUMMARY).is_file():
        try:
            summary = read_json_object(cell_dir / SUMMARY)
        except DamagedFile as e:
            _skip(skipped, f"{name}: {SUMMARY} {e}; cell left out")
            return None
    for section in ("variant", "model", "train", "data", "axes"):
        if config.get(section) is not None and not isinstance(config[section], dict):
            _skip(skipped, f"{name}: {CONFIG} field {section!r} is not an object; cell left out")
            return None
    if summary_status(summary) in DONE and (why := _not_a_metrics_file(cell_dir / METRICS)):
        _skip(skipped, f"{name}: finished, but its {METRICS} {why}; its logged steps are left out")
    return RunFiles(cell_dir, config, summary, read_metrics(cell_dir / METRICS, name, skipped) if rows else [])


def _not_a_metrics_file(path: Path) -> str | None:
    """Why a finished cell's metrics.jsonl cannot be read as one (None: a regular file). A
    FIFO, a device (a link to /dev/zero) or a folder is never opened."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not stat.S_ISREG(info.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a folder" if stat.S_ISDIR(info.st_mode) else "a device"
        return f"is {kind}, not a file"
    return None


def read_metrics(path: Path, cell_id: str, skipped: list[str] | None = None) -> list[dict[str, Any]]:
    """The valid rows of a metrics.jsonl, in file order. A line that is not a JSON object
    with an integer `step` (the last one cut by a crash, or garbage anywhere) is skipped with
    a warning naming it, and reading goes on: no valid row after it is lost."""
    return [row for _, row in scan_metrics(path, cell_id, skipped)]


def scan_metrics(source: Path | BinaryIO, cell_id: str,
                 skipped: list[str] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(byte offset of its line, row) for each valid row of a metrics.jsonl (a path, or a file
    opened in binary mode, read from its start), in file order, one line in memory at a time
    (read_metrics's rules; the skipped lines are named once the file has been read to its end)."""
    if not isinstance(source, Path):
        yield from _scan_lines(source, cell_id, skipped)
    elif source.is_file():
        with open(source, "rb") as f:
            yield from _scan_lines(f, cell_id, skipped)


def _scan_lines(f: BinaryIO, cell_id: str, skipped: list[str] | None) -> Iterator[tuple[int, dict[str, Any]]]:
    bad, number, offset = [], 0, f.seek(0)
    for line, size in sized_lines(f):  # a line over LINE_BYTES is None, read past in pieces
        number += 1
        row, why = ((None, f"longer than {LINE_BYTES} bytes") if line is None else parse_metrics_line(line)
                    if line.strip() else (None, None))  # a blank line: no row, no loss
        if row is not None:
            yield offset, row
        elif why:
            bad.append((number, why))
        offset += size
    for line, why in bad:
        where = "last line" if line == number else f"line {line}"
        hint = " (cut by a crash, or still being written)" if line == number else "; the rows after it are kept"
        _skip(skipped, f"{cell_id}: skipped {where} of {METRICS}, {why}{hint}", stacklevel=4)


def parse_metrics_line(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(row, None) for a JSON object with an integer `step`, else (None, why)."""
    try:
        row = parse_json(line.decode("utf-8"), top=None, finite=False)
    except ValueError:  # not JSON, not UTF-8, nested thousands deep (bounded_read)
        return None, "not JSON"
    if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
        return row, None
    return None, "not an object with an integer step"


def _skip(skipped: list[str] | None, message: str, stacklevel: int = 3) -> None:
    warnings.warn(message, stacklevel=stacklevel)
    if skipped is not None:
        skipped.append(message)


def _cell_frames(files: RunFiles) -> tuple[dict[str, Any], pd.DataFrame]:
    config, rows = files.config, files.rows
    cell_id = files.cell_id
    summary = files.summary or {}
    variant = config.get("variant") or {}
    model = config.get("model") or {}
    train = config.get("train") or {}
    data = config.get("data") or {}
    record: dict[str, Any] = {
        "cell_id": cell_id,
        "group": files.group,
        "seed": config.get("seed"),
        "status": files.status,
        "variant_id": variant.get("id"),
        **{axis: variant.get(axis, AXIS_VALUE_BEFORE_IT_EXISTED.get(axis)) for axis in VARIANT_AXES},
        "model": model.get("name"),
        "n_layer": model.get("n_layer"),
        "d_model": model.get("d_model"),
        "params": model.get("params"),
        "planned_steps": train.get("steps"),
        "lr": train.get("lr"),
        "warmup": train.get("warmup"),
        "logged_steps": len(rows),
        "last_step": rows[-1]["step"] if rows else None,
        "summary_final_loss": summary.get("final_loss"),
        "summary_final_val_loss": summary.get("final_val_loss"),
        "diverged_at_step": summary.get("diverged_at_step"),
        "steps_trained": summary.get("steps"),
        "wall_time_s": summary.get("wall_time_s"),
        "error": summary.get("error"),
        "missing_steps": summary.get("missing_steps"),  # logged steps whose rows a resume lost
        "grid": config.get("grid"),
        "data_fingerprint": data.get("fingerprint"),
        "unigram_entropy": data.get("unigram_entropy"),
        "kernels": config.get("kernels"),
        "device": config.get("device"),
        **{key: config.get(key) for key in FORM_KEYS},
        "git_commit": config.get("git_commit"),
        "path": str(files.path),
        "_axes": dict(config.get("axes") or {}),
        "_settings": {**{k: train.get(k) for k in setting_keys(config)},
                      "data": (str(data.get("fingerprint") or ""))[:19] or None,  # "sha256:" + 12 hex
                      "dtype": config.get("dtype")},
    }
    steps = pd.DataFrame(rows)
    if not steps.empty:
        # The engine drops metrics past the checkpoint it resumes from; should a reader catch
        # a resume half-way, the later line of a step is the one the run continued from.
        steps = steps.drop_duplicates("step", keep="last")
        steps.insert(0, "cell_id", cell_id)
        steps.insert(1, "group", record["group"])
        steps.insert(2, "seed", record["seed"])
    return record, steps


def _assemble(root, kind, records, step_frames, grid, pending, skipped) -> Runs:
    # Option axes (lr, warmup, model, ...) come from each config's `axes`; the variant axes
    # always become columns (from config.variant) so plots can facet by them.
    axis_names: list[str] = []
    for rec in records:
        for name in rec["_axes"]:
            if name not in axis_names and name not in ("variant",):
                axis_names.append(name)
    setting_names = list(dict.fromkeys(key for rec in records for key in rec["_settings"]))
    for key in setting_names:
        # A run directory written before an option existed does not record it; it trained as
        # that option's default does, so it is compared only on what it records.
        values = {json.dumps(rec["_settings"][key], sort_keys=True) for rec in records if key in rec["_settings"]}
        if len(values) > 1 and key not in axis_names:
            axis_names.append(key)
            for rec in records:
                rec["_axes"].setdefault(key, rec["_settings"].get(key))
    for rec in records:
        rec.pop("_settings")
        axes = rec.pop("_axes")
        for name in axis_names:
            if name in VARIANT_AXES or name == "seed":
                continue  # canonical values come from config.variant / config.seed
            # An option may share its name with a config column (lr, warmup, model): both hold
            # the same resolved value, so keep the config's where this cell's axes lack it.
            if axes.get(name) is not None or name not in rec:
                rec[name] = axes.get(name)

    cells = pd.DataFrame(records)
    if cells.empty:
        cells = pd.DataFrame(columns=["cell_id", "group", "seed", "status", "variant_id", *VARIANT_AXES])
    axis_columns = list(VARIANT_AXES) + [a for a in axis_names if a not in VARIANT_AXES and a != "seed"] + ["seed"]

    frames = [f for f in step_frames if not f.empty]
    if frames:
        steps = pd.concat(frames, ignore_index=True)
    else:
        steps = pd.DataFrame(columns=["cell_id", "group", "seed", "step"])
    # JSON null (a non-finite value) arrives as None; as NaN every numeric column is float. The
    # columns are converted in one frame: replaced one at a time, each became a block of its own,
    # and the next column anything added to a 12-block grid's steps (over a hundred metrics)
    # printed pandas' "DataFrame is highly fragmented" warning on every report.
    steps = pd.DataFrame({c: steps[c] if c in ("cell_id", "group") else pd.to_numeric(steps[c], errors="coerce")
                          for c in steps.columns}, index=steps.index)
    steps = steps.sort_values(["cell_id", "step"], kind="stable").reset_index(drop=True)
    return Runs(Path(root), kind, cells, steps, grid, pending, skipped, axis_columns)

