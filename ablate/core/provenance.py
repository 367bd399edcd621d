"""What a run records about the software that produced it."""
from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

import ablate


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The harness's commit (with `+dirty` for local changes), or None outside git."""
    root = Path(ablate.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    return {"ablate": ablate.__version__, "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__}


@lru_cache(maxsize=None)
def cpuinfo(field: str) -> str:
    """The first value of `field` in /proc/cpuinfo ("model name", "flags"), "" where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == field), "")
    except OSError:
        return ""


def machine() -> dict[str, str]:
    """The CPU a run computes on. torch's CPU ops choose their code by the CPU's instruction set
    (`torch.backends.cpu.get_cpu_capability()`: AVX512, AVX2, ...), so a seeded run repeats bit
    for bit on one machine, and another CPU may round otherwise."""
    return {"cpu": cpuinfo("model name") or platform.processor() or platform.machine(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def machine_record(old: dict | None) -> dict:
    """config.json's `machine` (where the run started; None for a run recorded before this was)
    and `resumed_on` (each other machine it then continued on, in order), given the config.json
    the run folder held (None: a new run)."""
    now = machine()
    if old is None:
        return {"machine": now, "resumed_on": []}
    started, resumed_on = _recorded(old)
    if _last(started, resumed_on) != now:
        resumed_on.append(now)
    return {"machine": started, "resumed_on": resumed_on}


def _recorded(config: dict) -> tuple[dict | None, list[dict]]:
    """A config.json's (machine, resumed_on); what is not a machine's record reads as unknown."""
    def known(m):
        return isinstance(m, dict) and isinstance(m.get("cpu"), str)

    resumed_on = config.get("resumed_on")
    return (config["machine"] if known(config.get("machine")) else None,
            [m for m in resumed_on if known(m)] if isinstance(resumed_on, list) else [])


def _last(started: dict | None, resumed_on: list[dict]) -> dict | None:
    """The machine a run last computed on (None: not recorded)."""
    return resumed_on[-1] if resumed_on else started


def machine_changed(old: dict | None) -> str | None:
    """One line for stderr when a run recorded on another machine continues here, else None."""
    if old is None:
        return None
    last, now = _last(*_recorded(old)), machine()
    if last is None or last == now:
        return None
    return (f"continues on {now['cpu']} ({now['torch_cpu_capability']}), where it last ran on {last.get('cpu')} "
            f"({last.get('torch_cpu_capability')}): torch's CPU ops may round otherwise from here, so its numbers "
            "are no longer one machine's bits (config.json resumed_on)")
