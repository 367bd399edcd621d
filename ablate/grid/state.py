"""A grid folder's shared state: grid.json and each cell's status, read from disk alone.

Every backend trains a cell with `ablate.engine.cell.run_cell`, which owns the per-cell flock, so
the state of a grid is its run directories: summary.json -> its status; lock held ->
running; else pending. grid.json is never trusted as the truth: it is re-derived from the
run directories under a grid-level flock and written atomically, so every writer (the grid
process, a Ray task, a SLURM job) agrees and none can clobber a run directory.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from ablate.core import rundir
from ablate.core.rundir import (CellLock, DONE, GRID_JSON, GRID_LOCK, file_version, finished_status, read_json,
                                replace_atomic, write_json_atomic)
from ablate.engine.cell import Cell
from ablate.engine.train import check_existing_run


def cell_status(out_root: str | Path, cell_id: str) -> str:
    """The status of cell `cell_id` of the grid folder `out_root` (ablate.core.rundir.status)."""
    return rundir.status(Path(out_root) / cell_id)


def _entry(cell: dict[str, Any], status: str) -> dict[str, Any]:
    """A cell's line in grid.json: its record (Grid.record()'s entry) and its status."""
    return {"id": cell["id"], "group": cell["group"], "status": status, "options": cell["options"],
            **({"threads": cell["threads"]} if "threads" in cell else {})}


class _FileLock:
    """A blocking exclusive flock, for the few milliseconds grid.json takes to write."""
    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class GridJson:
    """grid.json of one grid folder, kept by the process running the grid so that an update
    costs what changed, not the grid's size: `write(changed)` re-derives the status of the
    cells named (the ones this process started or finished) and re-serialises only their
    lines; the file is the cached lines joined. Every FULL_EVERY_S (and on `write()` without
    ids, as at the start and end of a run) all cells are re-derived, so cells that other
    processes train show up too. Same keys and contents as write_grid_json."""

    FULL_EVERY_S = 30.0

    def __init__(self, out_root: str | Path, record: dict[str, Any]):
        self.out_root = Path(out_root)
        self.head = {k: v for k, v in record.items() if k != "cells"}
        self.entries = record["cells"]
        self.index = {c["id"]: i for i, c in enumerate(self.entries)}
        self.status: list[str | None] = [None] * len(self.entries)
        self.lines: list[str] = [""] * len(self.entries)
        self.counts: Counter = Counter()
        self.last_full = float("-inf")
        self.written: tuple | None = None  # grid.json as this process last wrote it (rundir.file_version)

    def _derive(self, i: int) -> None:
        c = self.entries[i]
        status = cell_status(self.out_root, c["id"])
        if status == self.status[i]:
            return
        if self.status[i] is not None:
            self.counts[self.status[i]] -= 1
        self.counts[status] += 1
        self.status[i] = status
        self.lines[i] = "    " + json.dumps(_entry(c, status), allow_nan=False)

    def write(self, changed: Iterable[str] | None = None) -> dict[str, Any]:
        """Update grid.json (all cells when `changed` is None or a full pass is due); returns
        its header with counts (without the cells, which `state()` adds)."""
        self.out_root.mkdir(parents=True, exist_ok=True)
        with _FileLock(self.out_root / GRID_LOCK):
            # Another process (a second grid on this folder) wrote grid.json since we did: our
            # cached statuses of its cells are older than its file, so re-derive them all, or
            # the counts would go backwards.
            full = (changed is None or time.monotonic() - self.last_full > self.FULL_EVERY_S
                    or self._written_elsewhere())
            if full:
                self.last_full = time.monotonic()
            for i in range(len(self.entries)) if full else sorted({self.index[c] for c in changed if c in self.index}):
                self._derive(i)
            head = {**self.head, "counts": {k: v for k, v in self.counts.items() if v},
                    "updated": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")}
            text = json.dumps(head, indent=2, allow_nan=False)
            # The cells last, one per line: a small change rewrites bytes, not Python objects.
            text = text[:-2] + ',\n  "cells": [\n' + ",\n".join(self.lines) + "\n  ]\n}\n"
            # No fsync: grid.json is re-derived from the run directories by any later run.
            replace_atomic(self.out_root / GRID_JSON, lambda f: f.write(text.encode()), fsync=False)
            self.written = file_version(self.out_root / GRID_JSON)
        return head

    def _written_elsewhere(self) -> bool:
        return file_version(self.out_root / GRID_JSON) != self.written

    def state(self) -> dict[str, Any]:
        """What the last write wrote, as write_grid_json returns it."""
        cells = [_entry(c, st) for c, st in zip(self.entries, self.status)]
        return {**self.head, "counts": {k: v for k, v in self.counts.items() if v}, "cells": cells}


def write_grid_json(out_root: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """Re-derive every cell's status from disk and write grid.json atomically (see module doc).
    `record` is Grid.record(): the grid's description plus its cells' ids, groups and options."""
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    with _FileLock(out_root / GRID_LOCK):
        cells = [_entry(c, cell_status(out_root, c["id"])) for c in record["cells"]]
        data = {k: v for k, v in record.items() if k != "cells"}
        data["counts"] = dict(Counter(c["status"] for c in cells))
        data["cells"] = cells
        data["updated"] = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
        write_json_atomic(out_root / GRID_JSON, data)
    return data


def recorded_threads(out_root: str | Path) -> dict[str, int]:
    """cell id -> the torch threads an earlier run of the grid gave it (grid.json), so that a
    rerun trains every cell as the first run would have, however many cells are left."""
    try:
        cells = read_json(Path(out_root) / GRID_JSON).get("cells", [])
        return {c["id"]: int(c["threads"]) for c in cells if isinstance(c, dict) and c.get("threads") is not None}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return {}  # none yet, or a damaged grid.json (rewritten by this run)


def refresh_grid_json(out_root: str | Path, record: dict[str, Any] | None) -> None:
    """What a remote task (Ray, SLURM) does after its cell: rewrite grid.json if it can. The
    driver rewrites it too, so a task's result never depends on this write succeeding."""
    if record is not None:
        try:
            write_grid_json(out_root, record)
        except OSError:
            pass


def check_existing_runs(cells: Iterable[Cell], out_root: str | Path) -> None:
    """Refuse up front (nothing written) when a cell's folder already holds a run of a
    different config, e.g. a rerun with `--set steps=5` into a folder of 300-step runs. The
    same comparison `ablate train` makes (ablate.engine.train.check_existing_run): the variant by its
    id, data by fingerprint, kernels, device and dtype as resolved."""
    try:  # one listing, not a path per cell: a grid of a million seeds is checked in seconds
        present = set(os.listdir(out_root))
    except (FileNotFoundError, NotADirectoryError):
        return
    for cell in cells:
        if cell.id in present:
            check_existing_run(cell, Path(out_root) / cell.id)  # a folder without config.json passes


def order_for_dispatch(cells: list[Cell], out_root: str | Path) -> tuple[list[Cell], list[Cell]]:
    """(finished, to_run): finished cells (completed or diverged) are not dispatched at all; a
    failed cell is tried again; cells another process holds right now go last, so this
    process starts with work nobody else is doing."""
    finished, free, held = [], [], []
    for cell in cells:
        run_dir = Path(out_root) / cell.id
        if finished_status(run_dir) in DONE:
            finished.append(cell)
        elif CellLock(run_dir).is_held_elsewhere():
            held.append(cell)
        else:
            free.append(cell)
    return finished, free + held
