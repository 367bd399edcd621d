"""A grid folder's state as `ablate status` shows it (local, Ray, SLURM, several machines on
one shared folder), read from grid.json and the run directories alone; standard library only,
since `ablate status` is a light path.

It only reads. A cell is running when another process holds its `.lock`; that is asked with
CellLock.is_held_elsewhere, which tests the lock without taking it (F_OFD_GETLK), so a
trainer locking the cell at that instant never finds it busy, and it sees locks held on other
machines where the shared file system carries them (NFS, Lustre). A running cell's step, loss
and rate come from the last few kilobytes of its metrics.jsonl, never the whole file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ablate.core import rundir
from ablate.core.bounded_read import parse_json
from ablate.core.errors import ConfigError
from ablate.core.rundir import (COMPLETED, CONFIG, DIVERGED, DONE, FAILED, FINISHED, GRID_JSON, INTERRUPTED, LOCK,
                                METRICS, PENDING, RUNNING, json_object, open_regular)
from ablate.core.timefmt import fmt_time

TAIL_BYTES = 16384  # enough for a few metrics rows of a deep model's per-layer keys
MAX_TAIL_BYTES = 1 << 20


def report(root: Path) -> str:
    """The state of the grid folder (or run directory) `root` as `ablate status` prints it."""
    return render(root, *grid_states(root))


@dataclass
class CellState:
    cell_id: str
    status: str  # completed | diverged | failed | running | interrupted | pending
    planned_steps: int | None = None
    step: int | None = None  # the last logged step
    loss: float | None = None
    steps_per_s: float | None = None

    @property
    def steps_left(self) -> int | None:
        if self.planned_steps is None:
            return None
        return max(self.planned_steps - (self.step + 1 if self.step is not None else 0), 0)


def _read_object(path: Path) -> dict | None:
    try:
        return rundir.read_json(path, top=dict)
    except (OSError, ValueError):  # none, or damaged (bounded_read.UnreadableFile)
        return None


def tail_rows(path: Path, size: int = TAIL_BYTES) -> list[dict]:
    """The complete, valid metrics rows in the last `size` bytes of `path` (more if that
    holds fewer than two rows), oldest first."""
    try:
        with open_regular(path) as f:
            end = f.seek(0, os.SEEK_END)
            while True:
                start = max(end - size, 0)
                f.seek(start)
                lines = f.read(end - start).split(b"\n")
                if start > 0:
                    lines = lines[1:]  # the first piece may be the end of a longer line
                # A line cut by a crash or still being written, or garbage, is skipped.
                rows = [r for r in map(_row, lines) if isinstance(r, dict) and isinstance(r.get("step"), int)]
                if len(rows) >= 2 or start == 0 or size >= MAX_TAIL_BYTES:
                    return rows
                size *= 4
    except OSError:
        return []


def _row(line: bytes):
    """One metrics line as JSON, None when it is not (bounded_read: nesting thousands deep too)."""
    try:
        return parse_json(line, top=dict, finite=False)
    except ValueError:
        return None


def rate(rows: list[dict]) -> float | None:
    """Steps per second between the first and last row of the tail (None when its `time_s`
    does not advance, as across a resume that does not count the time before it)."""
    timed = [r for r in rows if isinstance(r.get("time_s"), (int, float))]
    if len(timed) < 2:
        return None
    first, last = timed[0], timed[-1]
    seconds, steps = last["time_s"] - first["time_s"], last["step"] - first["step"]
    return steps / seconds if seconds > 0 and steps > 0 else None


def cell_state(run_dir: Path, cell_id: str, planned: int | None) -> CellState:
    """The cell's status (ablate.core.rundir.status; a pending cell that logged steps is
    interrupted) and, while it is unfinished, how far it got."""
    status = rundir.status(run_dir)
    if status in FINISHED:
        return CellState(cell_id, status, planned)
    steps = json_object((_read_object(run_dir / CONFIG) or {}).get("train")).get("steps")
    planned = steps if isinstance(steps, int) else planned
    if status == PENDING and not (run_dir / METRICS).exists():
        return CellState(cell_id, PENDING, planned)
    rows = tail_rows(run_dir / METRICS)
    last = rows[-1] if rows else {}
    losses = [r["loss"] for r in rows if isinstance(r.get("loss"), (int, float))]
    running = status == RUNNING
    return CellState(cell_id, RUNNING if running else INTERRUPTED, planned, last.get("step"),
                     losses[-1] if losses else None, rate(rows) if running else None)


def grid_states(root: Path) -> tuple[dict | None, list[CellState]]:
    """(grid.json or None, a state per cell: grid.json's cells, then any other cell folder)."""
    if not root.is_dir():
        raise ConfigError(f"{root} is not a folder; valid: a grid folder (grid.json and/or cell folders)")
    if (root / CONFIG).is_file():  # a lone run directory
        return None, [cell_state(root, root.name, None)]
    grid = _read_object(root / GRID_JSON)
    cells = json_object(grid).get("cells")
    listed = [c for c in cells if isinstance(c, dict) and isinstance(c.get("id"), str)] if isinstance(cells, list) else []
    base_steps = json_object(json_object(grid).get("base")).get("steps")
    planned = {c["id"]: json_object(c.get("options")).get("steps", base_steps) for c in listed}
    planned = {cid: steps if isinstance(steps, int) else None for cid, steps in planned.items()}
    others = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in planned
                    and ((p / CONFIG).is_file() or (p / LOCK).exists()))
    if not planned and not others:
        why = f"{GRID_JSON} is unreadable and there are" if (root / GRID_JSON).exists() else f"no {GRID_JSON} and"
        raise ConfigError(f"{root}: {why} no cell folders; valid: a grid folder (grid.json and/or cell folders)")
    ids = list(planned) + others
    return grid, [cell_state(root / cid, cid, planned.get(cid)) for cid in ids]


