"""`ablate kernels check|bench`: the kernel backends against `reference`, and their speed.

check  runs the parity suite (ablate/kernels/parity.py) for every GPU backend on this machine
       and prints op x backend: max relative error and pass/fail; exit status 1 on any failure.
       Without a GPU, the Triton kernels run in Triton's interpreter on the CPU
       (TRITON_INTERPRET=1 is set before Triton loads) and `cuda` is reported unavailable.
       `--backends cpu` checks the `cpu` backend on the ops it has C kernels for, as `auto` does.
bench  times each op forward and forward + backward for PyTorch eager, torch.compile and the
       kernel backends on the same inputs (ablate/bench/kernel_ops.py; also `ablate bench --only kernels`).
"""
from __future__ import annotations

import os
import sys

GPU_BACKENDS = ("triton", "cuda")


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


def _device(arg):
    import torch

    from ablate.errors import ConfigError

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
    from ablate.errors import ConfigError

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
    device = _device(args.device)
    if args.action == "check":
        return _check(args, device)
    return _bench(args, device)


def _cpu_kernels() -> str:
    """The CPU C kernels the `cpu` backend computes with on this machine, each loaded first: a cached
    library that does not verify is rebuilt (ablate/kernels/cpu_cache.py), and one that cannot
    be built is named with why."""
    from ablate.kernels import cpu_attention, cpu_gelu

    parts = []
    for what, kernel in (("GELU", cpu_gelu.KERNEL), ("attention", cpu_attention.KERNEL)):
        lib, why = kernel.library()
        parts.append(f"{what} {kernel.best()}" + ("" if lib is not None else f" (the C kernel is not used: {why})"))
    return "the cpu backend's forms: " + ", ".join(parts)


def _check(args, device) -> int:
    names = _backend_names(args.backends, ",".join(GPU_BACKENDS), (*GPU_BACKENDS, "cpu"))  # cpu: its own ops' cases
    interpreted = _interpret_triton_on_cpu(device)
    from ablate.kernels import parity

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
    import torch

    from ablate.errors import ConfigError

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
    from ablate.bench import kernel_ops as bench
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
