"""The one timing loop every benchmark and the time estimate use."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1, calls: int = 1,
               sync: Callable[[], object] = lambda: None) -> list[float]:
    """Seconds a call of `fn`, one sample per repeat (each the mean of `calls` calls), after
    `warmup` untimed calls. `sync` waits for queued work (torch.cuda.synchronize on a GPU)."""
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return samples


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, repeats: int = 1, warmup: int = 1,
                calls: int = 1) -> dict[str, list[float]]:
    """Each of `fns` timed in turn, round after round (time_calls), so a machine whose speed
    drifts slows them all alike: name -> one sample (the round's mean) per round."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(statistics.fmean(time_calls(fn, repeats, warmup, calls)))
    return samples


def spread(values: list[float]) -> str:
    """'MEDIAN [MIN..MAX]' of ratios or times, as every bench prints them."""
    return f"{statistics.median(values):.3g} [{min(values):.3g}..{max(values):.3g}]"
