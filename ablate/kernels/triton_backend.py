"""The `triton` backend: the kernels of triton_kernels.py behind the ops of ops_base.

Importing this module registers the loader `triton` with ablate.kernels. The backend runs on
CUDA tensors; with TRITON_INTERPRET=1 set before the import, the same kernels run on CPU
tensors in Triton's interpreter (slow; it is how the parity suite runs on machines without a
GPU). Ops the kernels do not cover fall back to `reference` (see ops_base.KernelBackend).
"""
from __future__ import annotations

import functools

import torch

from ablate.core.errors import ConfigError
from ablate.kernels import triton_kernels as tk
from ablate.kernels.ops_base import KernelBackend, define_ops

OPS = define_ops("ablate_triton", tk)


class TritonBackend(KernelBackend):
    name = "triton"
    max_norm_width = tk.MAX_NORM_WIDTH
    interpreted = tk.INTERPRETED

    def device_ok(self, t: torch.Tensor) -> bool:
        # Interpreted kernels read and write host memory; compiled ones need CUDA tensors.
        return t.device.type == "cpu" if self.interpreted else t.is_cuda


@functools.lru_cache(maxsize=None)
def load() -> TritonBackend:
    if not tk.INTERPRETED and not torch.cuda.is_available():
        raise ConfigError("kernels 'triton' needs a CUDA GPU (or TRITON_INTERPRET=1 set before start-up "
                          "to run its kernels in Triton's slow CPU interpreter); valid here: reference, cpu")
    return TritonBackend(OPS)
