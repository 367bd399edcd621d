"""Two copies of one model, built from one seed, trained in turn step by step in one process
through the training loop's own step (ablate.train.train_step). Steps a few milliseconds apart
see the same machine, so the ratio of the copies' summed step times is what differs between
them, not the machine's load. Where the copies compute the same math their losses must be the
same bits, and a round says whether they were. Used by `ablate bench --only probes`
(bench/probe_cost.py) and `ablate bench --only cpu-mlp` (bench/cpu_kernels.py)."""
from __future__ import annotations

import contextlib

import torch

from ablate import fpmode
from ablate.bench.timing import time_calls

WARM = 3  # steps of each round left out of its timing


def plan_for(model: str, layers: int | None, steps: int, threads: int, probes: bool, **extra):
    """The bench's harness run (ablate/bench/steps.py) planned, on the CPU, with subnormals as a
    new run of the harness has them."""
    from ablate.bench.steps import harness_options
    from ablate.cell import Cell
    from ablate.train import plan_run

    plan = plan_run(Cell.from_options(harness_options(model, layers, steps, probes, threads, "cpu", **extra)))
    fpmode.apply(plan.cfg.flush_denormal)
    return plan


def build_copy(plan, ops=None, probed: bool = False) -> tuple:
    """(model, optimizer, probes or None) from the plan's seed; `ops` a kernel backend (the plan's)."""
    from ablate.model import build_model
    from ablate.probes import Probes
    from ablate.train import make_optimizer

    cfg = plan.cfg
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.spec, plan.size, ops or plan.ops, plan.device, init=cfg.init_name)
    model.record_act_norms = probed
    probes = Probes(model, autocast=(plan.device.type, plan.amp)) if probed else None
    return model, make_optimizer(model, cfg), probes


def steps_in_turn(plan, copies: list[tuple], first: int, steps: int | None = None,
                  before=lambda i: None) -> tuple[list[list[float]], list[list[float]]]:
    """Each copy's seconds and loss a step for `steps` steps (the plan's), copy `first` going
    first and the order alternating; before(i) runs untimed ahead of copy i's step."""
    from ablate.train import train_step

    cfg = plan.cfg
    seconds, losses = [[] for _ in copies], [[] for _ in copies]
    order = [first, *[i for i in range(len(copies)) if i != first]]
    for step in range(steps or cfg.steps):
        x, y = plan.data.batch("train", step, cfg.seed, cfg.batch_size, cfg.context, plan.device)
        for i in order:
            model, opt, probes = copies[i]
            before(i)
            seconds[i] += time_calls(lambda: losses[i].append(train_step(plan, model, model, opt, probes, step, x, y)[0]),
                                     repeats=1, warmup=0)
        order.reverse()
    return seconds, losses


def round_in_turn(plan, copies: list[tuple], first: int) -> tuple[list[float], bool]:
    """Each copy's summed step seconds after the first WARM steps (steps_in_turn), and whether
    every step's losses were the same bits."""
    seconds, losses = steps_in_turn(plan, copies, first)
    return [sum(s[WARM:]) for s in seconds], all(lost == losses[0] for lost in losses[1:])


@contextlib.contextmanager
def threads_and_flushing(threads: int):
    """Run at `threads` torch threads; the caller's threads and subnormal setting restored after."""
    outer = torch.get_num_threads(), fpmode.main_thread_flushing()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(outer[0])
        fpmode.set_flush_denormal(outer[1])
