"""`ablate grid --backend ray --address auto` against a running Ray cluster (`ray start --head`).

Runs when a Ray cluster is up on this machine (`ray start --head --num-cpus 2`, as .ci/run
does); skipped otherwise. The driver is a separate `ablate grid` process, as a user runs it.
"""
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cluster_helpers import (assert_complete, engine_missing, grid_process, killable_grid, logged_steps,
                                           one_ray_at_a_time, run_grid, trained_ids, wait_until, write_grid)

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")

PROBE = "import json, ray; ray.init(address='auto', log_to_driver=False); print(json.dumps(ray.cluster_resources()))"


def _cluster_resources() -> dict | None:
    """The running cluster's resources, or None when no Ray cluster answers."""
    try:
        with one_ray_at_a_time():
            proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return None
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if proc.returncode == 0 and lines else None


RESOURCES = _cluster_resources()
if RESOURCES is None:
    engine_missing("no running Ray cluster (ray.init(address='auto') fails); start one with "
                   "`ray start --head --num-cpus 2`")


@pytest.fixture(autouse=True, scope="module")
def no_other_ray():
    with one_ray_at_a_time():
        yield


def test_a_grid_runs_on_the_running_cluster(tmp_path):
    from ablate.grid.spec import load_grid

    path = write_grid(tmp_path, 'norm = ["pre", "post"]\nseed = [0, 1]\n', steps=12, name="four")
    grid, out = load_grid(path), tmp_path / "out"
    rc, text = run_grid(path, "--out", out, "--backend", "ray", "--address", "auto", "--quiet")
    assert rc == 0, text
    assert "submitted 4 Ray tasks (1 CPU, 0 GPU each)" in text and "Ray (auto)" in text
    assert sorted(trained_ids(text)) == sorted(c.id for c in grid.cells)
    assert_complete(grid, out, 12)


def test_a_killed_ray_worker_is_retried_and_every_step_is_logged_once(tmp_path):
    from ablate.grid.spec import load_grid

    path, steps = killable_grid(tmp_path, "kill")
    grid, out = load_grid(path), tmp_path / "out"
    proc = grid_process(path, "--out", out, "--backend", "ray", "--address", "auto", "--quiet")
    victim = grid.cells[0]
    run_dir = out / victim.id
    wait_until(lambda: logged_steps(run_dir) > steps // 3, 120, f"{victim.id} trains a third of its steps")
    pid = int((run_dir / ".lock").read_text().split()[0])  # the lock holder: the Ray worker training it
    assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::"), "the lock holder is not a Ray worker"
    os.kill(pid, signal.SIGKILL)
    assert not (run_dir / "summary.json").exists()  # killed mid-run
    text = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, text
    # Ray retried the task (no lost-task error, no failed cell) and the retry resumed the cell.
    assert f"error     {victim.id}" not in text and not re.search(r"^\[\d+/\d+\] failed", text, re.M), text
    assert_complete(grid, out, steps)  # the retried task resumed: every step once, none lost
    assert sorted(trained_ids(text)) == sorted(c.id for c in grid.cells)


def test_per_cell_resources_map_onto_rays(tmp_path, capsys):
    from ablate.cli import main

    path = write_grid(tmp_path, "seed = [0]\n", steps=4, name="res")
    cpus = RESOURCES.get("CPU", 0)
    rc, text = run_grid(path, "--out", tmp_path / "two", "--backend", "ray", "--address", "auto",
                        "--cpus-per-cell", f"{cpus:g}", "--quiet")
    assert rc == 0, text
    assert f"submitted 1 Ray tasks ({cpus:g} CPU, 0 GPU each)" in text
    (config,) = (tmp_path / "two").glob("*/config.json")
    assert json.loads(config.read_text())["train"]["threads"] == 1  # the grid's own threads = 1 wins

    gpus = RESOURCES.get("GPU", 0)
    for flags, says in ((["--gpus-per-cell", f"{gpus + 1:g}"], f"--gpus-per-cell {gpus + 1:g} but the Ray cluster has"),
                        (["--cpus-per-cell", f"{cpus + 1:g}"], f"--cpus-per-cell {cpus + 1:g} but the Ray cluster has")):
        assert main(["grid", str(path), "--out", str(tmp_path / "no"), "--backend", "ray", "--address", "auto",
                     *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("ablate grid: error: ") and says in err and "\n" not in err, err
        assert not (tmp_path / "no").exists()
