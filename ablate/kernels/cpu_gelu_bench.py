"""The CPU tanh-GELU's forms timed against torch's own GELUs, interleaved, on one shape:

    python -m ablate.kernels.cpu_gelu_bench                 # tiny's MLP activation, 16 x 64 x 256
    python -m ablate.kernels.cpu_gelu_bench 16 128 512      # small's

Every form this machine computes (ablate/kernels/cpu_gelu.py) and torch's erf GELU (nanoGPT's)
and tanh GELU, forward and backward, at one thread, taking turns (ablate/kernels/cpu_bench.py).
`poly-bias` is timed on what it computes, gelu(h + b) with a bias over the last dimension and,
backward, the bias's gradient too; "poly + bias" is the same work unfused, torch's bias add
before `poly` and its column sum after (on the CPU, addmm's bias costs about that add).
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from ablate.kernels import cpu_gelu
from ablate.kernels.cpu_bench import CALLS, ROUNDS, interleave, print_table, shape_from


def _implementations(x: torch.Tensor, dy: torch.Tensor) -> dict[str, tuple]:
    """name -> (forward, backward) callables on x and dy."""
    def form(name):
        def fwd():
            with cpu_gelu.using(name):
                return cpu_gelu.gelu(x)

        def bwd():  # the backward kernel alone, as torch's gelu_backward is timed
            with cpu_gelu.using(name):
                cpu_gelu._call("bwd", x, dy, torch.empty_like(x))

        return fwd, bwd

    def with_bias(fused):
        """gelu(x + b) and its backward with the bias's gradient: one kernel, or the GELU kernel and torch."""
        b, db = torch.randn(x.shape[-1]), torch.empty(x.shape[-1])

        def fwd():
            with cpu_gelu.using("poly-bias"):
                if not fused:
                    return cpu_gelu.gelu(x + b)
                y = torch.empty_like(x)
                cpu_gelu._bias_fwd(x, b, y)
                return y

        def bwd():
            dx = torch.empty_like(x)
            with cpu_gelu.using("poly-bias"):
                if fused:
                    return cpu_gelu._bias_bwd(x, b, dy, dx, db)
                cpu_gelu._call("bwd", x + b, dy, dx)
                return dx.view(-1, x.shape[-1]).sum(0)

        return fwd, bwd

    def torch_gelu(approximate):
        def bwd():
            torch.ops.aten.gelu_backward(dy, x, approximate=approximate)

        return (lambda: F.gelu(x, approximate=approximate)), bwd

    forms = [f for f in cpu_gelu.available() if f != cpu_gelu.PASSES]
    impls = {f: with_bias(True) if f in cpu_gelu.BIAS_FORMS else form(f) for f in forms}
    if set(forms) & set(cpu_gelu.BIAS_FORMS):
        impls["poly + bias"] = with_bias(False)
    impls["torch erf"], impls["torch tanh"] = torch_gelu("none"), torch_gelu("tanh")
    return impls


def bench(shape: tuple[int, ...], rounds: int = ROUNDS, calls: int = CALLS) -> list[tuple[str, str, list[float]]]:
    """[(implementation, 'fwd' or 'bwd', microseconds a call per round)]."""
    torch.manual_seed(0)
    x, dy = torch.randn(shape) * 3, torch.randn(shape)
    return interleave(_implementations(x, dy), rounds, calls)


def main(argv: list[str]) -> int:
    shape = shape_from("cpu_gelu_bench", argv, (16, 64, 256), "the shape's dimensions")
    if shape is None:
        return 2
    print_table(f"CPU tanh-GELU forms and torch's GELUs on {' x '.join(map(str, shape))} float32", bench(shape))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
