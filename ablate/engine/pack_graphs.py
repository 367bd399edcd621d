"""A pack's step captured in CUDA graphs and replayed (CUDA only; never reached on a CPU).

A small model's step is hundreds of kernel launches of a few microseconds each: on a GPU the host
that launches them is the bottleneck, not the chip. A CUDA graph records the launches of one step
once and replays them with one call. The pack's step (ablate/engine/pack_train.py, `PackRun.body`) was
written for it: it reads nothing back to the host, updates its state in place (weights, AdamW
moments, step count, the divergence mask), and takes the step and its rates from device tensors
(`step_index`, `lr_now`) that are filled before each replay. One graph per kind of step: plain, and
logged (the per-layer probes); the stability probes' steps (every probe_every-th) run eagerly.

Capturing needs warm-up steps first (on a side stream, as torch.cuda.graphs asks), which would
train: the pack's state is copied before them and restored after, so a captured pack trains the
same steps as an eager one. Whether a replayed step gives the eager step's bits on a device is
for the device check to show (`python -m ablate.bench.packs --captured` prints the difference);
until it has, capture stays off (ablate.engine.pack_train.CAPTURE_ON_CUDA) and the eager step, which
already runs without a host sync, is what runs.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from typing import Any

import torch

WARMUP_STEPS = 3  # eager steps on a side stream before a capture (torch.cuda.graphs' advice)
# torch.cuda.set_sync_debug_mode while a pack's step runs on CUDA: a host sync inside it warns
# (once per place), where the CPU tests can only count the readbacks (tests/ablate/engine/test_pack_train.py).
STEP_SYNC_DEBUG = "warn"


@contextlib.contextmanager
def syncs_flagged(device: torch.device):
    """On CUDA, any host sync in the block warns (STEP_SYNC_DEBUG); elsewhere nothing."""
    if device.type != "cuda":
        yield
        return
    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(STEP_SYNC_DEBUG)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(old)


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph
    x: torch.Tensor  # the static inputs the graph reads
    y: torch.Tensor
    record: Any  # the StepRecord whose tensors the graph writes


class CapturedSteps:
    """The captured kinds of step of one PackRun, made on first use."""

    def __init__(self, pack):
        self.pack = pack  # the PackRun
        self.graphs: dict[bool, _Graph] = {}
        self.failed = False

    def replay_step(self, step: int, logged: bool, x: torch.Tensor, y: torch.Tensor):
        """The step `step` (its step_index and lr_now already filled) by replaying its graph."""
        run = self.pack
        if self.failed:
            return run.body(step, logged, False, x, y)
        if logged not in self.graphs:
            try:
                self.graphs[logged] = self._capture(step, logged, x, y)
            except Exception as e:  # noqa: BLE001  (a plugin's op cannot be captured: run eagerly)
                self.failed = True
                print(f"ablate: the pack's step cannot be captured in a CUDA graph ({type(e).__name__}: "
                      f"{' '.join(str(e).split())[:120]}); it runs eagerly", file=sys.stderr, flush=True)
                return run.body(step, logged, False, x, y)
        g = self.graphs[logged]
        g.x.copy_(x)
        g.y.copy_(y)
        g.graph.replay()
        rec = g.record
        # The graph writes the same memory on every replay: the record keeps copies (on the device).
        return type(rec)(step, rec.loss.clone(), rec.parts.clone() if rec.parts is not None else None, list(rec.names))

    def _capture(self, step: int, logged: bool, x: torch.Tensor, y: torch.Tensor) -> _Graph:
        run = self.pack
        saved = _state(run)
        kept = [t.clone() for t in saved]
        static_x, static_y = x.clone(), y.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                run.body(step, logged, False, static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        run.capturing = True
        try:
            with torch.cuda.graph(graph):
                record = run.body(step, logged, False, static_x, static_y)
        finally:
            run.capturing = False
        with torch.no_grad():
            for t, k in zip(saved, kept):  # the warm-up steps trained: undo them, in place
                t.copy_(k)
        return _Graph(graph, static_x, static_y, record)


def _state(run) -> list[torch.Tensor]:
    """Every tensor a step changes, in place."""
    return [run.flat.flat.detach(), run.opt.exp_avg, run.opt.exp_avg_sq, run.opt.step_t, run.first, run.active,
            run.diverged_at]
