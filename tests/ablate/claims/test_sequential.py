"""The group-sequential decision (ablate/claims/sequential.py) by simulation with known truth: seeded,
numpy only, no training. Each test kind's false-decision rate under the null stays within alpha
plus two Monte Carlo standard errors over 2,000 sequences of looks; its power under a stated
alternative; futility at the effect of interest; graphical Holm across clauses; and the decision
and the cells it asks for, rebuilt from synthetic run folders."""
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from ablate.analysis.stats import ONE_SIDED_ALPHA
from ablate.claims.claim_file import parse_claim
from ablate.claims.sequential import clause_looks, decide_claim, decide_results
from ablate.claims.spending import LOOKS, boundaries, nominal_levels, spent
from ablate.claims.verdict import AGREES, CANNOT_TELL, DISAGREES, Result
from tests.helpers.synthetic_runs import write_run

SEQUENCES = 2000
ALPHA = ONE_SIDED_ALPHA
PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"


def comparison(measure="final_val_loss", **kw):
    entry = {"measure": measure, "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher", "effect": 0.5, **kw}
    if "than" in kw:
        entry.pop("b")
    if entry["effect"] is None:
        entry.pop("effect")
    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g",
                        "clause": [{"sentence": "s", "label": "l", "compare": [entry]}]}).clauses[0].compare[0]


def outcome_rates(c, draw, level=ALPHA, n=SEQUENCES):
    """Share of simulated sequences (each LOOKS[-1] seeds' values, looked at LOOKS) ending in each outcome."""
    counts = {AGREES: 0, DISAGREES: 0, CANNOT_TELL: 0}
    for _ in range(n):
        values = draw()
        r = Result(c, "u", seed_values=tuple(values), seed_ids=tuple(range(len(values))))
        counts[clause_looks([r], level)[-1].outcome] += 1
    return {k: v / n for k, v in counts.items()}


def ceiling(rate=ALPHA, n=SEQUENCES):
    return rate + 2 * math.sqrt(rate * (1 - rate) / n)


def test_the_boundaries_spend_alpha_as_lan_demets_obrien_fleming():
    # Two equally spaced looks at one-sided 0.025: 2.963 and 1.969 (Jennison & Turnbull 2000, table 7.6)
    assert boundaries((12, 24), 0.025) == pytest.approx((2.9626, 1.9686), abs=2e-3)
    assert spent(1.0, ALPHA) == pytest.approx(ALPHA) and spent(0.5, ALPHA) < ALPHA / 10
    levels = nominal_levels(ALPHA)
    assert list(levels) == sorted(levels) and levels[-1] < ALPHA and levels[0] < 1e-5


def test_a_continuous_measure_s_sign_test_holds_its_error_rate_under_the_null_and_has_power():
    rng = np.random.default_rng(0)
    c = comparison()
    null = outcome_rates(c, lambda: rng.normal(0.0, 1.0, LOOKS[-1]))
    assert null[AGREES] <= ceiling()
    at_effect = outcome_rates(c, lambda: rng.normal(0.5, 1.0, LOOKS[-1]))  # the truth is the effect itself
    assert at_effect[DISAGREES] <= ceiling()  # futility's error: "no effect as large as 0.5" when there is
    alternative = outcome_rates(c, lambda: rng.normal(1.5, 1.0, LOOKS[-1]), n=500)  # 1.5 sd: stated alternative
    assert alternative[AGREES] >= 0.8


def test_non_inferiority_holds_its_error_rate_at_the_margin():
    rng = np.random.default_rng(1)
    c = comparison(expect="not_higher", margin=0.3, effect=None)
    at_margin = outcome_rates(c, lambda: rng.normal(0.3, 1.0, LOOKS[-1]))  # worse by exactly the margin
    assert at_margin[AGREES] <= ceiling()
    equal = outcome_rates(c, lambda: rng.normal(-1.2, 1.0, LOOKS[-1]), n=500)  # 1.5 sd inside the margin
    assert equal[AGREES] >= 0.8


def _shares(rng, p, cells=6):
    return rng.binomial(cells, p, LOOKS[-1]) / cells


