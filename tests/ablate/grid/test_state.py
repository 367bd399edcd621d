"""ablate.grid.state: a grid folder's state read from its run folders alone: each cell's
status (ablate.core.rundir.status), grid.json re-derived from them (an update re-derives only what
changed, and its counts never go back with two grid processes on one folder), and which cells to
dispatch."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ablate.core.errors import ConfigError
from ablate.core.rundir import CONFIG, GRID_JSON, METRICS, SUMMARY, write_json_atomic
from ablate.engine.cell import Cell
from ablate.grid import state as grid_state
from ablate.grid.spec import load_grid
from tests.helpers.repo import REPO

OPTIONS = {"layers": 2, "steps": 3, "probes": False, "eval_batches": 1, "final_eval_batches": 1,
           "batch_size": 2, "seq_len": 16, "device": "cpu"}


def record(ids):
    return {"name": "g", "cells": [{"id": i, "group": i.split("__seed")[0], "options": {}} for i in ids]}


STATES = {"done": "completed", "div": "diverged", "bad": "failed", "damaged": "failed", "partial": "pending",
          "busy": "running", "never": "pending"}


def make_states(root: Path, name=lambda key: key) -> subprocess.Popen:
    """A cell folder in every state of STATES: completed, diverged, failed, damaged, partial
    (interrupted), running (its lock held by another process, returned), never started."""
    for key, summary in (("done", {"status": "completed"}), ("div", {"status": "diverged"}),
                         ("bad", {"status": "failed", "attempts": 1})):
        (root / name(key)).mkdir()
        write_json_atomic(root / name(key) / SUMMARY, summary)
    (root / name("damaged")).mkdir()
    (root / name("damaged") / SUMMARY).write_text('{"stat')
    (root / name("partial")).mkdir()
    (root / name("partial") / METRICS).write_text('{"step": 0, "loss": 4.0}\n')
    holder = subprocess.Popen([sys.executable, "-c",
                               "import time; from ablate.core.rundir import CellLock; "
                               f"assert CellLock({str(root / name('busy'))!r}).acquire(); print('held', flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.fixture
def folder(tmp_path):
    holder = make_states(tmp_path)
    yield tmp_path
    holder.kill()
    holder.wait()


def test_each_cell_status_comes_from_its_run_folder(folder):
    assert {cid: grid_state.cell_status(folder, cid) for cid in STATES} == STATES


def test_grid_json_counts_what_the_folders_say_and_the_incremental_writer_agrees(folder):
    written = grid_state.write_grid_json(folder, record(list(STATES)))
    assert {c["id"]: c["status"] for c in written["cells"]} == STATES
    assert written["counts"] == {"completed": 1, "diverged": 1, "failed": 2, "pending": 2, "running": 1}
    assert json.loads((folder / GRID_JSON).read_text())["counts"] == written["counts"]
    kept = grid_state.GridJson(folder, record(list(STATES)))
    head = kept.write()
    assert head["counts"] == written["counts"] and kept.state()["cells"] == written["cells"]


def test_grid_json_updates_rederive_only_the_cells_that_changed(tmp_path, monkeypatch):
    path = tmp_path / "g.toml"
    path.write_text("[axes]\nseed = %s\n" % list(range(300)))
    grid, out = load_grid(path), tmp_path / "out"
    grid_json = grid_state.GridJson(out, grid.record())
    grid_json.write()
    derived = []
    real = grid_state.cell_status
    monkeypatch.setattr(grid_state, "cell_status", lambda root, cid: derived.append(cid) or real(root, cid))
    done = grid.cells[7].id
    (out / done).mkdir()
    write_json_atomic(out / done / "summary.json", {"status": "completed"})
    grid_json.write({done})
    assert derived == [done]
    state = json.loads((out / "grid.json").read_text())
    assert state["counts"] == {"pending": 299, "completed": 1}
    assert [c["id"] for c in state["cells"]] == [c.id for c in grid.cells]
    assert state["cells"][7] == {"id": done, "group": grid.cells[7].group, "status": "completed",
                                 "options": grid.cells[7].options}
    assert state == {**grid_state.write_grid_json(out, grid.record()), "updated": state["updated"]}


def test_grid_json_counts_never_go_back_with_two_grid_processes_on_one_folder(tmp_path):
    cells = record([f"c{i}" for i in range(3)])
    a, b = grid_state.GridJson(tmp_path, cells), grid_state.GridJson(tmp_path, cells)  # one per grid process
    a.write(), b.write()
    seen = []
    for i, writer in ((0, b), (1, a), (2, b)):  # each process finishes a cell in turn
        (tmp_path / f"c{i}").mkdir()
        (tmp_path / f"c{i}" / "summary.json").write_text(json.dumps({"status": "completed"}))
        writer.write([f"c{i}"])
        seen.append(json.loads((tmp_path / "grid.json").read_text())["counts"].get("completed", 0))
        (a if writer is b else b).write(["c2"])  # the other process reports on a cell of its own
        seen.append(json.loads((tmp_path / "grid.json").read_text())["counts"].get("completed", 0))
    assert seen == sorted(seen) and seen[-1] == 3, seen


def test_finished_cells_are_not_dispatched_and_busy_ones_go_last(tmp_path):
    cells = {key: Cell.from_options({**OPTIONS, "seed": i}) for i, key in enumerate(STATES)}
    holder = make_states(tmp_path, name=lambda key: cells[key].id)
    try:
        finished, to_run = grid_state.order_for_dispatch(list(cells.values()), tmp_path)
    finally:
        holder.kill()
        holder.wait()
    key_of = {cell.id: key for key, cell in cells.items()}
    assert sorted(key_of[c.id] for c in finished) == ["div", "done"]
    assert [key_of[c.id] for c in to_run] == ["bad", "damaged", "partial", "never", "busy"]


def test_a_cell_folder_holding_another_run_is_refused_up_front(tmp_path):
    cell = Cell.from_options(OPTIONS)
    (tmp_path / cell.id).mkdir()
    grid_state.check_existing_runs([cell], tmp_path)  # a folder without config.json passes
    write_json_atomic(tmp_path / cell.id / CONFIG, {"train": {"steps": 300}, "kernels": "torch", "device": "cpu"})
    with pytest.raises(ConfigError) as e:
        grid_state.check_existing_runs([cell], tmp_path)
    assert "steps=300" in str(e.value) and "\n" not in str(e.value)
    grid_state.check_existing_runs([cell], tmp_path / "absent")  # nothing there yet: nothing to refuse


def test_a_rerun_keeps_the_threads_grid_json_recorded(tmp_path):
    assert grid_state.recorded_threads(tmp_path) == {}
    write_json_atomic(tmp_path / GRID_JSON, {"cells": [{"id": "a", "threads": 2}, {"id": "b"}, "junk"]})
    assert grid_state.recorded_threads(tmp_path) == {"a": 2}
    (tmp_path / GRID_JSON).write_text("{")
    assert grid_state.recorded_threads(tmp_path) == {}
