"""The harness's training step against the plain nanoGPT-style loop, in lockstep.

Each repeat trains, in a rotated order, the harness's default block with every probe on and
with probes off, and the same block with nanoGPT's GELU (act=gelu_erf) with probes on and
off. Every harness step is followed, in the same process, by one step of each plain loop (its
partners, one per GELU, taking turns to go first), outside the step time the harness logs. A
machine this shared slows down and speeds up over seconds, so a ratio of runs taken one after
the other measures the machine as much as the loops; partner steps a tenth of a second apart
see the same machine. A run's ratio is (its partner's steps' total seconds) / (its own steps'
total seconds), the probed steps included; the table gives the median of the runs and their
spread (min..max). Probe overhead is the probes-on run's ratio over the probes-off run's of
the same repeat, each against its partner.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ablate.bench.plain_gpt import GRAD_CLIP, PlainLoop
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
plain:          nanoGPT's model and loop (ablate/bench/plain_gpt.py), one iteration: set lr,
                forward, fetch the next batch, backward, clip the gradients' norm to 1.0 (nanoGPT's
                default), fused AdamW, zero_grad, loss.item();
                "tanh" with GPT-2's GELU (the harness's default block), "erf" with nanoGPT's own;
                each run one step after each harness step, in lockstep
harness logged: the tokens_per_s the harness writes to metrics.jsonl: its step (set lr, batch,
                forward, backward, probes, the same clip, fused AdamW step, zero_grad, loss to
                the host)
harness period: the time between consecutive metrics.jsonl time_s, less the plain steps run in
                between: the logged step plus the per-step bookkeeping around it (writing the
                metrics line, divergence and checkpoint checks)
harness:        the default block (GELU tanh, GPT-2's); "gelu_erf" is the same block with
                nanoGPT's GELU. Same-math pairs (tanh/tanh, erf/erf) are the harness's own cost;
                gelu_erf with probes off, its loop's alone
probes on:      every probe at log_every 1{probe_every}; off: probes = false
each run: {steps} steps, batch {batch}, constant lr, the first {skip} steps left out; a run's
                speed is its steps' total time (every probed step in it)"""


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
class LockstepRun:
    """One harness run and its partners' steps, index for index (the first SKIP left out)."""

    logged_s: list[float]  # per step, the seconds the harness logged (tokens / tokens_per_s)
    period_s: list[float]  # per step, the span between consecutive time_s less the partners' steps
    partners: dict[str, list[float]]  # plain GELU ("tanh", "none") -> that loop's step seconds

    def ratio(self, gelu: str, kind: str = "logged_s") -> float:
        """Harness speed over the partner's: the partner's total seconds over the harness's,
        over the same steps (the period has one span fewer: the last row follows the final
        evaluation)."""
        own = getattr(self, kind)
        return sum(self.partners[gelu][: len(own)]) / sum(own)


@dataclass
class StepComparison:
    model: str
    n_layer: int
    tokens_per_step: int
    on: list[LockstepRun] = field(default_factory=list)  # every run's partners: tanh and erf
    off: list[LockstepRun] = field(default_factory=list)
    same_math: list[LockstepRun] = field(default_factory=list)  # probes on, act=gelu_erf
    same_math_off: list[LockstepRun] = field(default_factory=list)  # probes off, act=gelu_erf: the loop alone

    def tok_s(self, runs: list[LockstepRun], partner: str | None = None) -> float:
        """Tokens/s of the median run: the harness's, or its partner's."""
        steps = [r.partners[partner] if partner else r.logged_s for r in runs]
        return statistics.median(self.tokens_per_step * len(s) / sum(s) for s in steps)

    @staticmethod
    def ratio(runs: list[LockstepRun], gelu: str, kind: str = "logged_s") -> Spread:
        return Spread([r.ratio(gelu, kind) for r in runs])

    @property
    def probe_overhead(self) -> Spread:
        """Extra step time with probes on versus off, each against its tanh partner, per repeat
        (a fraction, not a ratio)."""
        return Spread([off.ratio("tanh") / on.ratio("tanh") - 1 for on, off in zip(self.on, self.off)])