def test_the_sign_test_over_seeds_holds_its_error_rate_under_the_null_and_has_power():
    rng = np.random.default_rng(2)
    c = comparison("failed", effect=0.25)
    # both arms fail 30% of their 6 cells a seed: the per-seed difference is symmetric about 0
    null = outcome_rates(c, lambda: _shares(rng, 0.3) - _shares(rng, 0.3))
    assert null[AGREES] <= ceiling()
    # post fails 80% of its cells, pre 10%: every seed the claimed way, most of the time
    alternative = outcome_rates(c, lambda: _shares(rng, 0.8) - _shares(rng, 0.1), n=500)
    assert alternative[AGREES] >= 0.8


def test_a_failure_rate_against_a_bound_holds_its_error_rate():
    rng = np.random.default_rng(3)
    c = comparison("failed", expect="lower", than=0.25, effect=0.25)
    # per-seed share - 0.25 symmetric about 0: the median share is the bound itself
    null = outcome_rates(c, lambda: rng.choice([-0.25, 0.25], LOOKS[-1]) * rng.uniform(0.1, 1, LOOKS[-1]))
    assert null[AGREES] <= ceiling()
    never = outcome_rates(c, lambda: _shares(rng, 0.02) - 0.25, n=300)
    assert never[AGREES] >= 0.8


def test_looking_at_every_look_beats_looking_once_with_the_same_error():
    # The point of the spending: a naive test at alpha at every look would exceed alpha.
    rng = np.random.default_rng(4)
    c = comparison()
    naive = 0
    for _ in range(SEQUENCES):
        d = rng.normal(0.0, 1.0, LOOKS[-1])
        naive += any(Result(c, "u", seed_values=tuple(d[:n]), seed_ids=tuple(range(n))) and
                     _one_look_agrees(c, d[:n]) for n in LOOKS)
    assert naive / SEQUENCES > ceiling()  # why a sequential design is needed


def _one_look_agrees(c, d):
    from ablate.claims.verdict import run_test

    t = run_test(Result(c, "u", seed_values=tuple(d), seed_ids=tuple(range(len(d)))), ALPHA)
    return t is not None and t.shown(ALPHA)


def test_futility_is_decided_when_the_interval_excludes_the_effect():
    c = comparison()
    d = np.array([0.02, -0.03, 0.01, 0.0, -0.01, 0.03] * 2)  # about 0 with a small spread; effect 0.5
    looks = clause_looks([Result(c, "u", seed_values=tuple(d), seed_ids=tuple(range(12)))], ALPHA)
    # a sign test's smallest p at 6 seeds (1/64) is over the second look's level: futile at 12
    assert [lk.n_seeds for lk in looks] == [3, 6, 12] and looks[-1].outcome == DISAGREES
    assert looks[-1].futility_statistic >= looks[-1].boundary


# ------------------------------------------------------------------ from run folders, end to end


def _failure_seed(root, seed, post_fails, pre_fails):
    for lr in (1e-3, 1e-2):
        write_run(root, POST, seed, losses=[4.0, 3.3], val_loss=3.35 if post_fails else 2.5, unigram_entropy=3.4,
                  options={"lr": lr})
        write_run(root, PRE, seed, losses=[4.0, 3.0], val_loss=3.35 if pre_fails else 2.5 + 0.01 * (seed % 3),
                  unigram_entropy=3.4, options={"lr": lr})


