"""Elementwise activations. Each function here is the reference math for its name:
kernel backends may replace it with a faster kernel of the same name, never change it."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ablate.variants.registry import ACTIVATIONS


@ACTIVATIONS.register("gelu")
def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), as GPT-2."""
    return F.gelu(x, approximate="tanh")


@ACTIVATIONS.register("gelu_erf")
def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU, x * Phi(x)."""
    return F.gelu(x)


@ACTIVATIONS.register("relu")
def relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


@ACTIVATIONS.register("silu")
def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


@ACTIVATIONS.register("relu2")
def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (So et al. 2021, Primer)."""
    return F.relu(x).square()
