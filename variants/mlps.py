"""Feed-forward sublayers (the `mlp` axis).

The gated MLPs use a hidden width of 2/3 of the dense one (8/3 x d_model instead of 4x),
so that three matrices hold as many parameters as the dense MLP's two: the comparison is
parameter-matched (Shazeer 2020). For d_model 768 that is 2048.
"""
from __future__ import annotations

import torch
from torch import nn

from ablate.variants.tables import MLPS


def gated_hidden(dense_hidden: int) -> int:
    """Hidden width of a gated MLP with the parameter count of a dense one of `dense_hidden`."""
    return round(2 * dense_hidden / 3)


@MLPS.register("dense")
class DenseMLP(nn.Module):
    """x -> W2 act(W1 x): the GPT-2 MLP, 4x wide."""

    gated = False

    def __init__(self, d_model: int, dense_hidden: int, act: str, ops):
        super().__init__()
        self.ops, self.act = ops, act
        self.c_fc = nn.Linear(d_model, dense_hidden)
        self.c_proj = nn.Linear(dense_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Through the backend with both layers' weights, not c_proj(act(c_fc(x))): its CPU path adds
        # c_fc's bias in the activation's pass and writes the activation's gradient over the buffer
        # c_proj's backward made for it (ablate/kernels/cpu_gelu.py, form poly-bias).
        return self.ops.dense_mlp(self.act, x, self.c_fc.weight, self.c_fc.bias, self.c_proj.weight, self.c_proj.bias)


class GatedMLP(nn.Module):
    """x -> W2 (gate_act(Wg x) * (Wu x)). Wg and Wu are one matmul (`c_fc`, gate half first)."""

    gated = True
    gate_act: str = ""

    def __init__(self, d_model: int, dense_hidden: int, act: str | None, ops):
        super().__init__()
        self.ops = ops
        hidden = gated_hidden(dense_hidden)
        self.c_fc = nn.Linear(d_model, 2 * hidden)
        self.c_proj = nn.Linear(hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.c_fc(x).chunk(2, dim=-1)
        return self.c_proj(self.ops.gated(self.gate_act, gate, up))


@MLPS.register("swiglu")
class SwiGLU(GatedMLP):
    gate_act = "silu"


@MLPS.register("geglu")
class GEGLU(GatedMLP):
    gate_act = "gelu"


@MLPS.register("reglu")
class ReGLU(GatedMLP):
    gate_act = "relu"
