"""ablate status: counts, running cells' progress and time left, read-only."""
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

from ablate.cli import main
from ablate.core.rundir import CellLock
from ablate.grid.status import grid_states, tail_rows
from tests.helpers.repo import REPO
from tests.helpers.synthetic_runs import write_grid, write_run

V = "pre.layernorm.gelu.dense.res"


def half_finished_grid(root: Path):
    """2 completed, 1 diverged, 1 failed, 1 running (its lock held), 1 interrupted (a folder
    with metrics, nobody holding it), 2 pending (in grid.json only). Planned: 100 steps each."""
    done = [write_run(root, V, s, [4.0, 3.5, 3.0], planned_steps=100) for s in (0, 1)]
    diverged = write_run(root, V, 2, [4.0, 9.0], planned_steps=100)
    failed = write_run(root, V, 3, [4.0], status="failed", planned_steps=100)
    running = write_run(root, V, 4, [4.0, 3.8, 3.6, 3.5, 3.4], status="running", planned_steps=100)
    interrupted = write_run(root, V, 5, [4.0, 3.9], status="running", planned_steps=100)
    write_grid(root, [*done, diverged, failed, running, interrupted], pending=[f"{V}__seed=6", f"{V}__seed=7"],
               base={"model": "tiny", "steps": 100})
    return running, interrupted


def snapshot(folder: Path):
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_status_of_a_half_finished_grid_counts_every_state_and_reads_the_running_cell(tmp_path, capsys):
    running, interrupted = half_finished_grid(tmp_path)
    lock = CellLock(running.path)
    assert lock.acquire()  # a trainer (an OFD lock: another holder even in this process)
    try:
        before = snapshot(tmp_path)
        _, cells = grid_states(tmp_path)
        assert main(["status", str(tmp_path)]) == 0
        assert snapshot(tmp_path) == before  # read-only
    finally:
        lock.release()
    states = {c.cell_id: c for c in cells}
    assert sorted(c.status for c in cells) == ["completed", "completed", "diverged", "failed", "interrupted",
                                               "pending", "pending", "running"]
    live = states[running.cell_id]
    assert (live.step, live.loss, live.planned_steps) == (4, 3.4, 100)
    assert abs(live.steps_per_s - 10.0) < 1e-9  # synthetic time_s: 0.1 s per step
    assert states[interrupted.cell_id].step == 1

    out = capsys.readouterr().out
    assert "8 cells: 3 done (2 completed, 1 diverged), 1 running, 1 failed, 3 pending (1 interrupted" in out
    assert f"{running.cell_id}          5/100    3.4000     10.00" in out
    # left: running 95 + interrupted 98 + pending 2 x 100 = 393 steps at 10 steps/s
    assert "time left: about 39s (393 steps at 10.00 steps/s)" in out


def test_a_status_check_takes_no_lock_a_trainer_could_find_busy(tmp_path, monkeypatch):
    running, _ = half_finished_grid(tmp_path)
    holder = CellLock(running.path)
    assert holder.acquire()
    taken = []
    real_fcntl = fcntl.fcntl
    setters = {fcntl.F_SETLK, fcntl.F_SETLKW, fcntl.F_OFD_SETLK, fcntl.F_OFD_SETLKW}

    def watched_fcntl(fd, cmd, arg=0):
        if cmd in setters:
            taken.append(cmd)
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(fcntl, "fcntl", watched_fcntl)
    monkeypatch.setattr(fcntl, "flock", lambda fd, op: taken.append(op))
    monkeypatch.setattr(fcntl, "lockf", lambda fd, op, *a: taken.append(op))
    try:
        _, cells = grid_states(tmp_path)
    finally:
        holder.release()
    assert taken == [] and sum(c.status == "running" for c in cells) == 1


def test_the_tail_is_read_without_the_whole_file_and_skips_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "loss": 1.0, "time_s": i * 0.5, "pad": "x" * 200} for i in range(2000)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2000, "lo')
    tail = tail_rows(path)
    assert 2 <= len(tail) < 200 and [r["step"] for r in tail] == list(range(2000 - len(tail), 2000))


def test_status_refuses_a_folder_that_is_no_grid(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ablate", "status", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "valid:" in result.stderr
    assert "Traceback" not in result.stderr


def test_watch_refreshes_until_interrupted(tmp_path, monkeypatch, capsys):
    import ablate.commands.status as status

    half_finished_grid(tmp_path)
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt  # Ctrl-C during the second wait

    monkeypatch.setattr(status.time, "sleep", sleep)
    assert main(["status", str(tmp_path), "--watch", "--interval", "0.5"]) == 0
    assert sleeps == [0.5, 0.5] and capsys.readouterr().out.count("8 cells:") == 2
    assert main(["status", str(tmp_path), "--interval", "0"]) == 2


def run_cli(*args, cwd=None, env=None, timeout=60):
    """`python -m ablate ...` in a child process (a hang is a failure, not a stuck suite)."""
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, args)], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True)


def test_status_returns_when_a_cells_metrics_is_a_fifo(tmp_path):
    running = write_run(tmp_path, V, 0, [4.0, 3.8], status="running", planned_steps=10)
    write_grid(tmp_path, [running], base={"model": "tiny", "steps": 10})
    (running.path / "metrics.jsonl").unlink()
    os.mkfifo(running.path / "metrics.jsonl")  # nobody ever writes it: opening it to read would block
    os.unlink(running.path / "config.json")
    os.mkfifo(running.path / "config.json")
    result = run_cli("status", tmp_path, timeout=20)
    assert result.returncode == 0, result.stderr
    assert "1 cell: " in result.stdout and "interrupted" in result.stdout


def test_an_interval_past_a_day_is_refused_before_any_refresh(tmp_path):
    """inf, 1e10 or 400 digits overflowed time.sleep after the first refresh (OverflowError)."""
    half_finished_grid(tmp_path)
    for interval in ("inf", "1e10", "9" * 400):
        result = run_cli("status", tmp_path, "--watch", "--interval", interval, timeout=30)
        assert result.returncode == 2 and "valid:" in result.stderr and "Traceback" not in result.stderr
        assert result.stdout == ""  # refused as the arguments are parsed, before a refresh