CLAIM = {"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
    {"sentence": "s0", "label": "post fails more", "compare": [
        {"measure": "failed", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher", "effect": 0.25}]},
    {"sentence": "s1", "label": "loss higher", "compare": [
        {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher",
         "effect": 0.05}]}]}


def test_the_decision_asks_for_the_next_look_s_cells_then_stops(tmp_path):
    claim = parse_claim(CLAIM)
    for s in range(3):
        _failure_seed(tmp_path, s, True, False)
    first = decide_claim(claim, tmp_path)
    assert not first.done and [c.status for c in first.clauses] == [CANNOT_TELL, CANNOT_TELL]
    assert first.clauses[0].next_seeds == (0, 1, 2, 3, 4, 5)
    assert {"norm": "post", "seed": [0, 1, 2, 3, 4, 5]} in first.next_cells
    assert first.to_json()["clauses"][0]["looks"][0]["seeds"] == 3
    for s in range(3, 12):
        _failure_seed(tmp_path, s, True, False)
    again = decide_claim(claim, tmp_path)
    # 12 seeds, every one the claimed way on both clauses: decided, nothing more to run
    assert again.done and [c.status for c in again.clauses] == [AGREES, AGREES] and not again.next_cells
    assert again.headline == "agrees (2 of 2)"
    assert [lk.n_seeds for lk in again.clauses[0].looks] == [3, 6, 12]
    # rebuilt from the folders alone: the same decision every time, as plain JSON
    assert decide_claim(claim, tmp_path).to_json() == again.to_json()
    json.dumps(again.to_json(), allow_nan=False)


def test_seeds_beyond_a_complete_look_wait_for_the_next_one(tmp_path):
    claim = parse_claim(CLAIM)
    for s in range(8):  # 8 seeds: looks at 3 and 6; seeds 6 and 7 wait for the look at 12
        _failure_seed(tmp_path, s, True, False)
    decision = decide_claim(claim, tmp_path)
    assert [lk.n_seeds for lk in decision.clauses[0].looks] == [3, 6]
    assert decision.clauses[0].next_seeds == tuple(range(12))


def test_the_decision_report_shows_each_look_and_the_running_statistic(tmp_path):
    from ablate.claims.decision_report import write_decision_report

    claim = parse_claim(CLAIM)
    for s in range(12):
        _failure_seed(tmp_path / "cells", s, True, False)
    decision = decide_claim(claim, tmp_path / "cells")
    report = write_decision_report(claim, tmp_path / "decide", decision, stopped="every clause decided")
    text = report.read_text()
    assert "**Verdict: agrees (2 of 2).**" in text and "The looks ended: every clause decided." in text
    assert "| 12 |" in text and "unit: the seed" in text
    assert (tmp_path / "decide" / "plots" / "decide_t.png").read_bytes().startswith(b"\x89PNG")


def test_holm_across_clauses_holds_the_familywise_error_rate():
    # three clauses, one with a real effect and two null: a false "agrees" on either null clause
    # is a familywise error; the real one's decision frees its share of alpha for the others.
    from ablate.claims.sequential import decide_results

    entry = {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher",
             "effect": 0.5}
    claim = parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
        {"sentence": f"s{i}", "label": f"c{i}", "compare": [entry]} for i in range(3)]})
    rng = np.random.default_rng(5)
    errors, real = 0, 0
    for _ in range(SEQUENCES):
        means = (1.5, 0.0, 0.0)
        results = [[Result(clause.compare[0], "u", seed_values=tuple(rng.normal(mu, 1.0, LOOKS[-1])),
                           seed_ids=tuple(range(LOOKS[-1])))] for clause, mu in zip(claim.clauses, means)]
        statuses = [c.status for c in decide_results(claim, results).clauses]
        errors += AGREES in statuses[1:]
        real += statuses[0] == AGREES
    assert errors / SEQUENCES <= ceiling()
    assert real / SEQUENCES >= 0.8  # the real effect (1.5 sd) is found at Holm's level


def test_futility_says_when_the_effect_is_shown_the_other_way(tmp_path):
    claim = parse_claim({**CLAIM, "clause": CLAIM["clause"][1:]})  # "post's loss is higher", effect 0.05
    for s in range(12):  # post ends 0.1 nats *below* pre in every seed
        write_run(tmp_path, POST, s, losses=[4.0, 3.0], val_loss=2.4 + 0.01 * (s % 3), unigram_entropy=3.4)
        write_run(tmp_path, PRE, s, losses=[4.0, 3.0], val_loss=2.5, unigram_entropy=3.4)
    clause = decide_claim(claim, tmp_path).clauses[0]
    last = clause.looks[-1]
    assert clause.status == DISAGREES and last.statistic <= -last.boundary
    assert clause.why.startswith("no effect as large as 0.05 nats at 12 seeds")
    assert clause.why.endswith(f"; shown the other way (z {last.statistic:.2f} <= -{last.boundary:.2f})")
    for s in range(12):  # about no difference: futile, but not the other way
        write_run(tmp_path / "flat", POST, s, losses=[4.0, 3.0], val_loss=2.5 + 0.01 * (s % 3 - 1), unigram_entropy=3.4)
        write_run(tmp_path / "flat", PRE, s, losses=[4.0, 3.0], val_loss=2.5, unigram_entropy=3.4)
    flat = decide_claim(claim, tmp_path / "flat").clauses[0]
    assert flat.status == DISAGREES and "other way" not in flat.why


