"""Packs: a grid's cells that differ only in their seed (or lr, or warmup) handed to one worker
and trained as one stacked model (ablate/engine/pack_train.py), each into its own run folder.

`--stack K` (grid, reproduce, ladder) sets the most members a pack takes; `auto` (STACK_DEFAULT)
packs on a CUDA device as many as its memory holds (`auto_members`) and, on a CPU, none: there
the default `cpu` kernels do not run under vmap, and a CPU is compute-bound (issue 53 measured
1.02-1.09x a member at width 64). `1` turns packing off: every cell trains alone, as before.

The grid runner dispatches one cell per pack, its lead; `PackCellFn`, the cell function the
backend calls, trains the whole pack when handed a lead (or any other cell as run_cell does).
A pack that cannot run (PackRefused: another optimizer, kernels, a model vmap cannot batch)
says why in one line and its cells train alone, as does any cell already finished, failed
before, or held by another process: run_cell handles those exactly as without packs.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TYPE_CHECKING

from ablate.core.counts import shown
from ablate.core.errors import ConfigError
from ablate.core.rundir import (CELL_TRAINED, CONFIG, CellLock, file_version, finished_status, read_summary,
                                remove_stale_temporaries)
from ablate.engine import plugins

if TYPE_CHECKING:  # the CLI reads STACK_DEFAULT without importing torch (ablate.engine.cell does)
    from ablate.engine.cell import Cell, CellOutcome, CellResources

STACK_AUTO = "auto"
STACK_DEFAULT = STACK_AUTO  # `--stack` when not given
STACK_OFF = 1
MAX_AUTO_MEMBERS = 64  # `auto`'s ceiling on a GPU (the issue's measured packs go to 32)
# Options in which a pack's members may differ: each member keeps its own (its batches and init
# from its seed; its rates from a per-member lr table).
MEMBER_OPTIONS = ("seed", "lr", "warmup")


def parse_stack(value: Any) -> int | str:
    """`--stack`'s value: a positive member count or `auto`; ConfigError naming it otherwise."""
    if value is None or value == STACK_AUTO:
        return STACK_AUTO
    try:
        k = int(value)
    except (TypeError, ValueError):
        k = 0
    if k < 1 or str(value).strip() != str(k):

        raise ConfigError(f"--stack {shown(value)} is not a member count; valid: auto, or a whole number 1 or more "
                          "(1 trains every cell alone)")
    return k


def pack_key(cell: Cell) -> str:
    """Cells with one key may share a pack: the same grid, plugins and options but MEMBER_OPTIONS."""
    options = {k: v for k, v in cell.config.as_dict().items() if k not in MEMBER_OPTIONS}
    return json.dumps([cell.grid, list(cell.plugins), options], sort_keys=True, default=str)


def auto_members(cell: Cell) -> int:
    """`auto`: 1 on a CPU; on a CUDA device, the members whose weights, optimizer state and
    activations fit in 70% of its free memory (a rough upper estimate per member), at most
    MAX_AUTO_MEMBERS."""
    cfg = cell.setting
    if cfg.device == "cpu":
        return STACK_OFF
    import torch  # lazy: keeps torch off `ablate grid --help`

    if not torch.cuda.is_available():
        return STACK_OFF
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(MAX_AUTO_MEMBERS, int(0.7 * free) // member_bytes(cfg)))


def member_bytes(cfg) -> int:
    """A member's memory, roughly: float32 weights, gradients and two AdamW moments, and the
    activations of a step (about 34 bytes per token and width per block, Korthikanti et al. 2022,
    and the logits in three precisions)."""
    size = cfg.size
    d, layers, vocab = size.d_model, size.n_layer, size.vocab_size
    params = vocab * d + cfg.context * d + layers * 12 * d * d
    tokens = cfg.batch_size * cfg.context
    return 16 * params + tokens * (34 * d * layers + 10 * vocab)


def group_packs(cells: list[Cell], stack: int | str) -> list[list[Cell]]:
    """The packs, in the order of their first cell: cells of one pack_key, at most `stack` (or
    auto_members) at a time; a pack of one is a cell trained alone."""
    if stack == STACK_OFF:
        return [[c] for c in cells]
    groups: dict[str, list[list[Cell]]] = {}
    limits: dict[str, int] = {}
    order: list[list[Cell]] = []
    for cell in cells:
        key = pack_key(cell)
        chunks = groups.setdefault(key, [])
        if key not in limits:  # auto: measured once per kind of cell
            limits[key] = stack if stack != STACK_AUTO else auto_members(cell)
        if not chunks or len(chunks[-1]) >= limits[key]:
            chunks.append([])
            order.append(chunks[-1])
        chunks[-1].append(cell)
    return order


@dataclass
class PackCellFn:
    """The cell function of a grid with packs (picklable: workers receive it). `packs`: lead
    cell id -> every member with its CellResources, the lead first; `inner`: the cell function
    a cell alone runs with (run_cell, or a test's)."""
    packs: dict[str, list[tuple[Cell, CellResources]]] = field(default_factory=dict)
    inner: Any = None

    def __call__(self, cell: Cell, out_root, retries: int = 0, quiet: bool = True,
                 execution: CellResources | None = None) -> CellOutcome:
        from ablate.engine.cell import run_cell  # lazy: keeps torch off `ablate grid --help`

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
    from ablate.engine.cell import CellResources  # lazy: keeps torch off `ablate grid --help`

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
    from ablate.engine.cell import CellOutcome, environment_error  # lazy: keeps torch off `ablate grid --help`
    from ablate.engine.pack_optim import PackRefused
    from ablate.engine.pack_train import train_pack
    from ablate.engine.train import plan_run

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
