"""One interface for the ops the model spends its elementwise time in, with backends.

Every backend offers: activation(name, x), gated(gate_act, gate, up), layer_norm,
rms_norm, add_layer_norm, add_rms_norm (residual add fused with the norm after it).
`reference` is plain PyTorch and always available; `cpu` is reference with the CPU's C kernels
(GELU, attention; cpu_backend.py); `triton` and `cuda` are registered here by the module that
defines them, imported (and built) only when asked for. `auto` resolves on a CPU to `cpu` once it
passes the parity suite, on a GPU to `reference` unless another backend was measured faster on
whole steps of the cell's shape there (select.py). A plugin registers its own in KERNEL_BACKENDS.
"""
from __future__ import annotations

import importlib
from typing import Callable

from ablate.core.errors import ConfigError
from ablate.core.registry import Registry
from ablate.kernels.reference import ReferenceBackend
from ablate.kernels.select import pick_auto

KERNEL_BACKENDS: Registry[Callable[[], object]] = Registry("kernels", ConfigError)  # name -> loader()


def _loaded_from(module: str) -> Callable[[], object]:
    """A loader that imports `module` on first use (its GPU dependencies too) and calls its `load()`."""
    def load():
        try:
            imported = importlib.import_module(module)
        except ImportError as e:
            name = module.rsplit(".", 1)[-1].removesuffix("_backend")
            raise ConfigError(f"kernels {name!r} is not available here ({e}); valid here: reference, cpu") from None
        return imported.load()
    return load


KERNEL_BACKENDS.register("reference", ReferenceBackend)
KERNEL_BACKENDS.register("cpu", _loaded_from("ablate.kernels.cpu_backend"))
KERNEL_BACKENDS.register("triton", _loaded_from("ablate.kernels.triton_backend"))
KERNEL_BACKENDS.register("cuda", _loaded_from("ablate.kernels.cuda_backend"))
BACKENDS = tuple(KERNEL_BACKENDS)  # the built-in ones
CHOICES = BACKENDS + ("auto",)
GPU_BACKENDS = ("triton", "cuda")  # what `ablate kernels check|bench|tune` default to


def kernel_choices() -> list[str]:
    """What the `kernels` option takes: every registered backend (a plugin's too), and `auto`."""
    return [*KERNEL_BACKENDS, "auto"]


def get_backend(name: str = "reference", device: str = "cpu", shape: dict | None = None):
    """The backend object for `name` on `device`; `auto` picks per device (on a GPU by whole
    steps of `shape` timed there, step_cache.step_shape; select.py)."""
    if name != "auto" and name not in KERNEL_BACKENDS:
        raise ConfigError(f"unknown kernels {name!r}; valid: {', '.join(kernel_choices())}")
    if name == "auto":
        name = pick_auto(device, shape)
    if name == "cpu" and not str(device).startswith("cpu"):
        raise ConfigError(f"kernels 'cpu' runs on the CPU only, not on {device}; valid there: "
                          f"{', '.join(k for k in kernel_choices() if k != 'cpu')}")
    return KERNEL_BACKENDS.get(name)()