# ----------------------------------------- the whole --decide loop's family-wise error, simulated
#
# Every sampled kind is read by the exact sign test (ablate/claims/decide.py), so a clause's looks
# depend on its seeds only through counts: how many of the first n seeds lie above and below 0,
# the effect and minus it. The simulations below draw several thousand sequences with numpy,
# run the real clause_looks once per distinct pattern of counts (and level), and the real
# graphical Holm (sequential.graphical_holm) on every sequence: the decisions are exactly those
# of decide_results, at a small part of its cost.

FAMILY_SEQUENCES = 4000


def _patterns(d, effect, looks):
    """Each sequence's counts at each look that its sign tests read (x: a - b turned the claimed
    way): x above 0, x below 0, x below the effect."""
    cols = []
    for n in looks:
        x = d[:, :n]
        cols += [(x > 0).sum(1), (x < 0).sum(1), (x < effect).sum(1)]
    return np.unique(np.stack(cols, 1), axis=0, return_index=True, return_inverse=True)[1:]


class Family:
    """Clauses (one comparison each) with drawn per-seed values: clause_looks memoised on the
    counts its sign tests read."""

    def __init__(self, compares, draws, looks=LOOKS):
        self.compares, self.draws, self.looks, self.cache = compares, draws, looks, {}
        self.patterns = [_patterns(d if c.higher else -d, c.effect or 0.0, looks) for c, d in zip(compares, draws)]
        self.patterns = [(first, inverse.ravel()) for first, inverse in self.patterns]

    def looks_of(self, i):
        def at(j, level):
            first, inverse = self.patterns[j]
            key = (j, int(inverse[i]), level)
            if key not in self.cache:
                d = self.draws[j][first[key[1]]]
                r = Result(self.compares[j], "u", seed_values=tuple(d), seed_ids=tuple(range(len(d))))
                self.cache[key] = clause_looks([r], level, self.looks)
            return self.cache[key]
        return at

    def false_agrees(self, null, alpha=ALPHA, holm=None):
        """Share of sequences with any null clause shown the claimed way (a false "agrees")."""
        from ablate.claims.sequential import graphical_holm

        holm = holm or graphical_holm
        m, n = len(self.compares), len(self.draws[0])
        errors = 0
        for i in range(n):
            _, rejected = holm(m, alpha, self.looks_of(i))
            errors += any(j in rejected for j in null)
        return errors / n


def _claim_of(entries):
    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
        {"sentence": f"s{i}", "label": f"c{i}", "compare": [e]} for i, e in enumerate(entries)]})


def _entry(measure="final_val_loss", effect=1.0, **kw):
    entry = {"measure": measure, "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher", "effect": effect, **kw}
    if "than" in kw:
        entry.pop("b")
    return entry


def _median_share_at(bound, cells, rng, shape):
    """Per-seed failure shares of `cells` cells whose median is exactly `bound`: the seed's failure
    count is binomial at the rate whose chance of a share under the bound equals that of over it."""
    from scipy import optimize, stats as st

    lo, hi = math.floor(bound * cells - 1e-9), math.ceil(bound * cells + 1e-9)
    rate = optimize.brentq(lambda p: st.binom.cdf(lo, cells, p) - st.binom.sf(hi - 1, cells, p), 1e-6, 1 - 1e-6)
    return rng.binomial(cells, rate, shape) / cells


def _nulls(rng, n, seeds=LOOKS[-1]):
    """Per-seed a - b under each null the tests are about (their median exactly 0)."""
    shape = (n, seeds)
    return {
        "normal": rng.normal(0.0, 1.0, shape),
        # an exponential skew on the side the claim points to, and on the other: median 0
        "skew claimed": rng.exponential(1.0, shape) - math.log(2),
        "skew opposite": math.log(2) - rng.exponential(1.0, shape),
        # a failed run on one side now and then: a jump of 3 sd the claimed way in 10% of seeds
        "failure jump": np.where(rng.random(shape) < 0.5, -np.abs(rng.normal(0, 0.3, shape)),
                                 np.where(rng.random(shape) < 0.2, 3.0, np.abs(rng.normal(0, 0.3, shape)))),
        # failure shares: both arms fail 30% of their 6 cells a seed
        "shares": rng.binomial(6, 0.3, shape) / 6 - rng.binomial(6, 0.3, shape) / 6,
        # one arm's share of failed cells against a bound of 0.25, its median exactly at the bound
        "bound": _median_share_at(0.25, 4, rng, shape) - 0.25,
    }


