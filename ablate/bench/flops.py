"""Model FLOPs per token, and this machine's matmul peak to hold them against: float32 torch.mm
at the thread count in use, at the shapes a training step of the model runs (each linear's
forward, input-gradient and weight-gradient products) and at one large square size."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.bench.plain_gpt import PlainGPT
from ablate.bench.timing import time_calls
from ablate.engine.sizes import ModelSize

FLOPS_FORMULA = ("model FLOPs per token = 6 x N + 6 x n_layer x seq_len x d_model (forward + backward; "
                 "N = parameters less the position embedding, which does no matmul; the second term is "
                 "causal attention's q.k and attention x v)")
SQUARE = 2048


def flops_per_token(size: ModelSize) -> int:
    """FLOPS_FORMULA; N counts the tied token embedding once, as the output layer's matmul."""
    with torch.device("meta"):
        model = PlainGPT(size.vocab_size, size.context, size.d_model, size.n_layer, size.n_head)
    params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * params + 6 * size.n_layer * size.context * size.d_model


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
    return [matmul for name, k, n, count in linears for matmul in (
        Matmul(f"{name} fwd", tokens, k, n, count), Matmul(f"{name} dgrad", tokens, n, k, count),
        Matmul(f"{name} wgrad", n, tokens, k, count))]


def sgemm_flops(m: int, k: int, n: int, min_time: float = 0.05) -> float:
    """FLOP/s of a float32 (m,k)x(k,n) matmul into a preallocated output: the best of 3 rounds
    of at least `min_time` each."""
    a, b, c = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    one = max(min(time_calls(lambda: torch.mm(a, b, out=c), 1)), 1e-7)
    return 2 * m * k * n / min(time_calls(lambda: torch.mm(a, b, out=c), 3, 0, calls=max(1, int(min_time / one))))


@dataclass
class Peak:
    matmuls: list[tuple[Matmul, float]]  # each step matmul and its FLOP/s
    square: float  # FLOP/s of a SQUARE^3 matmul

    def best_of(self, other: "Peak") -> "Peak":
        """Per shape, the faster of two measurements of the same step's matmuls."""
        return Peak([(m, max(f, g)) for (m, f), (_, g) in zip(self.matmuls, other.matmuls)],
                    max(self.square, other.square))

    @property
    def step_mix(self) -> float:
        """FLOP/s of one step's matmuls run back to back: the most the model's shapes allow."""
        return sum(m.flops * m.count for m, _ in self.matmuls) / sum(m.flops * m.count / f for m, f in self.matmuls)


def measure_peak(size: ModelSize, tokens: int) -> Peak:
    shapes: dict[tuple, float] = {}
    for m in step_matmuls(size, tokens):
        if (m.m, m.k, m.n) not in shapes:
            shapes[m.m, m.k, m.n] = sgemm_flops(m.m, m.k, m.n)
    return Peak([(m, shapes[m.m, m.k, m.n]) for m in step_matmuls(size, tokens)], sgemm_flops(SQUARE, SQUARE, SQUARE))
