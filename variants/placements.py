"""Where the norms sit in a block (the `norm` axis), and how the residual stream is added.

Each placement owns its block's norms and wires a block's two sublayers, attention and MLP:
`forward(x, attn, mlp)`. `final_norm` says whether the model needs a norm after the last
block (pre-norm leaves the residual stream unnormalised; post-norm already normalised it).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ablate.variants.tables import PLACEMENTS


class Placement(nn.Module):
    final_norm: bool = True
    needs_norms: bool = True
    requires_residual: bool = False
    default_init: str = "gpt2"  # the init (variants/inits.py) used when none is named

    def __init__(self, d_model: int, n_layer: int, make_norm: Callable[[], nn.Module], residual: bool):
        super().__init__()
        self.residual = residual

    def forward(self, x: torch.Tensor, attn: nn.Module, mlp: nn.Module) -> torch.Tensor:
        raise NotImplementedError


@PLACEMENTS.register("pre")
class PreNorm(Placement):
    """x + f(norm(x)) (GPT-2, LLaMA, ANDREA). The MLP's norm is fused with the attention's
    residual add, which is the fused add+norm kernel's reason to exist."""

    def __init__(self, d_model, n_layer, make_norm, residual):
        super().__init__(d_model, n_layer, make_norm, residual)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()

    def forward(self, x, attn, mlp):
        a = attn(self.norm_attn(x))
        if self.residual:
            x, h = self.norm_mlp.add_forward(x, a)
            return x + mlp(h)
        return mlp(self.norm_mlp(a))


@PLACEMENTS.register("post")
class PostNorm(Placement):
    """norm(x + f(x)) (Vaswani et al. 2017, BERT). The stream leaves each block normalised."""

    final_norm = False

    def __init__(self, d_model, n_layer, make_norm, residual):
        super().__init__(d_model, n_layer, make_norm, residual)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()

    def add_norm(self, norm, x, y):
        return norm.add_forward(x, y)[1] if self.residual else norm(y)

    def forward(self, x, attn, mlp):
        x = self.add_norm(self.norm_attn, x, attn(x))
        return self.add_norm(self.norm_mlp, x, mlp(x))


@PLACEMENTS.register("sandwich")
class SandwichNorm(Placement):
    """x + norm_out(f(norm_in(x))) (Ding et al. 2021, CogView): pre-norm plus a norm on
    each branch's output, which bounds what a branch can add to the stream."""

    def __init__(self, d_model, n_layer, make_norm, residual):
        super().__init__(d_model, n_layer, make_norm, residual)
        self.norm_attn_in, self.norm_attn_out = make_norm(), make_norm()
        self.norm_mlp_in, self.norm_mlp_out = make_norm(), make_norm()

    def forward(self, x, attn, mlp):
        a = self.norm_attn_out(attn(self.norm_attn_in(x)))
        x = x + a if self.residual else a
        m = self.norm_mlp_out(mlp(self.norm_mlp_in(x)))
        return x + m if self.residual else m


def deepnorm_constants(n_layer: int) -> tuple[float, float]:
    """(alpha, beta) for a decoder-only DeepNet of `n_layer` blocks."""
    return (2 * n_layer) ** 0.25, (8 * n_layer) ** -0.25


@PLACEMENTS.register("deepnorm")
class DeepNorm(Placement):
    """norm(alpha x + f(x)) (Wang et al. 2022, DeepNet). For a decoder of N layers alpha =
    (2N)^(1/4); its companion init, `deepnet` (branch weights scaled by beta = (8N)^(-1/4)),
    is the default here. With another init the residual scaling stays and the init is the one named."""

    final_norm = False
    requires_residual = True
    default_init = "deepnet"

    def __init__(self, d_model, n_layer, make_norm, residual):
        super().__init__(d_model, n_layer, make_norm, residual)
        self.alpha, self.beta = deepnorm_constants(n_layer)
        self.norm_attn, self.norm_mlp = make_norm(), make_norm()

    def forward(self, x, attn, mlp):
        x = self.norm_attn.add_forward(self.alpha * x, attn(x))[1]
        return self.norm_mlp.add_forward(self.alpha * x, mlp(x))[1]


@PLACEMENTS.register("none")
class NoNorm(Placement):
    """x + f(x) with no normalisation at all: the control that shows what norms buy."""

    final_norm = False
    needs_norms = False

    def forward(self, x, attn, mlp):
        x = x + attn(x) if self.residual else attn(x)
        return x + mlp(x) if self.residual else mlp(x)

