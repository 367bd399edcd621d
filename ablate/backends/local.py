"""`--backend local`: a grid's cells in long-lived worker processes on this machine.

Workers are spawned processes (torch imported once, then one cell at a time over the
worker's own pipe; no queue lock is shared, so a worker that dies mid-message cannot stall
the others). Each asks the kernel to SIGKILL it when the grid process dies
(PR_SET_PDEATHSIG), so an orphan never keeps training or holds a cell lock after `kill -9`
of the grid. A worker that dies under a cell is replaced and the cell retried `retries`
times, then recorded failed. With workers = 0 the cells train in this process.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import multiprocessing as mp
import os
import signal
import sys
import time
from collections import Counter, deque
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Iterable

from ablate.backends.base import Backend, CellFn, RunResult, call_cell, record_failed_cell, record_payload
from ablate.core.cores import cpu_count
from ablate.core.rundir import PENDING, SUMMARY, read_json
from ablate.engine.cell import Cell, CellResources
from ablate.engine.data import load_data
from ablate.engine.train import pick_device
from ablate.grid.progress import Progress
from ablate.grid.state import cell_status
from ablate.kernels import get_backend


class LocalBackend(Backend):
    """Cells in `workers` processes here (default: one per visible GPU x cells_per_gpu when a
    cell wants a GPU, else 1), each worker with its share of the CPU threads."""

    name = "local"

    def check(self) -> None:
        check_local_devices(self.grid)
        preload_data(self.grid)

    def prepare(self, todo: list[Cell]) -> None:
        o = self.options
        wants_gpu = any(c.setting.device != "cpu" for c in todo)
        self.gpus = visible_gpus() if wants_gpu and todo else []
        self.workers = o.workers if o.workers is not None else (len(self.gpus) * o.cells_per_gpu if self.gpus else 1)

    def threads_per_cell(self, todo: list[Cell]) -> int:
        return max(1, cpu_count() // max(min(self.workers, len(todo)), 1))

    def slots(self, todo: list[Cell]) -> int:
        return min(self.workers, len(todo))

    def describe(self, todo: list[Cell], executions: dict[str, CellResources]) -> str:
        n = self.slots(todo)
        where = f"{n} worker{'s' if n != 1 else ''}" if self.workers else "this process"
        per_cell = sorted({executions[c.id].threads_for(c) or 1 for c in todo})
        if self.gpus:
            return where + f" on GPUs {','.join(self.gpus)}"
        if len(per_cell) == 1:
            return where + f", {per_cell[0]} thread{'s' if per_cell[0] != 1 else ''} each"
        return where + (f", {'/'.join(map(str, per_cell))} threads as recorded per cell" if per_cell else "")

    def run(self, todo, executions, progress, record, on_change, cell_fn=None) -> RunResult:
        o = self.options

        def train(cells: list[Cell], progress: Progress) -> RunResult:
            return run_local(cells, self.out, workers=self.workers, retries=o.retries, progress=progress,
                             on_change=on_change, cell_fn=cell_fn, gpus=self.gpus, cells_per_gpu=o.cells_per_gpu,
                             executions=executions)

        result = train(todo, progress)
        # A cell that was busy (another process held it) and is now free but unfinished (that
        # process stopped) is trained here: this grid never ends with a cell nobody trains.
        for _ in range(3):
            again = [c for c in todo if result.outcomes.get(c.id) == "busy"
                     and cell_status(self.out, c.id) == PENDING]
            if not again:
                break
            progress.write(f"grid {self.grid.name}: {len(again)} cell{'s' if len(again) != 1 else ''} another "
                           f"process held and left unfinished: training {'them' if len(again) != 1 else 'it'} here")
            more = train(again, Progress(self.grid.name, len(again), min(self.workers, len(again)), quiet=o.quiet))
            result.outcomes.update(more.outcomes)
            result.refused += more.refused
            result.errors += more.errors
        return result


def preload_data(grid) -> None:
    """Tokenise each distinct corpus once, here, before any worker starts (BPE is trained
    once, not by every worker), and refuse bad data before anything is written."""
    seen = set()
    for cfg in grid.configs.distinct():
        key = (cfg.data, cfg.size.tokenizer, cfg.size.vocab_size)
        if key not in seen:
            seen.add(key)
            load_data(*key)


def check_local_devices(grid) -> None:
    """With local workers, a device or kernel backend this machine lacks is an input error for
    the whole grid (exit 2, nothing written), not a refusal per cell. (Ray and SLURM cells run
    elsewhere, so their machines decide.)"""
    seen = set()
    for cfg in grid.configs.distinct():
        key = (cfg.device, cfg.kernels)
        if key in seen:
            continue
        seen.add(key)
        device = pick_device(cfg)
        if cfg.kernels in ("cpu", "triton", "cuda"):  # `auto` always resolves to something that runs
            get_backend(cfg.kernels, str(device))  # as the cell's own plan_run will


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (even by kill -9)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except OSError:
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker(slot: int, parent_pid: int, gpu: str | None, conn, cell_fn, out_root: str, retries: int) -> None:
    """A long-lived worker: import torch once, then train the cells the grid process sends
    over `conn` (its own pipe: no lock shared with other workers, so one dying mid-message
    cannot block the rest) until it sends None."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the grid process decides; it sends SIGTERM
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        import ablate.engine.train  # noqa: F401  (torch and the trainer once, not per cell)
    except ImportError:
        pass
    try:
        conn.send(("ready", os.getpid()))
        while True:
            item = conn.recv()
            if item is None:
                break
            cell, execution = item
            conn.send(("start", cell.id))
            payload = call_cell(cell_fn, cell, out_root, retries, execution)
            conn.send(("result", cell.id, payload))
            if payload[0] == "interrupted":  # SIGTERM/SIGINT: the grid is stopping
                break
    except (EOFError, OSError):  # the grid process is gone
        pass
    # Every cell's files are written and closed; skip the interpreter's teardown of torch
    # (about a second of every grid, spent while the grid process waits in join).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@dataclasses.dataclass
