"""`ablate grid --backend slurm`: the cells as one SLURM job array, through submitit.

Each array task (ablate.backends.slurm_job) calls the same `run_cell` on the shared output
folder and re-derives grid.json; near its time limit it checkpoints and requeues itself, as
often as the cell needs. The grid process only submits and follows:

- Which job trains which cell is kept in `<slurm folder>/jobs.json`. A rerun of the grid
  follows the jobs of that file that SLURM still runs or queues, and submits a new array only
  for the unfinished cells that have none, so `--no-wait` then a rerun, or a rerun after
  Ctrl-C, waits for what is there instead of submitting it twice. Submission is under a
  lock, so two grid processes on one folder never submit one cell twice.
- A cell is done when its summary.json exists. A job that leaves the queue without one
  (cancelled, failed, out of time without a requeue) is reported with its state, and the grid
  exits 1; its checkpoint stays, and a rerun submits the cell again and resumes it.

With `--slurm-cluster local|debug` submitit runs the array as local processes or in-process
(for tests without SLURM); those have no queue to follow, so submitit's own job objects are.
"""
from __future__ import annotations

import errno
import fcntl
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ablate.backends import slurm_tools
from ablate.backends.base import Backend, RunResult, record_payload
from ablate.backends.slurm_job import SlurmCellJob, read_result
from ablate.core import bounded_read
from ablate.core.errors import ConfigError
from ablate.core.rundir import CELL_TRAINED, DONE, SUMMARY, read_json, write_json_atomic
from ablate.engine.cell import Cell, CellResources, finished_status
from ablate.grid.progress import Progress

INSTALL_HINT = "the slurm backend needs submitit, which is not installed; valid: pip install -e .[slurm], or --backend local|ray"
CLUSTERS = ("slurm", "local", "debug")
JOBS_FILE = "jobs.json"

__all__ = ["SlurmBackend", "SlurmCellJob", "import_submitit", "make_executor", "run_slurm", "signal_delay_s"]


class SlurmBackend(Backend):
    """The cells as one SLURM job array (submitit), each task with `cpus_per_cell` CPUs."""

    name = "slurm"

    def check(self) -> None:
        import_submitit()
        if self.options.slurm_cluster == "slurm":  # before anything is written, not at prepare
            check_sbatch()

    def prepare(self, todo: list[Cell]) -> None:
        o = self.options
        gpus_per_job = o.gpus_per_job if o.gpus_per_job is not None else (0 if self.grid.scale == "cpu" else 1)
        self.executor = make_executor(Path(o.slurm_folder or self.out / ".submitit").resolve(), cluster=o.slurm_cluster,
                                      partition=o.partition, time_min=o.time, gpus_per_job=gpus_per_job,
                                      cpus_per_cell=o.cpus_per_cell, name=f"ablate-{self.grid.name}",
                                      array_parallelism=o.array_parallelism)

    def threads_per_cell(self, todo: list[Cell]) -> int | None:
        cpus = self.options.cpus_per_cell
        return max(1, int(cpus)) if cpus else None  # None: the job's allocation decides

    def describe(self, todo, executions) -> str:
        return f"submitit {self.options.slurm_cluster}"

    @property
    def detached(self) -> bool:
        return self.options.no_wait

    def run(self, todo, executions, progress, record, on_change, cell_fn=None) -> RunResult:
        return run_slurm(todo, self.out, retries=self.options.retries, cluster=self.options.slurm_cluster,
                         wait=not self.options.no_wait, progress=progress, record=record, on_change=on_change,
                         executor=self.executor, executions=executions)


def _executions(cells: list[Cell], executions: dict[str, CellResources] | None) -> list[CellResources]:
    return [(executions or {}).get(c.id) or CellResources() for c in cells]


def import_submitit():
    try:
        import submitit  # lazy: an optional package (submitit)
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return submitit


