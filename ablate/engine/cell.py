"""The cell function: train one fully specified cell into its run directory, exactly once.

Every way of running cells (`ablate train`, local workers, Ray tasks, SLURM array jobs)
calls `run_cell`. It is idempotent: a finished cell (summary.json saying completed or
diverged) is skipped, a cell locked by a live process is reported busy, anything else is
resumed or started. A failed cell is tried again: its failed summary is kept beside it as
`summary.failed-<k>.json`, and its `error-attempt<n>.txt` files are kept and numbered on.
"""
from __future__ import annotations

import errno
import os
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.core.errors import ConfigError
# finished_status and failed_summary are the run folder's (ablate.core.rundir); the backends and
# commands that run cells import them from here too.
from ablate.core.rundir import (ATTEMPTS, CELL_BUSY, CELL_SKIPPED, CELL_TRAINED, CONFIG, DONE, FAILED, SUMMARY,  # noqa: F401
                                CellLock, failed_summary, file_version,
                                finished_status, read_summary, remove_stale_temporaries, replace_atomic, write_json_atomic)
from ablate.engine import plugins as loaded  # as `loaded`: `plugins` names a Cell field
from ablate.engine.config import TrainConfig, group_id, resolve, seeded_id, with_seed

# A cell id names a folder: one path component, at most NAME_MAX bytes on Linux file systems.
NAME_MAX = 255
# Errors of the machine, not of the run: recording them as the run's result would be wrong
# (and writing the record would fail too). They reach the command as one line.
ENVIRONMENT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


_GIVEN: dict[frozenset, frozenset] = {}


@dataclass(frozen=True, slots=True)
class Cell:
    """One unit of work: what defines the run, resolved once where the cell is made (by
    `ablate train` or by loading a grid), plus where it belongs. Planning, the identity check
    and training read `config`; nothing resolves the cell's options again. How it executes
    (its threads) travels beside it as a `CellResources`, so a scheduler never rewrites a cell."""

    # The resolved config of the cell's setting, shared by the seeds of one setting (a grid of
    # a million seeds holds one config per setting, not per cell); `config` adds the seed.
    setting: TrainConfig
    seed: int
    id: str
    group: str
    # The axes that name the cell within its grid, but the seed (shared by a setting's seeds).
    setting_axes: dict[str, Any] = field(default_factory=dict)
    grid: str | None = None
    # The option names the user set (one shared frozenset per set of names): `options` and
    # config.json record those, and a user's `threads` wins over a scheduler's.
    given: frozenset[str] = frozenset()
    # The plugins (ablate/engine/plugins.py) whose registered values the cell may name: every process
    # that trains it imports them first.
    plugins: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, options: dict[str, Any], id_keys=(), axes=None, grid=None, keep_defaults: bool = False,
                     cfg: TrainConfig | None = None, group: str | None = None, seed: int | None = None,
                     plugins: tuple[str, ...] | None = None) -> "Cell":
        """keep_defaults: name the cell by every id key, also one at its default (see group_id).
        The cell carries the plugins this process imported (they defined its values).
        cfg, group, seed: `resolve(options)` (a setting's config, shared by its seeds, with the
        cell's `seed` apart), its group_id, when the caller has them (a grid resolves each
        setting once); plugins: what ablate.engine.plugins.requested() says, when the caller has it."""
        if plugins is None:
            plugins = loaded.requested()
        cfg = cfg if cfg is not None else resolve(options)  # raises ConfigError on anything invalid
        seed = cfg.seed if seed is None else seed
        group = group if group is not None else group_id(cfg, id_keys, keep_defaults)
        given = frozenset(options)
        given = _GIVEN.setdefault(given, given)  # one copy per set of names, not one per cell
        axes = axes or {}
        setting_axes = {k: v for k, v in axes.items() if k != "seed"} if "seed" in axes else axes  # shared, not copied
        return cls(cfg, seed, seeded_id(group, seed), group, setting_axes, grid, given, plugins)

    @property
    def config(self) -> TrainConfig:
        """The cell's resolved config, its seed included."""
        return with_seed(self.setting, self.seed)

    @property
    def options(self) -> dict[str, Any]:
        """The options the user set, with their resolved values (what grid.json records)."""
        cfg = self.config
        return {k: getattr(cfg, k) for k in sorted(self.given)}

    @property
    def axes(self) -> dict[str, Any]:
        return {**self.setting_axes, "seed": self.seed} if self.grid is not None else dict(self.setting_axes)

    def is_given(self, option: str) -> bool:
        return option in self.given


@dataclass(frozen=True)
class CellResources:
    """How a scheduler runs a cell, apart from what the cell is: the torch threads of its
    worker's share of the machine. A `threads` the cell's own options set wins; a resumed run
    keeps the count it started with (ablate.engine.train), whatever either says."""
    threads: int | None = None

    def threads_for(self, cell: Cell) -> int | None:
        return cell.setting.threads if cell.setting.threads is not None else self.threads


@dataclass
class CellOutcome:
    cell_id: str
    outcome: str  # CELL_TRAINED | CELL_SKIPPED (already finished) | CELL_BUSY (another process holds it)
    summary: dict[str, Any] | None


def check_id_fits(cell_id: str, named_by: str) -> None:
    """Refuse a cell id too long to be a folder name, before anything is written. `named_by`
    says what the id is made of and what to change, for the message."""
    size = len(cell_id.encode())
    if size > NAME_MAX:
        raise ConfigError(f"cell id {cell_id[:48]}... is {size} bytes, longer than a file name may be ({NAME_MAX}); "
                          f"it names the cell's folder and is made of {named_by}")


