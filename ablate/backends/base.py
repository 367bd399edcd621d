"""The one interface every way of running a grid's cells implements (local, ray, slurm).

A backend trains cells by calling `ablate.engine.cell.run_cell` (through `call_cell`), which owns
the per-cell flock, so skipping finished cells, locking running ones, resuming and grid.json
behave the same on every backend. The grid runner (ablate.grid.runner) drives a backend in
this order, and nothing is written before `prepare` has returned:

    check()                 the backend can run here at all (Ray or submitit installed, the
                            devices and data a local worker needs); ConfigError if not
    prepare(todo)           connect, check resources; ConfigError for what the user can fix
    threads_per_cell(todo)  the torch threads of a cell whose grid.json records none
    describe(todo, ...)     where the cells run, for the plan line
    slots(todo)             how many cells run at once in this process's view (status lines)
    run(todo, ...)          train them; a RunResult

What a scheduler gives a cell (its threads) reaches it as a `CellResources` beside it; the cell,
what defines the run, is never rewritten.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from ablate.core.errors import ConfigError
from ablate.core.rundir import CELL_BUSY, CellLock, SUMMARY, read_json, write_json_atomic
from ablate.engine.cell import Cell, CellOutcome, CellResources, ENVIRONMENT_ERRNOS, failed_summary, run_cell
from ablate.grid.progress import Progress

CellFn = Callable[..., CellOutcome]  # run_cell's signature: (cell, out_root, retries, quiet, execution=)
OnChange = Callable[..., None]  # on_change(cell_id=ID) when a cell starts or ends; on_change(idle=True) while waiting
# What call_cell returns, by its first element: ("done", outcome, summary), or (kind, message).
PAYLOAD_KINDS = ("done", "refused", "error", "interrupted")


class Backend:
    """Base class of the backends; `options` is the grid's GridRunOptions, `out` its folder."""

    name = ""

    def __init__(self, options, grid, out: Path):
        self.options, self.grid, self.out = options, grid, Path(out)

    def check(self) -> None:
        """Refuse (ConfigError) a backend that cannot run here, before anything is written."""

    def prepare(self, todo: list[Cell]) -> None:
        """Connect and check resources for `todo` (the unfinished cells), before anything is written."""

    def threads_per_cell(self, todo: list[Cell]) -> int | None:
        """Torch threads for a cell without a recorded count; None: decided where it runs."""
        return None

    def describe(self, todo: list[Cell], executions: dict[str, CellResources]) -> str:
        raise NotImplementedError

    def slots(self, todo: list[Cell]) -> int:
        return 0

    @property
    def detached(self) -> bool:
        """Whether `run` submits and returns without waiting for the cells (SLURM's --no-wait)."""
        return False

    def run(self, todo: list[Cell], executions: dict[str, CellResources], progress: Progress,
            record: dict[str, Any], on_change: OnChange, cell_fn: CellFn | None = None) -> "RunResult":
        raise NotImplementedError


def call_cell(cell_fn: CellFn | None, cell: Cell, out_root: str, retries: int,
              execution: CellResources | None = None) -> tuple:
    """Run one cell (with run_cell, or `cell_fn` in tests); never raises. Returns a payload (see
    PAYLOAD_KINDS): ("done", outcome, summary), or ("refused" | "error" | "interrupted", message)."""
    fn = cell_fn or run_cell
    try:
        result = fn(cell, out_root, retries, True, execution=execution)
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
        result.outcomes[cell.id] = CELL_BUSY if payload[1] == CELL_BUSY else status
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


def record_failed_cell(out_root: str | Path, cell: Cell, error: str, attempts: int) -> dict:
    """Record a cell whose worker kept dying as failed (run_cell could not), and return its
    summary; one already there (the cell finished, only the message saying so was lost) is
    returned as it is."""
    run_dir = Path(out_root) / cell.id
    if (run_dir / SUMMARY).exists():
        return read_json(run_dir / SUMMARY)
    summary = failed_summary(error, attempts)
    lock = CellLock(run_dir)
    if lock.acquire():
        try:
            if not (run_dir / SUMMARY).exists():
                write_json_atomic(run_dir / SUMMARY, summary)
            return read_json(run_dir / SUMMARY)
        finally:
            lock.release()
    return summary
