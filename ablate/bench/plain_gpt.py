"""A minimal plain-PyTorch GPT training loop: the baseline the harness is measured against.

Written independently of ablate.model on purpose (nn.LayerNorm, F.gelu, no kernel
interface, no probes, no run directory), with the same shapes, init, optimizer and data.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, n_layer: int, n_head: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(PlainBlock(d, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def plain_training_steps(size, data, steps: int, batch_size: int, lr: float, seed: int, device="cpu") -> float:
    """Train `steps` steps, then evaluate one validation batch (as the harness's final
    evaluation does); returns the wall-clock seconds of both."""
    import time

    torch.manual_seed(seed)
    with torch.device(device):
        model = PlainGPT(size.vocab_size, size.context, size.d_model, size.n_layer, size.n_head)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = data.batch("train", step, seed, batch_size, size.context, device)
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the loop a user writes looks at its loss
    with torch.no_grad():
        x, y = data.batch("val", 0, 0, batch_size, size.context, device)
        model(x, y).item()
    return time.perf_counter() - t0