def run_cell(cell: Cell, out_root: str | Path, retries: int = 0, quiet: bool = True,
             execution: CellResources | None = None) -> CellOutcome:
    """Train `cell` under `out_root/<cell.id>/`, retrying a Python error `retries` times
    before recording status `failed`. Divergence is a result and is never retried; a cell
    that failed before is tried again. A run directory holding a run of another config is
    refused (ConfigError), finished or not. `execution`: how to run it (a scheduler's threads)."""
    from ablate.engine.train import plan_run, train  # heavy imports (torch) only when needed

    loaded.load(cell.plugins)  # a worker, Ray task or SLURM job: before anything names their values
    run_dir = Path(out_root) / cell.id
    if finished_status(run_dir) in DONE:
        return _finished(cell, run_dir)
    # Everything that can refuse the cell (the run folder's config.json included) is checked
    # before the lock creates its folder, so a refused cell leaves nothing behind; the plan
    # carries what it read, and train uses it.
    plan = plan_run(cell, execution, run_dir)
    lock = CellLock(run_dir)
    if not lock.acquire():
        return CellOutcome(cell.id, CELL_BUSY, None)
    try:
        status = finished_status(run_dir)
        if status in DONE:  # finished while we waited for the lock
            return _finished(cell, run_dir)
        if file_version(run_dir / CONFIG) != plan.recorded_version:
            plan = plan_run(cell, execution, run_dir)  # another process began it meanwhile: read it again
        remove_stale_temporaries(run_dir)  # we hold the lock: whoever wrote them is gone
        attempts_before = _set_aside_failed(run_dir) if status == FAILED else 0
        first = _next_error_index(run_dir)
        for attempt in range(retries + 1):
            try:
                return CellOutcome(cell.id, CELL_TRAINED, train(cell, run_dir, quiet=quiet, plan=plan))
            except ConfigError:
                raise  # the user's input, not the run, is wrong: nothing to record
            except OSError as e:
                if e.errno in ENVIRONMENT_ERRNOS:
                    raise  # the machine's fault (a full disk): not the run's result; a rerun resumes
                error = _record_error(run_dir, first + attempt, e)
            except Exception as e:  # noqa: BLE001  (any other error in a run is its result)
                if (full := environment_error(e)) is not None:
                    raise full from None  # a full disk, however a library wrapped it
                error = _record_error(run_dir, first + attempt, e)
            if attempt == retries:
                summary = failed_summary(error, attempts_before + attempt + 1)
                write_json_atomic(run_dir / SUMMARY, summary)
                return CellOutcome(cell.id, CELL_TRAINED, summary)
    finally:
        lock.release()
    raise AssertionError("unreachable")


def environment_error(e: BaseException | None) -> OSError | None:
    """The machine's error (ENVIRONMENT_ERRNOS) behind `e`, however it was wrapped: torch.save
    reports a write that hit a full disk as RuntimeError("[enforce fail at inline_container.cc]
    unexpected pos ..."), the OSError only in its context."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError) and e.errno in ENVIRONMENT_ERRNOS:
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


_ERROR_FILE = re.compile(r"^error-attempt(\d+)\.txt$")
_FAILED_SUMMARY = re.compile(r"^summary\.failed-(\d+)\.json$")


def _indices(run_dir: Path, pattern: re.Pattern) -> list[int]:
    return [int(m.group(1)) for name in os.listdir(run_dir) if (m := pattern.match(name))]


def _next_error_index(run_dir: Path) -> int:
    """error-attempt<n>.txt numbers go on across reruns: no earlier attempt's file is overwritten."""
    return max(_indices(run_dir, _ERROR_FILE), default=-1) + 1


def _record_error(run_dir: Path, index: int, e: BaseException) -> str:
    """Write the traceback as error-attempt<index>.txt (atomically: never an empty or half file)
    and return the error as one line."""
    text = traceback.format_exc()
    replace_atomic(run_dir / f"error-attempt{index}.txt", lambda f: f.write(text.encode()), fsync=False)
    return (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0]


def _set_aside_failed(run_dir: Path) -> int:
    """Keep a failed run's summary as summary.failed-<k>.json (the cell is unfinished again)
    and return how many attempts it counted."""
    try:
        attempts = int((read_summary(run_dir) or {}).get(ATTEMPTS) or 1)
    except (ValueError, TypeError):
        attempts = 1  # a damaged summary: one attempt we know nothing more about
    k = max(_indices(run_dir, _FAILED_SUMMARY), default=-1) + 1
    os.replace(run_dir / SUMMARY, run_dir / f"summary.failed-{k}.json")
    return attempts


def _finished(cell: Cell, run_dir: Path) -> CellOutcome:
    """A finished cell is never run again, but it only stands in for the run asked for when
    it is that run: a finished run of other data or settings is refused, not handed back."""
    # lazy: keeps jsonlines, numpy, tokenizers, tqdm off `ablate train --help`
    from ablate.engine.train import check_existing_run

    check_existing_run(cell, run_dir)
    return CellOutcome(cell.id, CELL_SKIPPED, read_summary(run_dir))


# SLURM jobs submitted before the rename unpickle their cell's resources under the old name.
Execution = CellResources
