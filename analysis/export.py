"""Run directories -> the researcher's dashboard: TensorBoard event files or W&B offline runs.

    export_tensorboard(grid_dir, out) / export_wandb(grid_dir, out) -> Exported

One dashboard run per cell, named `<group>/seed=<n>` so the seeds of a group sit together.
Every metrics.jsonl key is a scalar at its step (per-layer keys keep their names, so
`grad_norm/layer_3/attn` is its own tag; a probe logged every `probe_every` steps has points
only there; a null, i.e. non-finite, value is written as NaN). Exporting again adds only what
is new since the last export, and nothing is ever written into a run directory.

TensorBoard keeps no state besides its event files: each export of a cell writes one more
complete event file whose name says what it holds (`.start` the hyper-parameters,
`.steps-A-B` the scalars of steps A..B, `.end-<hash>` the summary), so what was exported is
read back from the names alone, and a crash between writing a file and remembering it cannot
duplicate or lose steps. The files are written with TensorBoard's own record writer and
appear by an atomic rename, complete, under names that sort in the order they were written
(TensorBoard reads a run's files in name order). The hyper-parameter experiment (the HParams
tab's columns) and the Custom Scalars layout (a chart per per-layer metric, a line per layer)
are one `.experiment-<hash>` file at the top, replaced when they change.

W&B: see export_wandb (a changed cell is written again whole; `wandb sync` cannot append).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import itertools
import json
import math
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from ablate.analysis.load import RunFiles, VARIANT_AXES, read_run_files, scan_runs, setting_keys
from ablate.analysis.metrics_index import MetricsIndex
from ablate.core.bounded_read import read_json
from ablate.core.rundir import COMPLETED, METRICS, RESULT_KEYS, SUMMARY
from ablate.core.safe_files import create_temporary, output_folder, replace_atomic

SUMMARY_FIELDS = RESULT_KEYS  # summary.json's numbers (ablate/core/rundir.py)
# What the hyper-parameter table shows beside the axes (the last value of each in a run).
HPARAM_METRICS = ("summary/final_loss", "summary/final_val_loss", "loss", "val_loss")
LAYER_KEY = re.compile(r"^(?P<metric>.+)/layer_\d+(?P<part>/[^/]+)?$")
PART = re.compile(r"^events\.out\.tfevents\.(?P<seq>\d{6})\.ablate(?P<start>\.start)?"
                  r"(?:\.steps-(?P<first>\d+)-(?P<last>\d+))?(?:\.end-(?P<end>[0-9a-f]{12}))?"
                  r"(?:\.experiment-(?P<experiment>[0-9a-f]{12}))?$")


class ExportError(ValueError):
    """Bad input or a missing extra: one line saying what is valid."""


@dataclass
class Exported:
    out: Path
    updated: list[str] = field(default_factory=list)  # dashboard runs that got something new
    unchanged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # damaged cells and lines, one line each


def _require(target: str, module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ExportError(f"--to {target} needs the {target} package, which is not installed; "
                          f"valid: pip install -e '.[{target}]'") from None


def read_cells(root: str | Path, out: Path) -> tuple[Iterator[tuple[RunFiles, MetricsIndex]], list[str]]:
    """Every readable run directory under `root` as (its config and summary, an index of its
    metrics: analysis/metrics_index.py), read one at a time as the caller goes, so neither a
    big grid nor a big run has to fit in memory; and the list of what was skipped, which fills
    as they are read. Refuses an `out` inside a run directory before anything is read. The
    caller closes each index."""
    scan = scan_runs(root)
    resolved = out.resolve()
    for cell_dir in scan.cell_dirs:
        if resolved == cell_dir.resolve() or cell_dir.resolve() in resolved.parents:
            raise ExportError(f"--out {out} is inside the run directory {cell_dir}; valid: a folder outside "
                              "every run directory (nothing is ever written into one)")
    cells = ((files, MetricsIndex.open(d / METRICS, files.cell_id, scan.skipped)) for d in scan.cell_dirs
             if (files := read_run_files(d, scan.skipped, rows=False)) is not None)
    return cells, scan.skipped


# File systems allow 255 bytes a name: a longer one is cut, with a hash of the whole to keep it unique.
MAX_COMPONENT_BYTES = 200


def path_component(text: str) -> str:
    """A name read from a run folder (data) as one safe path component: no separator, no NUL,
    never "", "." or "..", so that joining it to --out can neither climb out nor restart at /;
    one over MAX_COMPONENT_BYTES is cut and ends in `~` and 12 hex digits of its SHA-256."""
    text = re.sub(r"[/\\\x00]", "_", text)
    text = text if text.strip(".") else text.replace(".", "_") or "_"
    if len(text.encode()) > MAX_COMPONENT_BYTES:
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        text = text.encode()[:MAX_COMPONENT_BYTES - 13].decode(errors="ignore") + "~" + digest
    return text


def run_name(files: RunFiles) -> str:
    return f"{path_component(files.group)}/seed={path_component(str(files.config.get('seed')))}"


def _say(result: Exported, line: str) -> None:
    """A warning the command prints, one line (as for the damaged cells it skipped)."""
    warnings.warn(line, stacklevel=2)
    result.skipped.append(line)


def inside(out: Path, name: str) -> Path:
    """`out / name`, refused (ExportError) should it resolve anywhere but below `out`."""
    path = out / name
    if out.resolve() not in path.resolve().parents:
        raise ExportError(f"run name {name!r} would be written outside --out {out}")
    return path


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row's values as floats (null = non-finite -> NaN); `step` is the x axis."""
    out = {}
    for key, value in row.items():
        if key == "step":
            continue
        if value is None:
            out[key] = math.nan
        elif isinstance(value, (bool, int, float)):
            out[key] = float(value) if not isinstance(value, int) or abs(value) < 2**1023 else math.nan
    return out


