"""The largest stable learning rate (ablate/claims/claim_measures.py) on synthetic cells with a known edge."""
from __future__ import annotations

import math

import pytest

from ablate.claims.claim_file import parse_claim
from ablate.claims.claim_measures import stable_edge
from ablate.claims.verdict import AGREES, evaluate
from tests.helpers.synthetic_runs import write_run

POST, PRE = "post.layernorm.gelu.dense.res", "pre.layernorm.gelu.dense.res"
LADDER = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2)
ENTROPY = 3.4
TRAINS, PLATEAU, DIVERGES = [5.0, 3.0, 2.2, 2.0], [5.0, 3.5, 3.4, 3.35], [5.0, 4.0, float("nan")]


def ladder(root, variant, seed, edge, warmup=0, failure=PLATEAU):
    """Cells at every LADDER rate: the run trains up to `edge` and fails above it."""
    for lr in LADDER:
        losses = TRAINS if lr <= edge else failure
        write_run(root, variant, seed, losses=losses, options={"lr": lr, "warmup": warmup}, unigram_entropy=ENTROPY,
                  planned_steps=len(TRAINS))  # a diverged run stops early; its plan is the same


def claim(measure, a, b, at, effect=0.3):
    return parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g", "clause": [
        {"sentence": "s", "label": "c", "compare": [{"measure": measure, "a": a, "b": b, "at": at,
                                                      "expect": "higher", "effect": effect}]}]})


def test_the_edge_is_read_from_below_and_censored_ends_are_scored():
    assert stable_edge(LADDER, [1, 1, 0, 0, 0]) == (pytest.approx(math.log10(2e-3)), "inside")
    # A lucky run above the first failure does not raise the edge.
    assert stable_edge(LADDER, [1, 0, 1, 0, 0])[0] == pytest.approx(math.log10(1e-3))
    assert stable_edge(LADDER, [1] * 5) == (pytest.approx(math.log10(2e-2)), "above")
    low, place = stable_edge(LADDER, [0] * 5)
    assert place == "below" and low == pytest.approx(math.log10(1e-3) - math.log10(2))  # one step under
    assert stable_edge(list(reversed(LADDER)), [0, 0, 0, 1, 1])[1] == "inside"  # order of the cells is free


def test_largest_stable_lr_reads_each_seeds_known_edge_with_and_without_warmup(tmp_path):
    edges = {0: (2e-3, 1e-2), 1: (1e-3, 5e-3), 2: (2e-3, 2e-2), 3: (5e-3, 1e-2)}  # seed: (no warmup, warmup)
    for seed, (cold, warm) in edges.items():
        ladder(tmp_path, POST, seed, cold, warmup=0, failure=DIVERGES if seed % 2 else PLATEAU)
        ladder(tmp_path, POST, seed, warm, warmup=100)
    verdict = evaluate(claim("largest_stable_lr", {"warmup": 100}, {"warmup": 0}, {"norm": "post"}), tmp_path)
    r = verdict.results[0]
    assert [k[0] for k in r.keys] == [0, 1, 2, 3]
    assert r.a == pytest.approx(tuple(math.log10(edges[s][1]) for s in range(4)))
    assert r.b == pytest.approx(tuple(math.log10(edges[s][0]) for s in range(4)))
    assert r.unit == "log10 lr"


def test_warmup_lr_gain_compares_post_norms_gain_with_pre_norms(tmp_path):
    for seed in range(6):
        ladder(tmp_path, POST, seed, 2e-3, warmup=0)
        ladder(tmp_path, POST, seed, 1e-2 if seed % 2 else 2e-2, warmup=100)
        ladder(tmp_path, PRE, seed, 1e-2, warmup=0)
        ladder(tmp_path, PRE, seed, 1e-2, warmup=100)
    verdict = evaluate(claim("warmup_lr_gain", {"norm": "post"}, {"norm": "pre"}, {}), tmp_path)
    r = verdict.results[0]
    assert r.b == pytest.approx((0.0,) * 6)
    assert r.a[0] == pytest.approx(1.0) and r.a[1] == pytest.approx(math.log10(5))
    assert verdict.clauses[0].outcome == AGREES


def test_a_ladder_with_an_unfinished_rate_is_missing_not_guessed(tmp_path):
    ladder(tmp_path, POST, 0, 2e-3)
    ladder(tmp_path, POST, 0, 1e-2, warmup=100)
    unfinished = write_run(tmp_path, POST, 0, losses=TRAINS, options={"lr": 5e-3, "warmup": 100}, status="running",
                           unigram_entropy=ENTROPY, planned_steps=len(TRAINS))
    (unfinished.path / "summary.json").unlink()  # the 5e-3 cell with warmup: still running
    verdict = evaluate(claim("largest_stable_lr", {"warmup": 100}, {"warmup": 0}, {"norm": "post"}), tmp_path)
    r = verdict.results[0]
    assert not r.keys and "did not finish" in next(iter(r.missing["a"].values()))


def test_a_seed_whose_ladder_a_killed_look_left_short_is_missing_and_the_others_are_read(tmp_path):
    # `--decide` killed as look 2 began: seed 2 has the first rate's folder only. The comparison
    # (not only that seed) once said "needs a ladder of at least 3 rates" and read no seed at all.
    for seed in (0, 1):
        ladder(tmp_path, PRE, seed, 1e-2)
        ladder(tmp_path, POST, seed, 2e-3)
    write_run(tmp_path, PRE, 2, losses=TRAINS, options={"lr": LADDER[0], "warmup": 0}, unigram_entropy=ENTROPY)
    verdict = evaluate(claim("largest_stable_lr", {"norm": "pre"}, {"norm": "post"}, {}), tmp_path)
    r = verdict.results[0]
    assert [k[0] for k in r.keys] == [0, 1] and r.a == pytest.approx((math.log10(1e-2),) * 2)
    assert list(r.missing["a"]) == [(2,)] and "the seed has 1" in r.missing["a"][(2,)]


def test_dead_counts_collapsed_runs_and_not_slow_ones(tmp_path):
    # Post-norm's plateaued runs have a first block 12 decades under the top; pre-norm's are alive.
    for seed in range(6):
        for variant, first in ((POST, 1e-12), (PRE, 0.5)):
            write_run(tmp_path, variant, seed, losses=PLATEAU, unigram_entropy=ENTROPY, n_layer=3,
                      grad_norms=[[first, 1.0, 1.0]] * len(PLATEAU))
    verdict = evaluate(claim("dead", {"norm": "post"}, {"norm": "pre"}, {}, effect=0.5), tmp_path)
    r = verdict.results[0]
    assert r.a == (1.0,) * 6 and r.b == (0.0,) * 6 and verdict.clauses[0].outcome == AGREES
