"""`ablate bench --only steps`: the harness's training step against the plain nanoGPT-style loop
(bench/plain_gpt.py), in lockstep, and against this machine's matmul peak (bench/flops.py).

Each repeat trains four harness runs in a rotated order: the default block with every probe on
and off, and the same with nanoGPT's GELU (act=gelu_erf). After every harness step, in the same
process and outside the step time it logs, one step of each plain loop (GPT-2's tanh GELU and
nanoGPT's erf, taking turns to go first): a shared machine's speed drifts over seconds, and
steps a tenth of a second apart see the same machine. A run's ratio is its partner's total step
seconds over its own. The columns are explained in docs/performance.md.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ablate.bench.plain_gpt import GRAD_CLIP, PlainLoop
from ablate.core.rundir import METRICS
from ablate.engine.cell import Cell
from ablate.engine.data import load_data
from ablate.engine.sizes import get_size
from ablate.engine.train import train

BATCH, LR, SEED = 16, 1e-3, 0
SKIP = 5  # the first steps of every run, left out of every figure (allocator and cache warm-up)
# Each repeat's runs: (options beyond harness_options', probes on)
RUNS = {"on": ({}, True), "off": ({}, False), "same_math": ({"act": "gelu_erf"}, True),
        "same_math_off": ({"act": "gelu_erf"}, False)}

WHAT_IS_TIMED = """\
plain:    nanoGPT's model and loop (ablate/bench/plain_gpt.py); "tanh" with GPT-2's GELU (the harness's
          default block), "erf" with nanoGPT's own; one step of each after every harness step, in lockstep
harness:  the tokens_per_s it logs, and its period (metrics line to metrics line, less the plain steps);
          "gelu_erf" is its block with nanoGPT's GELU; probes on: every probe at log_every 1, probe_every
          {probe_every} (the harness's default: {default}; 1: every probe every step); off: probes = false
each run: {steps} steps, batch {batch}, constant lr, the first {skip} steps left out; {repeats} repeats, ratios:
          median [min..max] of runs; the columns: docs/performance.md"""


@dataclass
class LockstepRun:
    """One harness run and its partners' steps, index for index (the first SKIP left out)."""

    logged_s: list[float]  # per step, the seconds the harness logged (tokens / tokens_per_s)
    period_s: list[float]  # per step, the span between consecutive time_s less the partners' steps
    partners: dict[str, list[float]]  # plain GELU ("tanh", "none") -> that loop's step seconds

    def ratio(self, gelu: str, kind: str = "logged_s") -> float:
        """The partner's total seconds over the harness's, over the same steps (the period has one
        span fewer: the last row follows the final evaluation)."""
        own = getattr(self, kind)
        return sum(self.partners[gelu][: len(own)]) / sum(own)


def harness_options(model: str, layers: int | None, steps: int, probes: bool, threads: int, **extra) -> dict:
    """The harness run the bench times: both loops clip, as nanoGPT's does; one validation batch
    at the end, as the plain loop has none."""
    return {"model": model, "layers": layers, "steps": steps, "batch_size": BATCH, "lr": LR, "seed": SEED,
            "schedule": "constant", "eval_every": steps, "eval_batches": 1, "final_eval_batches": 1,
            "checkpoint_every": steps, "log_every": 1, "probes": probes, "device": "cpu", "threads": threads,
            "kernels": "auto", "grad_clip": GRAD_CLIP, **extra}


def lockstep_run(options: dict, partners: dict[str, PlainLoop]) -> LockstepRun:
    """Train the harness run `options`, one step of every partner loop after each of its steps."""
    steps: dict[str, list[float]] = {g: [] for g in partners}
    between: list[float] = []  # seconds of partner steps after each harness step
    order = list(partners)

    def after_step():
        for g in order:
            steps[g].append(partners[g].step())
        between.append(sum(steps[g][-1] for g in order))
        order.reverse()  # two partners take turns to go first

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "cell"
        train(Cell.from_options(options), run_dir, after_step=after_step)
        rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]
    logged = [rows[0]["tokens"] / r["tokens_per_s"] for r in rows[SKIP:]]  # tokens: so far, a step at row 0
    # Row i's time_s is written before step i's partners run; the last row's comes after the
    # final evaluation, so spans stop at the row before.
    times = [r["time_s"] for r in rows[SKIP - 1 : -1]]
    periods = [b - a - between[SKIP - 1 + i] for i, (a, b) in enumerate(zip(times, times[1:]))]
    return LockstepRun(logged, periods, {g: s[SKIP:] for g, s in steps.items()})


def compare_steps(model: str, layers: int | None, steps: int, repeats: int, threads: int,
                  probe_every: int | None = None) -> dict[str, list[LockstepRun]]:
    """RUNS' runs of each repeat, in a rotated order, each with both partners taking turns (so
    that every harness step resumes after the same work)."""
    size = get_size(model).with_layers(layers)
    tokens = load_data(None, size.tokenizer, size.vocab_size).train[0]

    def partners(gelus=("tanh", "none")) -> dict[str, PlainLoop]:
        return {g: PlainLoop(size, tokens, BATCH, LR, SEED, gelu=g) for g in gelus}

    lockstep_run(harness_options(model, layers, SKIP + 3, True, threads), partners(["none"]))  # warm-up
    runs: dict[str, list[LockstepRun]] = {kind: [] for kind in RUNS}
    extra = {"probe_every": probe_every} if probe_every else {}
    for r in range(repeats):
        for kind in [*RUNS][r % len(RUNS):] + [*RUNS][: r % len(RUNS)]:
            options = harness_options(model, layers, steps, RUNS[kind][1], threads, **RUNS[kind][0], **extra)
            runs[kind].append(lockstep_run(options, partners()))
    return runs
