"""Running a grid's cells on this machine, and the grid-level state every backend shares.

Every backend (local workers here, Ray tasks, SLURM array jobs) trains a cell by calling
`ablate.cell.run_cell`, which owns the per-cell flock: a finished cell is skipped, a cell
locked by a live process is reported busy, anything else is resumed. So two grid processes
on one folder never train the same cell, and a rerun picks up where a killed one stopped.

grid.json is never updated incrementally: it is re-derived from the run directories
(summary.json -> its status; lock held -> running; else pending) under a grid-level flock
and written atomically, so every writer agrees and none can clobber a run directory.

Local workers are long-lived spawned processes (torch imported once, then one cell at a
time over the worker's own pipe; no queue lock is shared, so a worker that dies mid-message
cannot stall the others). Each asks the kernel to SIGKILL it when the grid process dies
(PR_SET_PDEATHSIG), so an orphan never keeps training or holds a cell lock after `kill -9`
of the grid. A worker that dies under a cell is replaced and the cell retried `retries`
times, then recorded failed.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import fcntl
import json
import os
import signal
import sys
import time
from collections import Counter, deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable

from ablate.cell import ENVIRONMENT_ERRNOS, Cell, CellOutcome, finished_status, run_cell
from ablate.errors import ConfigError
from ablate.rundir import SUMMARY, CellLock, read_json, replace_atomic, write_json_atomic
from ablate.timefmt import fmt_time

GRID_JSON, GRID_LOCK = "grid.json", ".grid.lock"
FINISHED = ("completed", "diverged", "failed")
CellFn = Callable[..., CellOutcome]  # run_cell's signature: (cell, out_root, retries, quiet)


# ------------------------------------------------------------------------------ grid state


def cell_status(out_root: str | Path, cell_id: str) -> str:
    """pending | running | completed | diverged | failed, from the run directory alone."""
    run_dir = Path(out_root) / cell_id
    summary = run_dir / SUMMARY
    if summary.exists():
        try:
            return str(read_json(summary).get("status", "failed"))
        except (OSError, ValueError):
            return "failed"
    if CellLock(run_dir).is_held_elsewhere():
        return "running"
    return "pending"


class _FileLock:
    """A blocking exclusive flock, for the few milliseconds grid.json takes to write."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class GridJson:
    """grid.json of one grid folder, kept by the process running the grid so that an update
    costs what changed, not the grid's size: `write(changed)` re-derives the status of the
    cells named (the ones this process started or finished) and re-serialises only their
    lines; the file is the cached lines joined. Every FULL_EVERY_S (and on `write()` without
    ids, as at the start and end of a run) all cells are re-derived, so cells that other
    processes train show up too. Same keys and contents as write_grid_json."""

    FULL_EVERY_S = 30.0

    def __init__(self, out_root: str | Path, record: dict[str, Any]):
        self.out_root = Path(out_root)
        self.head = {k: v for k, v in record.items() if k != "cells"}
        self.entries = record["cells"]
        self.index = {c["id"]: i for i, c in enumerate(self.entries)}
        self.status: list[str | None] = [None] * len(self.entries)
        self.lines: list[str] = [""] * len(self.entries)
        self.counts: Counter = Counter()
        self.last_full = float("-inf")

    def _derive(self, i: int) -> None:
        c = self.entries[i]
        status = cell_status(self.out_root, c["id"])
        if status == self.status[i]:
            return
        if self.status[i] is not None:
            self.counts[self.status[i]] -= 1
        self.counts[status] += 1
        self.status[i] = status
        entry = {"id": c["id"], "group": c["group"], "status": status, "options": c["options"],
                 **({"threads": c["threads"]} if "threads" in c else {})}
        self.lines[i] = "    " + json.dumps(entry, allow_nan=False)

    def write(self, changed: Iterable[str] | None = None) -> dict[str, Any]:
        """Update grid.json (all cells when `changed` is None or a full pass is due); returns
        its header with counts (without the cells, which `state()` adds)."""
        self.out_root.mkdir(parents=True, exist_ok=True)
        with _FileLock(self.out_root / GRID_LOCK):
            full = changed is None or time.monotonic() - self.last_full > self.FULL_EVERY_S
            if full:
                self.last_full = time.monotonic()
            for i in range(len(self.entries)) if full else sorted({self.index[c] for c in changed if c in self.index}):
                self._derive(i)
            head = {**self.head, "counts": {k: v for k, v in self.counts.items() if v},
                    "updated": datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")}
            text = json.dumps(head, indent=2, allow_nan=False)
            # The cells last, one per line: a small change rewrites bytes, not Python objects.
            text = text[:-2] + ',\n  "cells": [\n' + ",\n".join(self.lines) + "\n  ]\n}\n"
            # No fsync: grid.json is re-derived from the run directories by any later run.
            replace_atomic(self.out_root / GRID_JSON, lambda f: f.write(text.encode()), fsync=False)
        return head

    def state(self) -> dict[str, Any]:
        """What the last write wrote, as write_grid_json returns it."""
        cells = [{"id": c["id"], "group": c["group"], "status": st, "options": c["options"],
                  **({"threads": c["threads"]} if "threads" in c else {})}
                 for c, st in zip(self.entries, self.status)]
        return {**self.head, "counts": {k: v for k, v in self.counts.items() if v}, "cells": cells}


def write_grid_json(out_root: str | Path, record: dict[str, Any]) -> dict[str, Any]:
    """Re-derive every cell's status from disk and write grid.json atomically (see module doc).
    `record` is Grid.record(): the grid's description plus its cells' ids, groups and options."""
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    with _FileLock(out_root / GRID_LOCK):
        cells = [{"id": c["id"], "group": c["group"], "status": cell_status(out_root, c["id"]),
                  "options": c["options"], **({"threads": c["threads"]} if "threads" in c else {})}
                 for c in record["cells"]]
        data = {k: v for k, v in record.items() if k != "cells"}
        data["counts"] = dict(Counter(c["status"] for c in cells))
        data["cells"] = cells
        data["updated"] = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
        write_json_atomic(out_root / GRID_JSON, data)
    return data


def recorded_threads(out_root: str | Path) -> dict[str, int]:
    """cell id -> the torch threads an earlier run of the grid gave it (grid.json), so that a
    rerun trains every cell as the first run would have, however many cells are left."""
    try:
        cells = read_json(Path(out_root) / GRID_JSON).get("cells", [])
        return {c["id"]: int(c["threads"]) for c in cells if isinstance(c, dict) and c.get("threads") is not None}
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return {}  # none yet, or a damaged grid.json (rewritten by this run)


def refresh_grid_json(out_root: str | Path, record: dict[str, Any] | None) -> None:
    """What a remote task (Ray, SLURM) does after its cell: rewrite grid.json if it can. The
    driver rewrites it too, so a task's result never depends on this write succeeding."""
    if record is not None:
        try:
            write_grid_json(out_root, record)
        except OSError:
            pass


def check_existing_runs(cells: Iterable[Cell], out_root: str | Path) -> None:
    """Refuse up front (nothing written) when a cell's folder already holds a run of a
    different config, e.g. a rerun with `--set steps=5` into a folder of 300-step runs. The
    same comparison `ablate train` makes (ablate.train.check_existing_run): the variant by its
    id, data by fingerprint, kernels, device and dtype as resolved."""
    from ablate.train import check_existing_run

    try:  # one listing, not a path per cell: a grid of a million seeds is checked in seconds
        present = set(os.listdir(out_root))
    except (FileNotFoundError, NotADirectoryError):
        return
    for cell in cells:
        if cell.id in present:
            check_existing_run(cell, Path(out_root) / cell.id)  # a folder without config.json passes


# ------------------------------------------------------------------------------ progress


def describe_result(outcome: str, summary: dict | None) -> tuple[str, str]:
    """(status, detail) for a line about a finished cell."""
    if outcome == "busy":
        return "busy", "running in another process"
    s = summary or {}
    status = s.get("status", "failed")
    if status == "completed":
        val = s.get("final_val_loss")
        detail = f"final loss {s.get('final_loss'):.4f}" if s.get("final_loss") is not None else "final loss n/a"
        detail += f", val {val:.4f}" if val is not None else ""
    elif status == "diverged":
        detail = f"diverged at step {s.get('diverged_at_step')}"
    else:
        attempts = s.get("attempts")
        detail = (s.get("error") or "unknown error") + (f" ({attempts} attempts)" if attempts else "")
    if outcome == "skipped":
        detail = f"already finished: {detail}"
    return status, detail


class Progress:
    """One bar over the cells to run (done / running / failed, ETA) and one status line per
    worker on a terminal; otherwise (or --quiet) plain lines. A line per finished cell always."""

    def __init__(self, name: str, to_run: int, slots: int, quiet: bool = False, stream=None):
        self.name, self.to_run, self.slots = name, to_run, slots
        self.counts: Counter = Counter()
        self.running: dict[int, str] = {}
        self.t0 = time.time()
        self.done = 0
        stream = stream or sys.stderr
        self.tty = not quiet and hasattr(stream, "isatty") and stream.isatty()
        self.bar = None
        self.lines: dict[int, Any] = {}
        if self.tty and to_run:
            from tqdm import tqdm

            self.bar = tqdm(total=to_run, desc=name, unit="cell", dynamic_ncols=True, file=stream,
                            bar_format="{desc}: {n_fmt}/{total_fmt} cells |{bar}| {elapsed}<{remaining}{postfix}")
            for slot in range(slots):
                self.lines[slot] = tqdm(total=0, bar_format="{desc}", position=slot + 1, leave=False,
                                        file=stream, desc=f"  worker {slot}: idle")
            self._postfix()

    def write(self, text: str) -> None:
        if self.bar is not None:
            from tqdm import tqdm

            tqdm.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def _postfix(self) -> None:
        if self.bar is not None:
            c = self.counts
            self.bar.set_postfix_str(
                f"done={c['completed'] + c['diverged']} running={len(self.running)} failed={c['failed']}"
                + (f" busy={c['busy']}" if c["busy"] else ""), refresh=True)

    def started(self, slot: int, cell_id: str) -> None:
        self.running[slot] = cell_id
        if slot in self.lines:
            self.lines[slot].set_description_str(f"  worker {slot}: {cell_id}", refresh=True)
        self._postfix()

    def set_running(self, cell_ids: Iterable[str]) -> None:
        """For backends that cannot see their workers (Ray, SLURM): the cells whose lock is held."""
        ids = list(cell_ids)
        if ids != list(self.running.values()):
            self.running = dict(enumerate(ids))
            self._postfix()

    def note(self, text: str) -> None:
        self.write(text)

    def finished(self, slot: int | None, cell_id: str, outcome: str, summary: dict | None,
                 seconds: float | None = None) -> str:
        self.running.pop(slot, None)
        status, detail = describe_result(outcome, summary)
        self.counts[status] += 1
        self.done += 1
        took = f"  ({fmt_time(seconds)})" if seconds is not None and outcome == "trained" else ""
        self.write(f"[{self.done}/{self.to_run}] {status:<9} {cell_id}  {detail}{took}")
        if self.bar is not None:
            self.bar.update(1)
            if slot in self.lines:
                self.lines[slot].set_description_str(f"  worker {slot}: idle", refresh=True)
        self._postfix()
        return status

    def close(self) -> None:
        for line in self.lines.values():
            line.close()
        if self.bar is not None:
            self.bar.close()
        self.lines, self.bar = {}, None


# ------------------------------------------------------------------------------ workers


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


def _call(cell_fn: CellFn | None, cell: Cell, out_root: str, retries: int) -> tuple:
    """Run one cell; never raises. Returns ("done", outcome, summary) | ("refused", message)
    | ("error", message) | ("interrupted", message)."""
    fn = cell_fn or run_cell
    try:
        result = fn(cell, out_root, retries, True)
        return ("done", result.outcome, result.summary)
    except ConfigError as e:
        return ("refused", " ".join(str(e).split()))
    except KeyboardInterrupt as e:  # train's Interrupted: checkpointed, resumable
        return ("interrupted", str(e) or "interrupted")
    except OSError as e:
        if e.errno in ENVIRONMENT_ERRNOS:  # a full disk: the user's to fix, one line (see ablate.cli)
            return ("refused", f"{e.strerror}: {e.filename}" if e.filename else f"{e.strerror}")
        return ("error", f"{type(e).__name__}: {e}".splitlines()[0])
    except Exception as e:  # noqa: BLE001  (run_cell records run errors; this is anything else)
        return ("error", f"{type(e).__name__}: {e}".splitlines()[0])


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
            cell = conn.recv()
            if cell is None:
                break
            conn.send(("start", cell.id))
            payload = _call(cell_fn, cell, out_root, retries)
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


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def with_threads(cell: Cell, threads: int | None) -> Cell:
    """The cell with its `threads` option set (unless the grid set it); the id is unchanged."""
    if threads is None or cell.options.get("threads") is not None:
        return cell
    return dataclasses.replace(cell, options={**cell.options, "threads": threads})


@dataclasses.dataclass
class RunResult:
    outcomes: dict[str, str]  # cell id -> final status of this process's attempt (or busy, ...)
    refused: list[str]  # ConfigError messages from cells (the input was wrong)
    errors: list[str]  # cells that ended without a result (worker died, job lost, ...)
    interrupted: bool = False


def record_payload(progress: Progress, result: RunResult, slot: int | None, cell: Cell,
                   payload: tuple, seconds: float | None) -> None:
    """One line and one outcome for a cell whose run ended (every backend uses this)."""
    kind = payload[0]
    if kind == "done":
        status = progress.finished(slot, cell.id, payload[1], payload[2], seconds)
        result.outcomes[cell.id] = "busy" if payload[1] == "busy" else status
        return
    progress.running.pop(slot, None)
    if kind == "refused":
        progress.write(f"refused   {cell.id}  {payload[1]}")
        result.refused.append(payload[1])
    elif kind == "interrupted":
        progress.write(f"stopped   {cell.id}  {payload[1]}")
        result.interrupted = True
    else:
        progress.write(f"error     {cell.id}  {payload[1]}")
        result.errors.append(f"{cell.id}: {payload[1]}")
    result.outcomes[cell.id] = kind


def order_for_dispatch(cells: list[Cell], out_root: str | Path) -> tuple[list[Cell], list[Cell]]:
    """(finished, to_run): finished cells (completed or diverged) are not dispatched at all; a
    failed cell is tried again; cells another process holds right now go last, so this
    process starts with work nobody else is doing."""
    finished, free, held = [], [], []
    for cell in cells:
        run_dir = Path(out_root) / cell.id
        if finished_status(run_dir) in ("completed", "diverged"):
            finished.append(cell)
        elif CellLock(run_dir).is_held_elsewhere():
            held.append(cell)
        else:
            free.append(cell)
    return finished, free + held


def _fail_summary(out_root: str | Path, cell: Cell, error: str, attempts: int) -> dict:
    """Record a cell whose worker kept dying as failed (run_cell could not)."""
    run_dir = Path(out_root) / cell.id
    summary = {"status": "failed", "final_loss": None, "final_val_loss": None, "diverged_at_step": None,
               "steps": None, "wall_time_s": None, "error": error, "attempts": attempts}
    lock = CellLock(run_dir)
    if lock.acquire():
        try:
            if not (run_dir / SUMMARY).exists():
                write_json_atomic(run_dir / SUMMARY, summary)
            return read_json(run_dir / SUMMARY)
        finally:
            lock.release()
    return summary


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
) -> RunResult:
    """Train `cells` (already filtered to the unfinished ones) with `workers` spawned worker
    processes, or in this process when workers == 0. `gpus` (CUDA_VISIBLE_DEVICES ids) gives
    worker i the GPU i // cells_per_gpu (round robin); None or [] trains on the CPU.
    `cell_fn` replaces run_cell (tests); in worker processes it must be importable by name.
    `on_change(cell_id=ID)` is called when a cell starts or ends, `on_change(idle=True)` while
    waiting (the caller rewrites grid.json, throttled)."""
    out_root = str(out_root)
    progress = progress or Progress("grid", len(cells), max(workers, 1), quiet=True)
    on_change = on_change or (lambda idle=False, cell_id=None: None)
    result = RunResult({}, [], [])
    if not cells:
        return result

    def record(slot, cell: Cell, payload: tuple, seconds: float | None) -> None:
        record_payload(progress, result, slot, cell, payload, seconds)
        on_change(cell_id=cell.id)

    if workers <= 0:  # in this process: no isolation, but debuggers and monkeypatching work
        try:
            for cell in cells:
                progress.started(0, cell.id)
                on_change(cell_id=cell.id)
                t0 = time.time()
                record(0, cell, _call(cell_fn, cell, out_root, retries), time.time() - t0)
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
            send(s, s.cell)
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
                record(slot, cell, ("done", "trained", _fail_summary(out_root, cell, error, crashes[cell.id])), None)
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
