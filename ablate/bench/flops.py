"""Model FLOPs per token, and this machine's matmul peak to hold them against.

The peak is measured, not looked up: single-precision matmuls (torch's sgemm) at the thread
count in use, at the shapes a training step of the model runs (each linear layer's forward,
input-gradient and weight-gradient products) and at one large square size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.bench.plain_gpt import PlainGPT
from ablate.bench.timing import time_calls
from ablate.sizes import ModelSize

FLOPS_FORMULA = ("model FLOPs per token = 6 x N + 6 x n_layer x seq_len x d_model (forward + backward; "
                 "N = parameters less the position embedding, which does no matmul; the second term is "
                 "causal attention's q.k and attention x v)")
SQUARE = 2048


def matmul_params(size: ModelSize) -> int:
    """N of FLOPS_FORMULA: every parameter except the position embedding (the tied token
    embedding counts once, as the output layer's matmul)."""
    with torch.device("meta"):
        model = PlainGPT(size.vocab_size, size.context, size.d_model, size.n_layer, size.n_head)
    return sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()


def flops_per_token(size: ModelSize, seq_len: int | None = None) -> int:
    T = seq_len or size.context
    return 6 * matmul_params(size) + 6 * size.n_layer * T * size.d_model


@dataclass
class Matmul:
    name: str
    m: int
    k: int
    n: int
    count: int  # how many of it one training step runs

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n


def step_matmuls(size: ModelSize, tokens: int) -> list[Matmul]:
    """The dense matmuls of one training step on `tokens` tokens: for each linear layer
    (M tokens, K in, N out) its forward (M,K)x(K,N), input gradient (M,N)x(N,K) and weight
    gradient (N,M)x(M,K)."""
    d, L = size.d_model, size.n_layer
    linears = [("attn qkv", d, 3 * d, L), ("attn proj", d, d, L), ("mlp fc", d, 4 * d, L),
               ("mlp proj", 4 * d, d, L), ("lm head", d, size.vocab_size, 1)]
    out = []
    for name, k, n, count in linears:
        out += [Matmul(f"{name} fwd", tokens, k, n, count), Matmul(f"{name} dgrad", tokens, n, k, count),
                Matmul(f"{name} wgrad", n, tokens, k, count)]
    return out


def _seconds(fn, min_time: float = 0.05, rounds: int = 3) -> float:
    """Best time of one call over `rounds` rounds of at least `min_time` each: the peak."""
    one = max(min(time_calls(fn, 1)), 1e-7)  # after a warm-up call: first-call allocation and dispatch
    return min(time_calls(fn, rounds, warmup=0, calls=max(1, int(min_time / one))))


def sgemm_flops(m: int, k: int, n: int, device: str = "cpu") -> float:
    """FLOP/s of a float32 (m,k)x(k,n) matmul into a preallocated output."""
    a = torch.randn(m, k, device=device)
    b = torch.randn(k, n, device=device)
    c = torch.empty(m, n, device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def run():
        torch.mm(a, b, out=c)
        sync()

    return 2 * m * k * n / _seconds(run)


@dataclass
class Peak:
    threads: int
    matmuls: list[tuple[Matmul, float]]  # each step matmul and its FLOP/s
    square: float  # FLOP/s of a SQUARE^3 matmul

    def best_of(self, other: "Peak") -> "Peak":
        """Per shape, the faster of two measurements of the same step's matmuls."""
        matmuls = [(m, max(f, g)) for (m, f), (_, g) in zip(self.matmuls, other.matmuls)]
        return Peak(self.threads, matmuls, max(self.square, other.square))

    @property
    def step_mix(self) -> float:
        """FLOP/s of one step's matmuls run back to back: the most the model's shapes allow."""
        flops = sum(m.flops * m.count for m, _ in self.matmuls)
        return flops / sum(m.flops * m.count / f for m, f in self.matmuls)


def measure_peak(size: ModelSize, tokens: int, threads: int | None = None, device: str = "cpu") -> Peak:
    threads = threads or torch.get_num_threads()
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        shapes = {}
        for m in step_matmuls(size, tokens):
            key = (m.m, m.k, m.n)
            if key not in shapes:
                shapes[key] = sgemm_flops(*key, device=device)
        return Peak(threads, [(m, shapes[(m.m, m.k, m.n)]) for m in step_matmuls(size, tokens)],
                    sgemm_flops(SQUARE, SQUARE, SQUARE, device=device))
    finally:
        torch.set_num_threads(outer)
