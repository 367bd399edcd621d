"""Learning-rate schedules after warmup (the `schedule` option). Each maps training progress
after warmup, t in [0, 1], to a multiplier of the peak lr; the linear warmup before it is the
engine's (ablate/engine/lr.py), the same for every schedule.

    constant  1
    cosine    min_lr_ratio + (1 - min_lr_ratio) (1 + cos(pi t)) / 2
    wsd       warmup-stable-decay (Hu et al. 2024, MiniCPM): 1 until the last `decay_fraction`
              of the steps, then linear to min_lr_ratio at the last step

A schedule declares the options it reads (`options=`, as optimizers do: variants/optimizers.py).
"""
from __future__ import annotations

import math

from ablate.core.checks import unit
from ablate.variants.tables import ComponentOption, SCHEDULES


@SCHEDULES.register("constant")
def constant(t: float, cfg) -> float:
    return 1.0


@SCHEDULES.register("cosine")
def cosine(t: float, cfg) -> float:
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t))


@SCHEDULES.register("wsd", options=(ComponentOption("decay_fraction", float, 0.2,
                                                      "wsd: the last fraction of steps that decays linearly", unit),))
def wsd(t: float, cfg) -> float:
    decay = SCHEDULES.settings("wsd", cfg)["decay_fraction"]
    stable = 1 - decay
    if t <= stable or decay == 0:
        return 1.0
    return 1 - (1 - cfg.min_lr_ratio) * (t - stable) / decay
