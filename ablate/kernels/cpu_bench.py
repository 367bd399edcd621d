"""Interleaved timing of CPU kernels against torch's ops, shared by the kernels' benches
(cpu_gelu_bench.py, cpu_attention_bench.py).

The implementations take turns, round after round, so a machine whose speed drifts slows them
all alike; each figure is the median over the rounds of a round's mean microseconds per call,
with the rounds' range. One thread.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import torch

ROUNDS, CALLS = 15, 50
KINDS = ("fwd", "bwd")


def interleave(impls: dict[str, tuple[Callable[[], object], Callable[[], object]]], rounds: int = ROUNDS,
               calls: int = CALLS) -> list[tuple[str, str, list[float]]]:
    """[(implementation, 'fwd' or 'bwd', microseconds a call per round)] for name -> (fwd, bwd)."""
    times = {(name, kind): [] for name in impls for kind in KINDS}
    outer = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(rounds):
            for name, pair in impls.items():
                for kind, fn in zip(KINDS, pair):
                    fn()
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    times[name, kind].append((time.perf_counter() - t0) / calls * 1e6)
    finally:
        torch.set_num_threads(outer)
    return [(name, kind, values) for (name, kind), values in times.items()]


def shape_from(prog: str, argv: list[str], default: tuple[int, ...], what: str) -> tuple[int, ...] | None:
    """The shape the command line gives (`default` when none), or None after one line on stderr."""
    bad = [a for a in argv if not (a.isdigit() and int(a) > 0)]
    if bad:
        print(f"{prog}: {bad[0]!r} is not a dimension; valid: positive integers, {what} (default "
              f"{' '.join(map(str, default))})", file=sys.stderr)
        return None
    return tuple(int(a) for a in argv) or default


def print_table(title: str, rows: list[tuple[str, str, list[float]]]) -> None:
    print(f"{title}, 1 thread (median of {ROUNDS} interleaved rounds of {CALLS} calls, and their range)")
    print(f"{'implementation':<14} {'kind':<4} {'us/call':>9}  range")
    for name, kind, values in rows:
        print(f"{name:<14} {kind:<4} {statistics.median(values):9.1f}  {min(values):.1f}..{max(values):.1f}")
