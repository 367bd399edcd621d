"""What one SLURM array task runs: train its cell, and requeue itself when the time limit nears.

`margin_s` before the time limit (read from squeue when the task starts, and again when SLURM's
`--signal=USR2@<delay>` warning arrives) the trainer gets SIGTERM: the current step finishes, a
checkpoint is written, `ablate.engine.train.Interrupted` ends the run, and the task requeues itself
(`scontrol requeue`) and exits without a result, so the same task starts again and resumes bit
for bit from the checkpoint. That repeats however often the cell needs; each requeue has
trained at least one step (the trainer checkpoints only after a step). submitit's own USR2
handler, which this replaces, interrupts Python mid-step, counts every warning as a timeout
and gives up after three.

SIGTERM before the deadline (`scancel`, a preemption) also checkpoints and stops, but the task
does not requeue: its result says where it stopped, and a rerun of the grid resumes it.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from ablate.backends.base import PAYLOAD_KINDS, call_cell
from ablate.backends.slurm_tools import parse_seconds
from ablate.core.cores import cpu_count
from ablate.core.rundir import SUMMARY, read_json, write_json_atomic
from ablate.engine.cell import Cell, CellResources
from ablate.grid.state import refresh_grid_json


def slurm_job_id() -> str | None:
    """This task's job id as scontrol and squeue name it ('123_4' in an array), or None."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def allocated_cpus() -> int:
    """The CPUs SLURM gave this task (its torch threads): --cpus-per-task if it was asked for,
    else the job's CPUs on this node; never more than this process may run on."""
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_JOB_CPUS_PER_NODE"):
        digits = re.match(r"\d+", os.environ.get(name, ""))  # "2" or "2(x3)" (per node, 3 nodes)
        if digits and int(digits.group()) > 0:
            return min(int(digits.group()), cpu_count())
    return cpu_count()


class _TimeLimitWatch:
    """Stop the run `margin_s` before the time limit: from then on, send ourselves SIGTERM once
    a second until the task ends. The trainer takes the first SIGTERM that arrives while it
    trains (outside training SIGTERM is ignored here), so a deadline reached during startup
    still stops the run after its first step.

    The deadline is read from squeue at the start and again on USR2. USR2 alone is not enough:
    SLURM may send it up to a minute before the time it was asked for (sbatch --signal), which
    for a short limit would stop every job after a fraction of its time."""

    def __init__(self, job_id: str | None, margin_s: float):
        self.job_id, self.margin_s = job_id, margin_s
        self.warned = threading.Event()
        self._timer: threading.Timer | None = None

    def install(self) -> None:
        self._previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR2)}
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # replaces submitit's (it only logs)
        signal.signal(signal.SIGUSR2, lambda signum, frame: self._schedule(from_signal=True))
        self._schedule(from_signal=False)

    def uninstall(self) -> None:
        """Put back what was there (submitit's debug executor runs tasks in the grid process)."""
        if self._timer is not None:
            self._timer.cancel()
        for s, handler in getattr(self, "_previous", {}).items():
            signal.signal(s, handler)

    def _schedule(self, from_signal: bool) -> None:
        left = time_left_s(self.job_id) if self.job_id else None
        if left is None:
            if from_signal:
                self._stop()  # no deadline to wait for: the warning is all we know
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(max(0.0, left - self.margin_s), self._stop)
        self._timer.daemon = True
        self._timer.start()

    def _stop(self) -> None:
        if not self.warned.is_set():
            self.warned.set()
            threading.Thread(target=self._nudge, daemon=True, name="ablate-time-limit").start()

    def _nudge(self) -> None:
        while True:
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait(1.0)


def time_left_s(job_id: str) -> float | None:
    """Seconds until this job's time limit (squeue's %L), or None if unknown or unlimited."""
    try:
        proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.split()
    return parse_seconds(lines[0]) if proc.returncode == 0 and lines else None


def requeue(job_id: str) -> str | None:
    """Put this task back in the queue; None on success, else scontrol's complaint.

    SLURM answers the request by sending SIGTERM to every process of the job, scontrol among
    them, often before it has exited: it would die with the request granted and this task would
    report a failed requeue of a job that is in fact queued again. So SIGTERM is ignored from
    here on, here and (the disposition is inherited across exec) in scontrol. The task is on its
    way out; SLURM's SIGKILL after KillWait still ends it if it hangs. Main thread only."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        proc = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if proc.returncode == 0:
        return None
    return " ".join((proc.stderr or proc.stdout).split())[:200] or f"scontrol exited {proc.returncode}"


class SlurmCellJob:
    """The callable submitit pickles for each array task. `margin_s`: how long before the time
    limit to stop (enough for a step, a checkpoint and the requeue)."""

    def __init__(self, margin_s: float = 90.0):
        self.margin_s = margin_s

    def __call__(self, cell: Cell, execution: CellResources, out_root: str, retries: int,
                 record: dict[str, Any] | None) -> tuple:
        job_id = slurm_job_id()
        watch = _TimeLimitWatch(job_id, self.margin_s)
        try:
            watch.install()
        except ValueError:  # not the main thread: no signals
            pass
        if job_id and execution.threads is None:
            execution = CellResources(allocated_cpus())  # yields to a resumed run's recorded count
        try:
            payload = call_cell(None, cell, out_root, retries, execution)
        finally:
            if not watch.warned.is_set():  # once warned, SIGTERM keeps coming until we exit
                watch.uninstall()
        finished = (Path(out_root) / cell.id / SUMMARY).exists()
        if payload[0] == "interrupted" and watch.warned.is_set() and not finished and job_id:
            problem = requeue(job_id)
            if problem is None:
                restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
                print(f"ablate: {cell.id}: time limit near, {payload[1].split(';')[0]}; requeued job {job_id} "
                      f"(requeue {restarts + 1})", flush=True)
                # No result file: the driver keeps following the job, which starts again.
                os._exit(0)
            payload = ("error", f"job {job_id} reached its time limit ({payload[1].split(';')[0]}) and could "
                                f"not be requeued ({problem}); rerun the grid to resume")
        elif payload[0] == "interrupted":
            payload = ("error", f"job {job_id or '?'} was stopped ({payload[1].split(';')[0]}); "
                                "rerun the grid to resume")
        refresh_grid_json(out_root, record)
        _write_result(payload)
        return payload


RESULT_SUFFIX = "_ablate_result.json"


def result_path(folder: str | Path, job_id: str) -> Path:
    """Where an array task leaves its payload for the grid process: plain JSON beside submitit's
    logs, so the grid process never unpickles a file of the shared folder."""
    return Path(folder) / f"{job_id}{RESULT_SUFFIX}"


def _write_result(payload: tuple) -> None:
    try:
        import submitit  # lazy: an optional package (submitit)

        env = submitit.JobEnvironment()
        folder, job_id = env.paths.folder, env.job_id
    except Exception:  # noqa: BLE001  (not inside a submitit job: a direct call, a test)
        return
    try:
        write_json_atomic(result_path(folder, job_id), list(payload))
    except (OSError, ValueError, TypeError):
        pass  # the summary.json on disk still tells the grid process what happened


def read_result(folder: str | Path, job_id: str) -> tuple | None:
    """What the task returned, from the JSON file it writes beside submitit's logs (result_path),
    or None if it wrote none or something else. submitit's own result pickle is never read:
    unpickling a file in a shared folder would run whatever code someone put there."""
    try:
        value = read_json(result_path(folder, job_id))
    except (OSError, ValueError):
        return None
    if isinstance(value, list) and value and value[0] in PAYLOAD_KINDS:
        return tuple(value)
    return None