MIXED = {2: [("normal", "t"), ("bound", "than")],
         4: [("skew claimed", "t"), ("shares", "binary"), ("failure jump", "t"), ("bound", "than")]}


def _compare(kind, effect):
    if kind == "than":  # "a's failure share is lower than 0.25"; effect in shares
        return _claim_of([_entry("failed", effect=min(0.2, 0.1 * effect), a={"norm": "pre"}, than=0.25,
                                 expect="lower")]).clauses[0].compare[0]
    if kind == "binary":
        return _claim_of([_entry("failed", effect=0.25 * effect)]).clauses[0].compare[0]
    return _claim_of([_entry(effect=effect)]).clauses[0].compare[0]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("effect", [0.5, 1.0, 1.5])
def test_the_decide_loop_holds_the_familywise_error_for_mixed_kinds_and_skewed_nulls(m, effect):
    rng = np.random.default_rng(10 + m + int(10 * effect))
    nulls = _nulls(rng, FAMILY_SEQUENCES)
    compares, draws = [], []
    for name, kind in MIXED[m]:
        compares.append(_compare(kind, effect))
        draws.append(-nulls[name] if kind == "than" else nulls[name])  # "lower": the claimed way is below
    assert Family(compares, draws).false_agrees(null=range(m)) <= ceiling(n=FAMILY_SEQUENCES)


def test_a_real_effect_passes_its_alpha_on_and_the_nulls_still_hold():
    rng = np.random.default_rng(20)
    nulls = _nulls(rng, FAMILY_SEQUENCES)
    real = rng.normal(1.5, 1.0, (FAMILY_SEQUENCES, LOOKS[-1]))  # clause 0 true: its share passes on
    compares = [_compare("t", 1.0), _compare("t", 1.0), _compare("t", 1.0), _compare("binary", 1.0)]
    family = Family(compares, [real, nulls["skew claimed"], nulls["failure jump"], nulls["shares"]])
    assert family.false_agrees(null=(1, 2, 3)) <= ceiling(n=FAMILY_SEQUENCES)


def test_futility_frees_no_alpha():
    # Four null clauses, effect of interest 1 sd: most stop for futility ("no effect as large as
    # 1 sd"), which rejects nothing; their shares stay locked.
    rng = np.random.default_rng(21)
    compares = [_compare("t", 1.0) for _ in range(4)]
    family = Family(compares, [rng.normal(0.0, 1.0, (FAMILY_SEQUENCES, LOOKS[-1])) for _ in range(4)])
    assert family.false_agrees(null=range(4)) <= ceiling(n=FAMILY_SEQUENCES)


def test_a_clause_stopped_for_futility_passes_no_share_on():
    from ablate.claims.sequential import decide_results

    claim = _claim_of([_entry(effect=1.0), _entry(effect=1.0)])
    futile = [0.1, -0.2, 0.05, 0.0, -0.1, 0.2, 0.1, -0.05, 0.15, -0.15, 0.3, -0.3]  # far short of 1
    nine = [1.5] * 10 + [-0.5] * 2  # 10 of 12 seeds the claimed way: p 0.019, within 0.025, not 0.0125
    results = [[Result(c.compare[0], "u", seed_values=tuple(d), seed_ids=tuple(range(12)))]
               for c, d in zip(claim.clauses, (futile, nine))]
    decision = decide_results(claim, results)
    assert [c.status for c in decision.clauses] == [DISAGREES, CANNOT_TELL]
    assert decision.clauses[1].level == pytest.approx(ALPHA / 2)


def test_the_fixed_design_s_holm_frees_no_alpha_through_futility():
    from ablate.claims.verdict import decide_clauses, run_test

    rng = np.random.default_rng(22)
    claim = _claim_of([_entry(effect=1.0)] * 4)
    n, errors = 3000, 0
    for _ in range(n):
        results = []
        for clause in claim.clauses:
            r = Result(clause.compare[0], "u", seed_values=tuple(rng.normal(0.0, 1.0, 12)), seed_ids=tuple(range(12)))
            results.append([Result(**{**r.__dict__, "test": run_test(r, ALPHA)})])
        errors += any(c.outcome == AGREES for c in decide_clauses(claim, results, [ALPHA] * 4))
    assert errors / n <= ceiling(n=n)


