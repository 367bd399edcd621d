"""The harness's training step against the plain nanoGPT-style loop, as interleaved pairs.

Each repeat trains, in a rotated order and all in this process so that machine noise hits
every side: the plain loop with nanoGPT's GELU (exact erf) and with GPT-2's tanh GELU (the
harness's default block's), the harness's default block with every probe on and with probes
off, and the harness with every probe on but nanoGPT's GELU (act=gelu_erf). Pairs of the same
math give the harness's own cost; the default block against nanoGPT's loop as it stands mixes
in the two GELUs' costs, and is printed as such.
A run's speed is its median step (robust to a burst of machine noise in one step); a pair's
ratio is (harness tokens/s) / (plain tokens/s) of runs next to each other; the table gives
the median of the pairs and their spread (min..max).
"""
from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ablate.bench.plain_gpt import plain_training_steps
from ablate.cell import Cell
from ablate.config import OPTION_NAMES, OPTIONS
from ablate.data import load_data
from ablate.rundir import METRICS
from ablate.sizes import get_size
from ablate.train import train

BATCH, LR, SEED = 16, 1e-3, 0
# The first steps of every run are left out of every figure (allocator and cache warm-up),
# as nanoGPT's MFU estimate leaves out its first 5 iterations.
SKIP = 5

# The harness's block with nanoGPT's activation (nn.GELU(): exact erf) instead of GPT-2's tanh.
SAME_MATH = {"act": "gelu_erf"}

WHAT_IS_TIMED = """\
plain:          nanoGPT's model and loop (ablate/bench/plain_gpt.py), each iteration timed as
                nanoGPT's train.py does, from the end of one to the end of the next: set lr,
                forward, fetch the next batch, backward, fused AdamW, zero_grad, loss.item();
                "tanh" with GPT-2's GELU (the harness's default block), "erf" with nanoGPT's own
harness logged: the tokens_per_s the harness writes to metrics.jsonl: its step (set lr, batch,
                forward, backward, probes, fused AdamW step, zero_grad, loss to the host)
harness period: the time between consecutive metrics.jsonl time_s: the logged step plus the
                per-step bookkeeping around it (writing the metrics line, divergence and
                checkpoint checks): the span nanoGPT's train.py times
harness:        the default block (GELU tanh, GPT-2's); "gelu_erf" is the same block with
                nanoGPT's GELU. Same-math pairs (tanh/tanh, erf/erf) are the harness's own cost
probes on:      every probe at log_every 1{probe_every}; off: probes = false
each run: {steps} steps, batch {batch}, constant lr, the first {skip} steps left out; a run's
                speed is its median step"""


def what_is_timed(steps: int, probe_every: int | None = None) -> str:
    """The bench's own description of its runs; `probe_every` None: the harness's default."""
    text = ""
    if "probe_every" in OPTIONS:
        default = OPTIONS["probe_every"].default
        text = f", probe_every {probe_every or default} (the harness's default: {default}; --probe-every 1 probes every step)"
    return WHAT_IS_TIMED.format(probe_every=text, steps=steps, batch=BATCH, skip=SKIP)


