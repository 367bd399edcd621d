"""`ablate grid --backend slurm` against a real SLURM (sbatch, squeue, scancel, time limits).

Runs when a SLURM cluster answers `sinfo` (the one from `scripts/slurm-local.sh start`, found by
its SLURM_CONF, or the machine's own); skipped otherwise. Each grid is tiny; the time-limit test's
cell pauses in every forward, so it outlasts a 1-minute limit however fast this machine is.
"""
import json
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from ablate.backends.slurm_job import read_result
from tests.helpers.cluster_helpers import (TINY_LAYERS, assert_complete, engine_missing, grid_process, killable_grid,
                                           logged_steps, metrics, run_grid, trained_ids, wait_until, without_timing,
                                           write_grid)

pytestmark = pytest.mark.slow

LOCAL_CONF = Path(os.environ.get("ABLATE_SLURM_DIR", "/tmp/ablate-slurm")) / "slurm.conf"


def _slurm_env() -> dict | None:
    """The environment in which sinfo reaches a cluster with an idle or busy node, or None."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return None
    env = dict(os.environ)
    if "SLURM_CONF" not in env and LOCAL_CONF.exists():
        env["SLURM_CONF"] = str(LOCAL_CONF)
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    states = proc.stdout.split()
    return env if proc.returncode == 0 and any(s.rstrip("*") in ("idle", "mixed", "allocated") for s in states) else None


ENV = _slurm_env()
if ENV is None:
    engine_missing("no SLURM cluster answers sinfo here; start a one-node one with `scripts/slurm-local.sh start` "
                   "(as root; it installs slurm-wlm and munge if missing)")
pytest.importorskip("submitit")


def squeue(*args) -> str:
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, env=ENV, timeout=30).stdout


def jobs_of(out: Path) -> dict:
    return json.loads((out / ".submitit" / "jobs.json").read_text())


def job_logs(out: Path, job_id: str) -> str:
    path = out / ".submitit" / f"{job_id}_0_log.out"
    return path.read_text() if path.exists() else ""


def test_four_cells_submitted_as_one_array_left_and_collected_by_a_rerun(tmp_path):
    from ablate.grid.spec import load_grid

    path = write_grid(tmp_path, 'norm = ["pre", "post"]\nseed = [0, 1]\n', steps=12, name="four")
    grid, out = load_grid(path), tmp_path / "out"
    argv = [path, "--out", out, "--backend", "slurm", "--time", "5", "--quiet"]
    rc, text = run_grid(*argv, "--no-wait", env=ENV)
    assert rc == 0, text
    assert "submitted 4 slurm array tasks as job" in text and "not waiting" in text
    jobs = jobs_of(out)
    arrays = {j.split("_")[0] for j in jobs.values()}
    assert sorted(jobs) == sorted(c.id for c in grid.cells) and len(arrays) == 1  # one job array
    (array,) = arrays
    assert sorted(jobs.values()) == sorted(f"{array}_{i}" for i in range(4))

    rc, text = run_grid(*argv, env=ENV)  # collects: follows the queued tasks, submits nothing
    assert rc == 0, text
    assert not re.search(r"submitted \d+ slurm", text)
    assert_complete(grid, out, 12)
    for job_id in jobs.values():  # each task ran once: one start in its log, no requeue
        assert job_logs(out, job_id).count("Starting with JobEnvironment") == 1, job_logs(out, job_id)
        # ...and left its payload as JSON, which the grid process reads instead of submitit's pickle
        assert read_result(out / ".submitit", job_id)[0] == "done"
    rc, text = run_grid(*argv, env=ENV)
    assert rc == 0 and "nothing to run" in text, text


# An activation with a floor on its time: the time-limit test's cell then outlasts the first
# job whatever this machine's speed and load (a cell sized by measured speed alone finished
# inside the first job when the measurement ran under load and the job alone).
PACED_PLUGIN = """
import time
import torch
from ablate.variants import ACTIVATIONS

@ACTIVATIONS.register("gelu_paced_test")
def gelu_paced(x):
    time.sleep({pause_s})
    return torch.nn.functional.gelu(x, approximate="tanh")
