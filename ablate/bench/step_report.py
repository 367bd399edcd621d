"""`ablate bench steps`' report: the harness's step against nanoGPT's loop (steps.py), then its
FLOP/s against this machine's matmul peak (flops.py), with where a profiled step's time goes
(harness.py)."""
from __future__ import annotations

import statistics

from ablate.bench.flops import FLOPS_FORMULA, Peak, SQUARE, flops_per_token, measure_peak
from ablate.bench.harness import step_breakdown
from ablate.bench.steps import BATCH, SKIP, WHAT_IS_TIMED, compare_steps
from ablate.bench.timing import header, row, spread
from ablate.engine.config import OPTIONS
from ablate.engine.sizes import ModelSize, get_size


def report(models: list[str], layers: int | None, steps: int, repeats: int, threads: int,
           probe_every: int | None = None):
    """The step table, then the FLOP/s table against the peak measured before and after it (the
    better of the two per shape: one measurement can land in a slow moment): lines as measured."""
    default = OPTIONS["probe_every"].default
    yield WHAT_IS_TIMED.format(probe_every=probe_every or default, default=default, steps=steps, batch=BATCH,
                               skip=SKIP, repeats=repeats) + "\n"
    yield header("model", "blocks", "plain tanh tok/s", "harness on tok/s", "on / plain, same GELU (tanh)",
                 "same, period", "gelu_erf on / plain erf", "gelu_erf off / plain erf",
                 "default block / nanoGPT as is (erf)", "probes off tok/s", "probe overhead")
    sizes = {model: get_size(model).with_layers(layers) for model in models}
    peaks = {model: measure_peak(size, BATCH * size.context) for model, size in sizes.items()}
    speeds = {}
    for model, size in sizes.items():
        runs = compare_steps(model, layers, steps, repeats, threads, probe_every)

        def tok_s(kind: str, partner: str | None = None) -> float:
            return statistics.median(BATCH * size.context * len(s) / sum(s)
                                     for s in (r.partners[partner] if partner else r.logged_s for r in runs[kind]))

        def ratios(kind: str, gelu: str, of: str = "logged_s") -> str:
            return spread([r.ratio(gelu, of) for r in runs[kind]], ".3f", "x")

        overhead = [off.ratio("tanh") / on.ratio("tanh") - 1 for on, off in zip(runs["on"], runs["off"])]
        speeds[model] = tok_s("on", "tanh"), tok_s("on")
        yield row(model, size.n_layer, f"{speeds[model][0]:,.0f}", f"{speeds[model][1]:,.0f}", ratios("on", "tanh"),
                  ratios("on", "tanh", "period_s"), ratios("same_math", "none"), ratios("same_math_off", "none"),
                  ratios("on", "none"), f"{tok_s('off'):,.0f}", spread(overhead, "+.1%"))
    yield from flops_report(sizes, peaks, speeds, threads)


def flops_report(sizes: dict[str, ModelSize], before: dict[str, Peak], speeds: dict[str, tuple[float, float]],
           threads: int):
    """Lines: each size's plain (tanh) and harness tokens/s (`speeds`) as FLOP/s against the peak,
    measured again and the better of it and `before` kept; under each, its shapes' figures and
    where a profiled harness step's time goes."""
    yield f"\nagainst the hardware: {FLOPS_FORMULA}"
    yield (f"peak: float32 matmul (torch.mm) at {threads} thread{'s' if threads != 1 else ''}, at every matmul shape "
           "of a training step (each linear's forward, input- and weight-gradient product; 'step mix' = their "
           f"FLOPs over their summed times) and at {SQUARE}^3, before and after the step comparison, the better kept\n")
    yield header("model", "blocks", "FLOPs/token", "step-mix peak GFLOP/s", "square peak GFLOP/s", "plain tanh GFLOP/s",
                 "harness on GFLOP/s", "harness / step mix", "harness / square", "plain tanh / step mix")
    for model, size in sizes.items():
        peak = measure_peak(size, BATCH * size.context).best_of(before[model])
        per_token = flops_per_token(size)
        plain, harness = (per_token * tok_s for tok_s in speeds[model])
        yield row(model, size.n_layer, f"{per_token:,}", f"{peak.step_mix / 1e9:.1f}", f"{peak.square / 1e9:.1f}",
                  f"{plain / 1e9:.1f}", f"{harness / 1e9:.1f}", f"{harness / peak.step_mix:.0%}",
                  f"{harness / peak.square:.0%}", f"{plain / peak.step_mix:.0%}")
        by_layer: dict[str, list[str]] = {}
        for m, f in peak.matmuls:
            layer, kind = m.name.rsplit(" ", 1)
            by_layer.setdefault(layer, []).append(f"{kind} {m.m}x{m.k}x{m.n} {f / 1e9:.1f}")
        yield "  matmul GFLOP/s: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in by_layer.items())
        yield "  " + step_breakdown(size, peak, threads)
