"""The `cpu` backend: `reference` with the CPU's C kernels for GPT-2's tanh GELU (cpu_gelu.py,
with the dense MLP's first bias in its pass on the form `poly-bias`) and for causal attention
(cpu_attention.py), on float32 CPU tensors outside torch.compile. Everything else, and those ops
where a kernel does not apply (another dtype or device, autocast, a form that is the torch
fallback), is `reference`'s plain PyTorch.

Which code computes a run's GELU and attention is part of its bits: a run on this backend
records the kernels' forms (config.json `gelu_cpu`, `attention_cpu`) and keeps them when
resumed (ablate.engine.train). `auto` picks this backend on a CPU once it passes the parity suite
(ablate/kernels/select.py), and `--kernels cpu` is refused in one line when it does not: a
library built wrong (a compiler that miscompiles a constant) never trains.
"""
from __future__ import annotations

import functools

import torch

from ablate.kernels import cpu_attention, cpu_gelu
from ablate.kernels.reference import ReferenceBackend
from ablate.kernels.select import refuse_failed_cpu


class CpuBackend(ReferenceBackend):
    name = "cpu"

    def activation(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name == "gelu" and cpu_gelu.handles(x):  # the same function in one pass (cpu_gelu.py)
            return cpu_gelu.gelu(x)
        return super().activation(name, x)

    def linear_activation(self, name: str, x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
        if name == "gelu" and cpu_gelu.handles_linear(x, weight, bias):  # the bias in the GELU's pass
            return cpu_gelu.linear_gelu(x, weight, bias)
        return super().linear_activation(name, x, weight, bias)

    def dense_mlp(self, name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  weight2: torch.Tensor, bias2: torch.Tensor | None) -> torch.Tensor:
        if name == "gelu" and cpu_gelu.handles_mlp(x, weight, bias, weight2, bias2):  # its backward in place
            return cpu_gelu.linear_gelu_linear(x, weight, bias, weight2, bias2)
        return super().dense_mlp(name, x, weight, bias, weight2, bias2)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if cpu_attention.handles(q, k, v):  # the same function in register tiles (cpu_attention.py)
            return cpu_attention.attention(q, k, v)
        return super().attention(q, k, v)


@functools.lru_cache(maxsize=None)
def unchecked() -> CpuBackend:
    """The backend before its parity check: what the check itself and `ablate kernels check` run."""
    return CpuBackend()


def load() -> CpuBackend:
    """The backend a run trains with (`--kernels cpu`), once its kernels passed the quick parity
    suite in this process (select.refuse_failed_cpu: ConfigError when they do not)."""
    refuse_failed_cpu()
    return unchecked()
