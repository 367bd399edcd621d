"""The CPU tanh-GELU's forms timed against torch's own GELUs, interleaved, on one shape:

    python -m ablate.kernels.cpu_gelu_bench                 # tiny's MLP activation, 16 x 64 x 256
    python -m ablate.kernels.cpu_gelu_bench 16 128 512      # small's

Every form this machine computes (ablate/kernels/cpu_gelu.py) and torch's erf GELU (nanoGPT's)
and tanh GELU, forward and backward, at one thread. The implementations take turns, round after
round, so a machine whose speed drifts slows them all alike; each figure is the median over the
rounds of a round's mean microseconds per call, with the rounds' range.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from ablate.kernels import cpu_gelu


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

    def torch_gelu(approximate):
        def bwd():
            torch.ops.aten.gelu_backward(dy, x, approximate=approximate)

        return (lambda: F.gelu(x, approximate=approximate)), bwd

    impls = {f: form(f) for f in cpu_gelu.available() if f != cpu_gelu.PASSES}
    impls["torch erf"], impls["torch tanh"] = torch_gelu("none"), torch_gelu("tanh")
    return impls


ROUNDS, CALLS = 15, 50


def bench(shape: tuple[int, ...], rounds: int = ROUNDS, calls: int = CALLS) -> list[tuple[str, str, list[float]]]:
    """[(implementation, 'fwd' or 'bwd', microseconds a call per round)]."""
    torch.manual_seed(0)
    x, dy = torch.randn(shape) * 3, torch.randn(shape)
    impls = _implementations(x, dy)
    times = {(name, kind): [] for name in impls for kind in ("fwd", "bwd")}
    outer = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(rounds):
            for name, pair in impls.items():
                for kind, fn in zip(("fwd", "bwd"), pair):
                    fn()
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    times[name, kind].append((time.perf_counter() - t0) / calls * 1e6)
    finally:
        torch.set_num_threads(outer)
    return [(name, kind, values) for (name, kind), values in times.items()]


def main(argv: list[str]) -> int:
    bad = [a for a in argv if not (a.isdigit() and int(a) > 0)]
    if bad:
        print(f"cpu_gelu_bench: {bad[0]!r} is not a dimension; valid: positive integers, the shape's "
              "dimensions (default 16 64 256)", file=sys.stderr)
        return 2
    shape = tuple(int(a) for a in argv) or (16, 64, 256)
    print(f"CPU tanh-GELU forms and torch's GELUs on {' x '.join(map(str, shape))} float32, 1 thread "
          f"(median of {ROUNDS} interleaved rounds of {CALLS} calls, and their range)")
    print(f"{'implementation':<14} {'kind':<4} {'us/call':>9}  range")
    for name, kind, values in bench(shape):
        print(f"{name:<14} {kind:<4} {statistics.median(values):9.1f}  {min(values):.1f}..{max(values):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
