"""The ways to run a grid's cells: local worker processes, Ray tasks, a SLURM job array.

Each is one class implementing ablate.backends.base.Backend, registered in RUN_BACKENDS by name
as a function that imports and returns it (the ray and slurm modules import their extras lazily
too). Every backend calls the same idempotent cell function, `ablate.engine.cell.run_cell`, on a shared
output folder, so skipping finished cells, locking running ones, resuming and grid.json behave
the same everywhere. Ray and submitit are optional extras, imported only when their backend runs.
"""
from __future__ import annotations

import importlib
from typing import Callable

from ablate.core.errors import ConfigError
from ablate.core.registry import Registry

RUN_BACKENDS: Registry[Callable[[], type]] = Registry("backend", ConfigError)  # name -> () -> the class


def _imported(module: str, cls: str) -> Callable[[], type]:
    return lambda: getattr(importlib.import_module(module), cls)


RUN_BACKENDS.register("local", _imported("ablate.backends.local", "LocalBackend"))
RUN_BACKENDS.register("ray", _imported("ablate.backends.ray_backend", "RayBackend"))
RUN_BACKENDS.register("slurm", _imported("ablate.backends.slurm_backend", "SlurmBackend"))
BACKENDS = tuple(RUN_BACKENDS)


def backend_class(name: str):
    return RUN_BACKENDS.get(name)()
