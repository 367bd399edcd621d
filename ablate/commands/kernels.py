"""`ablate kernels check|bench`: the kernel backends against `reference`, and their speed.

check  runs the parity suite (ablate/kernels/parity.py) for every GPU backend on this machine
       and prints op x backend: max relative error and pass/fail; exit status 1 on any failure.
       Without a GPU, the Triton kernels run in Triton's interpreter on the CPU
       (TRITON_INTERPRET=1 is set before Triton loads) and `cuda` is reported unavailable.
       `--backends cpu` checks the `cpu` backend on the ops it has C kernels for, as `auto` does.
bench  times each op forward and forward + backward for PyTorch eager, torch.compile and the
       kernel backends on the same inputs (ablate/bench/kernel_ops.py; also `ablate bench --only kernels`).
tune   times whole training steps of one cell's shape per backend on a CUDA device, repeats
       interleaved, and records them for `--kernels auto` (ablate/bench/step_tune.py): the
       only timing auto takes on a GPU.
"""
from __future__ import annotations

import os
import sys

from ablate.bench import step_tune
from ablate.core.errors import ConfigError

GPU_BACKENDS = ("triton", "cuda")
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
    from ablate.commands.train import add_option_flags  # lazy: keeps torch off `ablate bench --help`

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
    import torch  # lazy: keeps torch off `ablate bench --help`


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


def _interpret_triton_on_cpu(device: str) -> bool:
    """On a CPU, Triton's kernels can only run interpreted; the choice is made when Triton's
    decorators run, so set it before anything imports the Triton backend."""
    if device == "cpu" and "ablate.kernels.triton_kernels" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET") == "1"


def run(args) -> int:
    device = _device(args.device) if args.action != "tune" else None  # tune: the cell's own device option
    if args.action == "check":
        return _check(args, device)
    if args.action == "tune":
        return _tune(args)
    return _bench(args, device)


def _cpu_kernels() -> str:
    """The CPU C kernels the `cpu` backend computes with on this machine, each loaded first: a cached
    library that does not verify is rebuilt (ablate/kernels/cpu_cache.py), and one that cannot
    be built is named with why."""
    from ablate.kernels import cpu_attention, cpu_gelu  # lazy: keeps torch off `ablate bench --help`

    parts = []
    for what, kernel in (("GELU", cpu_gelu.KERNEL), ("attention", cpu_attention.KERNEL)):
        lib, why = kernel.library()
        parts.append(f"{what} {kernel.best()}" + ("" if lib is not None else f" (the C kernel is not used: {why})"))
    return "the cpu backend's forms: " + ", ".join(parts)


def _check(args, device) -> int:
    names = _backend_names(args.backends, ",".join(GPU_BACKENDS), (*GPU_BACKENDS, "cpu"))  # cpu: its own ops' cases
    interpreted = _interpret_triton_on_cpu(device)
    from ablate.kernels import parity  # lazy: keeps torch off `ablate bench --help`

    loaded = parity.load_backends(names, device)
    unavailable = {n: b for n, b in loaded.items() if isinstance(b, str)}
    running = {n: b for n, b in loaded.items() if not isinstance(b, str)}
    notes = []
    if "triton" in running and interpreted:
        notes.append("triton runs in Triton's interpreter on the CPU (TRITON_INTERPRET=1)")
    if device == "cpu":
        notes.append(_cpu_kernels())
    counts = ", ".join(f"{len(parity.cases(device, args.quick, parity.ops_for(n)))} for {n}" for n in running)
    print(f"ablate kernels check on {device}: cases {counts or 'none (no backend runnable)'}"
          + (f"; {'; '.join(notes)}" if notes else ""), flush=True)

    def progress(row):
        if args.verbose:
            state = "ok  " if row.passed else "FAIL"
            detail = row.error or f"fwd {row.fwd_err:.2e} bwd {row.bwd_err:.2e}"
            print(f"  {state} {row.backend:<7} {row.case.id:<44} {detail} ({row.seconds:.2f}s)", flush=True)

    rows = parity.run_suite(running, device, quick=args.quick, progress=progress)
    print(parity.format_table(rows, unavailable))
    if not running:
        print("no kernel backend can run here", file=sys.stderr)
        return 1
    failed = sum(not r.passed for r in rows)
    print(f"{len(rows) - failed}/{len(rows)} cases passed" + (f", {failed} FAILED" if failed else ""))
    return 1 if failed else 0