def test_an_effect_shown_the_claimed_way_but_smaller_than_claimed_says_so():
    from ablate.claims.sequential import decide_results

    claim = _claim_of([_entry(effect=1.0)])
    d = np.array([0.3, 0.25, 0.4, 0.35, 0.2, 0.3, 0.28, 0.33, 0.31, 0.22, 0.37, 0.29])  # 0.3, effect 1.0
    decision = decide_results(claim, [[Result(claim.clauses[0].compare[0], "u", seed_values=tuple(d),
                                              seed_ids=tuple(range(12)))]])
    c = decision.clauses[0]
    assert c.status == DISAGREES and c.why.startswith("agrees in direction, smaller than claimed: shown beyond 0")
    assert decision.to_json()["clauses"][0]["smaller_than_claimed"] is True


# ------------------------------------------------------------- the looks follow the grid's seeds


def test_the_looks_follow_the_grid_s_own_seeds_whatever_they_are(tmp_path):
    claim = parse_claim(CLAIM)
    for s in (5, 6, 7):  # a grid whose own seeds are 5, 6, 7
        _failure_seed(tmp_path, s, True, False)
    first = decide_claim(claim, tmp_path)
    assert [lk.seeds for lk in first.clauses[0].looks] == [(5, 6, 7)]
    assert first.clauses[0].next_seeds == (5, 6, 7, 8, 9, 10)  # the grid's seeds, then the next integers
    for s in (8, 9, 10):
        _failure_seed(tmp_path, s, True, False)
    again = decide_claim(claim, tmp_path)
    assert [lk.n_seeds for lk in again.clauses[0].looks] == [3, 6] and again.clauses[0].next_seeds == tuple(range(5, 17))


def test_a_best_rate_clause_s_fresh_seeds_follow_the_grid_s_own_seeds(tmp_path):
    entry = {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher",
             "effect": 0.05, "best_lr": True}
    claim = parse_claim({**CLAIM, "clause": [{"sentence": "s", "label": "l", "compare": [entry]}]})
    for s in (5, 6, 7):
        for lr in (1e-3, 1e-2):
            write_run(tmp_path, POST, s, losses=[4.0, 3.0], val_loss=2.6 + lr, unigram_entropy=3.4, options={"lr": lr})
            write_run(tmp_path, PRE, s, losses=[4.0, 3.0], val_loss=2.5 + lr, unigram_entropy=3.4, options={"lr": lr})
    first = decide_claim(claim, tmp_path)
    assert first.clauses[0].next_seeds == (8, 9, 10)  # fresh: never the seeds that chose the rates
    assert {"norm": "post", "seed": [8, 9, 10], "lr": 1e-3} in first.next_cells
    for s in (8, 9, 10):  # the chosen rates on the fresh seeds: the rates are not chosen again
        write_run(tmp_path, POST, s, losses=[4.0, 3.0], val_loss=2.601, unigram_entropy=3.4, options={"lr": 1e-3})
        write_run(tmp_path, PRE, s, losses=[4.0, 3.0], val_loss=2.501, unigram_entropy=3.4, options={"lr": 1e-3})
    again = decide_claim(claim, tmp_path)
    assert again.clauses[0].results[0].sweep_seeds == (5, 6, 7)
    assert [lk.seeds for lk in again.clauses[0].looks] == [(8, 9, 10)]
    assert again.clauses[0].next_seeds == tuple(range(8, 14))


def test_the_stated_power_is_what_the_decide_loop_achieves():
    # the closed form (spending.power) against the loop itself on simulated seeds
    from ablate.claims.spending import power

    rng = np.random.default_rng(30)
    c = _compare("t", 1.0)
    d = rng.normal(1.0, 1.0, (FAMILY_SEQUENCES, LOOKS[-1]))  # the true effect is the effect of interest, 1 sd
    family = Family([c], [d])
    agrees = np.mean([family.looks_of(i)(0, ALPHA)[-1].outcome == AGREES for i in range(FAMILY_SEQUENCES)])
    se = math.sqrt(power(1.0, ALPHA) * (1 - power(1.0, ALPHA)) / FAMILY_SEQUENCES)
    assert abs(agrees - power(1.0, ALPHA)) <= 3 * se
    assert power(1.5, ALPHA) > power(1.0, ALPHA) > power(1.0, ALPHA / 4) > power(0.5, ALPHA)


