"""`ablate bench`: every measurement of the harness itself, as tables to paste: its cost
against a plain nanoGPT-style loop and the machine's matmul peak, and the kernels against
torch's ops (ablate/bench/)."""
from __future__ import annotations

PARTS = ("steps", "probes", "grid", "startup", "memory", "profile", "gpu", "subnormals",
         "kernels", "cpu-gelu", "cpu-attention", "cpu-mlp")
OPT_IN = ("subnormals", "probes", "kernels", "cpu-gelu", "cpu-attention", "cpu-mlp")  # only when asked for


def _parts(texts: list[str] | None) -> list[str] | None:
    """The parts --only names (comma-separated, repeatable); ConfigError for one it does not know."""
    from ablate.errors import ConfigError

    if texts is None:
        return None
    parts = [p.strip() for text in texts for p in text.split(",") if p.strip()]
    bad = [p for p in parts if p not in PARTS] or ([] if parts else [",".join(texts)])
    if bad:
        raise ConfigError(f"--only {bad[0]!r} is not a part; valid: {', '.join(PARTS)}")
    return parts


def _shape(text: str | None, parts: list[str]) -> tuple[int, ...] | None:
    """--shape's dimensions; ConfigError unless positive integers (4 of them for cpu-attention)."""
    from ablate.errors import ConfigError

    if text is None:
        return None
    dims = text.split(",")
    if not all(d.strip().isdigit() and int(d) > 0 for d in dims):
        raise ConfigError(f"--shape {text!r}: valid: positive integers separated by commas, e.g. 16,64,256")
    if "cpu-attention" in parts and len(dims) != 4:
        raise ConfigError(f"--shape {text}: cpu-attention takes 4 dimensions; valid: batch,heads,context,head "
                          "dimension, e.g. 16,4,64,16")
    return tuple(int(d) for d in dims)


def add_arguments(p) -> None:
    p.add_argument("--only", action="append", metavar="PART[,PART]",
                   help=f"run only these parts (repeatable): {', '.join(PARTS)}; "
                        f"{', '.join(OPT_IN)} run only when named")
    p.add_argument("--shape", help="cpu-gelu's tensor shape (default 16,64,256) or cpu-attention's "
                                                "batch,heads,context,head dimension (default 16,4,64,16)")
    p.add_argument("--steps", type=int, default=60, help="training steps per timed run (default 60, at least 8)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats of each comparison (default 5; the grid scaling run does at most 2)")
    p.add_argument("--models", default="tiny,small", help="sizes for the step comparison (default tiny,small)")
    p.add_argument("--layers", type=int, help="depth of every size in the step comparison and profile (default: the size's)")
    p.add_argument("--threads", type=int, help="torch threads for the step comparison, the matmul peak and the "
                                               "profile (default: torch's, usually the cores)")
    p.add_argument("--probe-every", type=int, help="the harness's stability-probe interval in the step comparison "
                                                   "(default: the harness's; 1 = every probe every step)")
    p.add_argument("--grid-steps", type=int, default=100, help="steps per cell in the grid scaling run (default 100)")
    p.add_argument("--workers", type=int, help="workers of the grid scaling run (default: the cores)")
    p.add_argument("--subnormal-steps", type=int, help="steps of each lockstep pair of `--only subnormals` "
                                                       "(default: the claim cell's own)")


def _check(args, models: list[str]) -> None:
    from ablate.bench.steps import SKIP
    from ablate.errors import ConfigError
    from ablate.sizes import get_size

    if args.steps < SKIP + 3:
        raise ConfigError(f"--steps {args.steps}: need at least {SKIP + 3} (the first {SKIP} steps of a run are not timed)")
    for flag, value in (("--repeats", args.repeats), ("--layers", args.layers), ("--threads", args.threads), ("--probe-every", args.probe_every),
                        ("--grid-steps", args.grid_steps), ("--workers", args.workers),
                        ("--subnormal-steps", args.subnormal_steps)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} {value}: need a whole number of at least 1")
    if not models:
        raise ConfigError(f"--models {args.models!r}: need at least one size, e.g. tiny,small")
    for m in models:
        get_size(m)


def run(args) -> int:
    import torch

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    _check(args, models)
    threads = args.threads or torch.get_num_threads()
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)  # every part of this process: the steps, the peak, the profile
    try:
        return _run_parts(args, models, threads)
    finally:
        torch.set_num_threads(outer)  # a caller in the same process (a test) is left as it was


def _run_parts(args, models: list[str], threads: int) -> int:
    import os

    import torch

    # The opt-in parts train models twice more (minutes) or time kernels: only when asked for.
    parts = _parts(args.only) or [p for p in PARTS if p not in OPT_IN and (p != "gpu" or torch.cuda.is_available())]
    args.shape = _shape(args.shape, parts)
    load = ", load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()) if hasattr(os, "getloadavg") else ""
    plural = "s" if threads != 1 else ""
    print(f"ablate bench ({threads} torch thread{plural}, {os.cpu_count()} cores{load}, torch {torch.__version__})\n")
    if "steps" in parts:
        _steps(args, models, threads)
    if "probes" in parts:
        from ablate.bench.probe_cost import HEADER, probe_cost

        print(HEADER, flush=True)
        for model in models:
            print(probe_cost(model, args.layers, args.steps, args.repeats, threads, args.probe_every).describe(),
                  flush=True)
        print()
    if "grid" in parts:
        from ablate.bench.grid_scaling import describe, grid_scaling

        print(describe(grid_scaling(args.workers, steps=args.grid_steps, repeats=min(args.repeats, 2))), flush=True)
    from ablate.bench import harness as h

    if "startup" in parts:
        s = h.startup_cost()
        print(f"start-up per cell: cold process (start + import + build + data + 1 step) {s['cold_process_s']:.2f}s; "
              f"import alone {s['import_s']:.2f}s; in a warm worker (build + data + 1 step) {s['warm_cell_s']:.2f}s", flush=True)
    if "memory" in parts:
        print(f"peak resident memory of a tiny cell: {h.peak_memory_tiny_cell():.0f} MiB "
              "(the corpus is memory-mapped, never loaded into Python objects)", flush=True)
    if "gpu" in parts:
        if not torch.cuda.is_available():
            print("gpu: no CUDA device here; skipped")
        else:
            for row in h.gpu_figures():
                print(row, flush=True)
    if "subnormals" in parts:
        from ablate.bench.subnormals import describe, subnormal_pairs

        print(describe(subnormal_pairs(args.subnormal_steps, args.threads or 1)), flush=True)
    if "profile" in parts:
        print()
        print(h.profile_steps(models[0], args.layers))
    return _kernel_parts(args, parts, models)


