"""The rule that calls a run dead (collapsed), on one logged row: declared once, read by the
outcome of a finished run (analysis/outcomes.py, over its metrics.jsonl) and by the training
loop's opt-in early stop (`stop_dead`, ablate/engine/dead_stop.py), so a run stopped as dead is
the run its outcome calls dead.

A row is dead when the loss sits on the unigram plateau and the first block's gradient norm is at
least DEAD_GRAD_DECADES decades under the top block's (far under Adam's eps against the top's, so
the lower blocks no longer learn); where the row carries the stability probes, they must agree:
every position's representation the same (the top block's cos_sim at least COLLAPSED_COS) or
attention uniform (each block's entropy within UNIFORM_ATTENTION_SHARE of a uniform causal
attention's). The gradient test decides: a healthy run's representations are near-identical too
while it sits on the plateau early on, so the probes only confirm what the gradients show.
"""
from __future__ import annotations

import math
from typing import Mapping

from ablate.core.probe_registry import layer_keys

PLATEAU_MARGIN = 0.2  # nats above (unigram entropy - this) = stuck on the unigram plateau
# Issue 52: dead post-norm runs end with the first block's gradient 10-17 decades under the top
# block's; slow pre-norm runs within one. Six decades sits far from both.
DEAD_GRAD_DECADES = 6.0
GRAD_FLOOR = 1e-30  # gradient norms below this (0 included: underflow) count as this
COLLAPSED_COS = 0.99  # top block's mean pairwise cosine of the token vectors: all positions alike
UNIFORM_ATTENTION_SHARE = 0.95  # a block's attention entropy over a uniform causal attention's


def on_plateau(loss, unigram_entropy, margin: float = PLATEAU_MARGIN) -> bool:
    """Whether a loss sits on the unigram plateau (False when either is unknown or not finite)."""
    try:
        loss, entropy = float(loss), float(unigram_entropy)
    except (TypeError, ValueError):
        return False
    return math.isfinite(loss) and math.isfinite(entropy) and loss >= entropy - margin


def grad_reach(first, top) -> float | None:
    """log10(first block's gradient norm / the top block's), the first floored at GRAD_FLOOR;
    None unless both are finite and the top's is positive."""
    try:
        first, top = float(first), float(top)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(first) and math.isfinite(top) and top > 0):
        return None
    return math.log10(max(first, GRAD_FLOOR) / top)


def gradients_dead(reach: float | None) -> bool:
    return reach is not None and reach <= -DEAD_GRAD_DECADES


def uniform_entropy(context: int) -> float:
    """A uniform causal attention's mean entropy over query positions t: mean of log(t + 1)."""
    return sum(math.log(t) for t in range(1, int(context) + 1)) / int(context)


def same_representations(top_cos_sim) -> bool:
    return float(top_cos_sim) >= COLLAPSED_COS


def uniform_attention(entropies, context: int) -> bool:
    uniform = uniform_entropy(context)
    return uniform > 0 and all(float(e) >= UNIFORM_ATTENTION_SHARE * uniform for e in entropies)


def layer_values(row: Mapping, metric: str) -> list:
    """A row's `metric/layer_{i}` values, in layer order."""
    return [row[k] for k in layer_keys(row, metric)]


def _finite(values) -> bool:
    try:
        return bool(values) and all(math.isfinite(float(v)) for v in values)
    except (TypeError, ValueError):
        return False


def probes_confirm(row: Mapping, context: int | None) -> bool | None:
    """What the row's stability probes say of a collapse: True or False, None without them."""
    evidence = []
    cos = layer_values(row, "cos_sim")[-1:]
    if _finite(cos):
        evidence.append(same_representations(cos[0]))
    entropies = layer_values(row, "attn_entropy")
    if _finite(entropies) and context:
        evidence.append(uniform_attention(entropies, context))
    return any(evidence) if evidence else None


def read_row(row: Mapping, unigram_entropy, context: int | None) -> tuple[bool, bool | None] | None:
    """One metrics row read by the rule (module docstring): None for a row without per-layer
    gradient norms (a step not logged); else (whether it is a dead run's, what its stability
    probes say: probes_confirm)."""
    grads = layer_values(row, "grad_norm")
    if len(grads) < 2:
        return None
    probes = probes_confirm(row, context)
    dead = (on_plateau(row.get("loss"), unigram_entropy) and gradients_dead(grad_reach(grads[0], grads[-1]))
            and probes is not False)
    return dead, probes


def row_dead(row: Mapping, unigram_entropy, context: int | None) -> bool:
    """Whether one logged metrics row (its loss, its per-layer gradient norms and, on a probe
    step, its stability probes) is a dead run's."""
    read = read_row(row, unigram_entropy, context)
    return read is not None and read[0]
