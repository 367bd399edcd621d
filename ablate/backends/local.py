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
import os
import signal
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, Callable, Iterable

from ablate.backends.base import Backend, CellFn, RunResult, call_cell, cpu_count, fail_summary, record_payload
from ablate.cell import Cell, Execution
from ablate.grid_state import cell_status
from ablate.progress import Progress
from ablate.rundir import PENDING, SUMMARY, read_json


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

    def describe(self, todo: list[Cell], executions: dict[str, Execution]) -> str:
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
    from ablate.data import load_data

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
    from ablate.kernels import get_backend
    from ablate.train import pick_device

    seen = set()
    for cfg in grid.configs.distinct():
        key = (cfg.device, cfg.kernels)
        if key in seen:
            continue
        seen.add(key)
        device = pick_device(cfg)
        if cfg.kernels in ("triton", "cuda"):  # `auto` always resolves to something that runs
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
        import ablate.train  # noqa: F401  (torch and the trainer once, not per cell)
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
        import torch

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
    executions: dict[str, Execution] | None = None,
) -> RunResult:
    """Train `cells` (already filtered to the unfinished ones) with `workers` spawned worker
    processes, or in this process when workers == 0. `gpus` (CUDA_VISIBLE_DEVICES ids) gives
    worker i the GPU i // cells_per_gpu (round robin); None or [] trains on the CPU.
    `cell_fn` replaces run_cell (tests); in worker processes it must be importable by name.
    `on_change(cell_id=ID)` is called when a cell starts or ends, `on_change(idle=True)` while
    waiting (the caller rewrites grid.json, throttled). `executions`: cell id -> how it runs
    (its threads); a cell without one gets the default Execution."""
    out_root = str(out_root)
    progress = progress or Progress("grid", len(cells), max(workers, 1), quiet=True)
    on_change = on_change or (lambda idle=False, cell_id=None: None)
    result = RunResult({}, [], [])
    if not cells:
        return result
    executions = executions or {}

    def execution_of(cell: Cell) -> Execution:
        return executions.get(cell.id) or Execution()

    def record(slot, cell: Cell, payload: tuple, seconds: float | None) -> None:
        record_payload(progress, result, slot, cell, payload, seconds)
        on_change(cell_id=cell.id)

    if workers <= 0:  # in this process: no isolation, but debuggers and monkeypatching work
        try:
            for cell in cells:
                progress.started(0, cell.id)
                on_change(cell_id=cell.id)
                t0 = time.time()
                record(0, cell, call_cell(cell_fn, cell, out_root, retries, execution_of(cell)), time.time() - t0)
                if result.interrupted:
                    break
        finally:
            progress.close()
        if result.interrupted:
            raise KeyboardInterrupt
        return result

    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    pending: deque[Cell] = deque(cells)
    crashes: Counter = Counter()
    failed_starts = [0]
    slots: dict[int, _Slot] = {}
    n_workers = min(workers, len(cells))

    def gpu_for(slot: int) -> str | None:
        if not gpus:
            return None
        return gpus[(slot // max(cells_per_gpu, 1)) % len(gpus)]

    def spawn(slot: int) -> None:
        parent_end, child_end = ctx.Pipe(duplex=True)
        gpu = gpu_for(slot)
        proc = ctx.Process(target=_worker, name=f"ablate-grid-worker-{slot}", daemon=True,
                           args=(slot, os.getpid(), gpu, child_end, cell_fn, out_root, retries))
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
        slots[slot] = _Slot(proc, parent_end, gpu)

    def send(s: _Slot, item) -> None:
        try:
            s.conn.send(item)
        except (BrokenPipeError, OSError):
            pass  # it died; its EOF or its exit code brings it to reap()

    def feed(slot: int) -> None:
        s = slots[slot]
        if pending:
            s.cell = pending.popleft()
            s.started = time.time()
            send(s, (s.cell, execution_of(s.cell)))
        else:
            s.cell = None
            s.stopping = True
            send(s, None)

    def reap(slot: int) -> None:
        """A worker died (OOM killer, segfault, kill): retry its cell or record it failed."""
        s = slots[slot]
        if s.dead:
            return
        s.dead = True
        s.proc.join(timeout=5)
        code = s.proc.exitcode
        s.conn.close()
        cell, s.cell = s.cell, None
        progress.running.pop(slot, None)
        if s.stopping and cell is None:
            return  # it had finished its work and was told to stop
        s.stopping = True
        if cell is not None:
            crashes[cell.id] += 1
            summary_path = Path(out_root) / cell.id / SUMMARY
            if summary_path.exists():  # it finished; only the message was lost
                record(slot, cell, ("done", "trained", read_json(summary_path)), None)
            elif crashes[cell.id] <= retries:
                progress.write(f"retry     {cell.id}  worker died (exit code {code}); "
                               f"attempt {crashes[cell.id] + 1} of {retries + 1}")
                pending.appendleft(cell)
            else:
                error = f"worker process died (exit code {code})"
                record(slot, cell, ("done", "trained", fail_summary(out_root, cell, error, crashes[cell.id])), None)
        elif not s.ready:
            failed_starts[0] += 1
            if failed_starts[0] > 2 * n_workers + 2:  # the environment is broken: stop trying
                while pending:
                    record(None, pending.popleft(), ("error", f"worker processes fail to start (exit code {code})"), None)
        if pending:
            spawn(max(slots) + 1)

    def handle(slot: int, msg: tuple) -> None:
        s = slots[slot]
        kind = msg[0]
        if kind == "ready":
            s.ready = True
            feed(slot)
        elif kind == "start":
            progress.started(slot, msg[1])
            on_change(cell_id=msg[1])
        elif kind == "result":
            cell, s.cell = s.cell, None
            if cell is None or cell.id != msg[1]:
                return
            record(slot, cell, msg[2], time.time() - s.started)
            if result.interrupted:
                raise KeyboardInterrupt
            feed(slot)

    previous_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        raise KeyboardInterrupt

    in_main = True
    try:
        signal.signal(signal.SIGTERM, on_term)  # a terminated grid stops its workers cleanly
    except ValueError:
        in_main = False
    try:
        for slot in range(n_workers):
            spawn(slot)
        while any(not s.dead and (not s.stopping or s.cell is not None) for s in slots.values()):
            live = {s.conn: slot for slot, s in slots.items() if not s.dead}
            sentinels = {s.proc.sentinel: slot for slot, s in slots.items() if not s.dead}
            ready = wait(list(live) + list(sentinels), timeout=0.5)
            if not ready:
                on_change(idle=True)
                continue
            for obj in ready:
                if obj in live:
                    slot = live[obj]
                    if slots[slot].dead:
                        continue
                    try:
                        while slots[slot].conn.poll():
                            handle(slot, slots[slot].conn.recv())
                    except (EOFError, OSError):
                        reap(slot)
                else:
                    slot = sentinels[obj]
                    s = slots[slot]
                    if not s.dead:
                        try:  # read what it sent before dying
                            while s.conn.poll():
                                handle(slot, s.conn.recv())
                        except (EOFError, OSError):
                            pass
                        reap(slot)
    except KeyboardInterrupt:
        result.interrupted = True
        _stop(slots.values())
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous_term)
        for s in slots.values():
            s.proc.join(timeout=5)
            if s.proc.is_alive():
                s.proc.kill()
                s.proc.join(timeout=5)
            if not s.conn.closed:
                s.conn.close()
        progress.close()
    return result


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