def render(root: Path, grid: dict | None, cells: list[CellState]) -> str:
    count = {s: sum(c.status == s for c in cells) for s in (*FINISHED, RUNNING, INTERRUPTED, PENDING)}
    done = sum(count[s] for s in DONE)
    name = f" ({grid['name']})" if grid and grid.get("name") else ""
    lines = [f"{root}{name}: {len(cells)} cell{'s' if len(cells) != 1 else ''}: {done} done ({count[COMPLETED]} completed, "
             f"{count[DIVERGED]} diverged), {count[RUNNING]} running, {count[FAILED]} failed, "
             f"{count[PENDING] + count[INTERRUPTED]} pending ({count[INTERRUPTED]} interrupted, resume on rerun)"]
    running = [c for c in cells if c.status == RUNNING]
    if running:
        width = max(len(c.cell_id) for c in running)
        lines.append(f"  {'running cell':<{width}}  {'step':>13}  {'loss':>8}  {'steps/s':>8}  {'left':>8}")
        for c in running:
            step = "—" if c.step is None else f"{c.step + 1}/{c.planned_steps or '?'}"
            loss = "—" if c.loss is None else f"{c.loss:.4f}"
            speed = "—" if c.steps_per_s is None else f"{c.steps_per_s:.2f}"
            left = (fmt_time(c.steps_left / c.steps_per_s) if c.steps_per_s and c.steps_left is not None else "—")
            lines.append(f"  {c.cell_id:<{width}}  {step:>13}  {loss:>8}  {speed:>8}  {left:>8}")
    lines.append(time_left(cells))
    return "\n".join(lines)


def time_left(cells: list[CellState]) -> str:
    """The grid's remaining steps over the running cells' combined rate: as many cells at
    once as now, each as fast as the running ones."""
    todo = [c for c in cells if c.status in (RUNNING, INTERRUPTED, PENDING)]
    if not todo:
        return "time left: none, every cell has finished"
    rates = [c.steps_per_s for c in cells if c.status == RUNNING and c.steps_per_s]
    left = [c.steps_left for c in todo]
    if not any(c.status == RUNNING for c in cells):
        return "time left: unknown, no cell is running (rerun to resume)"
    if not rates:
        return "time left: unknown (no running cell has logged a rate yet)"
    if any(n is None for n in left):
        return "time left: unknown (some cells' planned steps are not recorded)"
    return f"time left: about {fmt_time(sum(left) / sum(rates))} ({sum(left):,} steps at {sum(rates):.2f} steps/s)"
