"""What the probes cost a step, in lockstep (`ablate bench --only probes`, bench/lockstep.py):
two copies of one model, same seed, same batches, step in turn in one process through the
training loop's own step (ablate.train.train_step), one with every probe on (at log_every 1 and the harness's
probe_every, as `--only steps` has them) and one with none. Steps a few milliseconds apart see
the same machine, where `--only steps` reads the probes as the difference of two separate runs
each against the plain loop, whose spread is the machine's. The probes do not change the
math (clipping reuses their gradient norms, the ones torch's clip computes), so both copies'
losses must be the same bits; a round whose losses differ is reported."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from ablate.bench.lockstep import WARM, build_copy, plan_for, round_in_turn, threads_and_flushing


@dataclass
class ProbeCost:
    model: str
    n_layer: int
    steps: int
    overheads: list[float]  # per round: on time / off time - 1
    differing: int  # rounds whose losses were not the same bits

    def describe(self) -> str:
        o = self.overheads
        return (f"| {self.model} | {self.n_layer} | {len(o)} x {self.steps} | {statistics.median(o):+.2%} "
                f"[{min(o):+.2%}..{max(o):+.2%}] | {statistics.fmean(o):+.2%} | "
                f"{'yes' if not self.differing else f'no, {self.differing} round(s) differ'} |")


HEADER = ("the probes' cost in lockstep (one model twice in one process, every probe on / none, step by step; "
          f"the first {WARM} steps of a round untimed):\n"
          "| model | blocks | rounds x steps | overhead, median [range] of rounds | mean | same losses |\n"
          "|---|---|---|---|---|---|")


def probe_round(model: str, layers: int | None, steps: int, threads: int, first: int,
                probe_every: int | None = None) -> tuple[float, bool]:
    """(on time / off time - 1, whether the losses were the same bits), copy `first` going first."""
    extra = {"probe_every": probe_every} if probe_every else {}
    plan = plan_for(model, layers, steps, threads, True, **extra)
    seconds, same = round_in_turn(plan, [build_copy(plan, probed=True), build_copy(plan)], first)
    return seconds[0] / seconds[1] - 1, same


def probe_cost(model: str, layers: int | None, steps: int, rounds: int, threads: int,
               probe_every: int | None = None) -> ProbeCost:
    from ablate.sizes import get_size

    with threads_and_flushing(threads):
        results = [probe_round(model, layers, steps, threads, r % 2, probe_every) for r in range(rounds)]
    return ProbeCost(model, get_size(model).with_layers(layers).n_layer, steps, [o for o, _ in results],
                     sum(not same for _, same in results))
