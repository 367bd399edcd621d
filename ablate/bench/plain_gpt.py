"""The baseline the harness is measured against: a nanoGPT-style GPT and training loop, written
after nanoGPT's model.py and train.py (github.com/karpathy/nanoGPT), shape for shape the harness's
default block: pre-norm LayerNorm with biases (nn.LayerNorm; nanoGPT's own class exists for
bias=False), a 4x MLP, learned positions, tied embeddings, F.scaled_dot_product_attention,
GPT-2 init, nanoGPT's AdamW groups and gradient clipping. AdamW is fused, as the harness uses it
on every device (nanoGPT fuses it on CUDA only). Dropout is left out (0 here; a no-op module
would only slow the baseline down and flatter the harness). Nothing from ablate's model,
kernels, probes or training loop is used here.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ablate.bench.timing import once

# nanoGPT's train.py defaults, the harness's too
GRAD_CLIP, WEIGHT_DECAY, BETAS = 1.0, 0.1, (0.9, 0.95)


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, d: int, gelu: str):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)
        self.gelu = gelu  # F.gelu's `approximate`: "none" (exact, nanoGPT's) or "tanh" (GPT-2's)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate=self.gelu))


class Block(nn.Module):
    def __init__(self, d: int, n_head: int, gelu: str):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(d), CausalSelfAttention(d, n_head)
        self.ln_2, self.mlp = nn.LayerNorm(d), MLP(d, gelu)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, n_layer: int, n_head: int, gelu: str = "none"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.h = nn.ModuleList(Block(d, n_head, gelu) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied input/output embedding
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def configure_optimizer(model: nn.Module, lr: float):
    """nanoGPT's groups: decay on matrices and embeddings, none on biases and gains."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=BETAS, fused=True)


def get_batch(tokens: np.ndarray, batch_size: int, seq_len: int, device="cpu"):
    """nanoGPT's batch: random windows of a memory-mapped uint16 token array."""
    ix = torch.randint(len(tokens) - seq_len, (batch_size,))
    x = torch.stack([torch.from_numpy(tokens[i : i + seq_len].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(tokens[i + 1 : i + 1 + seq_len].astype(np.int64)) for i in ix])
    return x.to(device), y.to(device)


class PlainLoop:
    """nanoGPT's train.py loop over a PlainGPT, one iteration a `step()` (which returns its
    seconds): set the lr, forward, fetch the next batch, backward, clip the gradients' norm, the
    optimizer step, zero the gradients, and read the loss (.item(), as train.py does at
    log_interval 1, the harness's default logging). `gelu`: F.gelu's `approximate`, "none"
    (nanoGPT's exact erf) or "tanh" (GPT-2's, the harness's default block)."""

    def __init__(self, size, tokens: np.ndarray, batch_size: int, lr: float, seed: int, device="cpu",
                 gelu: str = "none"):
        torch.manual_seed(seed)
        with torch.device(device):
            self.model = PlainGPT(size.vocab_size, size.context, size.d_model, size.n_layer, size.n_head, gelu)
        self.optimizer = configure_optimizer(self.model, lr)
        self.tokens, self.batch_size, self.seq_len, self.lr, self.device = tokens, batch_size, size.context, lr, device
        self.batch = get_batch(tokens, batch_size, size.context, device)

    def step(self) -> float:
        return once(self._iterate)

    def _iterate(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr  # constant, as the harness is run here
        _, loss = self.model(*self.batch)
        self.batch = get_batch(self.tokens, self.batch_size, self.seq_len, self.device)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss.item()
