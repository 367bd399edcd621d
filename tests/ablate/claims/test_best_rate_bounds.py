"""ablate/claims/best_rate_bounds.py: a best-rate comparison read against every near-best rate.
Simulated with known truth (numpy, seeded) on issue 52's coarse grids, the whole look sequence of
`--decide`: choose on 3 seeds, test on fresh seeds at LOOKS; and from synthetic run folders, the
pairings and the cells the next look asks for."""
import math

import numpy as np
import pytest

from ablate.analysis.stats import ONE_SIDED_ALPHA
from ablate.claims.best_rate_bounds import Candidates, Rival, n_pairings, pairings
from ablate.claims.claim_file import parse_claim
from ablate.claims.rate_choice import within_noise
from ablate.claims.sequential import clause_looks, decide_claim
from ablate.claims.spending import LOOKS
from ablate.claims.verdict import AGREES, DISAGREES, Result, evaluate
from tests.helpers.synthetic_runs import write_run

SEQUENCES = 1500
CHOOSING = 3
PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"


def _claim(effect=0.02, expect="lower"):
    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
        {"sentence": "s", "label": "l", "compare": [
            {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": expect,
             "effect": effect, "best_lr": True}]}]})


def _ceiling(rate=ONE_SIDED_ALPHA, n=SEQUENCES):
    return rate + 2 * math.sqrt(rate * (1 - rate) / n)


def _outcome(rng, compare, curve_a, curve_b, noise, rivals: bool, monotone: bool) -> str:
    """One `--decide` sequence: 3 choosing seeds at every rate, then fresh seeds at the candidate
    rates; a seed effect shared by both arms and all rates, rate-by-seed noise on each cell."""
    n = CHOOSING + LOOKS[-1]
    shared = rng.normal(0.0, 0.05, (n, 1))
    scores = {side: np.asarray(curve) + shared + rng.normal(0.0, noise, (n, len(curve)))
              for side, curve in (("a", curve_a), ("b", curve_b))}
    cands = {}
    for side, x in scores.items():
        chosen, near = within_noise(x[:CHOOSING])
        cands[side] = (Candidates("", {}, (chosen, *([j for j, _, _ in near] if rivals else []))),)
    seeds = tuple(range(CHOOSING, n))

    def values(at):  # the fresh seeds' a - b at a pairing of rates (here: column indices)
        return tuple(scores["a"][CHOOSING:, at[("a", "")]] - scores["b"][CHOOSING:, at[("b", "")]])

    others = tuple(Rival(tuple(at.items()), seeds, values(at), end) for at, end in pairings(cands, monotone))
    r = Result(compare, "nats", seed_ids=seeds, seed_values=values({(s, ""): c[0].rates[0] for s, c in cands.items()}),
               rivals=others)
    return clause_looks([r], ONE_SIDED_ALPHA)[-1].outcome


def _rate(outcome, curve_a, curve_b, noise, rivals=True, expect="lower", seed=0, monotone=True, n=SEQUENCES):
    rng, compare = np.random.default_rng(seed), _claim(expect=expect).clauses[0].compare[0]
    return sum(_outcome(rng, compare, curve_a, curve_b, noise, rivals, monotone) == outcome
               for _ in range(n)) / n


@pytest.mark.parametrize("gap, noise", [(0.01, 0.02), (0.02, 0.025), (0.03, 0.03)])
def test_equal_best_rates_rarely_agree_on_a_coarse_grid(gap, noise):
    curve = [2.50, 2.50 + gap, 2.70]  # two rates within noise of each other, the arms' best equal
    assert _rate(AGREES, curve, curve, noise, seed=int(gap * 1000)) <= _ceiling()


def test_a_measure_not_minimised_by_the_best_rate_reads_every_pairing_and_holds_too():
    curve = [2.50, 2.52, 2.70]
    assert _rate(AGREES, curve, curve, 0.025, seed=3, monotone=False) <= _ceiling()


@pytest.mark.parametrize("expect", ["lower", "higher"])
def test_read_at_the_chosen_rates_alone_the_same_grid_agrees_too_often(expect):
    # The tests above can fail: without the near-best pairings the false "agrees" returns,
    # whichever way the claim points (the pairings that move b for "lower", a for "higher").
    curve = [2.50, 2.52, 2.70]
    assert _rate(AGREES, curve, curve, 0.025, rivals=False, expect=expect, seed=5) > _ceiling()
    assert _rate(AGREES, curve, curve, 0.025, expect=expect, seed=5) <= _ceiling()


def test_a_best_rate_better_by_the_effect_is_rarely_called_short_of_it():
    # a's best is 0.02 under b's (the effect of interest): "no effect as large as 0.02" is the error.
    assert _rate(DISAGREES, [2.48, 2.49, 2.68], [2.50, 2.51, 2.70], 0.025, seed=11) <= _ceiling()


