"""The cores this process may use: its CPU affinity (the limit a container or `taskset` sets),
else os.cpu_count(). Standard library only, so the tests' start-up and analysis/ (which imports
nothing of the engine) read it without torch."""
from __future__ import annotations

import os


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
