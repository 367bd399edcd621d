"""grid.json (ablate.grid.state.GridJson): updates re-derive only what changed, and its counts
never go back with two grid processes on one folder."""
from __future__ import annotations

import json

from ablate.grid import state as grid_state
from ablate.grid.spec import load_grid
from ablate.rundir import write_json_atomic


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
    from ablate.grid.state import GridJson

    record = {"name": "two", "cells": [{"id": f"c{i}", "group": f"c{i}", "options": {}} for i in range(3)]}
    a, b = GridJson(tmp_path, record), GridJson(tmp_path, record)  # one per grid process
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
