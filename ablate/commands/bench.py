"""`ablate bench`: every measurement of the harness itself, as tables to paste: its cost
against a plain nanoGPT-style loop and the machine's matmul peak, and the kernels against
torch's ops (ablate/bench/; docs/performance.md)."""
from __future__ import annotations

import argparse
import math
import os
import re

from ablate.bench.timing import threads
from ablate.commands import kernels
from ablate.core.cores import cpu_count
from ablate.core.counts import shown
from ablate.core.errors import ConfigError
from ablate.engine.sizes import get_size

PARTS = ("steps", "probes", "grid", "startup", "memory", "gpu", "subnormals", "profile",
         "cpu-gelu", "cpu-attention", "cpu-mlp", "kernels")
OPT_IN = ("subnormals", "probes", "kernels", "cpu-gelu", "cpu-attention", "cpu-mlp")  # only when asked for
# Each whole-number option's ceiling (its floor is 1; --steps' is SKIP + 3), far past any measurement:
# a larger value is a typo, refused before anything is built.
CEILINGS = {"steps": 100_000, "repeats": 1_000, "layers": 256, "threads": 1_024, "probe_every": 100_000,
            "grid_steps": 100_000, "workers": 1_024, "subnormal_steps": 100_000}
MAX_SHAPE_ELEMENTS = 1 << 28  # --shape: a tensor of 1 GiB of floats at most
_DIMENSION = re.compile(r"[0-9]{1,10}")  # ASCII digits: str.isdigit() also takes '²', which int() refuses


def add_arguments(p) -> None:
    p.add_argument("--only", action="append", metavar="PART[,PART]",
                   help=f"run only these parts (repeatable): {', '.join(PARTS)}; "
                        f"{', '.join(OPT_IN)} run only when named")
    p.add_argument("--shape", help="cpu-gelu's tensor shape (default 16,64,256) or cpu-attention's "
                                   "batch,heads,context,head dimension (default 16,4,64,16)")
    p.add_argument("--steps", type=int, default=60, help="training steps per timed run (default 60, at least 8)")
    p.add_argument("--repeats", type=int, default=5,
                   help="interleaved repeats of each comparison (default 5; the grid scaling run does at most 2)")
    p.add_argument("--models", default="tiny,small", help="sizes for the step comparison (default tiny,small)")
    p.add_argument("--layers", type=int,
                   help="depth of every size in the step comparison and profile (default: the size's)")
    p.add_argument("--threads", type=int, help="torch threads for the step comparison, the matmul peak and the "
                                               "profile (default: torch's, usually the cores)")
    p.add_argument("--probe-every", type=int, help="the harness's stability-probe interval in the step comparison "
                                                   "(default: the harness's; 1 = every probe every step)")
    p.add_argument("--grid-steps", type=int, default=100, help="steps per cell in the grid scaling run (default 100)")
    p.add_argument("--workers", type=int, help="workers of the grid scaling run (default: the cores)")
    p.add_argument("--subnormal-steps", type=int, help="steps of each lockstep pair of `--only subnormals` "
                                                       "(default: the claim cell's own)")