# ------------------------------------------------------------ more seeds after a plan's looks


def _crossing_rate(looks, cs, rng, n=40000):
    """Share of null sequences (mean-0 normal seeds; z = the seeds' standardised sum) crossing
    any boundary: the Brownian motion the boundaries are solved for, vectorised."""
    increments = rng.normal(0.0, 1.0, (n, looks[-1])).cumsum(1)
    z = np.stack([increments[:, k - 1] / math.sqrt(k) for k in looks], 1)
    return float((z >= np.asarray(cs)[None, :]).any(1).mean()), n


def test_a_continuation_keeps_the_past_looks_boundaries_and_the_error_rate():
    from ablate.claims.spending import continued

    rng = np.random.default_rng(40)
    # read at looks 3 and 6 of the plan (3, 6, 12), continued to (3, 6, 12, 24)
    cs = continued((3, 6, 12), 2, (3, 6, 12, 24), ALPHA)
    assert cs[:2] == boundaries((3, 6, 12), ALPHA)[:2]  # the looks already read keep their boundaries
    rate, n = _crossing_rate((3, 6, 12, 24), cs, rng)
    assert rate <= ceiling(n=n) and rate >= ALPHA - 2 * math.sqrt(ALPHA * (1 - ALPHA) / n)
    # a plan finished has spent all of alpha: the looks it adds cannot decide
    done = continued((3, 6, 12), 3, (3, 6, 12, 24), ALPHA)
    assert done[:3] == boundaries((3, 6, 12), ALPHA) and math.isinf(done[3])
    # restarting a fresh plan over seeds already judged is the leak a continuation avoids
    naive = (*boundaries((3, 6, 12), ALPHA), boundaries((3, 6, 12, 24), ALPHA)[3])
    assert _crossing_rate((3, 6, 12, 24), naive, rng)[0] > ceiling(n=n)


def test_a_fixed_design_over_a_decided_folder_states_its_error_rate():
    from ablate.claims.spending import fixed_after_decide

    rng = np.random.default_rng(41)
    from scipy import stats

    z_alpha = float(stats.norm.isf(ALPHA))
    for seeds in (24, 48):
        stated = fixed_after_decide(seeds, ALPHA)
        rate, n = _crossing_rate((3, 6, 12, seeds), (*boundaries((3, 6, 12), ALPHA), z_alpha), rng)
        assert abs(rate - stated) <= 3 * math.sqrt(stated * (1 - stated) / n)
        assert stated > ceiling(n=n)
    assert fixed_after_decide(12, ALPHA) == ALPHA  # within the plan's seeds: no new seed to cross


def test_the_quick_run_spends_no_alpha_so_decide_may_read_its_seeds_as_look_one(tmp_path):
    # The README's path: the quick run (the grid's 3 seeds, a fixed test at 0.025), then --decide,
    # whose look 1 is the same 3 seeds. The sign test's smallest p at 3 seeds is 1/8: the quick
    # run cannot say "agrees" (nor "does not agree"), so it spends nothing and look 1 is fresh.
    from ablate.claims.verdict import evaluate

    claim = parse_claim(CLAIM)
    for s in range(3):  # every seed as far the claimed way as it goes
        _failure_seed(tmp_path, s, True, False)
    quick = evaluate(claim, tmp_path)
    assert [c.outcome for c in quick.clauses] == [CANNOT_TELL, CANNOT_TELL]
    assert all("cannot decide with 3 seeds; needs at least 6" in c.why for c in quick.clauses)
    assert decide_claim(claim, tmp_path).clauses[0].looks[0].seeds == (0, 1, 2)


