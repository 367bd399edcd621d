"""What the probes cost a step (`ablate bench --only probes`): one model twice in lockstep
(bench/lockstep.py), one copy with every probe on (log_every 1 and the harness's probe_every,
as `--only steps` has them) and one with none. The probes change no math (clipping reuses their
gradient norms), so both copies' losses must be the same bits; a round whose losses differ is
reported."""
from __future__ import annotations

import statistics

from ablate.bench.lockstep import WARM, build_copy, plan_cell, rounds_in_turn
from ablate.bench.steps import harness_options
from ablate.bench.timing import header, row, spread, threads


def report(models: list[str], layers: int | None, steps: int, rounds: int, n_threads: int,
               probe_every: int | None = None) -> str:
    """A table row a model: each round's overhead (on time / off time - 1) and whether the losses agreed."""
    lines = [f"the probes' cost in lockstep (one model twice in one process, every probe on / none, step by "
             f"step; the first {WARM} steps of a round untimed):",
             header("model", "blocks", "rounds x steps", "overhead, median [range] of rounds", "mean", "same losses")]
    extra = {"probe_every": probe_every} if probe_every else {}
    for model in models:
        with threads(n_threads):
            plan = plan_cell(harness_options(model, layers, steps, True, n_threads, **extra))
            ratios, differing = rounds_in_turn(plan, lambda: [build_copy(plan), build_copy(plan, probed=True)], rounds)
        overheads = [r - 1 for r in ratios]
        lines.append(row(model, plan.size.n_layer, f"{rounds} x {steps}", spread(overheads, "+.2%"),
                         f"{statistics.fmean(overheads):+.2%}",
                         "yes" if not differing else f"no, {differing} round(s) differ"))
    return "\n".join(lines)
