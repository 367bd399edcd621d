"""The SLURM backend's parts that need no cluster: SLURM's time formats, the stop margin, and
what one array task does near its time limit, with stand-ins for `squeue` and `scontrol` on
PATH (the real thing is test_slurm_backend.py)."""
import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap

import pytest

from ablate.backends.slurm_backend import _SubmitLock, signal_delay_s
from ablate.backends.slurm_job import parse_seconds, read_result, result_path
from ablate.backends.slurm_tools import _sbatch_errors, is_active, parse_minutes
from ablate.core.errors import ConfigError
from tests.helpers.cluster_helpers import metrics, without_timing, write_grid


def test_slurm_durations_parse_as_sinfo_and_squeue_print_them():
    assert [parse_minutes(t) for t in ("30:00", "1:00:00", "2-00:00:00", "45", "0:30", "infinite", "")] == \
        [30, 60, 2880, 45, 1, None, None]
    assert [parse_seconds(t) for t in ("0:39", "4:05", "1:00:00", "1-00:00:10", "UNLIMITED")] == \
        [39.0, 245.0, 3600.0, 86410.0, None]


def test_the_stop_margin_fits_inside_short_limits():
    assert signal_delay_s(1) == 15  # submitit's fixed 90 s would come before a 60 s job started
    assert signal_delay_s(2) == 30
    assert signal_delay_s(60) == 90


def test_job_states_and_sbatch_errors():
    assert is_active("PENDING") and is_active("RUNNING") and is_active("REQUEUED") and is_active("COMPLETING")
    assert not any(is_active(s) for s in ("COMPLETED", "CANCELLED", "TIMEOUT", "FAILED", None))
    assert _sbatch_errors("sbatch: error: invalid partition specified: gpu\nallocation failure: Invalid partition "
                          "name specified\n") == "invalid partition specified: gpu; Invalid partition name specified"


def test_the_submit_lock_refuses_a_link_and_never_writes_through_it(tmp_path):
    folder, victim = tmp_path / "slurm", tmp_path / "victim.txt"
    folder.mkdir()
    victim.write_text("precious")
    (folder / ".submit.lock").symlink_to(victim)
    with pytest.raises(ConfigError, match="submit.lock is a symbolic link .*victim.txt.*remove the link"):
        with _SubmitLock(folder):
            pass
    assert victim.read_text() == "precious"
    # A dangling link: opening it with O_CREAT would create its target.
    (folder / ".submit.lock").unlink()
    (folder / ".submit.lock").symlink_to(tmp_path / "made-through-the-link")
    with pytest.raises(ConfigError, match="symbolic link"):
        with _SubmitLock(folder):
            pass
    assert not (tmp_path / "made-through-the-link").exists()
    # A plain file (or none) is locked as before.
    (folder / ".submit.lock").unlink()
    with _SubmitLock(folder) as lock:
        assert lock.path.is_file() and not lock.path.is_symlink()

TASK = """
    import pickle, sys
    from ablate.backends.slurm_job import SlurmCellJob
    from ablate.engine.cell import CellResources
    cell, out = pickle.load(open(sys.argv[1], "rb")), sys.argv[2]
    print("RESULT", SlurmCellJob(margin_s=float(sys.argv[3]))(cell, CellResources(), out, 0, None), flush=True)
"""


def fake_slurm(bin_dir, time_left: str):
    """squeue answers `time_left` for %L; scontrol records its arguments, then does what SLURM
    does on a requeue: SIGTERM to the job's processes, the task's and its own."""
    bin_dir.mkdir()
    scontrol = f'echo "$@" >> {bin_dir}/scontrol.calls\nkill -TERM $PPID $$\nsleep 0.2'
    for name, body in (("squeue", f'echo "{time_left}"'), ("scontrol", scontrol)):
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_task(tmp_path, cell, out, margin_s: float, time_left: str):
    bin_dir = tmp_path / f"bin-{time_left.replace(':', '')}"
    fake_slurm(bin_dir, time_left)
    (tmp_path / "cell.pkl").write_bytes(pickle.dumps(cell))
    script = tmp_path / "task.py"
    script.write_text(textwrap.dedent(TASK))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "SLURM_ARRAY_JOB_ID": "76", "SLURM_ARRAY_TASK_ID": "1"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "cell.pkl"), str(out), str(margin_s)],
                          capture_output=True, text=True, env=env, timeout=300)
    calls = (bin_dir / "scontrol.calls").read_text() if (bin_dir / "scontrol.calls").exists() else ""
    return proc, calls


