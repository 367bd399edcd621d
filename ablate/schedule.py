"""Learning-rate schedules: linear warmup, then constant or cosine decay."""
from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, warmup: int, steps: int, schedule: str, min_lr_ratio: float) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    span = max(steps - warmup, 1)
    progress = min((step - warmup) / span, 1.0)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
