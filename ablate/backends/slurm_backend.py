"""`ablate grid --backend slurm`: the cells as one SLURM job array, through submitit.

Each array task calls the same `run_cell` on the shared output folder and re-derives
grid.json. A task that reaches its time limit is checkpointed by the trainer (SIGTERM) and
requeued by submitit (the job is Checkpointable), so it resumes where it stopped.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from ablate.cell import Cell
from ablate.errors import ConfigError
from ablate.rundir import SUMMARY, read_json
from ablate.scheduler import Progress, RunResult, _call, record_payload, write_grid_json

INSTALL_HINT = "the slurm backend needs submitit, which is not installed; valid: pip install -e .[slurm], or --backend local|ray"
CLUSTERS = ("slurm", "local", "debug")


def import_submitit():
    try:
        import submitit
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return submitit


class SlurmCellJob:
    """What one array task runs. A class with `checkpoint` so submitit requeues it on timeout
    or preemption (run_cell resumes from the trainer's last checkpoint)."""

    def __call__(self, cell: Cell, out_root: str, retries: int, record: dict[str, Any] | None) -> tuple:
        payload = _call(None, cell, out_root, retries)
        if record is not None:
            try:
                write_grid_json(out_root, record)
            except OSError:
                pass
        return payload

    def checkpoint(self, *args: Any, **kwargs: Any):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(SlurmCellJob(), *args, **kwargs)


def make_executor(folder: str | Path, *, cluster: str = "slurm", partition: str | None = None,
                  time_min: int = 60, gpus_per_job: int = 0, cpus_per_cell: int | None = None,
                  name: str = "ablate", array_parallelism: int | None = None):
    submitit = import_submitit()
    if cluster not in CLUSTERS:
        raise ConfigError(f"unknown submitit cluster {cluster!r}; valid: {', '.join(CLUSTERS)}")
    if cluster == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("--backend slurm: no SLURM here (sbatch not found); valid: run it on a SLURM "
                          "login node, or --backend local|ray")
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    params: dict[str, Any] = {"timeout_min": int(time_min), "gpus_per_node": int(gpus_per_job),
                              "nodes": 1, "tasks_per_node": 1, "name": name}
    if cpus_per_cell:
        params["cpus_per_task"] = int(cpus_per_cell)
    if partition:
        params["slurm_partition"] = partition
    if array_parallelism:
        params["slurm_array_parallelism"] = int(array_parallelism)
    executor.update_parameters(**params)
    return executor


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
) -> RunResult:
    """Submit `cells` (the unfinished ones) as a job array and, with `wait`, follow them to
    the end. `cluster` "local" runs the array as local processes (tests), "debug" in-process."""
    out_root = str(Path(out_root).resolve())
    folder = Path(folder).resolve() if folder else Path(out_root) / ".submitit"
    progress = progress or Progress("grid", len(cells), 0, quiet=True)
    on_change = on_change or (lambda idle=False: None)
    result = RunResult({}, [], [])
    name = f"ablate-{record['name']}" if record else "ablate"
    executor = executor or make_executor(folder, cluster=cluster, partition=partition, time_min=time_min,
                             gpus_per_job=gpus_per_job, cpus_per_cell=cpus_per_cell, name=name,
                             array_parallelism=array_parallelism)
    n = len(cells)
    jobs = executor.map_array(SlurmCellJob(), cells, [out_root] * n, [retries] * n, [record] * n)
    array_id = jobs[0].job_id.split("_")[0] if jobs else "?"
    progress.note(f"submitted {n} {cluster} array tasks as job {array_id} (logs in {executor.folder})")
    if not wait:
        progress.close()
        return result
    poll_s = poll_s if poll_s is not None else (10.0 if cluster == "slurm" else 0.5)
    t0 = time.time()
    todo = dict(zip((j.job_id for j in jobs), zip(jobs, cells)))
    try:
        while todo:
            for job_id, (job, cell) in list(todo.items()):
                if not job.done():
                    continue
                del todo[job_id]
                try:
                    payload = job.result()
                except Exception as e:  # noqa: BLE001  (timeout, node failure, cancelled)
                    summary_path = Path(out_root) / cell.id / SUMMARY
                    if summary_path.exists():
                        payload = ("done", "trained", read_json(summary_path))
                    else:
                        reason = " ".join(str(e).split())[:160] or type(e).__name__
                        payload = ("error", f"job {job_id} ended without a result ({reason}); rerun to resume")
                record_payload(progress, result, None, cell, payload, time.time() - t0)
                on_change()
            running = [c.id for j, c in todo.values() if j.state in ("RUNNING", "COMPLETING")]
            progress.set_running(running)
            on_change(idle=True)
            if todo:
                time.sleep(poll_s)
    except KeyboardInterrupt:
        progress.write(f"stopped following job {array_id}; its tasks keep running "
                       f"(scancel {array_id} to stop them; rerun this command to follow them again)")
        result.interrupted = True
        raise
    finally:
        progress.close()
    return result
