"""Packs: a grid's cells that differ only in their seed (or lr, or warmup) handed to one worker
and trained as one stacked model (ablate/engine/pack_train.py), each into its own run folder.

`--stack K` (grid, reproduce, ladder) sets the most members a pack takes; `auto` (STACK_DEFAULT)
packs on a CUDA device as many as its memory holds (`auto_members`) and, on a CPU, none: there
the default `cpu` kernels do not run under vmap, and a CPU is compute-bound (issue 53 measured
1.02-1.09x a member at width 64). `1` turns packing off: every cell trains alone, as before.

Which cells pack, and how many a pack takes, are this module's (standard library only: the CLI
reads STACK_DEFAULT); running them is pack_run.py's, the stacked step pack_train.py's.
"""
from __future__ import annotations

import json
from typing import Any, TYPE_CHECKING

from ablate.core.counts import shown
from ablate.core.errors import ConfigError

if TYPE_CHECKING:  # the CLI reads STACK_DEFAULT without importing torch (ablate.engine.cell does)
    from ablate.engine.cell import Cell

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
    auto_members) at a time; a pack of one is a cell trained alone (as every cell with
    stop_dead is)."""
    if stack == STACK_OFF:
        return [[c] for c in cells]
    groups: dict[str, list[list[Cell]]] = {}
    limits: dict[str, int] = {}
    order: list[list[Cell]] = []
    for cell in cells:
        if cell.setting.stop_dead:
            # A pack's members step together, so a member found dead would stop nothing: a cell
            # that stops dead runs (the option stop_dead) trains alone, where it saves its steps.
            order.append([cell])
            continue
        key = pack_key(cell)
        chunks = groups.setdefault(key, [])
        if key not in limits:  # auto: measured once per kind of cell
            limits[key] = stack if stack != STACK_AUTO else auto_members(cell)
        if not chunks or len(chunks[-1]) >= limits[key]:
            chunks.append([])
            order.append(chunks[-1])
        chunks[-1].append(cell)
    return order
