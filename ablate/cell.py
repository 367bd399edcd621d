"""The cell function: train one fully specified cell into its run directory, exactly once.

Every way of running cells (`ablate train`, local workers, Ray tasks, SLURM array jobs)
calls `run_cell`. It is idempotent: a finished cell (summary.json present) is skipped, a
cell locked by a live process is reported busy, anything else is resumed or started.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.config import cell_id, group_id, resolve
from ablate.errors import ConfigError
from ablate.rundir import SUMMARY, CellLock, read_json, write_json_atomic


@dataclass(frozen=True)
class Cell:
    """One unit of work: flat options plus where it belongs."""

    options: dict[str, Any]
    id: str
    group: str
    axes: dict[str, Any] = field(default_factory=dict)
    grid: str | None = None
    # The option names the user set (None: all of `options`). A scheduler adds `threads` per
    # worker later; unlike a user's --threads, that yields to the count a run started with.
    given: frozenset[str] | None = None

    @classmethod
    def from_options(cls, options: dict[str, Any], id_keys=(), axes=None, grid=None,
                     keep_defaults: bool = False) -> "Cell":
        """keep_defaults: name the cell by every id key, also one at its default (see group_id)."""
        cfg = resolve(options)  # raises ConfigError on anything invalid
        return cls(dict(options), cell_id(cfg, id_keys, keep_defaults), group_id(cfg, id_keys, keep_defaults),
                   dict(axes or {}), grid, frozenset(options))

    def is_given(self, option: str) -> bool:
        return option in (self.options if self.given is None else self.given)


@dataclass
class CellOutcome:
    cell_id: str
    outcome: str  # trained | skipped (already finished) | busy (another process holds it)
    summary: dict[str, Any] | None


def run_cell(cell: Cell, out_root: str | Path, retries: int = 0, quiet: bool = True) -> CellOutcome:
    """Train `cell` under `out_root/<cell.id>/`, retrying a Python error `retries` times
    before recording status `failed`. Divergence is a result and is never retried.
    A run directory holding a run of another config is refused (ConfigError), finished or not."""
    from ablate.train import check_existing_run, plan_run, train  # heavy imports (torch) only when needed

    run_dir = Path(out_root) / cell.id
    if (run_dir / SUMMARY).exists():
        return _finished(cell, run_dir)
    # Everything that can refuse the cell is checked before the lock creates its folder, so a
    # refused cell leaves nothing behind; train uses the same plan.
    plan = plan_run(cell)
    check_existing_run(cell, run_dir, plan)
    lock = CellLock(run_dir)
    if not lock.acquire():
        return CellOutcome(cell.id, "busy", None)
    try:
        if (run_dir / SUMMARY).exists():  # finished while we waited for the lock
            return _finished(cell, run_dir)
        for attempt in range(retries + 1):
            try:
                return CellOutcome(cell.id, "trained", train(cell, run_dir, quiet=quiet, plan=plan))
            except ConfigError:
                raise  # the user's input, not the run, is wrong: nothing to record
            except Exception as e:  # noqa: BLE001  (any other error in a run is its result)
                error = f"{type(e).__name__}: {e}".splitlines()[0]
                (run_dir / f"error-attempt{attempt}.txt").write_text(traceback.format_exc())
                if attempt == retries:
                    summary = {
                        "status": "failed", "final_loss": None, "final_val_loss": None,
                        "diverged_at_step": None, "steps": None, "wall_time_s": None,
                        "error": error, "attempts": attempt + 1,
                    }
                    write_json_atomic(run_dir / SUMMARY, summary)
                    return CellOutcome(cell.id, "trained", summary)
    finally:
        lock.release()
    raise AssertionError("unreachable")


def _finished(cell: Cell, run_dir: Path) -> CellOutcome:
    """A finished cell is never run again, but it only stands in for the run asked for when
    it is that run: a finished run of other data or settings is refused, not handed back."""
    from ablate.train import check_existing_run

    check_existing_run(cell, run_dir)
    return CellOutcome(cell.id, "skipped", read_json(run_dir / SUMMARY))
