"""The CPU attention kernel timed against torch's attention, interleaved, on one shape:

    python -m ablate.kernels.cpu_attention_bench               # tiny's: batch 16, 4 heads, T 64, head dim 16
    python -m ablate.kernels.cpu_attention_bench 16 4 128 32   # small's

Every copy of the `blocked` form this CPU runs (ablate/kernels/cpu_attention.py) and torch's
F.scaled_dot_product_attention (causal), at one thread, taking turns (ablate/kernels/cpu_bench.py).
q, k and v are views of one (B, T, 3 H D) tensor, as the model's c_attn makes them. fwd is the
forward alone; bwd a backward through autograd (the engine's overhead on both sides alike).
"""
from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F

from ablate.kernels import cpu_attention
from ablate.kernels.cpu_bench import CALLS, ROUNDS, interleave, print_table, shape_from
from ablate.kernels.cpu_build import cpu_has

DEFAULT = (16, 4, 64, 16)


def _implementations(qkv: torch.Tensor, heads: int, dout: torch.Tensor) -> dict[str, tuple]:
    """name -> (forward, backward) callables."""
    q, k, v = cpu_attention.heads_of(qkv, heads)

    def timed(forward, attention, pin=contextlib.nullcontext):
        out = attention()  # the graph every bwd call runs back through

        def fwd():
            with pin():
                forward()

        def bwd():
            with pin():
                torch.autograd.grad(out, qkv, dout, retain_graph=True)

        return fwd, bwd

    impls = {}
    if "blocked" in cpu_attention.available():
        for copy in cpu_attention.FORMS["blocked"]:
            if cpu_has(*copy.needs):
                impls[copy.isa] = timed(lambda: cpu_attention.forward(q, k, v),
                                        lambda: cpu_attention.attention(q, k, v),
                                        lambda copy=copy: cpu_attention.KERNEL.pinned(copy))
    impls["torch sdpa"] = timed(lambda: F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(),
                                                                       is_causal=True),
                                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return impls


def bench(shape: tuple[int, int, int, int], rounds: int = ROUNDS,
          calls: int = CALLS) -> list[tuple[str, str, list[float]]]:
    """[(implementation, 'fwd' or 'bwd', microseconds a call per round)]."""
    B, H, T, D = shape
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * H * D, requires_grad=True)
    with cpu_attention.using("blocked" if "blocked" in cpu_attention.available() else cpu_attention.SDPA):
        return interleave(_implementations(qkv, H, torch.randn(B, H, T, D)), rounds, calls)


def main(argv: list[str]) -> int:
    shape = shape_from("cpu_attention_bench", argv, DEFAULT, "batch, heads, context and head dimension")
    if shape is None:
        return 2
    if len(shape) != 4:
        print(f"cpu_attention_bench: {len(shape)} dimensions given; valid: 4 (batch, heads, context, head "
              f"dimension; default {' '.join(map(str, DEFAULT))})", file=sys.stderr)
        return 2
    print_table(f"CPU attention and torch's on batch {shape[0]}, {shape[1]} heads, T {shape[2]}, head dimension "
                f"{shape[3]}, float32", bench(shape))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
