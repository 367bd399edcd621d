"""`ablate kernels check|bench|tune`: the kernel backends against `reference`, and their speed.

check  runs the parity suite (ablate/kernels/parity.py) for every GPU backend on this machine
       and prints op x backend: max relative error and pass/fail (ablate/kernels/check.py); exit
       status 1 on any failure.
       Without a GPU, the Triton kernels run in Triton's interpreter on the CPU
       (TRITON_INTERPRET=1 is set before Triton loads) and `cuda` is reported unavailable.
       `--backends cpu` checks the `cpu` backend on the ops it has C kernels for, as `auto` does.
bench  times each op forward and forward + backward for PyTorch eager, torch.compile and the
       kernel backends on the same inputs (ablate/bench/kernel_ops.py; also `ablate bench --only kernels`).
tune   times whole training steps of one cell's shape per backend on a CUDA device, repeats
       interleaved, and records them for `--kernels auto` (ablate/bench/step_tune.py): the
       only timing auto takes on a GPU.

The parser takes `ablate train`'s options (tune), so torch loads with it, `--help` included;
each action's library (the parity suite, the bench, the tuning) loads only when it runs.
"""
from __future__ import annotations

import torch

from ablate.commands.train import add_option_flags, collect_options
from ablate.core.errors import ConfigError
from ablate.kernels import GPU_BACKENDS

# The ceilings of tune's counts (a tune is minutes at most; more is a typo).
TUNE_STEPS, TUNE_STEPS_MAX = 10, 1000
TUNE_REPEATS, TUNE_REPEATS_MAX = 5, 100


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True, parser_class=type(p))
    c = sub.add_parser("check", help="parity of every kernel backend with reference (float64)",
                       description="Run the parity suite: each backend's ops, forward and backward, against "
                                   "`reference` evaluated in float64, on many shapes, float32 and bfloat16.")
    c.add_argument("--backends", default=",".join(GPU_BACKENDS),
                   help="comma-separated, of triton, cuda, cpu (default: triton,cuda)")
    c.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when present, else cpu)")
    c.add_argument("--quick", action="store_true", help="two shapes per op instead of the full suite")
    c.add_argument("--verbose", "-v", action="store_true", help="one line per case")
    b = sub.add_parser("bench", help="time each op per backend next to eager and torch.compile",
                       description="Time and achieved bandwidth per op and implementation, forward and "
                                   "forward+backward, with the device's copy bandwidth for scale.")
    b.add_argument("--backends", default=None,
                   help="comma-separated kernel backends (default: those that run natively here)")
    b.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when present, else cpu)")
    b.add_argument("--rows", type=int, default=None,
                   help="rows (batch x sequence) per op (default 16384 on a GPU, 256 on a CPU)")
    b.add_argument("--ops", default=None, help="comma-separated ops (default: all), e.g. act:gelu,layer_norm")
    b.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (median; default 20)")
    b.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile baseline")
    _add_tune(sub)


def _add_tune(sub) -> None:
    t = sub.add_parser("tune", help="time whole training steps per backend for --kernels auto (CUDA)",
                       description="Time whole training steps of the cell the options describe (as `ablate train` "
                                   "takes them) with reference and each backend that passes its parity check on "
                                   "this CUDA device, repeats interleaved, and record them in $ABLATE_CACHE/kernels/"
                                   "step_times.json: `--kernels auto` picks another backend than reference only "
                                   "where it was measured faster so, on this device, driver and library versions.")
    add_option_flags(t, skip=("kernels",))
    t.add_argument("--backends", default=",".join(GPU_BACKENDS), help="comma-separated, of triton, cuda "
                   "(default: triton,cuda; reference is always timed)")
    t.add_argument("--timed-steps", type=int, default=TUNE_STEPS,
                   help=f"whole steps per backend per round (default {TUNE_STEPS}, at most {TUNE_STEPS_MAX})")
    t.add_argument("--repeats", type=int, default=TUNE_REPEATS,
                   help=f"interleaved rounds (default {TUNE_REPEATS}, at most {TUNE_REPEATS_MAX})")


def _device(arg):
    if arg is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        d = torch.device(arg)
    except RuntimeError:
        raise ConfigError(f"unknown device {arg!r}; valid: cpu, cuda, cuda:N") from None
    if d.type not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {arg!r}; valid: cpu, cuda, cuda:N")
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {arg!r} is not available here (no CUDA device); valid here: cpu")
    return str(d)


def _backend_names(arg, default, valid=GPU_BACKENDS):
    names = [n.strip() for n in (arg or default).split(",") if n.strip()]
    bad = [n for n in names if n not in valid]
    if bad:
        raise ConfigError(f"unknown kernel backend {bad[0]!r}; valid: {', '.join(valid)}")
    return names


def _count(flag: str, value: int, ceiling: int) -> int:
    if not 1 <= value <= ceiling:
        raise ConfigError(f"{flag} {value} is out of range; valid: 1 to {ceiling}")
    return value


def run(args) -> int:
    if args.action == "tune":  # its device: the cell's own option
        return _tune(args)
    device = _device(args.device)
    if args.action == "check":
        from ablate.kernels.check import check  # lazy: each action's library loads only when it runs

        return check(_backend_names(args.backends, ",".join(GPU_BACKENDS), (*GPU_BACKENDS, "cpu")),  # cpu: its own ops
                     device, args.quick, args.verbose)
    if args.rows is not None and args.rows < 1:
        raise ConfigError(f"--rows {args.rows} must be at least 1")
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats} must be at least 1")
    from ablate.bench.kernel_ops import bench  # lazy: as check's

    names = _backend_names(args.backends, ",".join(GPU_BACKENDS)) if args.backends else None  # None: the device's
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    return bench(device, names, args.rows, ops, args.repeats, args.compile)


def _tune(args) -> int:
    """The counts and backends checked, the options read as `ablate train` reads them; the cell
    planned, timed and recorded by step_tune.tune_cell."""
    from ablate.bench.step_tune import tune_cell  # lazy: as check's in run

    steps = _count("--timed-steps", args.timed_steps, TUNE_STEPS_MAX)
    repeats = _count("--repeats", args.repeats, TUNE_REPEATS_MAX)
    names = _backend_names(args.backends, ",".join(GPU_BACKENDS))
    options, _ = collect_options(args)
    return tune_cell(options, names, steps, repeats)
