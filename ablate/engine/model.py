"""The base GPT, built from a block variant and a size.

Read top to bottom: attention, the block (the variant's choices are made in
`Block.__init__`), the model. Norms, activations, gated products and attention run through
`ops`, the kernel backend, so kernels never touch this file. The initialisation is a registered
scheme (variants/inits.py), applied once at the end of `GPT.__init__`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ablate.engine.sizes import ModelSize
from ablate.kernels import get_backend
from ablate.variants import INITS, MLPS, NORMS, PLACEMENTS, VariantSpec
from ablate.variants.inits import default_init
from ablate.variants.spec import QK_NONE


class CausalSelfAttention(nn.Module):
    def __init__(self, size: ModelSize, qk_norm: str = QK_NONE, ops=None):
        super().__init__()
        assert size.d_model % size.n_head == 0, "d_model must divide into heads"
        self.n_head = size.n_head
        self.ops = ops if ops is not None else get_backend("reference")
        self.c_attn = nn.Linear(size.d_model, 3 * size.d_model)  # q, k, v in one matmul
        self.c_proj = nn.Linear(size.d_model, size.d_model)
        # qk-norm: queries and keys normalised over each head's dimensions, one gain shared by
        # the heads (Dehghani et al. 2023), which bounds the attention logits' growth.
        d_head = size.d_model // size.n_head
        self.q_norm = NORMS.get(qk_norm)(d_head, ops) if qk_norm != QK_NONE else None
        self.k_norm = NORMS.get(qk_norm)(d_head, ops) if qk_norm != QK_NONE else None

    def qkv(self, x: torch.Tensor):
        """Queries, keys and values, (B, heads, T, d_head) each, queries and keys normalised
        when the block has qk-norm."""
        return self.heads(self.c_attn(x))

    def heads(self, qkv: torch.Tensor):
        """`c_attn`'s output (B, T, 3C) split into heads (and qk-normed). The stability probes
        keep `c_attn`'s output and call this to see the logits the forward computed."""
        B, T, C3 = qkv.shape
        q, k, v = qkv.split(C3 // 3, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C3 // 3 // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        y = self.ops.attention(*self.qkv(x))  # causal
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, spec: VariantSpec, size: ModelSize, ops):
        super().__init__()
        # The variant's choices, all in one place:
        self.attn = CausalSelfAttention(size, spec.qk_norm, ops)  # qk_norm
        self.mlp = MLPS.get(spec.mlp)(size.d_model, size.mlp_hidden, spec.act, ops)  # mlp + act
        make_norm = (lambda: NORMS.get(spec.norm_type)(size.d_model, ops)) if spec.norm_type else None
        self.wiring = PLACEMENTS.get(spec.norm)(size.d_model, size.n_layer, make_norm, spec.residual)  # norm, residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wiring(x, self.attn, self.mlp)


class GPT(nn.Module):
    def __init__(self, spec: VariantSpec, size: ModelSize, ops=None, init: str | None = None):
        super().__init__()
        self.spec, self.size = spec, size
        self.init = init or default_init(spec)
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
        if self.wte.weight.device.type != "meta":  # a meta model (counting parameters) has no values to fill
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
        INITS.get(self.init)(self)


def build_model(spec: VariantSpec, size: ModelSize, ops=None, device: str | torch.device = "cpu",
                init: str | None = None) -> GPT:
    with torch.device(device):
        return GPT(spec, size, ops, init)
