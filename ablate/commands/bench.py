"""`ablate bench`: every measurement of the harness itself, as tables to paste: its cost
against a plain nanoGPT-style loop and the machine's matmul peak, and the kernels against
torch's ops. The arguments are checked here; the parts run in ablate/bench/parts.py
(docs/performance.md)."""
from __future__ import annotations

import math
import re

from ablate.bench.parts import OPT_IN, PARTS, Settings, run_parts
from ablate.core.counts import shown
from ablate.core.errors import ConfigError
from ablate.engine.sizes import get_size

# Each whole-number option's ceiling (its floor is 1; --steps' is SKIP + 3), far past any measurement:
# a larger value is a typo, refused before anything is built. One per field of the parts' Settings.
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
    parts, models, shape = _checked(args)
    return run_parts(parts, models, shape, Settings(**{name: getattr(args, name) for name in CEILINGS}))