def summary_scalars(summary: dict[str, Any]) -> dict[str, float]:
    return {f"summary/{k}": float(summary[k]) for k in SUMMARY_FIELDS
            if isinstance(summary.get(k), (int, float)) and not isinstance(summary.get(k), bool)}


def hparams(files: RunFiles) -> dict[str, Any]:
    """The cell's config as flat hyper-parameters: what the dashboard filters and groups by
    (variant axes, model, seed, and the training options that define the run). A null value
    is left out: the run simply has no value for it."""
    config = files.config
    variant, model, train = (config.get(k) or {} for k in ("variant", "model", "train"))
    values: dict[str, Any] = {"group": files.group, "variant": variant.get("id"), "seed": config.get("seed"),
                              "grid": config.get("grid"), "model": model.get("name"), "n_layer": model.get("n_layer")}
    values.update({axis: variant.get(axis) for axis in VARIANT_AXES})
    for key in setting_keys(config):
        values.setdefault(key, train.get(key))
    values.update({k: v for k, v in (config.get("axes") or {}).items() if k not in values})
    out = {}
    for key, value in values.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, (bool, int, float, str)) else json.dumps(value, sort_keys=True)
    return out


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------ TensorBoard

@dataclass
class TensorBoardRun:
    """What the event files of one dashboard run already hold, read from their names."""

    started: bool = False
    last_step: int = -1
    end: str | None = None  # the digest of the summary last written
    next_seq: int = 0

    @classmethod
    def read(cls, run_dir: Path) -> "TensorBoardRun":
        state = cls()
        for path in sorted(run_dir.glob("events.out.tfevents.*")) if run_dir.is_dir() else []:
            m = PART.match(path.name)
            if not m:
                continue
            state.next_seq = max(state.next_seq, int(m["seq"]) + 1)
            state.started |= bool(m["start"])
            if m["last"] is not None:
                state.last_step = max(state.last_step, int(m["last"]))
            if m["end"]:
                state.end = m["end"]
        return state


