"""The dense MLP's backward in place (ablate/kernels/cpu_gelu.py, `_GeluBiasLinear`) timed in
whole training steps, against the same MLP as its two layers in turn:

    python -m ablate.kernels.cpu_mlp_bench                 # tiny x 12 blocks, 30 rounds of 24 steps
    python -m ablate.kernels.cpu_mlp_bench small 12 24 8   # size, blocks, steps, rounds

Why whole steps: what the in-place write saves is a fresh 4x-wide buffer, cold in cache, a
block a step; a kernel timed alone in a loop finds every buffer warm. Both sides compute the same
bits (tests/test_cpu_gelu.py), so two models built from one seed step on the same batches
through the training loop's own step, taking turns step by step (who goes first alternating;
ablate/bench/lockstep.py), at 1 thread, probes off, subnormals flushed as a new run of the
harness has them, on the bench's batch and learning rate (ablate/bench/steps.py). A round's
ratio is the two models' summed step times after the first 3 steps; the losses of both sides
are checked to be the same bits.
"""
from __future__ import annotations

import math
import statistics
import sys

import torch.nn.functional as F

from ablate.bench.lockstep import WARM, build_copy, plan_for, round_in_turn, threads_and_flushing
from ablate.kernels import cpu_gelu
from ablate.kernels.reference import ReferenceBackend
from ablate.sizes import SIZES

DEFAULT = ("tiny", 12, 24, 30)  # size, blocks, steps, rounds


class TwoLayers(ReferenceBackend):
    """The reference backend with the dense MLP as linear_activation, then F.linear (autograd's)."""

    def dense_mlp(self, name, x, weight, bias, weight2, bias2):
        return F.linear(self.linear_activation(name, x, weight, bias), weight2, bias2)


def bench_round(size: str, blocks: int, steps: int, first: int) -> tuple[float, bool]:
    """(two layers' time / in place's time, whether every loss was the same bits)."""
    plan = plan_for(size, blocks, steps, 1, False)
    seconds, same = round_in_turn(plan, [build_copy(plan, ReferenceBackend()), build_copy(plan, TwoLayers())], first)
    return seconds[1] / seconds[0], same


def _arguments(argv: list[str]) -> tuple[str, int, int, int] | None:
    """(size, blocks, steps, rounds) from the command line, or None after one line on stderr."""
    valid = (f"valid: [SIZE [BLOCKS [STEPS [ROUNDS]]]], SIZE one of {', '.join(SIZES)}, the others positive "
             f"integers, STEPS over {WARM} (default {' '.join(map(str, DEFAULT))})")
    if len(argv) > len(DEFAULT):
        print(f"cpu_mlp_bench: {len(argv)} arguments; {valid}", file=sys.stderr)
        return None
    given = [*argv, *map(str, DEFAULT[len(argv):])]
    bad = ([given[0]] if given[0] not in SIZES else []) + [a for a in given[1:] if not (a.isdigit() and int(a) > 0)]
    if not bad and int(given[2]) <= WARM:
        bad = [given[2]]
    if bad:
        print(f"cpu_mlp_bench: {bad[0]!r}: {valid}", file=sys.stderr)
        return None
    return given[0], int(given[1]), int(given[2]), int(given[3])


def main(argv: list[str]) -> int:
    args = _arguments(argv)
    if args is None:
        return 2
    size, blocks, steps, rounds = args
    if cpu_gelu.current() not in cpu_gelu.BIAS_FORMS:
        print(f"cpu_mlp_bench: this machine's GELU form is {cpu_gelu.current()!r}, which does not run the dense MLP "
              f"in place ({cpu_gelu.library()[1] or 'a form without the bias in its kernel'})", file=sys.stderr)
        return 1
    with threads_and_flushing(1):
        return _run(size, blocks, steps, rounds)


def _run(size: str, blocks: int, steps: int, rounds: int) -> int:
    print(f"the dense MLP in place against its two layers in turn: {size} x {blocks} blocks, {rounds} rounds of "
          f"{steps} steps (the first {WARM} untimed), 1 thread; ratio = two layers' time / in place's", flush=True)
    ratios, differ = [], 0
    for r in range(rounds):
        ratio, same = bench_round(size, blocks, steps, r % 2)
        ratios.append(ratio)
        differ += not same
        print(f"round {r + 1}: {ratio:.4f}x{'' if same else '  (the losses differ)'}", flush=True)
    error = statistics.stdev(ratios) / math.sqrt(rounds) if rounds > 1 else float("nan")
    print(f"in place: {statistics.median(ratios):.3f}x [{min(ratios):.3f}..{max(ratios):.3f}] (median [range]); "
          f"mean {statistics.fmean(ratios):.4f}x, standard error {error:.4f}")
    if differ:
        print(f"cpu_mlp_bench: the two sides' losses differed in {differ} of {rounds} rounds: they should be the "
              "same bits", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