def _kernel_parts(args, parts: list[str], models: list[str]) -> int:
    import argparse

    from ablate.bench import cpu_kernels

    if "cpu-gelu" in parts:
        print(cpu_kernels.gelu(args.shape or cpu_kernels.GELU_SHAPE) + "\n", flush=True)
    if "cpu-attention" in parts:
        print(cpu_kernels.attention(args.shape or cpu_kernels.ATTENTION_SHAPE) + "\n", flush=True)
    status = 0
    if "cpu-mlp" in parts:
        line, same = cpu_kernels.mlp(models[0], args.layers or 12, args.steps, args.repeats)
        print(line, flush=True)
        status = 0 if same else 1
    if "kernels" in parts:  # `ablate kernels bench`'s defaults
        from ablate.commands import kernels

        status |= kernels.run(argparse.Namespace(action="bench", device=None, backends=None, rows=None, ops=None,
                                                 repeats=max(args.repeats, 10), compile=True))
    return status


def _steps(args, models: list[str], threads: int) -> None:
    from ablate.bench import flops
    from ablate.bench.steps import BATCH, compare_steps, what_is_timed
    from ablate.sizes import get_size

    print(what_is_timed(args.steps, args.probe_every) + f"; {args.repeats} repeats, ratios: median [min..max] of runs\n")
    print("| model | blocks | plain tanh tok/s | harness on tok/s | on / plain, same GELU (tanh) | same, period "
          "| gelu_erf on / plain erf | gelu_erf off / plain erf | default block / nanoGPT as is (erf) "
          "| probes off tok/s | probe overhead |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    # The peak is measured before the step comparison and after it, and the better of the two
    # kept per shape: on a shared machine one measurement can land in a slow moment.
    sizes = {model: get_size(model).with_layers(args.layers) for model in models}
    before = {model: flops.measure_peak(size, BATCH * size.context, threads) for model, size in sizes.items()}
    for model in models:
        c = compare_steps(model, args.layers, args.steps, args.repeats, threads, probe_every=args.probe_every)
        results.append(c)
        o = c.probe_overhead
        print(f"| {model} | {c.n_layer} | {c.tok_s(c.on, 'tanh'):,.0f} | {c.tok_s(c.on):,.0f} "
              f"| {c.ratio(c.on, 'tanh')} | {c.ratio(c.on, 'tanh', 'period_s')} "
              f"| {c.ratio(c.same_math, 'none')} | {c.ratio(c.same_math_off, 'none')} | {c.ratio(c.on, 'none')} "
              f"| {c.tok_s(c.off):,.0f} "
              f"| {o.median:+.1%} [{min(o.values):+.1%}..{max(o.values):+.1%}] |", flush=True)

    print(f"\nagainst the hardware: {flops.FLOPS_FORMULA}")
    print(f"peak: float32 matmul (torch.mm) at {threads} thread{'s' if threads != 1 else ''}, at every matmul shape of a training step "
          f"(each linear's forward, input- and weight-gradient product; 'step mix' = their FLOPs over their "
          f"summed times) and at {flops.SQUARE}^3, before and after the step comparison, the better kept\n")
    print("| model | blocks | FLOPs/token | step-mix peak GFLOP/s | square peak GFLOP/s | plain tanh GFLOP/s "
          "| harness on GFLOP/s | harness / step mix | harness / square | plain tanh / step mix |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    from ablate.bench.harness import step_breakdown

    for c in results:
        size = sizes[c.model]
        peak = flops.measure_peak(size, BATCH * size.context, threads).best_of(before[c.model])
        per_token = flops.flops_per_token(size)
        plain = per_token * c.tok_s(c.on, "tanh")
        harness = per_token * c.tok_s(c.on)
        print(f"| {c.model} | {c.n_layer} | {per_token:,} | {peak.step_mix / 1e9:.1f} | {peak.square / 1e9:.1f} "
              f"| {plain / 1e9:.1f} | {harness / 1e9:.1f} | {harness / peak.step_mix:.0%} | {harness / peak.square:.0%} "
              f"| {plain / peak.step_mix:.0%} |", flush=True)
        by_layer: dict[str, list[str]] = {}
        for m, f in peak.matmuls:
            layer, kind = m.name.rsplit(" ", 1)
            by_layer.setdefault(layer, []).append(f"{kind} {m.m}x{m.k}x{m.n} {f / 1e9:.1f}")
        print("  matmul GFLOP/s: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in by_layer.items()))
        print("  " + step_breakdown(size, peak, threads).describe(), flush=True)
    print()
