"""`ablate kernels tune`: whole training steps of one cell's shape timed per kernel backend, with
repeats interleaved, recorded for `--kernels auto` (step_cache.py).

Each backend that loads and passes the quick parity suite on the device gets its own model
(built from the cell's seed, so every backend starts from the same weights), warmed up, then
timed for `steps` whole steps (forward under the cell's autocast, backward, optimizer step) in
each of `repeats` rounds; the backends take turns within a round, in an order that rotates, so
a clock or a neighbour that drifts over seconds falls on all of them. Per-op timings of isolated
calls are not used: on a GPU they measure host latency, which a step may hide or not.

`measure` is what times the steps of one backend (time_steps by default); tests give it a fake
one, since no CUDA device is needed to check what is recorded and picked.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from ablate.core.errors import ConfigError
from ablate.engine.cell import Cell
from ablate.engine.model import build_model
from ablate.engine.train import make_optimizer, plan_run
from ablate.kernels import parity, step_cache
from ablate.kernels.reference import ReferenceBackend
from ablate.kernels.select import failed_parity

WARMUP = 3  # steps before the first timed round: allocator, autotuning, compile


class Stepper:
    """One backend's model, optimizer and batch for the cell; `run(n)` takes n whole steps and
    returns their seconds, synchronised with the device."""

    def __init__(self, plan, ops):
        cfg = plan.cfg
        torch.manual_seed(cfg.seed)
        self.plan, self.model = plan, build_model(cfg.spec, plan.size, ops, plan.device, init=cfg.init_name)
        self.opt = make_optimizer(self.model, cfg)
        self.forward = torch.compile(self.model) if cfg.compile else self.model
        self.x, self.y = plan.data.batch("train", 0, cfg.seed, cfg.batch_size, cfg.context, plan.device)

    def _sync(self) -> None:
        if self.plan.device.type == "cuda":
            torch.cuda.synchronize(self.plan.device)

    def run(self, steps: int) -> float:
        plan = self.plan
        self._sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            with torch.autocast(plan.device.type, dtype=plan.amp, enabled=plan.amp is not None):
                _, loss = self.forward(self.x, self.y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        self._sync()
        return time.perf_counter() - t0


def time_steps(plan, backends: dict[str, object], steps: int, repeats: int,
               progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """Seconds a step per backend, one figure per round, the backends interleaved."""
    steppers = {name: Stepper(plan, ops) for name, ops in backends.items()}
    for stepper in steppers.values():
        stepper.run(WARMUP)
    seconds: dict[str, list[float]] = {name: [] for name in steppers}
    order = list(steppers)
    for round_ in range(repeats):
        for name in order[round_ % len(order):] + order[:round_ % len(order)]:
            seconds[name].append(steppers[name].run(steps) / steps)
        if progress:
            progress(f"round {round_ + 1}/{repeats}: " + ", ".join(f"{n} {s[-1] * 1e3:.2f} ms" for n, s in seconds.items()))
    return seconds


def candidates(names, device: str, say: Callable[[str], None]) -> dict[str, object]:
    """reference, and every backend of `names` that loads and passes the quick parity suite on
    the device (each one left out is said, with why)."""
    out: dict[str, object] = {"reference": ReferenceBackend()}
    for name, backend in parity.load_backends(tuple(n for n in names if n != "reference"), device).items():
        details: dict = {"parity": {}, "skipped": {}}
        if isinstance(backend, str):
            say(f"{name}: not timed ({backend})")
        elif failed_parity(name, backend, device, details, quiet=True):
            say(f"{name}: not timed ({details['skipped'][name]})")
        else:
            out[name] = backend
    return out


def tune(plan, names, steps: int, repeats: int, measure=time_steps, key=None,
         say: Callable[[str], None] = print) -> dict:
    """Time `plan`'s step with each backend of `names` (and reference) and record it; returns
    {"seconds", "choice", "path"}. `key`: the device key (step_cache.device_key by default)."""
    device = str(plan.device)
    backends = candidates(names, device, say)
    seconds = measure(plan, backends, steps, repeats, progress=say)
    shape = step_cache.step_shape(plan.cfg, plan.size, plan.amp)
    where = step_cache.record(key if key is not None else step_cache.device_key(device), shape, seconds, steps)
    return {"seconds": seconds, "choice": step_cache.fastest(seconds), "path": where}


def tune_cell(options: dict, names, steps: int, repeats: int) -> int:
    """Plan the cell of `options` as `ablate train` would (on reference), refuse anything but a
    CUDA device, then time and record (tune) and print each backend's step against reference."""
    plan = plan_run(Cell.from_options({**options, "kernels": "reference"}))
    if plan.device.type != "cuda":
        raise ConfigError(f"ablate kernels tune times steps on a CUDA device, not on {plan.device} (on a CPU `auto` "
                          "takes `cpu` once it passes its parity check); valid: --device cuda or cuda:N on a machine "
                          "with a GPU")
    print(f"ablate kernels tune on {plan.device}: {plan.cfg.size.name} x {plan.cfg.batch_size} x {plan.cfg.context}, "
          f"{repeats} interleaved rounds of {steps} steps per backend", flush=True)
    result = tune(plan, names, steps, repeats, say=lambda line: print(f"  {line}", flush=True))
    ref = min(result["seconds"]["reference"])
    for name, times in result["seconds"].items():
        best, worst = min(times), max(times)
        print(f"{name:<10} {best * 1e3:9.2f} ms a step (fastest round; slowest {worst * 1e3:.2f}), "
              f"{ref / best:.2f}x reference")
    print(f"--kernels auto on this device, driver and libraries, for this step: {result['choice']} "
          f"(recorded in {result['path']})")
    return 0