def harness_options(model: str, layers: int | None, steps: int, probes: bool, threads: int, device: str,
                    **extra) -> dict:
    """The harness run the bench times. Options the harness may not have yet are set only
    where it declares them, so the bench keeps working while the option table grows."""
    options = {"model": model, "layers": layers, "steps": steps, "batch_size": BATCH, "lr": LR, "seed": SEED,
               "schedule": "constant", "eval_every": steps, "eval_batches": 1, "checkpoint_every": steps,
               "log_every": 1, "probes": probes, "device": device, "threads": threads, "kernels": "auto",
               "grad_clip": GRAD_CLIP, **extra}  # both loops clip, as nanoGPT's does
    if "final_eval_batches" in OPTION_NAMES:  # the run ends with one validation batch, as the plain loop has none
        options["final_eval_batches"] = 1
    return options


def lockstep_run(options: dict, partners: dict[str, PlainLoop]) -> LockstepRun:
    """Train the harness run `options`, one step of every partner loop after each of its steps."""
    steps: dict[str, list[float]] = {g: [] for g in partners}
    between: list[float] = []  # seconds of partner steps after each harness step
    order = list(partners)

    def after_step():
        spent = 0.0
        for g in order:
            seconds = partners[g].step()
            steps[g].append(seconds)
            spent += seconds
        order.reverse()  # two partners take turns to go first
        between.append(spent)

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "cell"
        train(Cell.from_options(options), run_dir, after_step=after_step)
        rows = [json.loads(line) for line in (run_dir / METRICS).read_text().splitlines()]
    tokens_per_step = rows[0]["tokens"]
    logged = [tokens_per_step / r["tokens_per_s"] for r in rows[SKIP:]]
    # Row i's time_s is written before step i's partners run; the last row's comes after the
    # final evaluation, so spans stop at the row before.
    times = [r["time_s"] for r in rows[SKIP - 1 : -1]]
    periods = [b - a - between[SKIP - 1 + i] for i, (a, b) in enumerate(zip(times, times[1:]))]
    return LockstepRun(logged, periods, {g: s[SKIP:] for g, s in steps.items()})


def compare_steps(model: str = "tiny", layers: int | None = None, steps: int = 60, repeats: int = 5,
                  threads: int | None = None, device: str = "cpu", probe_every: int | None = None) -> StepComparison:
    """`probe_every`: the harness's stability-probe interval (None: its default)."""
    if steps < SKIP + 3:
        raise ValueError(f"steps must be at least {SKIP + 3}")
    threads = threads or torch.get_num_threads()
    size = get_size(model).with_layers(layers)
    tokens = load_data(None, size.tokenizer, size.vocab_size).train[0]
    result = StepComparison(model, size.n_layer, BATCH * size.context)

    def plain(gelu: str) -> PlainLoop:
        return PlainLoop(size, tokens, BATCH, LR, SEED, device, gelu=gelu)

    # Every run has both partners, taking turns to go first, so that each harness step resumes
    # after the same work (a run with fewer partners would find more of its data in cache).
    kinds = {"on": ({}, True), "off": ({}, False), "same_math": (SAME_MATH, True), "same_math_off": (SAME_MATH, False)}
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lockstep_run(harness_options(model, layers, SKIP + 3, True, threads, device), {"none": plain("none")})  # warm-up
        names = list(kinds)
        for r in range(repeats):
            for kind in names[r % len(names):] + names[: r % len(names)]:  # rotate which goes first
                extra, probes = kinds[kind]
                extra = {**extra, **({"probe_every": probe_every} if probe_every else {})}
                options = harness_options(model, layers, steps, probes, threads, device, **extra)
                getattr(result, kind).append(lockstep_run(options, {g: plain(g) for g in ("tanh", "none")}))
    finally:
        torch.set_num_threads(outer)
    return result
