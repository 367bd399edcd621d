"""Copies of one model, built from one seed, stepped in turn in one process through the training
loop's own step (ablate.engine.train.train_step). Steps a few milliseconds apart see the same machine,
so the ratio of the copies' summed step times is what differs between them, not the machine's
load; where the copies compute the same math, their losses must be the same bits. The probes
part (bench/probe_cost.py), cpu-mlp (bench/cpu_kernels.py), subnormals and the time estimate
step this way."""
from __future__ import annotations

import torch

from ablate.bench.timing import once
from ablate.engine import fpmode
from ablate.engine.cell import Cell
from ablate.engine.model import build_model
from ablate.engine.probes import Probes
from ablate.engine.train import make_optimizer, plan_run, train_step

WARM = 3  # steps of each round left out of its timing


def plan_cell(options: dict):
    """The cell's plan, with subnormals as a new run of the harness has them."""
    plan = plan_run(Cell.from_options(options))
    fpmode.apply(plan.cfg.flush_denormal)
    return plan


def build_copy(plan, ops=None, probed: bool = False) -> tuple:
    """(model, optimizer, probes or None) from the plan's seed; `ops` a kernel backend (the plan's)."""
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

    cfg = plan.cfg
    seconds, losses = [[] for _ in copies], [[] for _ in copies]
    order = [first, *[i for i in range(len(copies)) if i != first]]
    for step in range(steps or cfg.steps):
        x, y = plan.data.batch("train", step, cfg.seed, cfg.batch_size, cfg.context, plan.device)
        for i in order:
            model, opt, probes = copies[i]
            before(i)
            seconds[i].append(once(lambda: losses[i].append(
                train_step(plan, model, model, opt, probes, step, x, y)[0])))
        order.reverse()
    return seconds, losses


def rounds_in_turn(plan, make_copies, rounds: int) -> tuple[list[float], int]:
    """Per round, copy 1's summed step seconds over copy 0's after the first WARM steps, the
    copies fresh from make_copies() and taking turns to go first; and how many rounds' losses
    were not the same bits."""
    ratios, differing = [], 0
    for r in range(rounds):
        seconds, losses = steps_in_turn(plan, make_copies(), r % 2)
        ratios.append(sum(seconds[1][WARM:]) / sum(seconds[0][WARM:]))
        differing += losses[0] != losses[1]
    return ratios, differing