def test_the_fixed_design_words_an_effect_smaller_than_claimed(tmp_path):
    from ablate.claims.claim_report import clause_line
    from ablate.claims.verdict import evaluate

    claim = parse_claim({**CLAIM, "clause": CLAIM["clause"][1:]})  # "post's loss is higher", effect 0.05
    for s in range(8):  # post 0.01 nats above pre in every seed: the claimed way, far short of 0.05
        write_run(tmp_path, POST, s, losses=[4.0, 3.0], val_loss=2.51 + 0.001 * s, unigram_entropy=3.4)
        write_run(tmp_path, PRE, s, losses=[4.0, 3.0], val_loss=2.5, unigram_entropy=3.4)
    verdict = evaluate(claim, tmp_path)
    c = verdict.clauses[0]
    assert c.outcome == DISAGREES and c.shown
    assert "agrees in direction, smaller than claimed: shown beyond 0 the claimed way" in clause_line(0, c)
    from ablate.claims.claim_report import as_dict

    saved = as_dict(verdict)["clauses"][0]
    assert saved["smaller_than_claimed"] is True and saved["comparisons"][0]["test"]["estimand"] == "the median seed's a - b"


def test_a_planned_continuation_decides_at_its_added_look_only_with_alpha_left():
    from ablate.claims.sequential import decide_results

    claim = _claim_of([_entry(effect=0.5)])
    # 9 of the first 12 seeds the claimed way (p 0.073: no look of (3, 6, 12) decides), 19 of 24 (p 0.0033)
    d = [1.0] * 9 + [-1.0] * 3 + [1.0] * 10 + [-1.0] * 2
    results = [[Result(claim.clauses[0].compare[0], "u", seed_values=tuple(d), seed_ids=tuple(range(24)))]]
    plan = (3, 6, 12, 24)
    # declared before the old plan's last look (two looks read): look 4 has alpha to spend
    early = decide_results(claim, results, plan, kept_from=((3, 6, 12), 2)).clauses[0]
    assert early.status == AGREES and early.looks[-1].n_seeds == 24
    # after the plan (3, 6, 12) finished, nothing is left: the added look cannot decide
    late = decide_results(claim, results, plan, kept_from=((3, 6, 12), 3)).clauses[0]
    assert late.status == CANNOT_TELL and math.isinf(late.looks[-1].boundary)


def test_a_clause_waiting_for_its_other_comparison_says_which():
    from ablate.claims.sequential import decide_results

    claim = parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
        {"sentence": "s", "label": "both", "compare": [_entry(effect=1.0, label="gradient ratio"),
                                                       _entry(effect=0.02, label="init slope")]}]})
    clear = [9.0 + 0.1 * i for i in range(12)]  # every seed far beyond 1
    open_ = [0.05, -0.03] * 6  # half above 0.02, half below 0: neither shown nor short of 0.02
    results = [[Result(c, "u", seed_values=tuple(d), seed_ids=tuple(range(12)))
                for c, d in zip(claim.clauses[0].compare, (clear, open_))]]
    c = decide_results(claim, results).clauses[0]
    assert c.status == CANNOT_TELL and c.waits_for == ["init slope"]
    assert "waits for its other comparison: init slope" in c.why


def test_a_plan_past_the_power_ceiling_is_not_computed(monkeypatch):
    """`--looks 3,10000` (or --seeds 10000) ran the exact power, cubic in the seeds, for hours."""
    import ablate.claims.sequential as sequential

    def never(*args):
        raise AssertionError("power computed past MAX_POWER_SEEDS")

    monkeypatch.setattr(sequential, "power", never)
    lines = sequential.power_lines(parse_claim(CLAIM), (3, sequential.MAX_POWER_SEEDS + 1))
    assert lines and all(f"power not computed past {sequential.MAX_POWER_SEEDS} seeds" in line for line in lines)


def test_a_share_against_a_stated_rate_agrees_without_naming_an_effect_it_has_none_of():
    # prenorm-wins (d): "fails less than 1 in 4": a share failed is read against the bound (`than`),
    # its Result carrying no effect beyond it; the agreeing clause says so, not "... of interest ()"
    entry = _entry("failed", expect="lower", than=0.25, effect=0.1)
    claim = _claim_of([entry])
    compare = replace(claim.clauses[0].compare[0], effect=None)
    values = tuple([-0.25] * LOOKS[-1])  # every seed's share is 0, a quarter under the bound
    decision = decide_results(claim, [[Result(compare, "share failed", seed_values=values,
                                              seed_ids=tuple(range(len(values))))]])
    (clause,) = decision.clauses
    assert clause.status == AGREES
    assert "effect of interest" not in clause.why and "()" not in clause.why
    assert clause.why.startswith("shown beyond 0 at 12 seeds")
