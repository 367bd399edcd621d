"""The `reference` backend: plain PyTorch on any device. It is the ground truth that every
other backend is checked against, and the fallback for ops a backend does not implement."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ablate.variants.tables import ACTIVATIONS


class ReferenceBackend:
    name = "reference"

    def activation(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return ACTIVATIONS.get(name)(x)

    def linear_activation(self, name: str, x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
        """act(x W^T + b): a dense MLP's first layer and its activation."""
        return self.activation(name, F.linear(x, weight, bias))

    def bias_activation(self, name: str, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """act(x + b) in x's dtype (the bias rounded to it first, as autocast's matmul adds it):
        the op the GPU backends fuse into one pass (`linear_activation` without the bias)."""
        return self.activation(name, x + bias.to(x.dtype))

    def dense_mlp(self, name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  weight2: torch.Tensor, bias2: torch.Tensor | None) -> torch.Tensor:
        """act(x W^T + b) W2^T + b2: the dense MLP."""
        return F.linear(self.linear_activation(name, x, weight, bias), weight2, bias2)

    def gated(self, gate_act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.activation(gate_act, gate) * up

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal self-attention, q, k, v and the output (B, heads, T, d_head)."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def layer_norm(self, x, weight, bias, eps: float) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)

    def rms_norm(self, x, weight, eps: float) -> torch.Tensor:
        return F.rms_norm(x, x.shape[-1:], weight, eps)

    def add_layer_norm(self, x, y, weight, bias, eps: float):
        s = x + y
        return s, self.layer_norm(s, weight, bias, eps)

    def add_rms_norm(self, x, y, weight, eps: float):
        s = x + y
        return s, self.rms_norm(s, weight, eps)