class _Slot:
    proc: Any
    conn: Any  # the grid process's end of the worker's pipe
    gpu: str | None
    ready: bool = False
    cell: Cell | None = None
    started: float = 0.0
    stopping: bool = False
    dead: bool = False


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries."""
    try:
        import torch  # lazy: the launcher counts GPUs only on this path

        n = torch.cuda.device_count()  # NVML: does not initialise CUDA in this process
    except Exception:  # noqa: BLE001
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [x.strip() for x in env.split(",") if x.strip()] if env else [str(i) for i in range(n)]
    return ids[:n]


def run_local(
    cells: list[Cell],
    out_root: str | Path,
    *,
    workers: int = 1,
    retries: int = 1,
    progress: Progress | None = None,
    on_change: Callable[..., None] | None = None,
    cell_fn: CellFn | None = None,
    gpus: list[str] | None = None,
    cells_per_gpu: int = 1,
    executions: dict[str, CellResources] | None = None,
) -> RunResult:
    """Train `cells` (already filtered to the unfinished ones) with `workers` spawned worker
    processes, or in this process when workers == 0. `gpus` (CUDA_VISIBLE_DEVICES ids) gives
    worker i the GPU i // cells_per_gpu (round robin); None or [] trains on the CPU.
    `cell_fn` replaces run_cell (tests); in worker processes it must be importable by name.
    `on_change(cell_id=ID)` is called when a cell starts or ends, `on_change(idle=True)` while
    waiting (the caller rewrites grid.json, throttled). `executions`: cell id -> how it runs
    (its threads); a cell without one gets the default CellResources."""
    progress = progress or Progress("grid", len(cells), max(workers, 1), quiet=True)
    runner = _CellRunner(str(out_root), retries, progress, on_change, cell_fn, executions or {})
    if not cells:
        return runner.result
    if workers <= 0:  # in this process: no isolation, but debuggers and monkeypatching work
        return runner.run_here(cells)
    return WorkerPool(runner, min(workers, len(cells)), gpus or [], cells_per_gpu).run(cells)


class _CellRunner:
    """What both ways of running cells share: where they train, how each runs, and the record
    of how each ended (`result`, one progress line, `on_change`)."""
    def __init__(self, out_root: str, retries: int, progress: Progress, on_change: Callable[..., None] | None,
                 cell_fn: CellFn | None, executions: dict[str, CellResources]):
        self.out_root, self.retries, self.progress, self.cell_fn = out_root, retries, progress, cell_fn
        self.on_change = on_change or (lambda idle=False, cell_id=None: None)
        self.executions = executions
        self.result = RunResult({}, [], [])

    def execution_of(self, cell: Cell) -> CellResources:
        return self.executions.get(cell.id) or CellResources()

    def record(self, slot: int | None, cell: Cell, payload: tuple, seconds: float | None) -> None:
        record_payload(self.progress, self.result, slot, cell, payload, seconds)
        self.on_change(cell_id=cell.id)

    def run_here(self, cells: list[Cell]) -> RunResult:
        """Train the cells one after the other in this process; KeyboardInterrupt once one is stopped."""
        try:
            for cell in cells:
                self.progress.started(0, cell.id)
                self.on_change(cell_id=cell.id)
                t0 = time.time()
                payload = call_cell(self.cell_fn, cell, self.out_root, self.retries, self.execution_of(cell))
                self.record(0, cell, payload, time.time() - t0)
                if self.result.interrupted:
                    break
        finally:
            self.progress.close()
        if self.result.interrupted:
            raise KeyboardInterrupt
        return self.result


class WorkerPool:
    """The grid process's side of the worker processes: it starts `n_workers` of them (slot
    numbers 0..n-1; a replacement takes the next free number), feeds each a cell when it is
    ready or has sent its last result, and reaps a worker that dies, retrying its cell or
    recording it failed. A worker's messages: ("ready", pid), ("start", cell_id),
    ("result", cell_id, payload)."""
    def __init__(self, runner: _CellRunner, n_workers: int, gpus: list[str], cells_per_gpu: int):

        self.runner, self.n_workers, self.gpus, self.cells_per_gpu = runner, n_workers, gpus, cells_per_gpu
        self.ctx = mp.get_context("spawn")
        self.pending: deque[Cell] = deque()
        self.crashes: Counter = Counter()  # cell id -> workers that died under it
        self.failed_starts = 0  # workers that died before saying ready
        self.slots: dict[int, _Slot] = {}

    def run(self, cells: list[Cell]) -> RunResult:
        """Train `cells`; on SIGTERM or SIGINT stop the workers (they checkpoint) and re-raise."""
        self.pending.extend(cells)
        previous_term = _raise_on_sigterm()  # a terminated grid stops its workers cleanly
        try:
            for slot in range(self.n_workers):
                self.spawn(slot)
            while any(not s.dead and (not s.stopping or s.cell is not None) for s in self.slots.values()):
                self.serve()
        except KeyboardInterrupt:
            self.runner.result.interrupted = True
            _stop(self.slots.values())
            raise
        finally:
            if previous_term is not _NOT_MAIN_THREAD:
                signal.signal(signal.SIGTERM, previous_term)
            self.close()
        return self.runner.result

    def gpu_for(self, slot: int) -> str | None:
        if not self.gpus:
            return None
        return self.gpus[(slot // max(self.cells_per_gpu, 1)) % len(self.gpus)]

    def spawn(self, slot: int) -> None:
        r = self.runner
        parent_end, child_end = self.ctx.Pipe(duplex=True)
        gpu = self.gpu_for(slot)
        proc = self.ctx.Process(target=_worker, name=f"ablate-grid-worker-{slot}", daemon=True,
                                args=(slot, os.getpid(), gpu, child_end, r.cell_fn, r.out_root, r.retries))
        # The worker's GPU is in its environment from its first instruction (spawn copies
        # os.environ at start), before torch is imported there.
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if gpu is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        try:
            proc.start()
        finally:
            if gpu is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
        child_end.close()  # so that the worker's death reads as EOF here
        self.slots[slot] = _Slot(proc, parent_end, gpu)

    def serve(self) -> None:
        """Wait up to half a second for a message or a worker's death, and act on what came."""
        live = {s.conn: slot for slot, s in self.slots.items() if not s.dead}
        sentinels = {s.proc.sentinel: slot for slot, s in self.slots.items() if not s.dead}
        ready = wait(list(live) + list(sentinels), timeout=0.5)
        if not ready:
            self.runner.on_change(idle=True)
            return
        for obj in ready:
            if obj in live:
                self.read(live[obj])
            else:
                self.read_last_words(sentinels[obj])

    def drain(self, slot: int) -> bool:
        """Handle everything a worker sent; False when its pipe closed (it died)."""
        conn = self.slots[slot].conn
        try:
            while conn.poll():
                self.handle(slot, conn.recv())
        except (EOFError, OSError):
            return False
        return True

    def read(self, slot: int) -> None:
        """Handle what a worker sent; its pipe closed means it died."""
        if not self.slots[slot].dead and not self.drain(slot):
            self.reap(slot)

    def read_last_words(self, slot: int) -> None:
        """A worker's process ended: handle what it sent before dying, then reap it."""
        if not self.slots[slot].dead:
            self.drain(slot)
            self.reap(slot)

    def handle(self, slot: int, msg: tuple) -> None:
        s, r = self.slots[slot], self.runner
        kind = msg[0]
        if kind == "ready":
            s.ready = True
            self.feed(slot)
        elif kind == "start":
            r.progress.started(slot, msg[1])
            r.on_change(cell_id=msg[1])
        elif kind == "result":
            cell, s.cell = s.cell, None
            if cell is None or cell.id != msg[1]:
                return
            r.record(slot, cell, msg[2], time.time() - s.started)
            if r.result.interrupted:
                raise KeyboardInterrupt
            self.feed(slot)

    def feed(self, slot: int) -> None:
        """Send the worker the next cell, or None (stop) when none is left."""
        s = self.slots[slot]
        if self.pending:
            s.cell = self.pending.popleft()
            s.started = time.time()
            _send(s, (s.cell, self.runner.execution_of(s.cell)))
        else:
            s.cell = None
            s.stopping = True
            _send(s, None)

    def reap(self, slot: int) -> None:
        """A worker died (OOM killer, segfault, kill): retry its cell or record it failed."""
        s = self.slots[slot]
        if s.dead:
            return
        s.dead = True
        s.proc.join(timeout=5)
        code = s.proc.exitcode
        s.conn.close()
        cell, s.cell = s.cell, None
        self.runner.progress.running.pop(slot, None)
        if s.stopping and cell is None:
            return  # it had finished its work and was told to stop
        s.stopping = True
        if cell is not None:
            self.retry_or_fail(slot, cell, code)
        elif not s.ready:
            self.count_failed_start(code)
        if self.pending:
            self.spawn(max(self.slots) + 1)

    def retry_or_fail(self, slot: int, cell: Cell, code: int | None) -> None:
        """The cell whose worker died: finished after all, tried again, or recorded failed."""
        r = self.runner
        self.crashes[cell.id] += 1
        summary_path = Path(r.out_root) / cell.id / SUMMARY
        if summary_path.exists():  # it finished; only the message was lost
            r.record(slot, cell, ("done", "trained", read_json(summary_path)), None)
        elif self.crashes[cell.id] <= r.retries:
            r.progress.write(f"retry     {cell.id}  worker died (exit code {code}); "
                             f"attempt {self.crashes[cell.id] + 1} of {r.retries + 1}")
            self.pending.appendleft(cell)
        else:
            error = f"worker process died (exit code {code})"
            summary = record_failed_cell(r.out_root, cell, error, self.crashes[cell.id])
            r.record(slot, cell, ("done", "trained", summary), None)

    def count_failed_start(self, code: int | None) -> None:
        """A worker died before it was ready; after too many, the environment is broken: every
        cell left is recorded as an error instead of trying again forever."""
        self.failed_starts += 1
        if self.failed_starts > 2 * self.n_workers + 2:
            while self.pending:
                self.runner.record(None, self.pending.popleft(),
                                   ("error", f"worker processes fail to start (exit code {code})"), None)

    def close(self) -> None:
        """Wait for every worker to exit (kill one that does not within 5 s) and close the pipes."""
        for s in self.slots.values():
            s.proc.join(timeout=5)
            if s.proc.is_alive():
                s.proc.kill()
                s.proc.join(timeout=5)
            if not s.conn.closed:
                s.conn.close()
        self.runner.progress.close()


_NOT_MAIN_THREAD = object()


def _raise_on_sigterm() -> Any:
    """Make SIGTERM raise KeyboardInterrupt here; returns the handler it replaced, or
    _NOT_MAIN_THREAD where signals cannot be set (then nothing changed)."""
    def on_term(signum, frame):
        raise KeyboardInterrupt

    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, on_term)
    except ValueError:
        return _NOT_MAIN_THREAD
    return previous


def _send(s: _Slot, item) -> None:
    try:
        s.conn.send(item)
    except (BrokenPipeError, OSError):
        pass  # it died; its EOF or its exit code brings it to reap()


def _stop(slots: Iterable[_Slot], grace_s: float = 30.0) -> None:
    """SIGTERM every worker (train checkpoints at the end of its step and exits), then
    SIGKILL what is still alive after `grace_s`."""
    slots = list(slots)
    for s in slots:
        if s.proc.is_alive():
            try:
                os.kill(s.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + grace_s
    for s in slots:
        s.proc.join(timeout=max(0.0, deadline - time.time()))
        if s.proc.is_alive():
            s.proc.kill()
