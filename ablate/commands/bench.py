"""`ablate bench`: the harness's cost against plain PyTorch, as a table to paste."""
from __future__ import annotations

PARTS = ("steps", "grid", "startup", "memory", "profile", "gpu")


def add_arguments(p) -> None:
    p.add_argument("--only", action="append", choices=PARTS, help="run only these parts (repeatable)")
    p.add_argument("--steps", type=int, default=60, help="training steps per timed run (default 60)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved A/B repeats (default 5)")
    p.add_argument("--models", default="tiny,small", help="sizes for the step comparison (default tiny,small)")


def run(args) -> int:
    import torch

    from ablate.bench import harness as h
    from ablate.errors import ConfigError
    from ablate.sizes import get_size

    if args.steps < 2 or args.repeats < 1:
        raise ConfigError(f"--steps {args.steps} / --repeats {args.repeats}: need steps >= 2 and repeats >= 1")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        get_size(m)
    parts = args.only or [p for p in PARTS if p != "gpu" or torch.cuda.is_available()]
    print(f"ablate bench ({h.threads_note()}, torch {torch.__version__})\n")
    if "steps" in parts:
        print("| model | plain tok/s | harness probes on tok/s | on / plain | probes off tok/s | off / plain | probe overhead |")
        print("|---|---|---|---|---|---|---|")
        for model in models:
            c = h.compare_steps(model, args.steps, args.repeats)
            print(f"| {model} | {c.tok_s(c.plain_s):,.0f} | {c.tok_s(c.probes_on_s):,.0f} | {c.ratio_on:.3f}x | "
                  f"{c.tok_s(c.probes_off_s):,.0f} | {c.ratio_off:.3f}x | {c.probe_overhead:+.1%} |", flush=True)
        print(f"\n({args.repeats} interleaved repeats of {args.steps} steps, batch {h.BATCH}; ratios are medians of pairs)\n")
    if "grid" in parts:
        g = h.grid_throughput()
        print(f"grid of {g['cells']} tiny cells x {g['steps']} steps: workers 1 {g['workers1_s']:.1f}s "
              f"({g['cells_per_hour_1']:,.0f} cells/h), workers 2 {g['workers2_s']:.1f}s "
              f"({g['cells_per_hour_2']:,.0f} cells/h), speed-up {g['speedup']:.2f}x", flush=True)
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
    if "profile" in parts:
        print("\nprofile of a tiny run (self CPU time):")
        print(h.profile_tiny_step())
    return 0
