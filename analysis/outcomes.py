"""A cell's training outcome as a category, and the one way a loss measure scores a failed run.

    trained    completed with a final validation loss below the unigram plateau
    plateaued  completed, but its final validation loss lies within PLATEAU_MARGIN nats of the
               corpus's unigram entropy (or above it): it learnt (almost) nothing from context
               (`plateaued` below, the rule the report and the plots use too)
    diverged   stopped on a non-finite or exploding loss (summary.json status `diverged`)
    failed     did not finish as a result: the program failed, or the cell is still running;
               not a training outcome, so claims count it as a missing value and say so

A plateaued or diverged run is a *failed training run*: an outcome to count, never a value to
drop. Loss measures score a completed run as min(its loss, the unigram entropy of its data), the
loss of a model that ignores context: no run scores worse than ignoring context, and the score
is continuous in the loss (a run just under the plateau's edge and one just over it score
within a hair of each other: the plateau's label never moves a loss). A diverged run has no loss
of its own and scores the entropy (scoring it at its loss at initialisation, about 5.5 nats here,
would weigh a blow-up far above a plateau at about 3.2). Where the unigram entropy is unknown
(data without it recorded), the loss at initialisation stands in. Failure stays a measure of its
own (claim_measures `failed`, `diverged`, `dead`): the score does not count it.

A failed training run is one of three kinds (`failure_kind`, from the logs the harness keeps; the
rule and its thresholds are declared once in ablate/core/collapse.py, which the opt-in early stop
of dead runs reads too):

    dead       collapsed: it ended on the plateau with the first block's gradient norm at least
               DEAD_GRAD_DECADES decades under the top block's (far under Adam's eps against the
               top's, so the lower blocks no longer learn) and, where the stability probes are
               logged, every position's representation the same (top block's cos_sim at least
               COLLAPSED_COS) or attention uniform (each block's entropy within
               UNIFORM_ATTENTION_SHARE of a uniform causal attention's)
    slow       on the plateau with its gradients alive: it might still leave it given more steps
    diverged   stopped on a non-finite or exploding loss

The gradient test is the one that decides: a healthy run's representations are near-identical
too while it sits on the plateau early on (cos_sim 0.996 at step 20 of a post-norm run that
trains, seed 100), so the probes only confirm a collapse the gradients show.
"""
from __future__ import annotations

import math

import numpy as np

from ablate.core.collapse import (COLLAPSED_COS, DEAD_GRAD_DECADES, GRAD_FLOOR, PLATEAU_MARGIN,  # noqa: F401
                                  UNIFORM_ATTENTION_SHARE, grad_reach, gradients_dead, on_plateau,
                                  same_representations, uniform_attention)
from ablate.core.probe_registry import layer_keys
from ablate.core.rundir import COMPLETED as STATUS_COMPLETED, DIVERGED as STATUS_DIVERGED

TRAINED, PLATEAUED, DIVERGED, FAILED = "trained", "plateaued", "diverged", "failed"
DEAD, SLOW = "dead", "slow"
FAILURE_KINDS = (DEAD, SLOW, DIVERGED)  # what a failed training run is, in the order reports list them
DEAD_RULE = (f"dead: on the plateau with the first block's gradient norm at least {DEAD_GRAD_DECADES:g} decades under "
             f"the top block's (and, where probed, the top block's cos_sim >= {COLLAPSED_COS:g} or attention "
             f"uniform); slow: on the plateau with gradients alive")
OUTCOMES = (TRAINED, PLATEAUED, DIVERGED)  # the training outcomes, in the order reports list them
FAILED_TRAINING = (PLATEAUED, DIVERGED)
SCORING_RULE = ("a completed run scores min(its final val loss, the unigram entropy), a diverged one the unigram "
                "entropy (the loss of a model that ignores context): continuous in the loss, no jump at the "
                "plateau's edge")


