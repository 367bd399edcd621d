"""The dense MLP's backward in place (ablate/kernels/cpu_gelu.py, `_GeluBiasLinear`) timed in
whole training steps, against the same MLP as its two layers in turn:

    python -m ablate.kernels.cpu_mlp_bench                 # tiny x 12 blocks, 30 rounds of 24 steps
    python -m ablate.kernels.cpu_mlp_bench small 12 24 8   # size, blocks, steps, rounds

Why whole steps: what the in-place write saves is a fresh 4x-wide buffer, cold in cache, a
block a step; a kernel timed alone in a loop finds every buffer warm. Both sides compute the same
bits (tests/test_cpu_gelu.py), so two models built from one seed step on the same batches,
taking turns step by step (who goes first alternating), at 1 thread, probes off, subnormals
flushed as a new run of the harness has them, on the bench's batch and learning rate
(ablate/bench/steps.py). A round's ratio is the two models' summed step times after the first 3
steps; the losses of both sides are checked to be the same bits.
"""
from __future__ import annotations

import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from ablate import fpmode
from ablate.kernels import cpu_gelu
from ablate.kernels.reference import ReferenceBackend
from ablate.sizes import SIZES

DEFAULT = ("tiny", 12, 24, 30)  # size, blocks, steps, rounds
WARM = 3  # steps of each round left out of its timing


class TwoLayers(ReferenceBackend):
    """The reference backend with the dense MLP as linear_activation, then F.linear (autograd's)."""

    def dense_mlp(self, name, x, weight, bias, weight2, bias2):
        return F.linear(self.linear_activation(name, x, weight, bias), weight2, bias2)


def _loops(size: str, blocks: int, steps: int):
    """A step function per side, each training a fresh model from the same seed."""
    from ablate.bench.steps import harness_options
    from ablate.cell import Cell
    from ablate.model import build_model
    from ablate.train import clip_gradients, make_optimizer, plan_run

    plan = plan_run(Cell.from_options(harness_options(size, blocks, steps, False, 1, "cpu")))
    cfg = plan.cfg
    fpmode.apply(cfg.flush_denormal)  # subnormals as a new run of the harness has them

    def loop(ops):
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.spec, plan.size, ops, "cpu", init=cfg.init_name)
        opt = make_optimizer(model, cfg)

        def step(i: int) -> tuple[float, float]:
            x, y = plan.data.batch("train", i, cfg.seed, cfg.batch_size, cfg.context, "cpu")
            start = time.perf_counter()
            loss = model(x, y)[1]
            loss.backward()
            clip_gradients(model, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            value = loss.item()
            return time.perf_counter() - start, value
        return step
    return {"in place": loop(ReferenceBackend()), "two layers": loop(TwoLayers())}


def bench_round(size: str, blocks: int, steps: int, first: int) -> tuple[float, bool]:
    """(two layers' time / in place's time, whether every loss was the same bits)."""
    sides = _loops(size, blocks, steps)
    order = list(sides)[first:] + list(sides)[:first]
    seconds, losses = {s: 0.0 for s in sides}, {s: [] for s in sides}
    for i in range(steps):
        for side in order:
            dt, loss = sides[side](i)
            seconds[side] += dt if i >= WARM else 0.0
            losses[side].append(loss)
        order.reverse()
    return seconds["two layers"] / seconds["in place"], losses["in place"] == losses["two layers"]


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
    outer = torch.get_num_threads(), fpmode.main_thread_flushing()
    torch.set_num_threads(1)
    try:
        return _run(size, blocks, steps, rounds)
    finally:
        torch.set_num_threads(outer[0])
        fpmode.set_flush_denormal(outer[1])


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
