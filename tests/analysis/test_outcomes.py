"""A failed training run split into dead, slow and diverged, on synthetic logs (analysis/outcomes.py)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from ablate.analysis.load import load_runs
from ablate.analysis.metrics import cell_metrics
from ablate.analysis.outcomes import (DEAD, DEAD_GRAD_DECADES, DIVERGED, PLATEAUED, SLOW, TRAINED, collapsed,
                                      failure_kind, last_grad_reach)
from tests.helpers.synthetic_runs import write_run

ENTROPY = 3.4  # the synthetic corpus's unigram entropy: a final loss above 3.2 is on the plateau
PLATEAU = [5.0, 3.5, 3.4, 3.35, 3.3]


def _run(tmp_path, first_grad, cos=None, losses=PLATEAU, seed=0, **kw):
    """A 4-block run whose first block's gradient norm is `first_grad` times the top's on every step."""
    run = write_run(tmp_path, seed=seed, losses=losses, n_layer=4, unigram_entropy=ENTROPY,
                    grad_norms=[[first_grad, 1.0, 1.0, 1.0]] * len(losses), probe_every=2 if cos else None, **kw)
    if cos is not None:  # the synthetic probes' cos_sim is 0.1 + 0.05 i: set the top block's
        import json

        path = run.path / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        for row in rows:
            if "cos_sim/layer_3" in row:
                row["cos_sim/layer_3"] = cos
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = load_runs(tmp_path)
    metrics = cell_metrics(runs)
    row = metrics[metrics["cell_id"] == run.cell_id].iloc[0]
    return row["outcome"], runs.steps[runs.steps["cell_id"] == run.cell_id]


def test_a_plateaued_run_whose_lower_blocks_get_no_gradient_is_dead(tmp_path):
    outcome, steps = _run(tmp_path, first_grad=1e-12)
    assert outcome == PLATEAUED
    assert last_grad_reach(steps) == pytest.approx(-12)
    assert failure_kind(outcome, steps) == DEAD


def test_a_plateaued_run_with_gradients_alive_is_slow(tmp_path):
    outcome, steps = _run(tmp_path, first_grad=0.3)
    assert failure_kind(outcome, steps) == SLOW


def test_the_floor_is_the_stated_one_and_an_underflow_to_zero_is_dead(tmp_path):
    _, steps = _run(tmp_path / "a", first_grad=10 ** -(DEAD_GRAD_DECADES - 0.5))
    assert not collapsed(steps)
    _, steps = _run(tmp_path / "b", first_grad=0.0)
    assert collapsed(steps) and last_grad_reach(steps) < -DEAD_GRAD_DECADES


def test_the_probes_must_confirm_the_collapse_where_they_are_logged(tmp_path):
    # A vanished gradient with distinct token vectors (cos_sim 0.5) is not a collapse: slow.
    outcome, steps = _run(tmp_path / "a", first_grad=1e-12, cos=0.5)
    assert failure_kind(outcome, steps) == SLOW
    outcome, steps = _run(tmp_path / "b", first_grad=1e-12, cos=0.999)
    assert failure_kind(outcome, steps) == DEAD


def test_uniform_attention_confirms_a_collapse_when_the_context_is_known(tmp_path):
    outcome, steps = _run(tmp_path, first_grad=1e-12, cos=0.5)
    uniform = sum(math.log(t + 1) for t in range(4)) / 4
    steps = steps.assign(**{f"attn_entropy/layer_{i}": uniform for i in range(4)})
    assert failure_kind(outcome, steps) == SLOW  # no context: the attention test is off
    assert failure_kind(outcome, steps, context=4) == DEAD
    assert failure_kind(outcome, steps.assign(**{"attn_entropy/layer_0": 0.2}), context=4) == SLOW


def test_diverged_and_trained_runs_keep_their_own_words(tmp_path):
    outcome, steps = _run(tmp_path / "a", first_grad=1e-12, losses=[5.0, 4.0, float("nan")])
    assert outcome == DIVERGED and failure_kind(outcome, steps) == DIVERGED
    outcome, steps = _run(tmp_path / "b", first_grad=1e-12, losses=[5.0, 3.0, 2.0, 1.9])
    assert outcome == TRAINED and failure_kind(outcome, steps) is None


def test_no_logged_gradients_is_never_dead():
    assert failure_kind(PLATEAUED, pd.DataFrame({"step": [0, 1], "loss": [5.0, 3.3]})) == SLOW


def test_cell_metrics_carries_the_failure_kind_beside_the_outcome(tmp_path):
    write_run(tmp_path, seed=0, losses=PLATEAU, n_layer=2, unigram_entropy=ENTROPY, grad_norms=[[1e-12, 1.0]] * 5)
    write_run(tmp_path, seed=1, losses=PLATEAU, n_layer=2, unigram_entropy=ENTROPY, grad_norms=[[0.5, 1.0]] * 5)
    write_run(tmp_path, seed=2, losses=[5.0, 3.0, 2.2, 2.1, 2.0], n_layer=2, unigram_entropy=ENTROPY)
    metrics = cell_metrics(load_runs(tmp_path)).sort_values("seed")
    assert metrics["outcome"].tolist() == [PLATEAUED, PLATEAUED, TRAINED]
    assert metrics["failure"].tolist()[:2] == [DEAD, SLOW] and pd.isna(metrics["failure"].iloc[2])
