"""`ablate grid --backend ray`: one Ray task per cell, on a running cluster or a local one.

Each task calls the same `run_cell` on the shared output folder (so finished cells are
skipped, running ones are busy, and a lost task's cell resumes on a rerun) and then
re-derives grid.json, exactly as local workers do.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ablate.backends.base import Backend, RunResult, call_cell, record_failed_cell, record_payload
from ablate.core.errors import ConfigError
from ablate.core.rundir import CellLock
from ablate.engine.cell import Cell, CellResources
from ablate.grid.progress import Progress
from ablate.grid.state import refresh_grid_json

class RayBackend(Backend):
    """One Ray task per cell with `cpus_per_cell` CPUs (default 1, also its torch threads)."""

    name = "ray"

    @property
    def cpus(self) -> float:
        return self.options.cpus_per_cell or 1.0

    def check(self) -> None:
        import_ray()

    def prepare(self, todo: list[Cell]) -> None:
        self.session = prepare(self.options.address, self.options.gpus_per_cell, self.cpus)

    def threads_per_cell(self, todo: list[Cell]) -> int:
        return max(1, int(self.cpus))

    def describe(self, todo, executions) -> str:
        return f"Ray ({self.options.address or 'local'})"

    def run(self, todo, executions, progress, record, on_change, cell_fn=None) -> RunResult:
        return run_ray(todo, self.out, retries=self.options.retries, cpus_per_cell=self.cpus, progress=progress,
                       record=record, on_change=on_change, session=self.session, executions=executions)


INSTALL_HINT = "the ray backend needs Ray, which is not installed; valid: pip install -e .[ray], or --backend local|slurm"


def import_ray():
    try:
        import ray  # lazy: an optional package (ray)
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return ray


def ray_cell_task(cell: Cell, execution: CellResources, out_root: str, retries: int, record: dict[str, Any] | None) -> tuple:
    """What one Ray task runs (module level, so workers import it by name)."""
    payload = call_cell(None, cell, out_root, retries, execution)
    refresh_grid_json(out_root, record)
    return payload


def connect(address: str | None, num_cpus: int | None = None) -> tuple[Any, bool]:
    """(ray, started_here). Reuses an initialised Ray (a test's, a notebook's); otherwise
    connects to `address` ("auto" = the running cluster) or starts a local one."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    except ConnectionError as e:
        raise ConfigError(f"--address {address}: cannot connect to a Ray cluster ({' '.join(str(e).split())[:200]}); "
                          "valid: an address from `ray start --head`, auto, or no --address for a local Ray") from None
    return ray, True


def prepare(address: str | None = None, gpus_per_cell: float | None = None,
            cpus_per_cell: float = 1.0) -> tuple[Any, bool, float]:
    """Connect (or start a local Ray) and check the per-cell resources fit the cluster, before
    anything is written. Returns (ray, started_here, gpus_per_cell)."""
    ray, started_here = connect(address)
    try:
        resources = ray.cluster_resources()
        cluster_gpus, cluster_cpus = float(resources.get("GPU", 0)), float(resources.get("CPU", 0))
        if gpus_per_cell is None:
            gpus_per_cell = 1.0 if cluster_gpus > 0 else 0.0
        if gpus_per_cell > cluster_gpus:
            raise ConfigError(f"--gpus-per-cell {gpus_per_cell:g} but the Ray cluster has {cluster_gpus:g} GPUs; "
                              f"valid: 0 to {cluster_gpus:g}")
        if cpus_per_cell > cluster_cpus:
            raise ConfigError(f"--cpus-per-cell {cpus_per_cell:g} but the Ray cluster has {cluster_cpus:g} CPUs; "
                              f"valid: up to {cluster_cpus:g}")
    except BaseException:
        if started_here:
            ray.shutdown()
        raise
    return ray, started_here, gpus_per_cell


def run_ray(
    cells: list[Cell],
    out_root: str | Path,
    *,
    retries: int = 1,
    address: str | None = None,
    gpus_per_cell: float | None = None,
    cpus_per_cell: float = 1.0,
    progress: Progress | None = None,
    record: dict[str, Any] | None = None,
    on_change=None,
    poll_s: float = 1.0,
    session: tuple | None = None,
    executions: dict[str, CellResources] | None = None,
) -> RunResult:
    """Submit each of `cells` (the unfinished ones) as a Ray task and wait for them all.
    `gpus_per_cell` None means 1 when the cluster has GPUs, else 0; a fraction packs small
    cells onto one GPU. `session` is what prepare() returned (else it is called here); a Ray
    started for this grid is shut down at the end."""
    out_root = str(Path(out_root).resolve())
    progress = progress or Progress("grid", len(cells), 0, quiet=True)
    on_change = on_change or (lambda idle=False: None)
    result = RunResult({}, [], [])
    ray, started_here, gpus_per_cell = session or prepare(address, gpus_per_cell, cpus_per_cell)
    refs: dict = {}
    try:
        task = ray.remote(ray_cell_task).options(
            num_cpus=cpus_per_cell, num_gpus=gpus_per_cell, max_retries=retries, name="ablate-cell")
        record_ref = ray.put(record) if record is not None else None
        executions = executions or {}
        refs = {task.remote(cell, executions.get(cell.id) or CellResources(max(1, int(cpus_per_cell))), out_root, retries, record_ref): cell
                for cell in cells}
        progress.note(f"submitted {len(refs)} Ray tasks ({cpus_per_cell:g} CPU, {gpus_per_cell:g} GPU each)")
        started = {ref: time.time() for ref in refs}
        last_poll = 0.0
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=poll_s)
            for ref in ready:
                cell = refs.pop(ref)
                try:
                    payload = ray.get(ref)
                except ray.exceptions.RayError as e:  # the task's worker kept dying (or its message was lost)
                    summary = record_failed_cell(out_root, cell, f"Ray task lost: {type(e).__name__}", retries + 1)
                    payload = ("done", "trained", summary)
                record_payload(progress, result, None, cell, payload, time.time() - started[ref])
                on_change()
            on_change(idle=True)
            if time.time() - last_poll > 2.0:
                last_poll = time.time()
                progress.set_running(c.id for c in refs.values()
                                     if CellLock(Path(out_root) / c.id).is_held_elsewhere())
    except KeyboardInterrupt:
        for ref in list(refs):
            try:
                ray.cancel(ref, force=False)  # SIGINT-like: train checkpoints and stops
            except Exception:  # noqa: BLE001
                pass
        result.interrupted = True
        raise
    finally:
        progress.close()
        if started_here:
            ray.shutdown()
    return result
