"""The baseline the harness is measured against: a nanoGPT-style GPT and training loop.

Written for this benchmark after the structure of nanoGPT's model.py and train.py
(github.com/karpathy/nanoGPT), shape for shape the harness's default block: pre-norm
LayerNorm with biases, a 4x MLP, learned positions, tied embeddings, attention through
F.scaled_dot_product_attention, GPT-2 init. The GELU is nanoGPT's, nn.GELU()'s exact erf
form, by default; `gelu="tanh"` gives the harness's default block (GPT-2's tanh
approximation), which on the CPU costs about twice as much (see docs/performance.md's `ablate bench`
section). nanoGPT's dropout layers are left out
(dropout is 0 here, and a no-op module only slows the baseline down, which would flatter
the harness). The optimizer is AdamW with fused=True, as the harness uses it on every
device (nanoGPT fuses it on CUDA only; the CPU's default per-tensor AdamW is slower).
Gradients are clipped to norm 1.0 every step, as nanoGPT's train.py does by default
(`grad_clip = 1.0`; its GradScaler is disabled in float32 and left out).

Nothing from ablate's model, kernels, probes or training loop is used here.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ablate.bench.timing import time_calls

GRAD_CLIP = 1.0  # nanoGPT's train.py default


class LayerNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


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
        self.ln_1, self.attn = LayerNorm(d), CausalSelfAttention(d, n_head)
        self.ln_2, self.mlp = LayerNorm(d), MLP(d, gelu)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, n_layer: int, n_head: int, gelu: str = "none"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.h = nn.ModuleList(Block(d, n_head, gelu) for _ in range(n_layer))
        self.ln_f = LayerNorm(d)
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


def configure_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]):
    """nanoGPT's groups: decay on matrices and embeddings, none on biases and gains."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)


def get_batch(tokens: np.ndarray, batch_size: int, seq_len: int, device="cpu"):
    """nanoGPT's batch: random windows of a memory-mapped uint16 token array."""
    ix = torch.randint(len(tokens) - seq_len, (batch_size,))
    x = torch.stack([torch.from_numpy(tokens[i : i + seq_len].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(tokens[i + 1 : i + 1 + seq_len].astype(np.int64)) for i in ix])
    return x.to(device), y.to(device)


class PlainLoop:
    """nanoGPT's train.py loop over a PlainGPT, one iteration per `step()`: set the lr,
    forward, fetch the next batch, backward, clip the gradients' norm (nanoGPT's grad_clip,
    1.0; 0 turns it off), the optimizer step, zero the gradients, and read
    the loss (.item(), as train.py does at log_interval 1, the harness's default logging).
    `step()` returns that iteration's seconds, so the bench can run it in lockstep with the
    harness's steps."""

    def __init__(self, size, tokens: np.ndarray, batch_size: int, lr: float, seed: int, device="cpu",
                 weight_decay: float = 0.1, betas=(0.9, 0.95), gelu: str = "none", grad_clip: float = GRAD_CLIP):
        torch.manual_seed(seed)
        self.grad_clip = grad_clip
        with torch.device(device):
            self.model = PlainGPT(size.vocab_size, size.context, size.d_model, size.n_layer, size.n_head, gelu)
        self.optimizer = configure_optimizer(self.model, lr, weight_decay, betas)
        self.tokens, self.batch_size, self.seq_len, self.lr, self.device = tokens, batch_size, size.context, lr, device
        self.batch = get_batch(tokens, batch_size, size.context, device)

    def step(self) -> float:
        """One iteration; its seconds (bench/timing.py)."""
        return time_calls(self._iterate, repeats=1, warmup=0)[0]

    def _iterate(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr  # constant, as the harness is run here
        _, loss = self.model(*self.batch)
        self.batch = get_batch(self.tokens, self.batch_size, self.seq_len, self.device)
        loss.backward()
        if self.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss.item()


def plain_training_steps(size, tokens: np.ndarray, steps: int, batch_size: int, lr: float, seed: int,
                         device="cpu", weight_decay: float = 0.1, betas=(0.9, 0.95), gelu: str = "none") -> list[float]:
    """Train `steps` iterations of PlainLoop; returns each iteration's seconds."""
    loop = PlainLoop(size, tokens, batch_size, lr, seed, device, weight_decay, betas, gelu)
    return [loop.step() for _ in range(steps)]