"""
PAUSE_S = 0.1  # a call; the tiny grid's TINY_LAYERS blocks call it once each a forward


def test_a_cell_longer_than_its_time_limit_is_requeued_and_resumes_bit_for_bit(tmp_path):
    """--time 1 on a cell that needs more than one job: each job stops before the limit with a
    checkpoint, requeues itself and resumes; the metrics equal an uninterrupted local run's."""
    from ablate.grid.spec import RUN_IMPORTS, load_grid

    batch_size, seq_len = 8, 64
    # At least 48 s of pauses in the training steps' forwards alone: the first job stops 15 s
    # before its 60 s limit, after at most 45 s of training. Evaluation, probes and compute add
    # some 30 s more; a second job (a third on a slow machine) finishes the cell.
    steps = int(48 / (PAUSE_S * TINY_LAYERS))
    (tmp_path / "paced.py").write_text(PACED_PLUGIN.format(pause_s=PAUSE_S))
    path = write_grid(tmp_path, 'seed = [0]\nact = ["gelu_paced_test"]\n', steps=steps, name="limit",
                      batch_size=batch_size, seq_len=seq_len, imports=("paced.py",))
    grid, out, ref = load_grid(path, imports_policy=RUN_IMPORTS), tmp_path / "out", tmp_path / "ref"
    reference = {}
    # The uninterrupted run trains on the other core meanwhile.
    thread = threading.Thread(target=lambda: reference.update(
        zip(("rc", "text"), run_grid(path, "--out", ref, "--workers", "1", "--quiet", "--trust-imports",
                                     timeout=600))))
    thread.start()
    rc, text = run_grid(path, "--out", out, "--backend", "slurm", "--time", "1", "--quiet", "--trust-imports",
                        timeout=600, env=ENV)
    thread.join()
    assert rc == 0, text
    assert reference["rc"] == 0, reference["text"]
    (job_id,) = jobs_of(out).values()
    log = job_logs(out, job_id)
    assert log.count("requeued job") >= 1, log  # the limit really cut the cell
    assert log.count("Starting with JobEnvironment") == log.count("requeued job") + 1, log
    assert_complete(grid, out, steps)
    cell = grid.cells[0]
    assert without_timing(metrics(out / cell.id)) == without_timing(metrics(ref / cell.id))
    mine, theirs = (json.loads((d / cell.id / "summary.json").read_text()) for d in (out, ref))
    assert (mine["final_loss"], mine["final_val_loss"]) == (theirs["final_loss"], theirs["final_val_loss"])


def test_a_cancelled_array_task_is_reported_and_a_rerun_recovers_it(tmp_path):
    from ablate.grid.spec import load_grid

    path, steps = killable_grid(tmp_path, "cancel")
    grid, out = load_grid(path), tmp_path / "out"
    argv = [path, "--out", out, "--backend", "slurm", "--time", "5", "--quiet"]
    proc = grid_process(*argv, env=ENV)
    victim = grid.cells[0]
    wait_until(lambda: logged_steps(out / victim.id) > steps // 3, 120, f"{victim.id} trains a third of its steps")
    job_id = jobs_of(out)[victim.id]
    subprocess.run(["scancel", job_id], check=True, env=ENV, timeout=30)
    text = proc.communicate(timeout=300)[0]
    assert proc.returncode == 1, text  # never success over a cell without a result
    assert f"job {job_id} was stopped" in text or f"job {job_id} ended CANCELLED" in text, text
    assert not (out / victim.id / "summary.json").exists()
    assert trained_ids(text) == [grid.cells[1].id]
    assert json.loads((out / "grid.json").read_text())["counts"] == {"completed": 1, "pending": 1}

    rc, text = run_grid(*argv, env=ENV)
    assert rc == 0, text
    assert "submitted 1 slurm array tasks" in text and trained_ids(text) == [victim.id]
    assert_complete(grid, out, steps)  # nothing lost, nothing logged twice


def test_a_request_slurm_refuses_is_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch):
    from ablate.cli import main

    if "SLURM_CONF" in ENV:
        monkeypatch.setenv("SLURM_CONF", ENV["SLURM_CONF"])

    path = write_grid(tmp_path, "seed = [0]\n", steps=4, name="refused")
    for flags, says in ((["--partition", "no-such-partition"], "SLURM refuses --partition no-such-partition"),
                        (["--cpus-per-cell", "1024"], "SLURM refuses --time 60 --cpus-per-cell 1024"),
                        (["--gpus-per-job", "64"], "SLURM refuses --time 60 --gpus-per-job 64"),
                        (["--time", "1000"], "--time 1000 exceeds the MaxTime of partition")):
        assert main(["grid", str(path), "--out", str(tmp_path / "out"), "--backend", "slurm", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("ablate grid: error: ") and says in err and "\n" not in err, err
        assert not (tmp_path / "out").exists()
