"""One interface for the ops the model spends its elementwise time in, with backends.

Every backend offers: activation(name, x), gated(gate_act, gate, up), layer_norm,
rms_norm, add_layer_norm, add_rms_norm (residual add fused with the norm after it).
`reference` is plain PyTorch and always available; `triton` and `cuda` register here
when their modules load. `auto` resolves to the fastest backend verified on the device.
"""
from __future__ import annotations

from typing import Callable

from ablate.errors import ConfigError
from ablate.kernels.reference import ReferenceBackend

BACKENDS = ("reference", "triton", "cuda")
CHOICES = BACKENDS + ("auto",)
_LOADERS: dict[str, Callable[[], object]] = {"reference": ReferenceBackend}


def register_loader(name: str, loader: Callable[[], object]) -> None:
    """Let a GPU backend module make itself loadable by name."""
    _LOADERS[name] = loader


def get_backend(name: str = "reference", device: str = "cpu"):
    """The backend object for `name` on `device`; `auto` picks per device."""
    if name not in CHOICES:
        raise ConfigError(f"unknown kernels {name!r}; valid: {', '.join(CHOICES)}")
    if name == "auto":
        from ablate.kernels.select import pick_auto

        name = pick_auto(device)
    if name not in _LOADERS:
        _load_optional(name)
    return _LOADERS[name]()


def _load_optional(name: str) -> None:
    try:
        if name == "triton":
            import ablate.kernels.triton_backend  # noqa: F401  (registers itself)
        elif name == "cuda":
            import ablate.kernels.cuda_backend  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"kernels {name!r} is not available here ({e}); valid here: reference") from None
    if name not in _LOADERS:
        raise ConfigError(f"kernels {name!r} is not available here; valid here: reference")
