"""Normalisation layers (the `norm_type` axis). They hold parameters only; the math runs
through the model's kernel backend so that CUDA/Triton kernels replace it transparently."""
from __future__ import annotations

import torch
from torch import nn

from ablate.variants.tables import NORMS


class Norm(nn.Module):
    """Interface every norm type implements.

    `add_forward(x, y)` returns `(x + y, norm(x + y))`: the residual add fused with the
    norm that follows it, which is where pre- and post-norm blocks spend their memory traffic.
    """

    def __init__(self, d_model: int, ops, eps: float = 1e-5):
        super().__init__()
        self.ops = ops
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def add_forward(self, x: torch.Tensor, y: torch.Tensor):
        raise NotImplementedError


@NORMS.register("layernorm")
class LayerNorm(Norm):
    def __init__(self, d_model: int, ops, eps: float = 1e-5):
        super().__init__(d_model, ops, eps)
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        return self.ops.layer_norm(x, self.weight, self.bias, self.eps)

    def add_forward(self, x, y):
        return self.ops.add_layer_norm(x, y, self.weight, self.bias, self.eps)


@NORMS.register("rmsnorm")
class RMSNorm(Norm):
    """RMSNorm (Zhang & Sennrich 2019): a gain, no bias, no mean subtraction."""

    def __init__(self, d_model: int, ops, eps: float = 1e-5):
        super().__init__(d_model, ops, eps)
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x, y):
        return self.ops.add_rms_norm(x, y, self.weight, self.eps)