def test_a_clear_best_rate_effect_is_still_found():
    # Rates far apart (one candidate each): the plain comparison, with its power.
    assert _rate(AGREES, [2.40, 2.60, 2.80], [2.50, 2.70, 2.90], 0.025, seed=13) >= 0.8


# ------------------------------------------------------------------ from run folders


RATES = (1e-3, 3e-3, 1e-2)


def _write(root, fresh_b_second: float, seeds=range(9)):
    """a (post) best at 3e-3; b (pre) chooses 3e-3 on seeds 0-2 with 1e-2 within noise of it; on
    the fresh seeds b at 1e-2 scores `fresh_b_second`."""
    for s in seeds:
        jitter = 0.002 * ((s * 7) % 5 - 2)
        fresh = s >= CHOOSING
        losses = {POST: (2.60, 2.45 + jitter, 2.90),
                  PRE: (2.95, 2.50 + jitter * 1.5, (fresh_b_second if fresh else 2.503) + 0.001 * (s % 3))}
        for variant, by_rate in losses.items():
            for lr, val in zip(RATES, by_rate):
                write_run(root, variant, s, losses=[4.0, 3.0], val_loss=val, unigram_entropy=3.4, options={"lr": lr})


def test_a_clause_needs_its_effect_shown_against_every_near_best_rate(tmp_path):
    close, far = tmp_path / "close", tmp_path / "far"
    _write(close, fresh_b_second=2.45)  # b's 1e-2 is its true best, as good as a's
    _write(far, fresh_b_second=2.56)  # b's chosen 1e-3 holds
    near = evaluate(_claim(effect=0.01), close).results[0]
    assert [(side, what, lr) for r in near.rivals for side, what, lr in r.rates] == [("b", "", 1e-2)]
    assert near.test.p_value > ONE_SIDED_ALPHA  # at b's 1e-2 a is no better: not shown
    held = evaluate(_claim(effect=0.01), far).results[0]
    assert held.rivals and held.test.p_value <= ONE_SIDED_ALPHA  # a beats b at both of b's near-best rates
    main = held.seed_values
    assert held.test.interval.high >= np.median(main)  # the interval spans every pairing


def test_the_next_look_trains_the_fresh_seeds_at_every_near_best_rate(tmp_path):
    _write(tmp_path, fresh_b_second=2.45, seeds=range(6))
    clause = decide_claim(_claim(effect=0.01), tmp_path).clauses[0]
    lrs = {side: need.get("lr") for need in clause.needs for side in ("a", "b")
           if need.get("norm") == {"a": "post", "b": "pre"}[side]}
    assert lrs == {"a": 3e-3, "b": [3e-3, 1e-2]}
    assert clause.needs[0]["seed"] == list(range(CHOOSING, CHOOSING + LOOKS[1]))


def test_groups_an_arm_leaves_open_move_together_one_arm_at_a_time():
    def two(small, large):
        return Candidates("width 64", {"width": 64}, small), Candidates("width 384", {"width": 384}, large)

    cands = {"a": two((1e-3, 3e-3), (1e-3,)), "b": two((3e-3, 1e-2), (1e-3, 3e-3))}
    moving = pairings(cands, monotone=True)
    assert n_pairings(cands, True) == len(moving) + 1 == 5  # a: 2 rate sets, b: 4, less the chosen each
    assert {end for at, end in moving if at[("a", "width 64")] != 1e-3} == {"low"}
    assert all(at[("a", "width 64")] == 1e-3 for at, end in moving if end == "high")
    assert n_pairings(cands, False) == len(pairings(cands, monotone=False)) + 1 == 8


def test_a_pairing_that_went_the_other_way_is_not_called_the_best_rates_shown_the_other_way():
    from ablate.claims.sequential import decide_results

    claim = _claim(effect=0.5)
    seeds = tuple(range(CHOOSING, CHOOSING + LOOKS[-1]))
    rng = np.random.default_rng(2)
    short = tuple(-0.1 + rng.normal(0, 0.01, len(seeds)))  # a below b, far short of the effect
    against = Rival((("b", "", 3e-3),), seeds, tuple(0.2 + rng.normal(0, 0.01, len(seeds))), "high")
    r = Result(claim.clauses[0].compare[0], "nats", seed_ids=seeds, seed_values=short, rivals=(against,))
    clause = decide_results(claim, [[r]]).clauses[0]
    assert clause.status == DISAGREES and "other way" not in clause.why
    plain = decide_results(claim, [[Result(r.compare, "nats", seed_ids=seeds, seed_values=against.seed_values)]])
    assert "shown the other way" in plain.clauses[0].why  # the words exist where a test shows it
