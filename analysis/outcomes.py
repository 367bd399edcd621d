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
own (claim_measures `failed`, `diverged`): the score does not count it.
"""
from __future__ import annotations

import math

import numpy as np

from ablate.rundir import COMPLETED as STATUS_COMPLETED, DIVERGED as STATUS_DIVERGED

PLATEAU_MARGIN = 0.2  # nats above (unigram entropy - this) = stuck on the unigram plateau
TRAINED, PLATEAUED, DIVERGED, FAILED = "trained", "plateaued", "diverged", "failed"
OUTCOMES = (TRAINED, PLATEAUED, DIVERGED)  # the training outcomes, in the order reports list them
FAILED_TRAINING = (PLATEAUED, DIVERGED)
SCORING_RULE = ("a completed run scores min(its final val loss, the unigram entropy), a diverged one the unigram "
                "entropy (the loss of a model that ignores context): continuous in the loss, no jump at the "
                "plateau's edge")


def plateaued(loss, unigram_entropy, margin: float = PLATEAU_MARGIN) -> bool:
    """Whether a final loss sits on the unigram plateau (False when either is unknown)."""
    try:
        loss, entropy = float(loss), float(unigram_entropy)
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(loss) and np.isfinite(entropy) and loss >= entropy - margin)


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