def test_a_requeue_survives_the_sigterm_slurm_sends_the_job_for_it(tmp_path):
    """SLURM signals every process of the job, scontrol too, as it grants the requeue: neither
    may die of it, or a granted requeue reads as a failed one (and the task reports an error)."""
    bin_dir = tmp_path / "bin"
    fake_slurm(bin_dir, "0:04")
    code = "from ablate.backends.slurm_job import requeue; print('PROBLEM', repr(requeue('76_1')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr  # the task itself took the SIGTERM and lived
    assert "PROBLEM None" in proc.stdout, proc.stdout
    assert (bin_dir / "scontrol.calls").read_text().split() == ["requeue", "76_1"]


@pytest.mark.slow
def test_a_task_near_its_time_limit_checkpoints_requeues_itself_and_resumes_bit_for_bit(tmp_path):
    """Time left 0:04 with a 2 s margin: the task stops after ~2 s with a checkpoint, calls
    `scontrol requeue 76_1` and exits without a result. Started again (time left ample), it
    resumes and finishes; the metrics equal an uninterrupted run's."""
    from ablate.engine.cell import run_cell
    from ablate.grid.spec import load_grid

    # Too many steps to finish inside the 2 s before the deadline (a quiet 2-core machine
    # trains 300 of them in about 1 s): the run must stop part-way, not finish first.
    steps = 2000
    grid = load_grid(write_grid(tmp_path, "seed = [0]\n", steps=steps, name="limit", checkpoint_every=100_000))
    cell, out = grid.cells[0], tmp_path / "out"
    proc, calls = run_task(tmp_path, cell, out, margin_s=2.0, time_left="0:04")
    assert proc.returncode == 0, proc.stderr
    assert calls.split() == ["requeue", "76_1"]
    assert "RESULT" not in proc.stdout  # no result: the driver keeps following the requeued task
    assert "time limit near" in proc.stdout and "requeued job 76_1" in proc.stdout
    run_dir = out / cell.id
    assert (run_dir / "checkpoint.pt").exists() and not (run_dir / "summary.json").exists()
    cut = len(metrics(run_dir))
    assert 0 < cut < steps

    proc, calls = run_task(tmp_path, cell, out, margin_s=2.0, time_left="59:00")
    assert proc.returncode == 0 and not calls, proc.stderr
    assert "RESULT ('done', 'trained'" in proc.stdout
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert [r["step"] for r in metrics(run_dir)] == list(range(steps))

    ref = tmp_path / "ref"
    run_cell(cell, ref)
    assert without_timing(metrics(run_dir)) == without_timing(metrics(ref / cell.id))


@pytest.mark.slow
def test_a_task_stopped_without_a_deadline_near_reports_where_it_stopped(tmp_path):
    """SIGTERM well before the deadline (scancel): checkpoint, no requeue, a result saying so."""
    from ablate.grid.spec import load_grid

    grid = load_grid(write_grid(tmp_path, "seed = [0]\n", steps=100_000, name="stop"))
    cell, out = grid.cells[0], tmp_path / "out"
    bin_dir = tmp_path / "bin"
    fake_slurm(bin_dir, "59:00")
    (tmp_path / "cell.pkl").write_bytes(pickle.dumps(cell))
    script = tmp_path / "task.py"
    script.write_text(textwrap.dedent(TASK))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "80"}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "cell.pkl"), str(out), "15"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    metrics_path = out / cell.id / "metrics.jsonl"
    import time

    deadline = time.time() + 120
    while time.time() < deadline and not (metrics_path.exists() and metrics_path.stat().st_size > 0):
        time.sleep(0.2)
    proc.terminate()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    assert "RESULT ('error', 'job 80 was stopped (interrupted by SIGTERM after step" in stdout
    assert not (bin_dir / "scontrol.calls").exists()
    assert (out / cell.id / "checkpoint.pt").exists()


class _Planted:
    def __reduce__(self):
        return (os.system, ("touch planted-by-a-pickle",))


def test_the_grid_process_reads_a_tasks_json_result_and_never_unpickles_submitits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / ".submitit"
    folder.mkdir()
    # What someone with write access to the shared folder could leave as submitit's result file.
    (folder / "7_3_0_result.pkl").write_bytes(pickle.dumps(("success", _Planted())))
    assert read_result(folder, "7_3") is None
    result_path(folder, "7_3").write_text(json.dumps(["done", "trained", {"status": "completed"}]))
    assert read_result(folder, "7_3") == ("done", "trained", {"status": "completed"})
    result_path(folder, "7_4").write_text(json.dumps({"not": "a payload"}))
    assert read_result(folder, "7_4") is None
    assert not (tmp_path / "planted-by-a-pickle").exists()
