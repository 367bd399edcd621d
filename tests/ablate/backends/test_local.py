"""`--backend local` (ablate/backends/local.py): worker processes with a fake trainer behind the real
run_cell: every cell once, retries, a worker that dies, GPUs per worker, busy cells."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ablate.backends import local
from ablate.cli import build_parser
from ablate.core import cores
from ablate.core.rundir import CellLock, write_json_atomic
from ablate.grid import state as grid_state
from ablate.grid.runner import GridRunOptions, run_checked_grid
from ablate.grid.spec import load_grid
from tests.helpers.fake_trainer import SMALL, attempts, fake_cell, grid_args, write_grid


def test_workers_run_every_cell_once_and_a_rerun_trains_nothing(tmp_path, capsys):
    path = write_grid(tmp_path, SMALL)
    grid, out = load_grid(path), tmp_path / "out"
    assert run_checked_grid(grid, out, grid_args(path, "--workers", "2", "--quiet"), cell_fn=fake_cell) == 0
    text = capsys.readouterr().out
    assert "6 to run on 2 workers" in text and len(re.findall(r"^\[\d/6\] completed ", text, re.M)) == 6
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert dirs == sorted(c.id for c in grid.cells)
    pids = set()
    threads = max(1, cores.cpu_count() // 2)
    for cell in grid.cells:
        runs = attempts(out / cell.id)
        assert len(runs) == 1 and runs[0]["threads"] == threads and runs[0]["gpu"] is None
        pids.add(runs[0]["pid"])
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids  # long-lived workers took all the cells
    state = json.loads((out / "grid.json").read_text())
    assert state["name"] == "small" and state["counts"] == {"completed": 6}
    assert [c["id"] for c in state["cells"]] == [c.id for c in grid.cells]
    assert all(c["status"] == "completed" and c["options"]["seed"] in (0, 1, 2) for c in state["cells"])

    assert run_checked_grid(grid, out, grid_args(path, "--workers", "2"), cell_fn=fake_cell) == 0
    text = capsys.readouterr().out
    assert "6 already finished, nothing to run" in text and "6 completed" in text
    assert all(len(attempts(out / c.id)) == 1 for c in grid.cells)


def test_a_failing_cell_is_retried_then_recorded_while_others_complete(tmp_path, capsys):
    path = write_grid(tmp_path, SMALL + "[[include]]\nmin_lr_ratio = 0.123\nweight_decay = 0.0\n")
    grid, out = load_grid(path), tmp_path / "out"
    bad = next(c for c in grid.cells if c.options.get("min_lr_ratio") == 0.123)
    assert run_checked_grid(grid, out, grid_args(path, "--workers", "2", "--retries", "2", "--quiet"), cell_fn=fake_cell) == 1
    text = capsys.readouterr().out
    assert len(attempts(out / bad.id)) == 3  # 1 + 2 retries, inside run_cell
    summary = json.loads((out / bad.id / "summary.json").read_text())
    assert summary["status"] == "failed" and "injected failure" in summary["error"] and summary["attempts"] == 3
    assert f"failed    {bad.id}  RuntimeError: injected failure (3 attempts)" in text
    state = json.loads((out / "grid.json").read_text())
    assert state["counts"] == {"completed": 6, "failed": 1}
    # A rerun tries the failed cell again (1 + 1 retry), keeps every earlier record, and exits 1 again.
    assert run_checked_grid(grid, out, grid_args(path, "--workers", "1", "--quiet"), cell_fn=fake_cell) == 1
    assert "1 failed before, tried again" in capsys.readouterr().out
    assert len(attempts(out / bad.id)) == 5
    assert sorted(p.name for p in (out / bad.id).glob("error-attempt*")) == [f"error-attempt{i}.txt" for i in range(5)]
    assert json.loads((out / bad.id / "summary.failed-0.json").read_text())["attempts"] == 3
    assert json.loads((out / bad.id / "summary.json").read_text())["attempts"] == 5
    assert all(len(attempts(out / c.id)) == 1 for c in grid.cells if c is not bad)  # completed: never again


def test_a_worker_that_dies_is_replaced_and_its_cell_retried_then_failed(tmp_path, capsys):
    path = write_grid(tmp_path, SMALL + "[[include]]\nbeta1 = 0.123\n")
    grid, out = load_grid(path), tmp_path / "out"
    dying = next(c for c in grid.cells if c.options.get("beta1") == 0.123)
    assert run_checked_grid(grid, out, grid_args(path, "--workers", "2", "--retries", "1", "--quiet"), cell_fn=fake_cell) == 1
    text = capsys.readouterr().out
    assert "worker died (exit code 3)" in text
    assert len(attempts(out / dying.id)) == 2
    summary = json.loads((out / dying.id / "summary.json").read_text())
    assert summary["status"] == "failed" and "worker process died" in summary["error"]
    assert all(json.loads((out / c.id / "summary.json").read_text())["status"] == "completed"
               for c in grid.cells if c is not dying)


def test_each_worker_gets_its_own_gpu_or_shares_one_when_asked(tmp_path):
    path = write_grid(tmp_path, "[base]\nweight_decay = 0.3\n[axes]\nseed = [0, 1, 2, 3]\n")
    grid = load_grid(path)
    for gpus, per_gpu in [(["0", "1"], 1), (["1", "0"], 2)]:
        out = tmp_path / f"out{per_gpu}"
        local.run_local(grid.cells, out, workers=2, gpus=gpus, cells_per_gpu=per_gpu, cell_fn=fake_cell)
        gpu_of = {}
        for cell in grid.cells:
            run = attempts(out / cell.id)[0]
            assert gpu_of.setdefault(run["pid"], run["gpu"]) == run["gpu"]  # a worker keeps its GPU
        if per_gpu == 1:  # one worker per GPU
            assert len(set(gpu_of.values())) == len(gpu_of) and set(gpu_of.values()) <= {"0", "1"}
        else:  # two workers share the first GPU
            assert set(gpu_of.values()) == {"1"}


def test_busy_cells_are_skipped_and_reported(tmp_path, capsys):
    path = write_grid(tmp_path, SMALL)
    grid, out = load_grid(path), tmp_path / "out"
    held = grid.cells[0]
    lock = CellLock(out / held.id)
    assert lock.acquire()  # another process is training this cell
    try:
        assert run_checked_grid(grid, out, grid_args(path, "--workers", "0"), cell_fn=fake_cell) == 0
        text = capsys.readouterr().out
        assert f"busy      {held.id}  running in another process" in text
        assert "1 running elsewhere" in text and "rerun later" in text
        state = json.loads((out / "grid.json").read_text())
        assert state["counts"] == {"completed": 5, "running": 1}
        assert not attempts(out / held.id)
    finally:
        lock.release()
    assert json.loads(json.dumps(grid_state.write_grid_json(out, grid.record())))["counts"]["pending"] == 1


def test_busy_cells_are_reported_as_they_end_and_never_skipped(tmp_path, capsys, monkeypatch):
    path = tmp_path / "g.toml"
    path.write_text("[base]\nsteps = 1\n[axes]\nseed = [0, 1, 2]\n")
    grid, out = load_grid(path), tmp_path / "out"
    calls = []

    def cell_fn(cell, out_root, retries=0, quiet=True, execution=None):
        from ablate.engine.cell import CellOutcome

        calls.append(cell.id)
        run_dir = Path(out_root) / cell.id
        run_dir.mkdir(parents=True, exist_ok=True)
        done = {"status": "completed", "final_loss": 1.0, "final_val_loss": 1.0, "diverged_at_step": None,
                "steps": 1, "wall_time_s": 0.0, "error": None}
        seed = cell.options["seed"]
        if calls.count(cell.id) == 1 and seed in (0, 1):
            if seed == 0:  # its holder finished it while we looked elsewhere
                write_json_atomic(run_dir / "summary.json", done)
            return CellOutcome(cell.id, "busy", None)
        write_json_atomic(run_dir / "summary.json", done)
        return CellOutcome(cell.id, "trained", done)

    args = GridRunOptions.from_args(build_parser().parse_args(["grid", str(path), "--workers", "0", "--quiet"]))
    assert run_checked_grid(grid, out, args, cell_fn=cell_fn) == 0
    text = capsys.readouterr().out
    final = text.strip().splitlines()[-1]
    assert final.startswith("grid g: 3 cells: 3 completed") and "another process" not in final, final
    assert "1 cell another process held and left unfinished: training it here" in text
    assert calls.count(grid.cells[1].id) == 2 and calls.count(grid.cells[0].id) == 1
    assert json.loads((out / "grid.json").read_text())["counts"] == {"completed": 3}
