"""Futility only where the design could have shown the effect (ablate/claims/design_checks.py): a
synthetic grid whose effect lives only at a rate the grid drops says "cannot tell from this
design", never "does not agree"; the same effect on a grid that brackets each arm's edge may."""
from __future__ import annotations

import pytest

from ablate.claims import design_checks
from ablate.claims.claim_file import parse_claim
from ablate.claims.verdict import CANNOT_TELL, DISAGREES, evaluate
from tests.helpers.synthetic_runs import write_run

POST = "post.layernorm.gelu.dense.res"
ENTROPY = 3.4
TRAINS, PLATEAU = [5.0, 3.0, 2.2, 2.0], [5.0, 3.5, 3.4, 3.35]
SEEDS = range(6)  # a sign test decides at 6 seeds, every one the same way (1/2^6 < 0.025)
# Without warmup post-norm trains up to 2e-3; with it up to 5e-3: the effect lives at 5e-3 alone.
EDGE = {0: 2e-3, 100: 5e-3}


def grid(root, rates):
    for seed in SEEDS:
        for warmup, edge in EDGE.items():
            for lr in rates:
                write_run(root, POST, seed, losses=TRAINS if lr <= edge else PLATEAU, unigram_entropy=ENTROPY,
                          options={"lr": lr, "warmup": warmup})


def claim(effect):
    return parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g", "clause": [
        {"sentence": "Post-norm trains poorly without warmup.", "label": "warmup rescues post-norm", "compare": [
            {"measure": "failed", "a": {"warmup": 0}, "b": {"warmup": 100}, "expect": "higher", "effect": effect}]}]})


def test_an_effect_at_a_rate_the_grid_drops_cannot_be_told_from_this_design(tmp_path, monkeypatch):
    grid(tmp_path, (1e-3, 3e-2))  # everything trains at 1e-3 and fails at 3e-2: 5e-3 is dropped
    verdict = evaluate(claim(0.25), tmp_path)
    clause, result = verdict.clauses[0], verdict.results[0]
    assert clause.outcome == CANNOT_TELL
    assert result.note.startswith(design_checks.DESIGN_PREFIX)
    assert "between 0.001 and 0.03" in result.note and "1.48 decades apart" in result.note
    assert result.seeds_needed is None  # more seeds of this design would not show it
    # Without the check the same data read "does not agree: no effect as large as 0.25".
    monkeypatch.setattr("ablate.claims.verdict.judged", lambda ctx, sides, r: r)  # where the verdict calls it
    assert evaluate(claim(0.25), tmp_path).clauses[0].outcome == DISAGREES


def test_a_grid_that_brackets_each_arms_edge_may_say_does_not_agree(tmp_path):
    grid(tmp_path, (1e-3, 2e-3, 5e-3, 1e-2))  # at most 0.4 decades apart, each edge inside
    verdict = evaluate(claim(0.5), tmp_path)  # one failed rate of four more a seed: 0.25, short of 0.5
    assert verdict.clauses[0].outcome == DISAGREES
    assert "no effect as large as 0.5" in verdict.clauses[0].why
    assert not verdict.results[0].note


@pytest.mark.parametrize("rates, words", [((3e-3, 5e-3, 1e-2), "fails at the lowest swept rate 0.003"),
                                          ((1e-4, 3e-4, 1e-3), "trains at every swept rate up to 0.001")])
def test_an_edge_outside_the_sweep_is_named(tmp_path, rates, words):
    grid(tmp_path, rates)
    result = evaluate(claim(0.25), tmp_path).results[0]
    assert design_checks.DESIGN_PREFIX in result.note and words in result.note


def test_agreement_is_kept_when_the_design_lacks(tmp_path):
    # The effect shows even on a coarse grid: futility is set aside, "agrees" is not.
    grid(tmp_path, (1e-3, 4e-3, 3e-2))
    verdict = evaluate(claim(0.25), tmp_path)
    assert verdict.clauses[0].outcome == "agrees" and design_checks.DESIGN_PREFIX in verdict.results[0].note


# A best-rate comparison: GELU and ReLU at their best rates, sweep seeds 0-2, fresh seeds 3-8.
GELU, RELU = "pre.layernorm.gelu.dense.res", "pre.layernorm.relu.dense.res"


def best_rate_grid(root, relu_best):
    """Both arms end 2.50 at their best rate and 0.2 nats worse a rate away: equal best losses,
    so a 0.1-nat effect of GELU over ReLU is absent wherever each best rate lies."""
    rates = (1e-3, 3e-3, 1e-2)
    for seed in range(9):
        for variant, best in ((GELU, 3e-3), (RELU, relu_best)):
            for lr in rates:
                final = 2.50 + 0.2 * abs(rates.index(lr) - rates.index(best)) + 0.001 * seed
                write_run(root, variant, seed, losses=[5.0, 3.0, final], val_loss=final, unigram_entropy=ENTROPY,
                          options={"lr": lr}, axes={"act": variant.split(".")[2]})


def best_rate_claim():
    return parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g", "clause": [
        {"sentence": "GELU reaches a lower loss than ReLU.", "label": "gelu lower", "compare": [
            {"measure": "final_val_loss", "a": {"act": "gelu"}, "b": {"act": "relu"}, "expect": "lower",
             "effect": 0.1, "best_lr": True}]}]})


def test_a_best_rate_inside_each_sweep_may_say_does_not_agree(tmp_path):
    best_rate_grid(tmp_path, relu_best=3e-3)
    verdict = evaluate(best_rate_claim(), tmp_path)
    assert verdict.clauses[0].outcome == DISAGREES and not verdict.results[0].note


def test_a_best_rate_at_an_end_of_its_sweep_cannot_be_told_from_this_design(tmp_path):
    best_rate_grid(tmp_path, relu_best=1e-3)  # ReLU's chosen rate is the sweep's lowest: its best may lie below
    result = evaluate(best_rate_claim(), tmp_path).results[0]
    assert design_checks.DESIGN_PREFIX in result.note
    assert "side b: its chosen rate 0.001 is an end of its sweep" in result.note
    assert evaluate(best_rate_claim(), tmp_path).clauses[0].outcome == CANNOT_TELL
