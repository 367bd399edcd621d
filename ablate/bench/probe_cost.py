"""What the probes cost a step, in lockstep (`ablate bench --only probes`): two copies of one
model, same seed, same batches, step in turn in one process through the training loop's own
step (ablate.train.train_step), one with every probe on (at log_every 1 and the harness's
probe_every, as `--only steps` has them) and one with none. Steps a few milliseconds apart see
the same machine, where `--only steps` reads the probes as the difference of two separate runs
each against the plain loop, whose spread is the machine's. The probes do not change the
math (clipping reuses their gradient norms, the ones torch's clip computes), so both copies'
losses must be the same bits; a round whose losses differ is reported."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ablate import fpmode

WARM = 3  # steps of each round left out of its timing


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


def _copies(model: str, layers: int | None, steps: int, threads: int, probe_every: int | None):
    from ablate.bench.steps import harness_options
    from ablate.cell import Cell
    from ablate.model import build_model
    from ablate.probes import Probes
    from ablate.train import make_optimizer, plan_run

    extra = {"probe_every": probe_every} if probe_every else {}
    plan = plan_run(Cell.from_options(harness_options(model, layers, steps, True, threads, "cpu", **extra)))
    cfg = plan.cfg
    fpmode.apply(cfg.flush_denormal)  # subnormals as a new run of the harness has them
    copies = []
    for probed in (True, False):
        torch.manual_seed(cfg.seed)
        net = build_model(cfg.spec, plan.size, plan.ops, plan.device, init=cfg.init_name)
        net.record_act_norms = probed
        probes = Probes(net, autocast=(plan.device.type, plan.amp)) if probed else None
        copies.append((net, make_optimizer(net, cfg), probes))
    return plan, copies


def probe_round(model: str, layers: int | None, steps: int, threads: int, first: int,
                probe_every: int | None = None) -> tuple[float, bool]:
    """(on time / off time - 1, whether the losses were the same bits), copy `first` going first."""
    from ablate.train import train_step

    plan, copies = _copies(model, layers, steps, threads, probe_every)
    cfg = plan.cfg
    seconds, losses = [0.0, 0.0], [[], []]
    order = [first, 1 - first]
    for step in range(steps):
        x, y = plan.data.batch("train", step, cfg.seed, cfg.batch_size, cfg.context, plan.device)
        for i in order:
            net, opt, probes = copies[i]
            start = time.perf_counter()
            loss = train_step(plan, net, net, opt, probes, step, x, y)[0]
            seconds[i] += time.perf_counter() - start if step >= WARM else 0.0
            losses[i].append(loss)
        order.reverse()
    return seconds[0] / seconds[1] - 1, losses[0] == losses[1]


def probe_cost(model: str, layers: int | None, steps: int, rounds: int, threads: int,
               probe_every: int | None = None) -> ProbeCost:
    from ablate.sizes import get_size

    outer = torch.get_num_threads(), fpmode.main_thread_flushing()
    torch.set_num_threads(threads)
    try:
        results = [probe_round(model, layers, steps, threads, r % 2, probe_every) for r in range(rounds)]
    finally:
        torch.set_num_threads(outer[0])
        fpmode.set_flush_denormal(outer[1])
    return ProbeCost(model, get_size(model).with_layers(layers).n_layer, steps, [o for o, _ in results],
                     sum(not same for _, same in results))
