"""The ways to run a grid's cells: local worker processes, Ray tasks, a SLURM job array.

Each is one class implementing ablate.backends.base.Backend, registered here by name. Every
backend calls the same idempotent cell function, `ablate.cell.run_cell`, on a shared output
folder, so skipping finished cells, locking running ones, resuming and grid.json behave the
same everywhere. Ray and submitit are optional extras, imported only when their backend runs.
"""
from __future__ import annotations

import importlib

# name -> "module:class", imported on use (the ray and slurm modules import their extras lazily too)
_CLASSES = {
    "local": "ablate.backends.local:LocalBackend",
    "ray": "ablate.backends.ray_backend:RayBackend",
    "slurm": "ablate.backends.slurm_backend:SlurmBackend",
}
BACKENDS = tuple(_CLASSES)


def backend_class(name: str):
    module, cls = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)