def export_tensorboard(root: str | Path, out: str | Path, own_folder: bool = False) -> Exported:
    """Write (or bring up to date) a TensorBoard log directory `out` for the runs under `root`.
    own_folder: `out` is the export's own (the default DIR/tensorboard), so a link planted
    there is replaced by a folder (output_folder), never written through; an --out the user
    names is theirs, link or not."""
    _require("tensorboard", "tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2  # lazy: an optional package (tensorboard)
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp

    out = Path(out)
    cells, skipped = read_cells(root, out)
    result = Exported(out, skipped=skipped)
    if own_folder:
        output_folder(out)

    def scalar_event(step: int, wall_time: float, values: dict[str, float]):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        return event_pb2.Event(step=step, wall_time=wall_time, summary=summary)

    def session_end(status: str, wall_time: float):
        info = plugin_data_pb2.SessionEndInfo(
            status=api_pb2.STATUS_SUCCESS if status == COMPLETED else api_pb2.STATUS_FAILURE, end_time_secs=wall_time)
        summary = summary_pb2.Summary()
        summary.value.add(tag=metadata.SESSION_END_INFO_TAG, tensor=metadata.NULL_TENSOR,
                          metadata=metadata.create_summary_metadata(plugin_data_pb2.HParamsPluginData(session_end_info=info)))
        return event_pb2.Event(wall_time=wall_time, summary=summary)

    all_hparams, families = {}, set()
    for files, metrics in cells:
        with metrics:
            name = run_name(files)
            if len(files.group.encode()) > MAX_COMPONENT_BYTES:
                _say(result, f"{files.cell_id}: its group is {len(files.group)} characters, longer than a folder "
                             f"name may be; its TensorBoard run is {name}")
            all_hparams[name] = values = hparams(files)
            families |= layer_families(metrics.keys)
            run_dir = inside(out, name)
            state = TensorBoardRun.read(run_dir)
            # Steps are placed in time from when the run began (config.json is written first).
            began = (files.path / "config.json").stat().st_mtime
            head, tokens, tail = [], [], []
            if not state.started:
                head.append(event_pb2.Event(wall_time=began, summary=hp.hparams_pb(values, trial_id=files.group,
                                                                                  start_time_secs=began)))
                tokens.append("start")
            new_steps = metrics.steps_after(state.last_step)
            if len(new_steps):
                tokens.append(f"steps-{new_steps[0]}-{new_steps[-1]}")
            if files.summary is not None and _digest(files.summary) != state.end:
                ended = (files.path / SUMMARY).stat().st_mtime
                tail.append(scalar_event(metrics.last_step or 0, ended, summary_scalars(files.summary)))
                tail.append(session_end(files.status, ended))
                tokens.append(f"end-{_digest(files.summary)}")
            if not tokens:
                result.unchanged.append(name)
                continue
            steps = (scalar_event(row["step"], began + float(row.get("time_s") or 0.0), scalars(row))
                     for row in metrics.rows_after(state.last_step))
            _write_event_file(run_dir, state.next_seq, tokens, itertools.chain(head, steps, tail), event_pb2)
            result.updated.append(name)

    _write_experiment(out, all_hparams, sorted(families), hp, event_pb2)
    return result


def _write_event_file(run_dir: Path, seq: int, tokens: list[str], events: Iterable, event_pb2) -> Path:
    """One complete event file (its events written as they come), written with TensorBoard's record writer under a name without
    `tfevents` (which TensorBoard would read half-written), then renamed into place."""
    from tensorboard.summary.writer.record_writer import RecordWriter  # lazy: an optional package (tensorboard)

    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / ".".join([f"events.out.tfevents.{seq:06d}.ablate", *tokens])
    fd, tmp = create_temporary(run_dir / f"part-{seq:06d}")  # a fresh file, never a planted link
    try:
        with os.fdopen(fd, "wb") as f:
            writer = RecordWriter(f)
            header = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
            for event in itertools.chain([header], events):
                writer.write(event.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def layer_families(keys: Iterable[str]) -> set[tuple[str, str]]:
    """(metric, part) of every per-layer key: `grad_norm/layer_3/attn` -> ("grad_norm", "/attn")."""
    return {(m["metric"], m["part"] or "") for key in keys if (m := LAYER_KEY.match(key))}


def _custom_scalars(families: list[tuple[str, str]], summary_pb2):
    """A Custom Scalars tab chart per per-layer metric, every layer one line in it: where a
    layer departs from the others shows at a glance."""
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata  # lazy: an optional package (tensorboard)
    from tensorboard.util import tensor_util

    charts = [layout_pb2.Chart(title=f"{metric}{part} by layer", multiline=layout_pb2.MultilineChartContent(
        tag=[rf"^{re.escape(metric)}/layer_\d+{re.escape(part)}$"])) for metric, part in families]
    layout = layout_pb2.Layout(category=[layout_pb2.Category(title="per layer", chart=charts)])
    summary = summary_pb2.Summary()
    summary.value.add(tag=metadata.CONFIG_SUMMARY_TAG, metadata=metadata.create_summary_metadata(),
                      tensor=tensor_util.make_tensor_proto(layout.SerializeToString()))
    return summary


def _write_experiment(out: Path, all_hparams: dict[str, dict[str, Any]], families: list[tuple[str, str]],
                      hp, event_pb2) -> None:
    """The hyper-parameter experiment (every hparam with the values seen, the metrics columns)
    and the per-layer chart layout, at the top of `out`; rewritten only when they changed,
    replacing the previous file."""
    from tensorboard.compat.proto import summary_pb2  # lazy: an optional package (tensorboard)

    if not all_hparams:
        return
    seen: dict[str, list] = {}
    for values in all_hparams.values():
        for key, value in values.items():
            if value not in seen.setdefault(key, []):
                seen[key].append(value)
    infos = []
    for key, values in seen.items():
        kinds = {bool if isinstance(v, bool) else float if isinstance(v, (int, float)) else str for v in values}
        # A discrete domain lists the values to filter by; it needs one type (ints as floats).
        kind = kinds.pop() if len(kinds) == 1 else None
        domain = hp.Discrete(sorted(kind(v) for v in values)) if kind else None
        infos.append(hp.HParam(key, domain))
    digest = _digest({"hparams": seen, "metrics": HPARAM_METRICS, "layers": families})
    previous = [p for p in out.glob("events.out.tfevents.*") if (m := PART.match(p.name)) and m["experiment"]]
    if any(PART.match(p.name)["experiment"] == digest for p in previous):
        return
    seq = max((int(PART.match(p.name)["seq"]) + 1 for p in previous), default=0)
    now = time.time()
    experiment = hp.hparams_config_pb(infos, [hp.Metric(tag) for tag in HPARAM_METRICS], time_created_secs=now)
    events = [event_pb2.Event(wall_time=now, summary=experiment)]
    if families:
        events.append(event_pb2.Event(wall_time=now, summary=_custom_scalars(families, summary_pb2)))
    _write_event_file(out, seq, [f"experiment-{digest}"], events, event_pb2)
    for path in previous:  # TensorBoard keeps the first experiment it reads: leave only the new one
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------------------ W&B

WANDB_STATE = "ablate-export"  # in wandb's own folder: {run id}.json per exported cell


def wandb_run_id(files: RunFiles) -> str:
    """Stable across exports (a re-export is the same run), unique per grid and cell."""
    return hashlib.sha256(f"{files.config.get('grid')}/{files.cell_id}".encode()).hexdigest()[:16]


def export_wandb(root: str | Path, out: str | Path, project: str | None = None) -> Exported:
    """Write W&B offline runs under `out/wandb/` (upload later with `wandb sync`). A cell
    unchanged since the last export is not touched. One that gained steps or finished is
    written again whole, as a new offline folder of the same run id that replaces the old one:
    `wandb sync` cannot join two offline folders into one run (the later replaces the earlier),
    so each folder must hold the whole run."""
    wandb = _require("wandb", "wandb")
    out = Path(out)
    cells, skipped = read_cells(root, out)
    result = Exported(out, skipped=skipped)
    state_dir = out / "wandb" / WANDB_STATE
    states = []
    output_folder(out / "wandb")  # a planted link replaced; an unwritable --out fails here, not in /tmp/wandb
    with _wandb_dirs_inside(out / "wandb"):
        try:
            for files, metrics in cells:
                with metrics:
                    states.append(_export_wandb_cell(wandb, files, metrics, out, project, state_dir, result))
        finally:
            if any(states):
                wandb.teardown()  # wait for wandb's service to write every record to disk
    # Only once the new folders are complete on disk: remember them and drop the ones they
    # replace (a crash before this leaves both, and the next export writes the cell again).
    for state_path, state in filter(None, states):
        for old in (out / "wandb").glob(f"offline-run-*-{state['run_id']}"):
            if old.name != state["folder"]:
                shutil.rmtree(old)
        output_folder(state_dir)
        text = json.dumps(state)
        replace_atomic(state_path, lambda f: f.write(text.encode()))
    return result


# Where wandb writes besides its runs (settings, caches, its service's debug log, artifacts,
# temporaries): by default under HOME and /tmp; an export writes inside --out only.
WANDB_DIRS = {"WANDB_DIR": "", "WANDB_CONFIG_DIR": ".config", "WANDB_CACHE_DIR": ".cache",
              "WANDB_DATA_DIR": ".data", "WANDB_ARTIFACT_DIR": ".artifacts", "TMPDIR": ".tmp",
              "XDG_CACHE_HOME": ".cache", "XDG_CONFIG_HOME": ".config"}


@contextlib.contextmanager
def _wandb_dirs_inside(folder: Path):
    """Point every directory wandb (and the service it starts) writes in below `folder`, and
    put the environment back afterwards."""
    saved = {k: os.environ.get(k) for k in WANDB_DIRS}
    try:
        for key, sub in WANDB_DIRS.items():
            path = folder / sub if sub else folder.parent
            path.mkdir(parents=True, exist_ok=True)
            os.environ[key] = str(path.resolve())
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _export_wandb_cell(wandb, files: RunFiles, metrics: MetricsIndex, out: Path, project: str | None,
                       state_dir: Path, result: Exported) -> tuple[Path, dict] | None:
    """Log one cell as an offline run unless it is unchanged; returns its new export state."""
    name, run_id = run_name(files), wandb_run_id(files)
    state_path = state_dir / f"{run_id}.json"
    try:  # export's own record: a damaged one (bounded_read) is exported again
        state = read_json(state_path)
    except (OSError, ValueError):
        state = {}
    steps = metrics.steps_after(-1)
    last = int(steps[-1]) if len(steps) else -1
    summary_digest = _digest(files.summary) if files.summary is not None else None
    if (state.get("last_step"), state.get("summary")) == (last, summary_digest):
        result.unchanged.append(name)
        return None
    axes = {k: v for k, v in (files.config.get("axes") or {}).items() if k != "seed"}
    run = wandb.init(
        mode="offline", dir=str(out), project=project or str(files.config.get("grid") or "ablate"),
        id=run_id, name=name, group=files.group[:128],
        job_type=str((files.config.get("variant") or {}).get("id") or "train")[:64],
        tags=[f"{k}={v}"[:64] for k, v in axes.items()], config=files.config,
        settings=wandb.Settings(silent=True, console="off", save_code=False, x_disable_stats=True),
    )
    try:
        folder = Path(run.dir).parent.name  # offline-run-<time>-<id>
        for row in metrics.rows_after(-1):
            run.log(scalars(row), step=row["step"])
        if files.summary is not None:
            run.summary.update({**summary_scalars(files.summary), "status": files.status})
    finally:
        run.finish()
    result.updated.append(name)
    return state_path, {"cell_id": files.cell_id, "run_id": run_id, "folder": folder, "last_step": last,
                        "summary": summary_digest}
