"""The learning rate at a step: linear warmup, then the configured schedule
(variants/schedules.py) over the remaining steps."""
from __future__ import annotations

from ablate.variants import SCHEDULES


def lr_at(step: int, cfg) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(cfg.steps - cfg.warmup, 1)
    progress = min((step - cfg.warmup) / span, 1.0)
    return cfg.lr * SCHEDULES.get(cfg.schedule)(progress, cfg)
