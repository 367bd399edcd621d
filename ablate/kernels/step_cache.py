"""Whole training steps timed per kernel backend: the only evidence `--kernels auto` takes on a GPU.

`ablate kernels tune` (step_tune.py) times whole steps of one cell's shape with each backend
and records them in $ABLATE_CACHE/kernels/step_times.json, one entry per device key and step
shape:

  {"device": {"name", "capability", "driver", "torch", "cuda", "triton"},
   "shape": {"model", "variant", "optimizer", "batch_size", "seq_len", "dtype", "compile"},
   "seconds": {backend: [seconds a step, one per interleaved repeat]}, "steps": N}

An entry counts only where every part of its device key is this process's (another GPU, driver,
torch, CUDA or Triton: measured elsewhere, so ignored). A backend is faster when its median step
beats `reference`'s fastest repeat: faster than reference in every repeat's comparison, not by
one lucky median. A damaged file is ignored with one line (and rewritten by the next tune).
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from importlib import metadata
from pathlib import Path

from ablate.core.bounded_read import UnreadableFile, read_json
from ablate.core.paths import cache_root
from ablate.core.rundir import write_json_atomic

FILE = "step_times.json"
MAX_ENTRIES = 200  # the oldest go first: a cache, not a history
REFERENCE = "reference"
_SAID: set[str] = set()


def path() -> Path:
    return cache_root() / "kernels" / FILE


def _version(package: str) -> str | None:
    """A package's version without importing it (importing Triton is part of what auto avoids)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version (Linux), or None where it cannot be read."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text(errors="replace")[:4096]
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return found.group(1) if found else None


def device_key(device) -> dict:
    """What a step timing depends on besides the step: the GPU, its driver, the libraries."""
    import torch  # lazy: torch only when used

    d = torch.device(device)
    index = d.index if d.index is not None else torch.cuda.current_device()
    return {"name": torch.cuda.get_device_name(index),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
            "driver": driver_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "triton": _version("triton")}


def step_shape(cfg, size, amp) -> dict:
    """The cell's step as far as its time goes: the model, the batch, the precision, compile."""
    return {"model": size.as_dict(), "variant": cfg.spec.id, "optimizer": cfg.optimizer,
            "batch_size": cfg.batch_size, "seq_len": cfg.context,
            "dtype": str(amp).removeprefix("torch.") if amp is not None else "float32", "compile": bool(cfg.compile)}


def _say(line: str) -> None:
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


def _is_entry(e) -> bool:
    if not isinstance(e, dict):
        return False
    seconds = e.get("seconds")
    return (isinstance(e.get("device"), dict) and isinstance(e.get("shape"), dict) and isinstance(seconds, dict)
            and all(isinstance(v, list) and v and all(isinstance(s, (int, float)) and s > 0 for s in v)
                    for v in seconds.values()))


def read_entries(quiet: bool = False) -> list[dict]:
    """The entries of the cache file (none when there is none); a damaged file counts as empty,
    with one line saying so (once a process)."""
    where = path()
    try:
        doc = read_json(where, top=dict, follow_links=False)
    except FileNotFoundError:
        return []
    except UnreadableFile as e:
        why = e.why
    else:
        entries = doc.get("entries")
        if isinstance(entries, list) and all(_is_entry(e) for e in entries):
            return entries
        why = "not a list of step timings"
    if not quiet:
        _say(f"ablate: the kernel step timings {where} are damaged ({why}); ignored: `--kernels auto` trains "
             "reference on the GPU until `ablate kernels tune` measures again")
    return []


def fastest(seconds: dict[str, list[float]]) -> str:
    """The backend whose median step beats reference's fastest repeat by the most; else reference."""
    if REFERENCE not in seconds:
        return REFERENCE
    bar = min(seconds[REFERENCE])
    medians = {name: statistics.median(times) for name, times in seconds.items() if name != REFERENCE}
    faster = {name: m for name, m in medians.items() if m < bar}
    return min(faster, key=faster.get) if faster else REFERENCE


def lookup(device: dict, shape: dict) -> dict | None:
    """{"seconds", "choice"} measured on exactly this device key and step shape, or None."""
    for entry in reversed(read_entries()):  # the newest measurement of a shape wins
        if entry["device"] == device and entry["shape"] == shape:
            return {"seconds": entry["seconds"], "choice": fastest(entry["seconds"])}
    return None


def record(device: dict, shape: dict, seconds: dict[str, list[float]], steps: int) -> Path:
    """Add (or replace) the entry for this device key and shape, atomically."""
    entries = [e for e in read_entries() if not (e["device"] == device and e["shape"] == shape)]
    entries = (entries + [{"device": device, "shape": shape, "seconds": seconds, "steps": steps}])[-MAX_ENTRIES:]
    where = path()
    where.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(where, {"entries": entries})
    return where