@dataclass
class Spread:
    """Ratios of interleaved pairs: their median and range."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def __format__(self, spec: str) -> str:
        return f"{self.median:.3f}x [{min(self.values):.3f}..{max(self.values):.3f}]"


@dataclass
class HarnessRun:
    logged_s: list[float]  # per timed step, the seconds the harness logged (tokens / tokens_per_s)
    period_s: list[float]  # per timed step, the span between consecutive logged time_s


@dataclass
class StepComparison:
    model: str
    n_layer: int
    tokens_per_step: int
    steps: int
    plain_s: list[list[float]] = field(default_factory=list)  # per repeat: each timed step's seconds, erf GELU
    plain_tanh_s: list[list[float]] = field(default_factory=list)  # the same with the tanh GELU
    on: list[HarnessRun] = field(default_factory=list)
    off: list[HarnessRun] = field(default_factory=list)
    same_math: list[HarnessRun] = field(default_factory=list)  # probes on, act=gelu_erf

    def tok_s(self, runs: list[list[float]]) -> float:
        """Tokens/s of the median run's median step."""
        return self.tokens_per_step / statistics.median(statistics.median(r) for r in runs)

    @staticmethod
    def steps_of(runs: list[HarnessRun], kind: str = "logged_s") -> list[list[float]]:
        return [getattr(r, kind) for r in runs]

    def ratio(self, plain: list[list[float]], runs: list[HarnessRun], kind: str = "logged_s") -> Spread:
        """Harness speed over plain speed, pair by pair (each run's median step)."""
        return Spread([statistics.median(p) / statistics.median(getattr(h, kind)) for p, h in zip(plain, runs)])

    @property
    def probe_overhead(self) -> Spread:
        """Extra median step time with probes on versus off, per pair (a fraction, not a ratio)."""
        return Spread([statistics.median(on.logged_s) / statistics.median(off.logged_s) - 1
                       for on, off in zip(self.on, self.off)])


def harness_options(model: str, layers: int | None, steps: int, probes: bool, threads: int, device: str,
                    **extra) -> dict:
    """The harness run the bench times. Options the harness may not have yet are set only
    where it declares them, so the bench keeps working while the option table grows."""
    options = {"model": model, "layers": layers, "steps": steps, "batch_size": BATCH, "lr": LR, "seed": SEED,
               "schedule": "constant", "eval_every": steps, "eval_batches": 1, "checkpoint_every": steps,
               "log_every": 1, "probes": probes, "device": device, "threads": threads, "kernels": "auto", **extra}
    if "final_eval_batches" in OPTION_NAMES:  # the run ends with one validation batch, as the plain loop has none
        options["final_eval_batches"] = 1
    return options


def harness_run(options: dict) -> HarnessRun:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "cell"
        train(Cell.from_options(options), run_dir)
        rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]
    tokens_per_step = rows[0]["tokens"]
    logged = [tokens_per_step / r["tokens_per_s"] for r in rows[SKIP:]]
    # The last row's time_s comes after the final evaluation, so spans stop at the row before.
    times = [r["time_s"] for r in rows[SKIP - 1 : -1]]
    return HarnessRun(logged, [b - a for a, b in zip(times, times[1:])])


def compare_steps(model: str = "tiny", layers: int | None = None, steps: int = 60, repeats: int = 5,
                  threads: int | None = None, device: str = "cpu", probe_every: int | None = None) -> StepComparison:
    """`probe_every`: the harness's stability-probe interval (None: its default)."""
    if steps < SKIP + 3:
        raise ValueError(f"steps must be at least {SKIP + 3}")
    threads = threads or torch.get_num_threads()
    size = get_size(model).with_layers(layers)
    tokens = load_data(None, size.tokenizer, size.vocab_size).train[0]
    result = StepComparison(model, size.n_layer, BATCH * size.context, steps)
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        harness_run(harness_options(model, layers, SKIP + 3, True, threads, device))  # warm caches once
        kinds = ["plain", "on", "plain_tanh", "off", "same_math"]
        for r in range(repeats):
            for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:  # rotate which goes first
                if kind.startswith("plain"):
                    gelu = "tanh" if kind == "plain_tanh" else "none"
                    times = plain_training_steps(size, tokens, steps, BATCH, LR, SEED, device, gelu=gelu)
                    getattr(result, f"{kind}_s").append(times[SKIP:])
                else:
                    extra = {**(SAME_MATH if kind == "same_math" else {}),
                             **({"probe_every": probe_every} if probe_every else {})}
                    options = harness_options(model, layers, steps, kind != "off", threads, device, **extra)
                    getattr(result, kind).append(harness_run(options))
    finally:
        torch.set_num_threads(outer)
    return result
