"""Weight initialisation schemes (the `init` option). Each is a function of the built model
that sets every parameter in place; biases start at zero and norm gains at one in all of them.

    gpt2     N(0, 0.02) matrices, the projections that write into the residual stream
             (`c_proj`) scaled by 1/sqrt(2N) (Radford et al. 2019): the default
    normal   N(0, 0.02) every matrix, no depth scaling
    xavier   Xavier-normal every matrix, embeddings included, each of q, k, v (and each half of a
             gated MLP's input matrix) as its own matrix: the 2017 Transformer's and Xiong et al.
             2020's setting
    small    N(0, sqrt(2 / (5 d))) every matrix (Nguyen & Salazar 2019, "SmallInit")
    deepnet  gpt2, then Xavier-normal in the blocks with gain beta = (8N)^(-1/4) on values, output
             and MLP projections and gain 1 on queries and keys (Wang et al. 2022, Algorithm 1);
             the default of norm=deepnorm, whose residual scaling it is derived for

Which init a block gets without one named is its placement's `default_init` (`default_init` below).
A new scheme is one decorated function here or in a plugin file.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ablate.variants.placements import deepnorm_constants
from ablate.variants.tables import INITS, PLACEMENTS

STD = 0.02  # GPT-2's


def default_init(spec) -> str:
    """The init a block gets when none is named: its placement's own (DeepNorm's is DeepNet's,
    which its residual scaling is derived for), else GPT-2's."""
    return PLACEMENTS.get(spec.norm).default_init


def _matrices(model):
    """(name, parameter) of every matrix (embeddings and linear weights); the tied output
    embedding is the token embedding, so it comes once."""
    return [(n, p) for n, p in model.named_parameters() if p.dim() >= 2]


def _vectors_to_defaults(model) -> None:
    for name, p in model.named_parameters():
        if p.dim() < 2:
            (nn.init.zeros_ if name.endswith("bias") else nn.init.ones_)(p)


def _separate_matrices(model):
    """Every matrix as the matrices it stores: q, k and v are one `c_attn` parameter, a gated
    MLP's gate and up halves one `c_fc`. Each part gets its own fan-in and fan-out."""
    parts = {}
    for module in model.modules():
        if hasattr(module, "c_attn"):
            parts[id(module.c_attn.weight)] = 3
        if getattr(module, "gated", False):
            parts[id(module.c_fc.weight)] = 2
    for _, p in _matrices(model):
        yield from p.chunk(parts.get(id(p), 1), dim=0)


@INITS.register("gpt2")
@torch.no_grad()
def gpt2(model) -> None:
    # One pass in parameter order: the RNG stream (and so every weight) is the one runs made
    # before inits were a registry used.
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif p.dim() == 1:
            nn.init.ones_(p)
        elif name.endswith("c_proj.weight"):
            nn.init.normal_(p, 0.0, STD / math.sqrt(2 * model.size.n_layer))
        else:
            nn.init.normal_(p, 0.0, STD)


@INITS.register("normal")
@torch.no_grad()
def normal(model) -> None:
    _vectors_to_defaults(model)
    for _, p in _matrices(model):
        nn.init.normal_(p, 0.0, STD)


@INITS.register("xavier")
@torch.no_grad()
def xavier(model) -> None:
    _vectors_to_defaults(model)
    for part in _separate_matrices(model):
        nn.init.xavier_normal_(part)


@INITS.register("small")
@torch.no_grad()
def small(model) -> None:
    _vectors_to_defaults(model)
    std = math.sqrt(2 / (5 * model.size.d_model))
    for _, p in _matrices(model):
        nn.init.normal_(p, 0.0, std)


@INITS.register("deepnet")
@torch.no_grad()
def deepnet(model) -> None:
    gpt2(model)  # embeddings (and everything the loop below does not touch) as GPT-2
    _, beta = deepnorm_constants(model.size.n_layer)
    for block in model.blocks:
        attn, mlp = block.attn, block.mlp
        q, k, v = attn.c_attn.weight.chunk(3, dim=0)
        nn.init.xavier_normal_(q, gain=1.0)
        nn.init.xavier_normal_(k, gain=1.0)
        nn.init.xavier_normal_(v, gain=beta)
        for w in (attn.c_proj.weight, mlp.c_fc.weight, mlp.c_proj.weight):
            nn.init.xavier_normal_(w, gain=beta)
