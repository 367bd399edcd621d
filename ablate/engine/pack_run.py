"""Running packs: the grid runner dispatches one cell per pack, its lead; `PackCellFn`, the cell
function the backend calls, trains the whole pack when handed a lead (or any other cell as
run_cell does). A pack that cannot run (PackRefused: another optimizer, kernels, a model vmap
cannot batch) says why in one line and its cells train alone, as does any cell already
finished, failed before, or held by another process: run_cell handles those exactly as without
packs. Which cells pack is pack.py's; the stacked step is pack_train.py's.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ablate.core.errors import ConfigError
from ablate.core.rundir import (CELL_TRAINED, CONFIG, CellLock, file_version, finished_status, read_summary,
                                remove_stale_temporaries)
from ablate.engine import plugins
from ablate.engine.cell import Cell, CellOutcome, CellResources, environment_error, run_cell
from ablate.engine.pack import group_packs, parse_stack
from ablate.engine.pack_optim import PackRefused
from ablate.engine.pack_train import train_pack
from ablate.engine.train import plan_run


@dataclass
class PackCellFn:
    """The cell function of a grid with packs (picklable: workers receive it). `packs`: lead
    cell id -> every member with its CellResources, the lead first; `inner`: the cell function
    a cell alone runs with (run_cell, or a test's)."""
    packs: dict[str, list[tuple[Cell, CellResources]]] = field(default_factory=dict)
    inner: Any = None

    def __call__(self, cell: Cell, out_root, retries: int = 0, quiet: bool = True,
                 execution: CellResources | None = None) -> CellOutcome:

        members = self.packs.get(cell.id)
        alone = self.inner or run_cell
        if not members:
            return alone(cell, out_root, retries, quiet, execution=execution)
        return run_pack(members, out_root, retries, quiet, alone)


def dispatch(todo: list[Cell], executions: dict[str, CellResources], stack: int | str,
             cell_fn=None) -> tuple[list[Cell], Any, int]:
    """What a backend is handed: one cell per pack (its lead) and the cell function that trains a
    lead's pack; and how many packs of more than one cell there are. Without packs: `todo` and
    `cell_fn` unchanged."""
    packs = [p for p in group_packs(todo, parse_stack(stack)) if len(p) > 1]
    if not packs:
        return todo, cell_fn, 0
    members = {p[0].id: [(c, executions.get(c.id) or CellResources()) for c in p] for p in packs}
    followers = {c.id for p in packs for c in p[1:]}
    return [c for c in todo if c.id not in followers], PackCellFn(members, cell_fn), len(packs)


def run_pack(members: list[tuple[Cell, CellResources]], out_root, retries: int, quiet: bool,
             alone) -> CellOutcome:
    """Train the pack's unfinished, free members as one model; every other member (finished,
    failed before, busy, or all of them when the pack is refused) through `alone`."""
    lead = members[0][0]
    plugins.load(lead.plugins)
    ready, locks, left = [], [], []
    try:
        for cell, execution in members:
            run_dir = Path(out_root) / cell.id
            if finished_status(run_dir) is not None:  # done (skipped) or failed (retried): as run_cell does
                left.append((cell, execution))
                continue
            plan = plan_run(cell, execution, run_dir)  # refuses (ConfigError) a folder holding another run
            lock = CellLock(run_dir)
            if not lock.acquire():
                left.append((cell, execution))  # run_cell reports it busy
                continue
            locks.append(lock)
            if finished_status(run_dir) is not None or file_version(run_dir / CONFIG) != plan.recorded_version:
                left.append((cell, execution))  # changed while we waited: run_cell reads it again
                continue
            remove_stale_temporaries(run_dir)
            ready.append((cell, execution, plan))
        if len(ready) > 1:
            try:
                train_pack([c for c, _, _ in ready], [p for _, _, p in ready])
                ready = []
            except PackRefused as e:
                print(f"ablate: pack of {len(ready)} ({ready[0][0].id}, ...) not stacked: {e}; its cells train alone",
                      file=sys.stderr, flush=True)
            except (ConfigError, KeyboardInterrupt):
                raise  # the user's input, or a stop (the members checkpointed): as run_cell does
            except Exception as e:  # noqa: BLE001  (alone, each member's error is recorded as its result)
                if environment_error(e) is not None:
                    raise
                print(f"ablate: pack of {len(ready)} ({ready[0][0].id}, ...) stopped ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:120]}); its unfinished cells go on alone", file=sys.stderr, flush=True)
    finally:
        for lock in locks:
            lock.release()
    outcomes = {}
    for cell, execution in [(c, x) for c, x, _ in ready] + left:
        outcomes[cell.id] = alone(cell, out_root, retries, quiet, execution=execution)
    return outcomes.get(lead.id) or CellOutcome(lead.id, CELL_TRAINED, read_summary(Path(out_root) / lead.id))
