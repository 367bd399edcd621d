"""ablate/claims/rate_choice.py: a best-rate clause says when its chosen rate may not be the arm's best.
Simulated with known truth (numpy, seeded) on issue 52's coarse grid: two rates 0.01-0.03 nats
apart with rate-by-seed noise 0.02-0.03; and from synthetic run folders, in the clause's words."""
import numpy as np
import pytest

from ablate.claims.claim_file import parse_claim
from ablate.claims.rate_choice import NEAR_BEST, within_noise
from tests.helpers.synthetic_runs import write_run

SWEEPS = 3000


def _sweeps(rng, curve, noise, seeds=3):
    """(sweeps, seeds, rates) scored losses: the arm's curve, a seed effect shared by its rates,
    and rate-by-seed noise."""
    shared = rng.normal(0.0, 0.05, (SWEEPS, seeds, 1))
    return np.asarray(curve)[None, None, :] + shared + rng.normal(0.0, noise, (SWEEPS, seeds, len(curve)))


@pytest.mark.parametrize("gap, noise", [(0.01, 0.02), (0.02, 0.025), (0.03, 0.03)])
def test_a_wrong_choice_on_a_coarse_grid_is_almost_always_flagged(gap, noise):
    rng = np.random.default_rng(int(gap * 1000))
    scores = _sweeps(rng, [2.50, 2.50 + gap, 2.70], noise)
    chosen, flagged = np.empty(SWEEPS, int), np.empty(SWEEPS, bool)
    for i, s in enumerate(scores):
        chosen[i], near = within_noise(s)
        flagged[i] = bool(near)
    wrong = chosen != 0  # the chosen rate is not the arm's best
    assert wrong.mean() > 0.05  # the selection error the issue measured (18-44% of sequences)
    assert flagged[wrong].mean() >= 0.9  # a wrong choice says it is a chosen rate, not the best


def test_rates_far_apart_are_rarely_flagged():
    rng = np.random.default_rng(7)
    scores = _sweeps(rng, [2.50, 2.70, 2.90], 0.025)
    flagged = np.array([bool(within_noise(s)[1]) for s in scores])
    assert flagged.mean() <= 0.1


PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"


def _claim():
    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
        {"sentence": "s", "label": "l", "compare": [
            {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher",
             "effect": 0.05, "best_lr": True}]}]})


@pytest.mark.parametrize("second, flagged", [(2.505, True), (2.9, False)])
def test_the_clause_says_its_rates_are_chosen_not_best_when_a_neighbour_is_within_noise(tmp_path, second, flagged):
    from ablate.claims.claim_report import clause_line
    from ablate.claims.verdict import evaluate

    for s in range(9):  # seeds 0-2 choose, 3-8 test at the chosen rates
        for k, (lr, base) in enumerate(((1e-3, 2.5), (3e-3, second))):
            jitter = 0.004 * ((s * 7 + 3 * k) % 5 - 2)  # rate-by-seed noise
            write_run(tmp_path, POST, s, losses=[4.0, 3.0], val_loss=base + 0.2 + jitter, unigram_entropy=3.4,
                      options={"lr": lr})
            write_run(tmp_path, PRE, s, losses=[4.0, 3.0], val_loss=base + jitter, unigram_entropy=3.4,
                      options={"lr": lr})
    verdict = evaluate(_claim(), tmp_path)
    assert bool(verdict.results[0].near) == flagged
    assert (NEAR_BEST in clause_line(0, verdict.clauses[0])) == flagged


def _arm(scores_by_seed_rate: dict) -> "pd.DataFrame":
    import pandas as pd

    rows = [{"seed": seed, "lr": lr, "scored_loss": v} for (seed, lr), v in scores_by_seed_rate.items()]
    return pd.DataFrame(rows)


def _slips(cells, choose_on=(0, 1, 2)):
    """slipped_rates at the rate the verdict chooses (at_best_lr on the choosing seeds)."""
    from ablate.claims.rate_choice import slipped_rates
    from ablate.claims.verdict import at_best_lr

    _, picks = at_best_lr(cells, [], choose_on=choose_on)
    return slipped_rates(cells, [], choose_on, {what: lr for what, lr, _ in picks})


def test_a_chosen_rate_that_fails_on_the_fresh_seeds_is_named():
    from ablate.claims.rate_choice import slipped_text

    # gelu-vs-relu's ReLU: 1e-2 lucky on the three choosing seeds, poor on the fresh ones.
    scores = {(0, 3e-3): 2.022, (1, 3e-3): 2.005, (2, 3e-3): 2.009, (0, 1e-2): 1.990, (1, 1e-2): 1.976,
              (2, 1e-2): 1.951, **{(s, 1e-2): v for s, v in zip(range(3, 9), (2.16, 2.22, 2.20, 2.29, 2.17, 1.97))}}
    slips = _slips(_arm(scores))
    assert [(lr, other) for _, lr, other, _, _ in slips] == [(1e-2, 3e-3)]
    assert "b's chosen rate did not hold on the fresh seeds" in slipped_text("b", slips)
    held = {**scores, **{(s, 1e-2): 1.97 + 0.01 * (s % 3) for s in range(3, 9)}}  # the fresh seeds agree
    assert _slips(_arm(held)) == []


def test_a_best_rate_chosen_right_is_rarely_called_slipped():
    rng = np.random.default_rng(3)
    curve, flagged, n = {1e-3: 2.20, 3e-3: 2.00, 1e-2: 2.03}, 0, 200
    for _ in range(n):
        seed_effect = rng.normal(0.0, 0.05, 12)
        scores = {(s, lr): mean + seed_effect[s] + rng.normal(0.0, 0.03) for s in range(3) for lr, mean in curve.items()}
        chosen = min(curve, key=lambda lr: np.mean([scores[(s, lr)] for s in range(3)]))
        scores.update({(s, chosen): curve[chosen] + seed_effect[s] + rng.normal(0.0, 0.03) for s in range(3, 12)})
        flagged += bool(_slips(_arm(scores)))
    assert flagged / n <= 0.05  # a true best (3e-3) or one 0.03 nats off it: no slip shown
