"""`ablate bench`'s parts: which module measures each part, and the run of the parts asked for,
each printed as a table to paste (docs/performance.md).

The top of this module is light: `ablate bench --help` reads PARTS from it before torch loads.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ablate.bench.timing import threads
from ablate.core.cores import cpu_count

PARTS = ("steps", "probes", "grid", "startup", "memory", "gpu", "subnormals", "profile",
         "cpu-gelu", "cpu-attention", "cpu-mlp", "kernels")
OPT_IN = ("subnormals", "probes", "kernels", "cpu-gelu", "cpu-attention", "cpu-mlp")  # only when asked for


@dataclass(frozen=True)
class Settings:
    """The measurements' sizes, as `ablate bench` takes them (None: the part's own default)."""

    steps: int  # training steps per timed run
    repeats: int  # interleaved repeats of each comparison
    layers: int | None = None  # depth of every size in the step comparison and profile
    threads: int | None = None  # torch threads (None: torch's)
    probe_every: int | None = None  # the harness's probe interval in the step comparison
    grid_steps: int = 100  # steps per cell of the grid scaling run
    workers: int | None = None  # workers of the grid scaling run (None: the cores)
    subnormal_steps: int | None = None  # steps of each lockstep pair of the subnormals part


def run_parts(parts: list[str], models: list[str], shape: tuple[int, ...] | None, settings: Settings) -> int:
    """Run each part of `parts` in turn and print what it measured; the parts' exit statuses, or-ed."""
    import torch  # lazy: this module's top stays light (PARTS, for `ablate bench --help`)

    n = settings.threads or torch.get_num_threads()
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    print(f"ablate bench ({n} torch thread{'s' if n != 1 else ''}, {cpu_count()} cores{load}, "
          f"torch {torch.__version__})\n")
    status = 0
    with threads(n):  # every part of this process; a caller in the same process (a test) is left as it was
        runners = _runners(settings, models, shape, n)
        for part in parts:
            result = runners[part]()
            if isinstance(result, int):  # printed as it went; its exit status
                status |= result
                continue
            for line in [result] if isinstance(result, str) else result:
                print(line, flush=True)
            print()
    return status


def _runners(s: Settings, models: list[str], shape: tuple[int, ...] | None, n: int) -> dict:
    """Each part: () -> its text, its lines as measured, or (where it prints its own) its exit status."""
    # lazy: as run_parts
    from ablate.bench import cpu_kernels, grid_scaling, harness, kernel_ops, probe_cost, step_report, subnormals

    def mlp() -> int:
        text, same = cpu_kernels.mlp(models[0], s.layers or 12, s.steps, s.repeats)
        print(text + "\n", flush=True)
        return 0 if same else 1

    return {
        "steps": lambda: step_report.report(models, s.layers, s.steps, s.repeats, n, s.probe_every),
        "probes": lambda: probe_cost.report(models, s.layers, s.steps, s.repeats, n, s.probe_every),
        "grid": lambda: grid_scaling.grid_scaling(s.workers, steps=s.grid_steps,
                                                  repeats=min(s.repeats, 2)).describe(),
        "startup": harness.startup_cost,
        "memory": harness.peak_memory,
        "gpu": harness.gpu_figures,
        "subnormals": lambda: subnormals.report(s.subnormal_steps, s.threads or 1),
        "profile": lambda: harness.profile_steps(models[0], s.layers),
        "cpu-gelu": lambda: cpu_kernels.gelu(shape or cpu_kernels.GELU_SHAPE),
        "cpu-attention": lambda: cpu_kernels.attention(shape or cpu_kernels.ATTENTION_SHAPE),
        "cpu-mlp": mlp,
        "kernels": lambda: kernel_ops.bench(repeats=max(s.repeats, 10)),
    }
