"""Run directories -> tidy pandas frames.

Reads only the files the training engine writes (config.json, metrics.jsonl, summary.json,
grid.json; see runs/README.md). It tolerates what a live or crashed grid leaves behind: a
cell without summary.json is reported as `running`, a metrics line cut by a crash is
skipped with a warning, and grid.json cells without a folder yet are listed as pending.
"""
from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

CONFIG, METRICS, SUMMARY, GRID = "config.json", "metrics.jsonl", "summary.json", "grid.json"

# The axes of a block variant (design.md); config.json's `variant` holds one value for each.
VARIANT_AXES = ("norm", "norm_type", "act", "mlp", "residual")
# The default block: the baseline a report compares against when none is named.
DEFAULT_VARIANT_ID = "pre.layernorm.gelu.dense.res"
FINISHED = ("completed", "diverged", "failed")
RUNNING = "running"  # a cell folder without summary.json: training, or interrupted

_SEED_SUFFIX = re.compile(r"__seed=[^_]+$")

# Training options that change a run's numbers (config.json `train`), besides the variant and
# the seed. Cells are compared only at equal values of these: one that varies across the folder
# without being a grid axis (two grids or a stray `ablate train` sharing one --out) becomes an
# option axis, so a baseline is never paired with a cell trained differently. Kernels, device,
# threads, compile and the logging options change rounding or what is logged, not the experiment.
SETTING_KEYS = ("model", "layers", "steps", "lr", "warmup", "schedule", "min_lr_ratio", "batch_size", "seq_len",
                "weight_decay", "beta1", "beta2", "grad_clip", "diverge_factor")


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
    pattern = re.compile(rf"^{re.escape(metric)}/layer_(\d+)$")
    found = [(int(m.group(1)), c) for c in frame.columns if (m := pattern.match(str(c)))]
    return [c for _, c in sorted(found)]


def load_runs(path: str | Path) -> Runs:
    """Read a grid folder (grid.json and/or cell folders with config.json, finished or not)
    or a single run directory (config.json directly inside). Raises RunsError otherwise."""
    root = Path(path)
    if not root.exists():
        raise RunsError(f"{str(path)!r} does not exist; valid: a grid folder or a run directory")
    if not root.is_dir():
        raise RunsError(f"{str(path)!r} is not a folder; valid: a grid folder or a run directory")

    skipped: list[str] = []
    if (root / CONFIG).is_file():
        records, steps = _read_cell(root, skipped)
        return _assemble(root, "run", [records], [steps], None, [], skipped)

    grid = _read_json(root / GRID) if (root / GRID).is_file() else None
    cell_dirs = sorted(p for p in root.iterdir() if p.is_dir() and (p / CONFIG).is_file())
    if grid is None and not cell_dirs:
        raise RunsError(
            f"{str(path)!r} is not a run or grid folder (no config.json, no grid.json, no cell "
            "folders); valid: a grid folder or a run directory"
        )
    listed = [c["id"] for c in (grid or {}).get("cells", [])]
    present = {p.name for p in cell_dirs}
    pending = [cid for cid in listed if cid not in present]
    for p in sorted(p for p in root.iterdir() if p.is_dir() and p.name in listed and not (p / CONFIG).is_file()):
        skipped.append(f"{p.name}: folder has no config.json yet (not started)")

    records, steps = [], []
    for cell_dir in cell_dirs:
        rec, st = _read_cell(cell_dir, skipped)
        records.append(rec)
        steps.append(st)
    return _assemble(root, "grid", records, steps, grid, pending, skipped)


def _read_json(path: Path) -> Any:
    with open(path) as f:
        return json.load(f)


def _read_metrics(path: Path, cell_id: str, skipped: list[str]) -> list[dict[str, Any]]:
    """One dict per readable line. A line that does not parse (a crash mid-write cuts the
    last one) is skipped with a warning: the rest of the run is still worth reporting."""
    if not path.is_file():
        return []
    rows = []
    with open(path) as f:
        lines = f.read().split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError("not an object with a step")
        except ValueError:
            where = "last line" if number >= len(lines) - 1 else f"line {number}"
            message = f"{cell_id}: skipped unreadable {where} of {METRICS} (cut by a crash?)"
            warnings.warn(message, stacklevel=3)
            skipped.append(message)
            continue
        rows.append(row)
    return rows


def _read_cell(cell_dir: Path, skipped: list[str]) -> tuple[dict[str, Any], pd.DataFrame]:
    config = _read_json(cell_dir / CONFIG)
    cell_id = config.get("cell_id") or cell_dir.name
    summary = _read_json(cell_dir / SUMMARY) if (cell_dir / SUMMARY).is_file() else None
    rows = _read_metrics(cell_dir / METRICS, cell_id, skipped)

    variant = config.get("variant") or {}
    model = config.get("model") or {}
    train = config.get("train") or {}
    data = config.get("data") or {}
    summary = summary or {}
    record: dict[str, Any] = {
        "cell_id": cell_id,
        "group": config.get("group") or _SEED_SUFFIX.sub("", cell_id),
        "seed": config.get("seed"),
        "status": summary.get("status", RUNNING),
        "variant_id": variant.get("id"),
        **{axis: variant.get(axis) for axis in VARIANT_AXES},
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
        "grid": config.get("grid"),
        "data_fingerprint": data.get("fingerprint"),
        "unigram_entropy": data.get("unigram_entropy"),
        "kernels": config.get("kernels"),
        "device": config.get("device"),
        "git_commit": config.get("git_commit"),
        "path": str(cell_dir),
        "_axes": dict(config.get("axes") or {}),
        "_settings": {**{k: train.get(k) for k in SETTING_KEYS},
                      "data": (data.get("fingerprint") or "")[:19] or None,  # "sha256:" + 12 hex
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
    for key in [*SETTING_KEYS, "data", "dtype"]:
        values = {json.dumps(rec["_settings"].get(key), sort_keys=True) for rec in records}
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
    # JSON null (a non-finite value) arrives as None; as NaN every numeric column is float.
    for column in steps.columns:
        if column not in ("cell_id", "group"):
            steps[column] = pd.to_numeric(steps[column], errors="coerce")
    steps = steps.sort_values(["cell_id", "step"], kind="stable").reset_index(drop=True)
    return Runs(Path(root), kind, cells, steps, grid, pending, skipped, axis_columns)