def check_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise ConfigError("--backend slurm: no SLURM here (sbatch not found); valid: run it on a SLURM "
                          "login node, or --backend local|ray")


def signal_delay_s(time_min: int) -> int:
    """How long before the time limit a task stops to finish its step, write a checkpoint and
    requeue (and when SLURM is asked to warn it with USR2). A quarter of the limit, 10 s to
    90 s: submitit's fixed 90 s would land at the start of a 1-minute job."""
    return int(max(10, min(90, time_min * 60 // 4)))


def _sbatch_flags(partition: str | None, time_min: int, gpus_per_job: int, cpus_per_cell: int | None) -> dict:
    flags = {"time": str(int(time_min)), "nodes": "1", "ntasks-per-node": "1"}
    if partition:
        flags["partition"] = partition
    if cpus_per_cell:
        flags["cpus-per-task"] = str(int(cpus_per_cell))
    if gpus_per_job:
        flags["gpus-per-node"] = str(int(gpus_per_job))
    return flags


def make_executor(folder: str | Path, *, cluster: str = "slurm", partition: str | None = None,
                  time_min: int = 60, gpus_per_job: int = 0, cpus_per_cell: int | None = None,
                  name: str = "ablate", array_parallelism: int | None = None):
    """A submitit executor for the array; with cluster "slurm" the request is first checked
    against this cluster (ConfigError naming the flag SLURM refuses, before anything is written)."""
    submitit = import_submitit()
    if cluster not in CLUSTERS:
        raise ConfigError(f"unknown submitit cluster {cluster!r}; valid: {', '.join(CLUSTERS)}")
    if cluster == "slurm":
        check_sbatch()
        shown = " ".join(f"--{k} {v:g}" if isinstance(v, (int, float)) else f"--{k} {v}"
                         for k, v in (("partition", partition), ("time", time_min),
                                      ("cpus-per-cell", cpus_per_cell), ("gpus-per-job", gpus_per_job)) if v)
        slurm_tools.check_request(_sbatch_flags(partition, time_min, gpus_per_job, cpus_per_cell), shown)
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    params: dict[str, Any] = {"timeout_min": int(time_min), "nodes": 1, "tasks_per_node": 1, "name": name}
    if gpus_per_job:
        params["gpus_per_node"] = int(gpus_per_job)  # no --gpus-per-node=0: a GPU-less cluster refuses it
    if cpus_per_cell:
        params["cpus_per_task"] = int(cpus_per_cell)
    if partition:
        params["slurm_partition"] = partition
    if array_parallelism:
        params["slurm_array_parallelism"] = int(array_parallelism)
    if cluster == "slurm":
        params["slurm_signal_delay_s"] = signal_delay_s(time_min)
    executor.update_parameters(**params)
    executor.ablate_margin_s = float(signal_delay_s(time_min))  # when each task stops to requeue
    return executor


# ------------------------------------------------------------------------------ which job has which cell


class _SubmitLock:
    """An exclusive flock on the slurm folder while deciding what to submit. Opened with
    O_NOFOLLOW, as every lock is: a .submit.lock that is a link is refused, never followed
    (O_CREAT through a dangling link would create its target)."""

    def __init__(self, folder: Path):
        self.path = folder / ".submit.lock"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ConfigError(f"{self.path} is a symbolic link (to {os.readlink(self.path)!r}); the submit lock "
                                  "must be a plain file: remove the link") from None
            raise
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def read_jobs(folder: Path) -> dict[str, str]:
    """{cell id: job id} of the jobs submitted for this grid so far."""
    try:
        data = bounded_read.read_json(folder / JOBS_FILE, top=dict, limit=bounded_read.LISTING_BYTES)  # bounded: damaged is none
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _submit(executor, cells: list[Cell], out_root: str, retries: int, record, executions) -> list[str]:
    n = len(cells)
    try:
        job = SlurmCellJob(margin_s=getattr(executor, "ablate_margin_s", 90.0))
        jobs = executor.map_array(job, cells, _executions(cells, executions), [out_root] * n, [retries] * n, [record] * n)
    except Exception as e:  # noqa: BLE001  (sbatch said no after check_request said yes)
        detail = getattr(e, "stderr", None) or getattr(e, "output", None) or str(e)
        if isinstance(detail, bytes):
            detail = detail.decode(errors="replace")
        raise ConfigError(f"sbatch refused the job array: {slurm_tools._sbatch_errors(str(detail))}") from None
    return [j.job_id for j in jobs]


# ------------------------------------------------------------------------------ following


def _ended_payload(folder: Path, job_id: str, state: str | None) -> tuple:
    """The outcome of a job that left the queue before its cell had a summary.json."""
    payload = read_result(folder, job_id)
    if payload is not None:
        return payload
    how = f"ended {state}" if state else "left the queue"
    return ("error", f"job {job_id} {how} without a result (its log: {folder}/{job_id}_0_log.err); "
                     "rerun the grid to resume the cell")


def run_slurm(
    cells: list[Cell],
    out_root: str | Path,
    *,
    retries: int = 1,
    partition: str | None = None,
    time_min: int = 60,
    gpus_per_job: int = 0,
    cpus_per_cell: int | None = None,
    folder: str | Path | None = None,
    cluster: str = "slurm",
    array_parallelism: int | None = None,
    wait: bool = True,
    progress: Progress | None = None,
    record: dict[str, Any] | None = None,
    on_change=None,
    poll_s: float | None = None,
    executor=None,
    executions: dict[str, CellResources] | None = None,
) -> RunResult:
    """Submit `cells` (the unfinished ones) as a job array, except those a job from an earlier
    run still queues or trains, and with `wait` follow them all to the end. `executions`: cell id -> its CellResources
    (a cell without one trains on the CPUs its job was allocated)."""
    out_root = str(Path(out_root).resolve())
    progress = progress or Progress("grid", len(cells), 0, quiet=True)
    on_change = on_change or (lambda idle=False: None)
    name = f"ablate-{record['name']}" if record else "ablate"
    executor = executor or make_executor(Path(folder).resolve() if folder else Path(out_root) / ".submitit",
                                         cluster=cluster, partition=partition, time_min=time_min,
                                         gpus_per_job=gpus_per_job, cpus_per_cell=cpus_per_cell, name=name,
                                         array_parallelism=array_parallelism)
    folder = Path(executor.folder)
    if cluster != "slurm":
        return _run_unqueued(executor, cluster, cells, out_root, retries, wait, progress, record, on_change, poll_s,
                             executions)
    try:
        return _run_queued(executor, folder, cells, out_root, retries, wait, progress, record, on_change, poll_s,
                           executions)
    finally:
        progress.close()


def _run_queued(executor, folder: Path, cells, out_root, retries, wait, progress, record, on_change, poll_s, executions):
    result = RunResult({}, [], [])
    with _SubmitLock(folder):
        jobs = read_jobs(folder)
        states = slurm_tools.job_states()
        if states is None:
            raise ConfigError("--backend slurm: squeue does not answer; valid: a working SLURM (sinfo should list its nodes)")
        follow = {c.id: jobs[c.id] for c in cells if slurm_tools.is_active(states.get(jobs.get(c.id, "")))}
        new = [c for c in cells if c.id not in follow]
        if new:
            ids = _submit(executor, new, out_root, retries, record, executions)
            follow.update(zip((c.id for c in new), ids))
            jobs.update(zip((c.id for c in new), ids))
            write_json_atomic(folder / JOBS_FILE, jobs)
            progress.note(f"submitted {len(new)} slurm array tasks as job {ids[0].split('_')[0]} (logs in {folder})")
        if len(follow) > len(new):
            queued = sorted({follow[c].split("_")[0] for c in follow if c not in {x.id for x in new}})
            progress.note(f"following {len(follow) - len(new)} cells already queued as job {', '.join(queued)}")
    if not wait:
        return result
    by_id = {c.id: c for c in cells}
    t0 = time.time()
    missing_since: dict[str, float] = {}
    poll = poll_s or 2.0
    try:
        while follow:
            states = slurm_tools.job_states()
            for cell_id, job_id in list(follow.items()):
                cell, run_dir = by_id[cell_id], Path(out_root) / cell_id
                state = None if states is None else states.get(job_id)
                if finished_status(run_dir) in DONE:
                    payload = read_result(folder, job_id)
                    if payload is None or payload[0] != "done":
                        payload = ("done", CELL_TRAINED, read_json(run_dir / SUMMARY))
                elif states is None or slurm_tools.is_active(state):
                    # Queued, running or being requeued (a failed summary from an earlier run stays
                    # until the job sets it aside); or squeue did not answer: ask again.
                    continue
                elif state is None and time.time() - missing_since.setdefault(cell_id, time.time()) < 2 * poll:
                    continue  # not listed: make sure it is gone, not a query that raced a requeue
                elif (run_dir / SUMMARY).exists():  # the job ended; its cell failed (run_cell recorded it)
                    payload = ("done", CELL_TRAINED, read_json(run_dir / SUMMARY))
                else:
                    payload = _ended_payload(folder, job_id, state)
                del follow[cell_id]
                record_payload(progress, result, None, cell, payload, time.time() - t0)
                on_change()
            if states is not None:
                progress.set_running(c for c, j in follow.items() if states.get(j) == "RUNNING")
            on_change(idle=True)
            # Quick polls while short cells finish, then SLURM's usual polite rate.
            poll = poll_s if poll_s is not None else (2.0 if time.time() - t0 < 120 else 10.0)
            if follow:
                time.sleep(poll)
    except KeyboardInterrupt:
        array = ", ".join(sorted({j.split("_")[0] for j in follow.values()}))
        progress.write(f"stopped following job {array}; its tasks keep running "
                       f"(scancel {array} stops them; rerun this command to follow them again)")
        result.interrupted = True
        raise
    return result


def _run_unqueued(executor, cluster, cells, out_root, retries, wait, progress, record, on_change, poll_s, executions):
    """submitit's local or debug executor: follow its own job objects."""
    result = RunResult({}, [], [])
    n = len(cells)
    jobs = executor.map_array(SlurmCellJob(), cells, _executions(cells, executions), [out_root] * n, [retries] * n,
                              [record] * n)
    array_id = jobs[0].job_id.split("_")[0] if jobs else "?"
    progress.note(f"submitted {n} {cluster} array tasks as job {array_id} (logs in {executor.folder})")
    if not wait:
        progress.close()
        return result
    t0 = time.time()
    todo = dict(zip((j.job_id for j in jobs), zip(jobs, cells)))
    try:
        while todo:
            for job_id, (job, cell) in list(todo.items()):
                if not job.done():
                    continue
                del todo[job_id]
                try:
                    # The debug executor runs the task in this process and hands its value back
                    # from memory; the others leave the task's JSON result in the folder.
                    payload = job.result() if cluster == "debug" else read_result(executor.folder, job_id)
                    if payload is None:
                        raise RuntimeError("the task wrote no result")
                except Exception as e:  # noqa: BLE001
                    summary_path = Path(out_root) / cell.id / SUMMARY
                    if summary_path.exists():
                        payload = ("done", CELL_TRAINED, read_json(summary_path))
                    else:
                        reason = " ".join(str(e).split())[:160] or type(e).__name__
                        payload = ("error", f"job {job_id} ended without a result ({reason}); rerun to resume")
                record_payload(progress, result, None, cell, payload, time.time() - t0)
                on_change()
            on_change(idle=True)
            if todo:
                time.sleep(0.5 if poll_s is None else poll_s)
    finally:
        progress.close()
    return result