def _bench(args, device) -> int:
    import torch  # lazy: keeps torch off `ablate bench --help`


    if args.rows is not None and args.rows < 1:
        raise ConfigError(f"--rows {args.rows} must be at least 1")
    if args.repeats < 1:
        raise ConfigError(f"--repeats {args.repeats} must be at least 1")

    on_gpu = device.startswith("cuda")
    # On a CPU the GPU backends would only run interpreted, which measures Python: leave them
    # out unless asked for.
    names = _backend_names(args.backends, ",".join(GPU_BACKENDS)) if (args.backends or on_gpu) else []
    if names and not on_gpu:
        _interpret_triton_on_cpu(device)
    from ablate.bench import kernel_ops as bench  # lazy: keeps torch off `ablate bench --help`
    from ablate.kernels import parity

    loaded = parity.load_backends(names, device) if names else {}
    for n, b in loaded.items():
        if isinstance(b, str):
            print(f"{n}: unavailable ({b})")
    rows = args.rows if args.rows is not None else (16384 if on_gpu else 256)
    cases = bench.default_cases(rows)
    if args.ops:
        wanted = [o.strip() for o in args.ops.split(",") if o.strip()]
        known = sorted({c.op for c in cases})
        bad = [o for o in wanted if o not in known]
        if bad:
            raise ConfigError(f"unknown op {bad[0]!r}; valid: {', '.join(known)}")
        cases = [c for c in cases if c.op in wanted]
    copy_bw = bench.copy_bandwidth(device, bench.timer(device, args.repeats))
    gpu = torch.cuda.get_device_name(torch.device(device)) if on_gpu else "CPU"
    print(f"ablate kernels bench on {device} ({gpu}), rows {rows}, median of {args.repeats}", flush=True)
    print(bench.format_header(copy_bw), flush=True)
    bench.run_bench(cases, loaded, device, use_compile=args.compile, repeats=args.repeats,
                    progress=lambda rs: print(bench.format_case(rs, copy_bw), flush=True))
    return 0


def _count(flag: str, value: int, ceiling: int) -> int:
    if not 1 <= value <= ceiling:
        raise ConfigError(f"{flag} {value} is out of range; valid: 1 to {ceiling}")
    return value


def _tune(args) -> int:
    """Plan the cell as `ablate train` would (on reference), refuse anything but a CUDA device,
    then time and record (step_tune.tune)."""
    from ablate.engine.cell import Cell  # lazy: keeps torch off `ablate bench --help`
    from ablate.commands.train import collect_options
    from ablate.engine.train import plan_run

    steps = _count("--timed-steps", args.timed_steps, TUNE_STEPS_MAX)
    repeats = _count("--repeats", args.repeats, TUNE_REPEATS_MAX)
    names = _backend_names(args.backends, ",".join(GPU_BACKENDS))
    options, _ = collect_options(args)
    plan = plan_run(Cell.from_options({**options, "kernels": "reference"}))
    if plan.device.type != "cuda":
        raise ConfigError(f"ablate kernels tune times steps on a CUDA device, not on {plan.device} (on a CPU `auto` "
                          "takes `cpu` once it passes its parity check); valid: --device cuda or cuda:N on a machine "
                          "with a GPU")
    print(f"ablate kernels tune on {plan.device}: {plan.cfg.size.name} x {plan.cfg.batch_size} x {plan.cfg.context}, "
          f"{repeats} interleaved rounds of {steps} steps per backend", flush=True)
    result = step_tune.tune(plan, names, steps, repeats, say=lambda line: print(f"  {line}", flush=True))
    ref = min(result["seconds"]["reference"])
    for name, times in result["seconds"].items():
        best, worst = min(times), max(times)
        print(f"{name:<10} {best * 1e3:9.2f} ms a step (fastest round; slowest {worst * 1e3:.2f}), "
              f"{ref / best:.2f}x reference")
    print(f"--kernels auto on this device, driver and libraries, for this step: {result['choice']} "
          f"(recorded in {result['path']})")
    return 0
