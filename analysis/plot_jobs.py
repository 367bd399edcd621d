"""Plots drawn side by side: each job (one plot kind: build the figure, write its PNG and SVG)
in a forked child process, as many at once as there are cores.

    run_plot_jobs([job, ...]) -> [what each job returned, with its figure left out]

Drawing is matplotlib's Python code, one core's work per figure (a 42-cell grid's seven report
plots took about 19 s in one process here), and the kinds are independent, so they go to
children forked from this process: a child starts in a millisecond with every frame already
in memory, nothing is pickled on the way in, and only (name, paths, caption) comes back.

Off Linux (fork is missing, or on macOS unsafe once system frameworks are loaded), with one
core, while Ray runs in this process, or when the caller wants the figures (the layout tests
measure them), the jobs run in this process, one after another. A job that fails in a
child is run again here, so its error is raised as it would have been.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
from pathlib import Path
from typing import Callable

from ablate.analysis.plots import Plot
from ablate.core.cores import cpu_count

Job = Callable[[], "Plot | None"]


def run_plot_jobs(jobs: list[Job], processes: int | None = None,
                  costs: list[float] | None = None) -> list[Plot | None]:
    """Run `jobs` (callables returning a Plot or None), `processes` at once (default: the cores
    this process may use); in this process when that is 1 or off Linux. Plots made
    in a child come back with figure None: their files are written, their figures gone.
    `costs` (relative, one per job) starts the costliest first: the longest job then does not
    start last while the other cores idle (longest-processing-time-first scheduling)."""
    processes = min(len(jobs), processes or cpu_count())
    if processes <= 1 or not sys.platform.startswith("linux") or _ray_is_running_here():
        return [job() for job in jobs]
    results: list[Plot | None] = [None] * len(jobs)
    failed: list[int] = []
    running: dict[int, tuple[int, int, bytearray]] = {}  # read end -> (job index, pid, bytes so far)
    queue = start_order(len(jobs), costs)
    sys.stdout.flush()
    sys.stderr.flush()  # a child must not write out again what this process had buffered
    try:
        while queue or running:
            while queue and len(running) < processes:
                index = queue.pop(0)
                read_end, pid = _fork(jobs[index])
                running[read_end] = (index, pid, bytearray())
            _read_ready(running, results, failed)
    except BaseException:
        for read_end, (_, pid, _) in running.items():
            _kill(pid)
            os.close(read_end)
        raise
    for index in failed:  # again here: its exception raised as it would have been
        results[index] = jobs[index]()
    return results


def start_order(n: int, costs: list[float] | None) -> list[int]:
    """The jobs' indices, costliest first (ties and no costs: as given)."""
    if costs is not None and len(costs) != n:
        raise ValueError(f"{len(costs)} costs for {n} plot jobs")
    return sorted(range(n), key=lambda i: -costs[i]) if costs else list(range(n))


def _ray_is_running_here() -> bool:
    """Ray's threads and gRPC channels (a grid run with --backend ray in this process) are not
    made to be forked: then the plots are drawn here."""
    ray = sys.modules.get("ray")
    return bool(ray is not None and getattr(ray, "is_initialized", lambda: False)())


def _fork(job: Job) -> tuple[int, int]:
    """Start `job` in a child; returns (the read end of its pipe, its pid)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run the job, send back what it made, and leave at once
        code = 1
        try:
            os.close(read_end)
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # the parent decides; a Ctrl-C just ends a child
            plot = job()
            record = None if plot is None else {"name": plot.name, "paths": [str(p) for p in plot.paths],
                                                "caption": plot.caption}
            with os.fdopen(write_end, "wb") as f:
                f.write(json.dumps(record).encode())
            code = 0
        finally:
            os._exit(code)  # no atexit, no flush of the parent's buffers, no matplotlib teardown
    os.close(write_end)
    return read_end, pid


def _read_ready(running: dict, results: list, failed: list) -> None:
    """Read what the children have sent; a child whose pipe reached its end has exited (or
    is about to): reap it and record its plot, or the job as failed."""
    ready, _, _ = select.select(list(running), [], [])
    for read_end in ready:
        chunk = os.read(read_end, 1 << 16)
        if chunk:
            running[read_end][2].extend(chunk)
            continue
        index, pid, payload = running.pop(read_end)
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not payload:
            failed.append(index)
            continue
        record = json.loads(payload)
        results[index] = None if record is None else Plot(record["name"], None, [Path(p) for p in record["paths"]],
                                                          record["caption"])


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