def _checked(args) -> tuple[list[str], list[str], tuple[int, ...] | None]:
    """(the parts, the models, the shape) the arguments name; ConfigError for a bad one."""
    import torch  # lazy: keeps torch off `ablate bench --help`

    from ablate.bench.steps import SKIP  # lazy: keeps torch off `ablate bench --help`

    if args.steps < SKIP + 3:
        raise ConfigError(f"--steps {args.steps}: need at least {SKIP + 3} (the first {SKIP} steps of a run are "
                          "not timed)")
    for name, ceiling in CEILINGS.items():
        value = getattr(args, name)
        floor = SKIP + 3 if name == "steps" else 1
        if value is not None and not floor <= value <= ceiling:
            raise ConfigError(f"--{name.replace('_', '-')} {shown(value, quote=False)}: need a whole number in "
                              f"{floor}..{ceiling}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise ConfigError(f"--models {args.models!r}: need at least one size, e.g. tiny,small")
    for m in models:
        get_size(m)
    parts = [p.strip() for text in args.only or [] for p in text.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS] or ([",".join(args.only)] if args.only and not parts else [])
    if bad:
        raise ConfigError(f"--only {bad[0]!r} is not a part; valid: {', '.join(PARTS)}")
    # The opt-in parts train models twice more (minutes) or time kernels: only when asked for.
    parts = parts or [p for p in PARTS if p not in OPT_IN and (p != "gpu" or torch.cuda.is_available())]
    if args.shape is None:
        return parts, models, None
    dims = args.shape.split(",")
    if not all(_DIMENSION.fullmatch(d.strip()) and int(d) > 0 for d in dims) or len(dims) > 8:
        raise ConfigError(f"--shape {shown(args.shape)}: valid: up to 8 positive integers separated by commas, e.g. "
                          "16,64,256")
    if math.prod(int(d) for d in dims) > MAX_SHAPE_ELEMENTS:
        raise ConfigError(f"--shape {args.shape}: {math.prod(int(d) for d in dims):,} elements; valid: at most "
                          f"{MAX_SHAPE_ELEMENTS:,} (a tensor of 1 GiB of floats)")
    if "cpu-attention" in parts and len(dims) != 4:
        raise ConfigError(f"--shape {args.shape}: cpu-attention takes 4 dimensions; valid: batch,heads,context,head "
                          "dimension, e.g. 16,4,64,16")
    return parts, models, tuple(int(d) for d in dims)


def run(args) -> int:

    import torch  # lazy: keeps torch off `ablate bench --help`


    parts, models, shape = _checked(args)
    n = args.threads or torch.get_num_threads()
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    print(f"ablate bench ({n} torch thread{'s' if n != 1 else ''}, {cpu_count()} cores{load}, "
          f"torch {torch.__version__})\n")
    status = 0
    with threads(n):  # every part of this process; a caller in the same process (a test) is left as it was
        runners = _runners(args, models, shape, n)
        for part in parts:
            result = runners[part]()
            if isinstance(result, int):  # printed as it went; its exit status
                status |= result
                continue
            for line in [result] if isinstance(result, str) else result:
                print(line, flush=True)
            print()
    return status


def _runners(args, models: list[str], shape: tuple[int, ...] | None, n: int) -> dict:
    """Each part: () -> its text, its lines as measured, or (where it prints its own) its exit status."""
    # lazy: keeps torch off `ablate bench --help`
    from ablate.bench import cpu_kernels, grid_scaling, harness, probe_cost, step_report, steps, subnormals

    def mlp() -> int:
        text, same = cpu_kernels.mlp(models[0], args.layers or 12, args.steps, args.repeats)
        print(text + "\n", flush=True)
        return 0 if same else 1

    return {
        "steps": lambda: step_report.report(models, args.layers, args.steps, args.repeats, n, args.probe_every),
        "probes": lambda: probe_cost.report(models, args.layers, args.steps, args.repeats, n, args.probe_every),
        "grid": lambda: grid_scaling.grid_scaling(args.workers, steps=args.grid_steps,
                                                  repeats=min(args.repeats, 2)).describe(),
        "startup": harness.startup_cost,
        "memory": harness.peak_memory,
        "gpu": harness.gpu_figures,
        "subnormals": lambda: subnormals.report(args.subnormal_steps, args.threads or 1),
        "profile": lambda: harness.profile_steps(models[0], args.layers),
        "cpu-gelu": lambda: cpu_kernels.gelu(shape or cpu_kernels.GELU_SHAPE),
        "cpu-attention": lambda: cpu_kernels.attention(shape or cpu_kernels.ATTENTION_SHAPE),
        "cpu-mlp": mlp,
        "kernels": lambda: kernels.run(argparse.Namespace(action="bench", device=None, backends=None, rows=None,
                                                          ops=None, repeats=max(args.repeats, 10), compile=True)),
    }
