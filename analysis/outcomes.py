"""A cell's training outcome as a category, and the one way a loss measure scores a failed run.

    trained    completed with a final validation loss below the unigram plateau
    plateaued  completed, but its final validation loss lies within PLATEAU_MARGIN nats of the
               corpus's unigram entropy (or above it): it learnt (almost) nothing from context
               (`plateaued` below, the rule the report and the plots use too)
    diverged   stopped on a non-finite or exploding loss (summary.json status `diverged`)
    failed     did not finish as a result: the program failed, or the cell is still running;
               not a training outcome, so claims count it as a missing value and say so

A plateaued or diverged run is a *failed training run*: an outcome to count, never a value to
drop. Loss measures score it as the unigram entropy of its data, the loss of a model that
ignores context, whichever way it failed (a diverged run has no loss of its own; scoring it at
its loss at initialisation, about 5.5 nats here, would weigh a blow-up far above a plateau at
about 3.2). Where the unigram entropy is unknown (data without it recorded), the loss at
initialisation stands in.
"""
from __future__ import annotations

import math

import numpy as np

from ablate.rundir import COMPLETED as STATUS_COMPLETED, DIVERGED as STATUS_DIVERGED

PLATEAU_MARGIN = 0.2  # nats above (unigram entropy - this) = stuck on the unigram plateau
TRAINED, PLATEAUED, DIVERGED, FAILED = "trained", "plateaued", "diverged", "failed"
OUTCOMES = (TRAINED, PLATEAUED, DIVERGED)  # the training outcomes, in the order reports list them
FAILED_TRAINING = (PLATEAUED, DIVERGED)
SCORING_RULE = (f"a plateaued run (final val loss within {PLATEAU_MARGIN:g} nats of the unigram entropy) or a "
                "diverged one scores the unigram entropy (the loss of a model that ignores context)")


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
    """The validation loss a loss measure uses: a trained run's own, a failed training run's
    unigram entropy (else its loss at initialisation); NaN for a cell without an outcome."""
    if outcome == TRAINED:
        return _number(final_val_loss)
    if outcome in FAILED_TRAINING:
        entropy = _number(unigram_entropy)
        return entropy if math.isfinite(entropy) else _number(init_loss)
    return math.nan
