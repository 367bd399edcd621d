"""The one timing loop every benchmark and the time estimate use, the conditions it runs under
(torch threads, subnormals), and how its figures are printed."""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable


WALL_CLOCK = (time.perf_counter, lambda start, end: end - start)  # (mark, seconds between two marks)


def cuda_events():
    """WALL_CLOCK's kind on the GPU's own timeline: the host's Python between calls is not counted."""
    import torch  # lazy: keeps torch off `ablate bench --help`

    def mark():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def between(start, end):
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    return mark, between


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1, calls: int = 1, clock=None,
               before: Callable[[], object] = lambda: None) -> list[float]:
    """Seconds a call of `fn`, one sample per repeat (each the mean of `calls` calls), after
    `warmup` untimed calls; `before()` runs untimed ahead of each repeat (a cache flush)."""
    mark, between = clock or WALL_CLOCK
    for _ in range(warmup):
        fn()
    marks = []
    for _ in range(repeats):
        before()
        start = mark()
        for _ in range(calls):
            fn()
        marks.append((start, mark()))
    return [between(start, end) / calls for start, end in marks]


def host_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1, calls: int = 20,
                 sync: Callable[[], object] = lambda: None) -> list[float]:
    """Host time: wall seconds a call of `fn` takes to return, the mean of `calls` back-to-back
    calls per sample, with the device drained (`sync`) untimed before each sample. On a GPU this
    is the time to enqueue the work, not to do it; on a CPU it is the work."""
    return time_calls(fn, repeats, warmup, calls, clock=WALL_CLOCK, before=sync)


def graph_seconds(fn: Callable[[], object], device, repeats: int, calls: int = 20, warmup: int = 3) -> list[float]:
    """GPU time of one call of `fn`: `calls` calls captured in one CUDA graph, the graph replayed
    between CUDA events, so no host time is counted (the host launches one graph). Warm-up and
    capture run on one side stream (cached per-stream buffers are made before the capture).
    Raises whatever capture raises (an op that syncs, or allocates host memory, cannot be captured)."""
    import torch  # lazy: keeps torch off `ablate bench --help`

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    return [t / calls for t in time_calls(graph.replay, repeats, warmup=1, clock=cuda_events())]


def steady_seconds(fn: Callable[[], object], repeats: int, calls: int = 20, warmup: int = 3) -> list[float]:
    """GPU time of one call of `fn` without a graph: `calls` back-to-back calls between CUDA
    events, the mean per call. Host-bound ops show their host time here (the GPU waits on it)."""
    return time_calls(fn, repeats, warmup, calls, clock=cuda_events())


def once(fn: Callable[[], object]) -> float:
    """Seconds of one call of `fn`, no warm-up (a step, a process)."""
    return time_calls(fn, 1, warmup=0)[0]


def interleaved(fns: dict, rounds: int, repeats: int = 1, warmup: int = 1, calls: int = 1) -> dict[object, list[float]]:
    """Each of `fns` timed in turn, round after round, so a machine whose speed drifts slows
    them all alike: name -> one sample (the round's mean) per round."""
    samples: dict = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(statistics.fmean(time_calls(fn, repeats, warmup, calls)))
    return samples


@contextlib.contextmanager
def threads(n: int):
    """Run at `n` torch threads; the caller's threads and subnormal setting restored after."""
    import torch  # lazy: keeps torch off `ablate bench --help`

    from ablate.engine import fpmode  # lazy: keeps torch off `ablate bench --help`

    outer = torch.get_num_threads(), fpmode.main_thread_flushing()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(outer[0])
        fpmode.set_flush_denormal(outer[1])


def spread(values: list[float], form: str = ".3g", unit: str = "") -> str:
    """'MEDIAN [MIN..MAX]' of ratios or times, as every bench prints them."""
    return f"{statistics.median(values):{form}}{unit} [{min(values):{form}}..{max(values):{form}}]"


def header(*names: str) -> str:
    """A markdown table's first two lines."""
    return row(*names) + "\n|" + "---|" * len(names)


def row(*cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"