def plateaued(loss, unigram_entropy, margin: float = PLATEAU_MARGIN) -> bool:
    """Whether a final loss sits on the unigram plateau (False when either is unknown)."""
    return on_plateau(loss, unigram_entropy, margin)


def outcome_of(status, final_val_loss, unigram_entropy) -> str:
    """The training outcome of a cell from its summary status and final validation loss."""
    if status == STATUS_DIVERGED:
        return DIVERGED
    if status != STATUS_COMPLETED:
        return FAILED
    return PLATEAUED if plateaued(final_val_loss, unigram_entropy) else TRAINED


def _number(value) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.nan
    return value if math.isfinite(value) else math.nan


def scored_loss(outcome: str, final_val_loss, unigram_entropy, init_loss) -> float:
    """The validation loss a loss measure uses: min(loss, unigram entropy) for a completed run
    (trained or plateaued), the entropy for a diverged one (else, without a recorded entropy, the
    loss at initialisation stands in for it); NaN for a cell without an outcome."""
    if outcome not in (TRAINED, *FAILED_TRAINING):
        return math.nan
    entropy = _number(unigram_entropy)
    ceiling = entropy if math.isfinite(entropy) else _number(init_loss)
    loss = _number(final_val_loss) if outcome != DIVERGED else math.nan
    if not math.isfinite(loss):
        return ceiling
    return min(loss, ceiling) if math.isfinite(ceiling) else loss


def failure_kind(outcome: str, steps, context: int | None = None) -> str | None:
    """DEAD, SLOW or DIVERGED for a failed training run (`outcome` PLATEAUED or DIVERGED), None
    for one that trained or has no outcome. `steps`: the run's metrics.jsonl rows (a frame);
    `context`: its sequence length, for the uniform-attention test (without it, that test is off)."""
    if outcome == DIVERGED:
        return DIVERGED
    if outcome != PLATEAUED:
        return None
    return DEAD if collapsed(steps, context) else SLOW


def collapsed(steps, context: int | None = None) -> bool:
    """Whether the run's last logged gradients show a collapse (module docstring), confirmed by
    the last stability probes where it logged them."""
    if not gradients_dead(last_grad_reach(steps)):
        return False
    evidence = [e for e in (_same_representations(steps), _uniform_attention(steps, context)) if e is not None]
    return not evidence or any(evidence)


def last_grad_reach(steps) -> float | None:
    """log10(first block's gradient norm / the top block's) at the last logged step where both
    are finite (the first block's floored at GRAD_FLOOR); None without them."""
    columns = _layers(steps, "grad_norm")
    if len(columns) < 2:
        return None
    first = steps[columns[0]].to_numpy(dtype=float)
    top = steps[columns[-1]].to_numpy(dtype=float)
    ok = np.isfinite(first) & np.isfinite(top) & (top > 0)
    if not ok.any():
        return None
    i = np.flatnonzero(ok)[-1]
    return grad_reach(first[i], top[i])


def _same_representations(steps) -> bool | None:
    value = _last(steps, _layers(steps, "cos_sim")[-1:])
    return None if value is None else same_representations(value[0])


def _uniform_attention(steps, context: int | None) -> bool | None:
    """Every block's mean attention entropy within UNIFORM_ATTENTION_SHARE of a uniform causal
    attention's, the mean over query positions t of log(t + 1)."""
    values = _last(steps, _layers(steps, "attn_entropy"))
    if values is None or not context:
        return None
    return uniform_attention(values, context)


def _last(steps, columns: list[str]):
    """The last row where every column is finite, as an array; None when there is none."""
    if not columns:
        return None
    values = steps[columns].to_numpy(dtype=float)
    ok = np.isfinite(values).all(axis=1)
    return values[np.flatnonzero(ok)[-1]] if ok.any() else None


def _layers(steps, metric: str) -> list[str]:
    """`metric/layer_{i}` columns (no part), in layer order."""
    return layer_keys(getattr(steps, "columns", []), metric)
