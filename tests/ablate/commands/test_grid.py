"""`ablate grid` end to end with the real trainer on tiny cells: a full grid, reruns,
kill -9 and resume, two grid processes on one folder, a failing cell, Ray and submitit."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ablate.cli import main
from ablate.core.rundir import CellLock
from ablate.grid.spec import load_grid
from tests.helpers.cluster_helpers import one_ray_at_a_time
from tests.helpers.live_files import complete_rows

pytestmark = pytest.mark.slow

# Tiny, fast cells: a 2-block model, short sequences, few eval batches, one thread.
TINY = """
    [base]
    model = "tiny"
    layers = 2
    batch_size = 4
    seq_len = 32
    eval_batches = 2
    eval_every = 2
    checkpoint_every = 2
    threads = 1
    steps = {steps}
"""


def write_grid(tmp_path, axes, steps=4, name="g", extra=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n' + textwrap.dedent(TINY.format(steps=steps)) + "[axes]\n"
                    + textwrap.dedent(axes) + textwrap.dedent(extra))
    return path


def metrics_steps(run_dir):
    # Polled while a grid runs: its last line may be half-written.
    return [row["step"] for row in complete_rows(run_dir / "metrics.jsonl")]


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def assert_complete(grid, out, steps):
    """Every cell finished once: summary completed, metrics steps 0..steps-1 exactly once."""
    for cell in grid.cells:
        run_dir = out / cell.id
        assert summary(run_dir)["status"] == "completed", cell.id
        assert metrics_steps(run_dir) == list(range(steps)), cell.id
        assert not list(run_dir.glob("error-attempt*"))
    assert sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")) == \
        sorted(c.id for c in grid.cells)
    state = json.loads((out / "grid.json").read_text())
    assert state["counts"] == {"completed": len(grid.cells)}


def trained_ids(text):
    """Cell ids this process trained to the end (not skipped, not busy)."""
    return re.findall(r"^\[\d+/\d+\] completed (\S+)  final loss", text, re.M)


def cli(*argv, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "ablate", "grid", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


@pytest.mark.slow
def test_a_small_grid_runs_once_per_distinct_cell_and_a_rerun_trains_nothing(tmp_path, capsys):
    path = write_grid(tmp_path, """
        norm = ["pre", "post"]
        act = ["gelu", "relu"]
        mlp = ["dense", "swiglu"]
    """)
    grid, out = load_grid(path), tmp_path / "out"
    assert len(grid.cells) == 6  # 8 crossings, the relu x swiglu ones collapse
    assert main(["grid", str(path), "--out", str(out), "--workers", "2", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert sorted(trained_ids(text)) == sorted(c.id for c in grid.cells)
    assert_complete(grid, out, 4)
    config = json.loads((out / grid.cells[1].id / "config.json").read_text())
    assert config["grid"] == "g" and config["axes"] == {"norm": "pre", "act": None, "mlp": "swiglu", "seed": 0}
    assert config["train"]["threads"] == 1 and config["variant"]["act"] is None
    mtimes = {c.id: (out / c.id / "summary.json").stat().st_mtime_ns for c in grid.cells}

    assert main(["grid", str(path), "--out", str(out), "--workers", "2"]) == 0
    text = capsys.readouterr().out
    assert "6 already finished, nothing to run" in text and trained_ids(text) == []
    assert mtimes == {c.id: (out / c.id / "summary.json").stat().st_mtime_ns for c in grid.cells}


@pytest.mark.slow
def test_kill_9_mid_grid_then_rerun_loses_and_duplicates_nothing(tmp_path):
    steps = 60  # long enough that the kill lands mid-grid even on a fast machine (it lands at step ~4)
    path = write_grid(tmp_path, "seed = [0, 1, 2]\n", steps=steps)
    grid, out = load_grid(path), tmp_path / "out"
    proc = cli(path, "--out", out, "--workers", "2", "--quiet")
    deadline = time.time() + 90
    logged = 0
    while time.time() < deadline and logged < 10:
        time.sleep(0.2)
        logged = sum(len(metrics_steps(out / c.id)) for c in grid.cells if (out / c.id / "metrics.jsonl").exists())
    assert logged >= 10, proc.communicate()[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not any((out / c.id / "summary.json").exists() and summary(out / c.id)["status"] != "completed"
                   for c in grid.cells)
    # The workers die with the grid process: within seconds no cell lock is held.
    deadline = time.time() + 10
    while time.time() < deadline and any(CellLock(out / c.id).is_held_elsewhere() for c in grid.cells):
        time.sleep(0.1)
    assert not any(CellLock(out / c.id).is_held_elsewhere() for c in grid.cells)
    unfinished = [c for c in grid.cells if not (out / c.id / "summary.json").exists()]
    assert unfinished  # the kill really interrupted the grid

    rerun = cli(path, "--out", out, "--workers", "2", "--quiet")
    text = rerun.communicate(timeout=180)[0]
    assert rerun.returncode == 0, text
    assert sorted(trained_ids(text)) == sorted(c.id for c in unfinished)
    assert_complete(grid, out, steps)


@pytest.mark.slow
def test_two_grid_processes_on_one_folder_split_the_work(tmp_path):
    path = write_grid(tmp_path, "seed = [0, 1, 2, 3, 4, 5]\n", steps=30)
    grid, out = load_grid(path), tmp_path / "out"
    out.mkdir()
    a = cli(path, "--out", out, "--workers", "1", "--quiet")
    b = cli(path, "--out", out, "--workers", "1", "--quiet")
    text_a, text_b = a.communicate(timeout=240)[0], b.communicate(timeout=240)[0]
    assert a.returncode == 0 and b.returncode == 0, text_a + text_b
    trained_a, trained_b = trained_ids(text_a), trained_ids(text_b)
    assert sorted(trained_a + trained_b) == sorted(c.id for c in grid.cells)  # each cell trained once
    assert trained_a and trained_b, (text_a, text_b)  # and both processes did some of it
    assert_complete(grid, out, 30)


@pytest.mark.slow
def test_a_failing_cell_is_retried_then_recorded_and_the_grid_exits_1(tmp_path, capsys, monkeypatch):
    import ablate.engine.train

    real = ablate.engine.train.train

    def flaky(cell, run_dir, quiet=True, plan=None):
        if cell.options["seed"] == 1:
            raise RuntimeError("injected failure")
        return real(cell, run_dir, quiet, plan)

    monkeypatch.setattr(ablate.engine.train, "train", flaky)
    path = write_grid(tmp_path, "seed = [0, 1, 2]\n")
    grid, out = load_grid(path), tmp_path / "out"
    assert main(["grid", str(path), "--out", str(out), "--workers", "0", "--retries", "1"]) == 1
    text = capsys.readouterr().out
    bad = out / "pre.layernorm.gelu.dense.res__seed=1"
    assert sorted(p.name for p in bad.glob("error-attempt*")) == ["error-attempt0.txt", "error-attempt1.txt"]
    assert summary(bad) == {**summary(bad), "status": "failed", "attempts": 2,
                            "error": "RuntimeError: injected failure"}
    assert "failed    pre.layernorm.gelu.dense.res__seed=1  RuntimeError: injected failure (2 attempts)" in text
    for seed in (0, 2):
        assert summary(out / f"pre.layernorm.gelu.dense.res__seed={seed}")["status"] == "completed"
    assert json.loads((out / "grid.json").read_text())["counts"] == {"completed": 2, "failed": 1}
    assert re.search(r"grid g: 3 cells: 2 completed, 1 failed", text)


def test_a_diverged_cell_is_a_result_not_a_failure(tmp_path, capsys):
    path = write_grid(tmp_path, "lr = [1e-3, 50.0]\n", steps=6)
    out = tmp_path / "out"
    assert main(["grid", str(path), "--out", str(out), "--workers", "0", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "diverged" in text
    assert json.loads((out / "grid.json").read_text())["counts"] == {"completed": 1, "diverged": 1}


def test_ray_backend_runs_a_two_cell_grid_on_a_local_ray(tmp_path, capsys):
    ray = pytest.importorskip("ray")
    path = write_grid(tmp_path, 'norm = ["pre", "post"]\n')
    grid, out = load_grid(path), tmp_path / "out"
    with one_ray_at_a_time():  # a cluster test's address="auto" must not find this Ray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            assert main(["grid", str(path), "--out", str(out), "--backend", "ray", "--quiet"]) == 0
        finally:
            ray.shutdown()
    text = capsys.readouterr().out
    assert "submitted 2 Ray tasks (1 CPU, 0 GPU each)" in text
    assert sorted(trained_ids(text)) == sorted(c.id for c in grid.cells)
    assert_complete(grid, out, 4)


def test_slurm_backend_runs_a_job_array_through_submitits_local_executor(tmp_path, capsys):
    pytest.importorskip("submitit")
    path = write_grid(tmp_path, 'norm = ["pre", "post"]\n')
    grid, out = load_grid(path), tmp_path / "out"
    argv = ["grid", str(path), "--out", str(out), "--backend", "slurm", "--slurm-cluster", "local",
            "--time", "5", "--quiet"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "submitted 2 local array tasks" in text
    assert sorted(trained_ids(text)) == sorted(c.id for c in grid.cells)
    assert_complete(grid, out, 4)
    assert list((out / ".submitit").glob("*_result.pkl"))  # the array tasks really ran through submitit
    assert main(argv) == 0  # a rerun submits nothing
    assert "nothing to run" in capsys.readouterr().out


def test_slurm_backend_without_slurm_is_refused(tmp_path, capsys, monkeypatch):
    pytest.importorskip("submitit")
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    path = write_grid(tmp_path, 'norm = ["pre"]\n')
    assert main(["grid", str(path), "--out", str(tmp_path / "out"), "--backend", "slurm"]) == 2
    assert "sbatch not found" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
