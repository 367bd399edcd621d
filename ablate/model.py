"""The base GPT, built from a block variant and a size.

Read top to bottom: attention, the block (the three variant choices are made in
`Block.__init__`), the model, and its initialisation. Norms, activations and gated
products run through `ops`, the kernel backend, so kernels never touch this file.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ablate.kernels import get_backend
from ablate.sizes import ModelSize
from ablate.variants import MLPS, NORMS, PLACEMENTS, VariantSpec


class CausalSelfAttention(nn.Module):
    def __init__(self, size: ModelSize):
        super().__init__()
        assert size.d_model % size.n_head == 0, "d_model must divide into heads"
        self.n_head = size.n_head
        self.c_attn = nn.Linear(size.d_model, 3 * size.d_model)  # q, k, v in one matmul
        self.c_proj = nn.Linear(size.d_model, size.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, spec: VariantSpec, size: ModelSize, ops):
        super().__init__()
        self.attn = CausalSelfAttention(size)
        # The variant's choices, all in one place:
        self.mlp = MLPS.get(spec.mlp)(size.d_model, size.mlp_hidden, spec.act, ops)  # mlp + act
        make_norm = (lambda: NORMS.get(spec.norm_type)(size.d_model, ops)) if spec.norm_type else None
        self.wiring = PLACEMENTS.get(spec.norm)(size.d_model, size.n_layer, make_norm, spec.residual)  # norm, residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wiring(x, self.attn, self.mlp)


class GPT(nn.Module):
    def __init__(self, spec: VariantSpec, size: ModelSize, ops=None):
        super().__init__()
        self.spec, self.size = spec, size
        self.ops = ops if ops is not None else get_backend("reference")
        self.wte = nn.Embedding(size.vocab_size, size.d_model)
        self.wpe = nn.Embedding(size.context, size.d_model)
        self.blocks = nn.ModuleList(Block(spec, size, self.ops) for _ in range(size.n_layer))
        needs_final = PLACEMENTS.get(spec.norm).final_norm
        self.norm_f = NORMS.get(spec.norm_type)(size.d_model, self.ops) if needs_final else None
        self.lm_head = nn.Linear(size.d_model, size.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied input/output embedding
        # When set, forward() records the L2 norm of the residual stream after every block
        # (one op per block; the probes divide by sqrt(elements) once to get the RMS).
        self.record_act_norms = False
        self.act_norms: list[torch.Tensor] = []
        self.reset_parameters()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        T = idx.shape[1]
        assert T <= self.size.context, f"sequence length {T} exceeds context {self.size.context}"
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        self.act_norms = []
        for block in self.blocks:
            x = block(x)
            if self.record_act_norms:
                self.act_norms.append(torch.linalg.vector_norm(x.detach(), dtype=torch.float32))
        if self.norm_f is not None:
            x = self.norm_f(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """GPT-2 init: N(0, 0.02) weights, zero biases, unit norms, and the projections that
        write into the residual stream scaled by 1/sqrt(2N). A placement may override its
        sublayers' init afterwards (DeepNorm does)."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 1:
                nn.init.ones_(p)  # norm gains
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * self.size.n_layer))
            else:
                nn.init.normal_(p, 0.0, 0.02)
        for block in self.blocks:
            block.wiring.reset_branch_parameters(block.attn, block.mlp)


def build_model(spec: VariantSpec, size: ModelSize, ops=None, device: str | torch.device = "cpu") -> GPT:
    with torch.device(device):
        return GPT(spec, size, ops)
