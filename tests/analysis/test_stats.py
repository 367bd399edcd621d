"""analysis.stats: intervals, paired and unpaired comparisons, multiple-testing correction,
power, and divergence rates across seeds."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from ablate.analysis.stats import (BOOTSTRAP_MIN_VALUES, Interval, MAX_SEEDS, PAIRED, WELCH, adjust_p_values,
                                   bootstrap_ci, correct, discordant_pairs, group_stats, holm, interval_note,
                                   mcnemar_exact, mcnemar_pairs_for_power, mean_interval, one_sample_p_value,
                                   one_sided_power, one_sided_seeds_for_power, paired_comparison, paired_p_value,
                                   paired_power, seeds_for_power, tost, welch_p_value)

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
RMS, ONE = "pre.rmsnorm.gelu.dense.res", "pre.layernorm.swiglu.res"


def cells_frame(rows):
    """A minimal cell_metrics frame: (group, seed, status, final_val_loss)."""
    frame = pd.DataFrame(rows, columns=["group", "seed", "status", "final_val_loss"])
    frame["variant_id"] = frame["group"]
    frame["cell_id"] = frame["group"] + "__seed=" + frame["seed"].astype(str)
    return frame


@pytest.fixture
def cells():
    return cells_frame([
        (PRE, 0, "completed", 3.00), (PRE, 1, "completed", 3.10), (PRE, 2, "completed", 3.05),
        (POST, 0, "completed", 3.20), (POST, 1, "completed", 3.35), (POST, 2, "completed", 3.15),
        (RMS, 0, "completed", 2.50), (RMS, 1, "completed", 2.60), (RMS, 2, "diverged", np.nan),
        (RMS, 3, "running", 2.40),
        (ONE, 0, "completed", 2.90),
    ])


def test_bootstrap_interval_contains_the_mean_is_deterministic_and_is_scipys():
    values = np.array([3.0, 3.1, 3.05, 2.98, 3.2])
    ci = bootstrap_ci(values, seed=7)
    assert ci.low < values.mean() < ci.high
    assert bootstrap_ci(values, seed=7) == ci  # same seed, same interval
    expected = scipy_stats.bootstrap((values,), np.mean, confidence_level=0.95, n_resamples=9999,
                                     method="percentile", rng=np.random.default_rng(7)).confidence_interval
    assert (ci.low, ci.high) == pytest.approx((expected.low, expected.high))
    # the percentile interval of a mean lies within the sample's range
    assert values.min() <= ci.low and ci.high <= values.max()


def test_a_mean_over_few_seeds_gets_the_t_interval_and_over_many_the_bootstrap():
    few = np.array([2.51, 2.55, 2.60])
    ci = mean_interval(few)
    expected = scipy_stats.t.interval(0.95, df=2, loc=few.mean(), scale=scipy_stats.sem(few))
    assert (ci.low, ci.high) == pytest.approx(expected)
    # wider than the seeds' range, which a percentile bootstrap over 3 seeds cannot leave
    assert ci.low < few.min() and ci.high > few.max()
    assert interval_note(3) == "95% t interval over 3 seeds"
    many = np.random.default_rng(0).normal(3.0, 0.1, size=BOOTSTRAP_MIN_VALUES)
    assert mean_interval(many) == bootstrap_ci(many)
    assert interval_note(BOOTSTRAP_MIN_VALUES) == f"95% bootstrap over {BOOTSTRAP_MIN_VALUES} seeds"
    assert mean_interval([2.0, 2.0]) == Interval(2.0, 2.0, 0.95) and mean_interval([2.0]) is None


def test_fewer_than_two_values_have_no_interval_and_no_p_value():
    assert bootstrap_ci([3.0]) is None and bootstrap_ci([]) is None
    assert welch_p_value([1.0], [1.0, 2.0]) is None
    same = bootstrap_ci([2.0, 2.0, 2.0])
    assert (same.low, same.high) == (2.0, 2.0)


def test_group_stats_counts_means_and_divergence_rate(cells):
    table = group_stats(cells, seed=0).set_index("group")
    pre = table.loc[PRE]
    assert pre["final_val_loss_mean"] == pytest.approx(3.05)
    assert pre["final_val_loss_std"] == pytest.approx(np.std([3.0, 3.1, 3.05], ddof=1))
    assert pre["final_val_loss_ci_low"] <= 3.05 <= pre["final_val_loss_ci_high"]
    assert (pre["n_completed"], pre["divergence"], pre["divergence_rate"]) == (3, "0/3", 0.0)

    rms = table.loc[RMS]  # the running seed 3 enters no statistic; the diverged one is counted
    assert (rms["n_cells"], rms["n_completed"], rms["n_diverged"], rms["n_running"]) == (4, 2, 1, 1)
    assert rms["final_val_loss_mean"] == pytest.approx(2.55) and rms["seeds"] == "0,1"
    assert rms["divergence"] == "1/3" and rms["divergence_rate"] == pytest.approx(1 / 3)

    one = table.loc[ONE]  # one seed: a mean, but no interval
    assert one["final_val_loss_mean"] == 2.90
    assert math.isnan(one["final_val_loss_ci_low"]) and math.isnan(one["final_val_loss_ci_high"])
    assert one["interval"] == "no interval: only one seed"


def welch_by_hand(a, b):
    """Welch's t and Welch-Satterthwaite degrees of freedom, two-sided p."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return 2 * scipy_stats.t.sf(abs(t), df)


def test_paired_comparison_by_seed(cells):
    c = paired_comparison(cells, POST, PRE, seed=0)
    diffs = np.array([3.20 - 3.00, 3.35 - 3.10, 3.15 - 3.05])
    assert c.seeds == (0, 1, 2) and c.n_pairs == 3
    assert c.mean_diff == pytest.approx(diffs.mean())
    assert (c.mean_group, c.mean_baseline) == pytest.approx((3.2333333, 3.05))
    assert c.ci_low <= c.mean_diff <= c.ci_high
    # The interval comes from the paired t-test whose p-value is reported, so the two never
    # disagree (a percentile bootstrap over 3 seeds would be the seeds' [min, max]).
    expected = scipy_stats.ttest_1samp(diffs, 0.0).confidence_interval(0.95)
    assert (c.ci_low, c.ci_high) == pytest.approx((expected.low, expected.high))
    assert (c.ci_low > 0 or c.ci_high < 0) == (c.p_value < 0.05)
    t_paired = diffs.mean() / (diffs.std(ddof=1) / math.sqrt(3))  # seeds pair: the paired t-test
    assert c.test == PAIRED and c.p_value == pytest.approx(2 * scipy_stats.t.sf(abs(t_paired), 2))
    assert c.differences == pytest.approx(tuple(diffs))
    assert c.p_value > 0.05 and not c.significant()
    assert c.sentence().startswith(f"No significant difference between `{POST}` and `{PRE}`")
    assert f"paired t-test p={c.p_value:.2f}" in c.sentence()
    assert f"about {seeds_for_power(diffs)} paired seeds would detect" in c.sentence()


def test_a_significant_difference_reads_as_lower_with_its_interval(cells):
    c = paired_comparison(cells, RMS, PRE)  # only seeds 0 and 1 completed in both
    assert c.seeds == (0, 1)
    assert c.mean_diff == pytest.approx(((2.50 - 3.00) + (2.60 - 3.10)) / 2)
    assert c.test == PAIRED and c.p_value is None  # both differences are -0.5: nothing to test
    c3 = paired_comparison(cells_frame([(RMS, s, "completed", v) for s, v in enumerate([2.50, 2.60, 2.54])]
                                       + [(PRE, s, "completed", v) for s, v in enumerate([3.00, 3.10, 3.05])]),
                           RMS, PRE)
    assert c3.p_value == pytest.approx(scipy_stats.ttest_rel([2.50, 2.60, 2.54], [3.00, 3.10, 3.05]).pvalue)
    assert c3.significant()
    sentence = c3.sentence()
    assert sentence.startswith(f"`{RMS}` has a lower final validation loss than `{PRE}` by 0.5033 nats")
    assert "95% CI of the difference" in sentence and "3 paired seeds" in sentence


def test_one_shared_seed_says_no_interval_instead_of_a_number(cells):
    c = paired_comparison(cells, ONE, PRE)
    assert c.n_pairs == 1 and c.ci_low is None and c.ci_high is None and c.p_value is None
    assert c.mean_diff == pytest.approx(2.90 - 3.00)
    assert "only one seed, no interval" in c.sentence()
    nothing = paired_comparison(cells, ONE, "not-run")
    assert nothing.n_pairs == 0 and "baseline `not-run` has no completed seed" in nothing.sentence()
    disjoint = paired_comparison(cells_frame([(ONE, 0, "completed", 1.0), (PRE, 1, "completed", 2.0)]), ONE, PRE)
    assert "no seed completed in both" in disjoint.sentence()
    all_diverged = paired_comparison(cells_frame([(ONE, 0, "diverged", np.nan), (PRE, 0, "completed", 2.0)]), ONE, PRE)
    assert all_diverged.sentence() == f"`{ONE}` has no completed seed, so its final validation loss cannot be compared with `{PRE}`."


def test_paired_and_welch_disagree_and_the_comparison_uses_the_pairing():
    # Seeds differ a lot (0.5 nats) but within each seed the variant is 0.05 lower with a tiny
    # spread: Welch sees only the seed spread, the paired test sees the consistent shift.
    seed_effect = [3.0, 3.5, 4.0, 3.2]
    shift = [0.05, 0.052, 0.048, 0.051]
    base = [(PRE, s, "completed", v) for s, v in enumerate(seed_effect)]
    rows = base + [(POST, s, "completed", v - d) for s, (v, d) in enumerate(zip(seed_effect, shift))]
    c = paired_comparison(cells_frame(rows), POST, PRE)
    a = [v - d for v, d in zip(seed_effect, shift)]
    welch = welch_p_value(a, seed_effect)
    assert welch == pytest.approx(welch_by_hand(a, seed_effect)) and welch > 0.5  # Welch: nothing to see
    assert c.test == PAIRED and c.p_value < 1e-4 and c.significant()  # paired: a clear difference
    assert c.p_value == pytest.approx(scipy_stats.ttest_rel(a, seed_effect).pvalue)


def test_seeds_that_do_not_pair_fall_back_to_welch():
    # Disjoint seeds: no pairs, so the two groups' means are compared with Welch's test.
    rows = [(PRE, s, "completed", v) for s, v in zip((0, 1, 2), [3.0, 3.1, 3.05])]
    rows += [(POST, s, "completed", v) for s, v in zip((3, 4, 5), [3.3, 3.2, 3.25])]
    c = paired_comparison(cells_frame(rows), POST, PRE)
    assert c.test == WELCH and c.n_pairs == 0 and c.mean_diff == pytest.approx(0.2)
    assert c.p_value == pytest.approx(welch_by_hand([3.3, 3.2, 3.25], [3.0, 3.1, 3.05]))
    assert c.ci_low <= 0.2 <= c.ci_high and "unpaired: 3 and 3 seeds" in c.sentence()
    # Same seeds but another batch size: the seeds give different batches, so they do not pair.
    frame = cells_frame([(PRE, s, "completed", v) for s, v in enumerate([3.0, 3.1, 3.05])]
                        + [(POST, s, "completed", v) for s, v in enumerate([3.3, 3.2, 3.25])])
    frame["batch_size"] = np.where(frame["group"] == PRE, 16, 32)
    assert paired_comparison(frame, POST, PRE).test == WELCH
    frame["batch_size"] = 16
    assert paired_comparison(frame, POST, PRE).test == PAIRED


def test_benjamini_hochberg_is_scipys_and_skips_missing_p_values():
    p = [0.01, None, 0.04, 0.03, 0.005, 0.2]
    expected = scipy_stats.false_discovery_control([0.01, 0.04, 0.03, 0.005, 0.2], method="bh")
    adjusted = adjust_p_values(p, "bh")
    assert adjusted[1] is None
    assert [x for x in adjusted if x is not None] == pytest.approx(list(expected))
    assert adjust_p_values([None, None]) == [None, None] and adjust_p_values([]) == []
    with pytest.raises(ValueError, match="valid: bh, holm"):
        adjust_p_values([0.1], "bonferroni")


def test_holm_against_a_reference_computation():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04; made
    # non-decreasing: 0.02, 0.03, 0.06, 0.06; back in the original order.
    assert list(holm([0.01, 0.04, 0.03, 0.005])) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert list(holm([0.5, 0.9])) == pytest.approx([1.0, 1.0])  # capped at 1
    rng = np.random.default_rng(3)
    for _ in range(20):  # Holm's definition: max over j <= i of (m - j) p_(j), capped at 1
        p = rng.uniform(0, 0.2, size=7)
        order = np.argsort(p)
        reference = np.empty(7)
        for rank, index in enumerate(order):
            reference[index] = min(1.0, max((7 - j) * p[order[j]] for j in range(rank + 1)))
        assert list(holm(p)) == pytest.approx(list(reference))


def test_correct_adjusts_a_family_and_significance_follows_the_adjusted_p():
    rows = [(PRE, s, "completed", v) for s, v in enumerate([3.0, 3.1, 3.05])]
    rows += [(POST, s, "completed", v) for s, v in enumerate([3.06, 3.13, 3.10])]  # paired p ~ 0.03
    rows += [(RMS, s, "completed", v) for s, v in enumerate([3.01, 3.2, 2.99])]  # noise
    frame = cells_frame(rows)
    raw = [paired_comparison(frame, g, PRE) for g in (POST, RMS)]
    assert raw[0].significant()  # uncorrected, p < 0.05
    fixed = correct(raw, "holm")
    assert [c.p_adjusted for c in fixed] == pytest.approx(list(holm([c.p_value for c in raw])))
    assert fixed[0].p_adjusted > 0.05 and not fixed[0].significant()
    assert "Holm-adjusted" in fixed[0].sentence() and "No significant difference" in fixed[0].sentence()


@pytest.mark.parametrize("effect, expected", [(0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_for_power_matches_the_published_paired_t_test_sample_sizes(effect, expected):
    # Two-sided paired t-test, alpha 0.05, 80% power: n = 34, 15, 10 for d_z = 0.5, 0.8, 1.0
    # (Cohen 1988; G*Power). Differences with mean / std = effect:
    differences = np.array([-1.0, 1.0, -1.0, 1.0]) * (1 / np.std([-1, 1, -1, 1], ddof=1)) + effect
    assert differences.mean() / differences.std(ddof=1) == pytest.approx(effect)
    n = seeds_for_power(differences)
    assert n == expected
    assert paired_power(effect, n - 1) < 0.8 <= paired_power(effect, n)


def test_seeds_for_power_is_none_where_it_cannot_be_estimated():
    assert seeds_for_power([0.1]) is None  # one difference: no spread
    assert seeds_for_power([0.1, 0.1, 0.1]) is None  # no variation
    assert seeds_for_power([-0.1, 0.1]) is None  # mean zero: no difference to detect
    assert seeds_for_power([1e-6, -1e-6 + 1e-9, 2e-6, -2e-6]) is None  # beyond MAX_SEEDS
    medium = [0.3, -0.1, 0.25, -0.05]
    assert seeds_for_power(medium, power=0.99) > seeds_for_power(medium, power=0.8) > 2
    # d_z = 10: two pairs give 73% power, three 99.99%; scipy's nct gives NaN for the far tail
    # at 1 degree of freedom, which must count as 0, not poison the sum.
    assert paired_power(10.0 - 1e-12, 2) == pytest.approx(0.7328, abs=1e-4)
    assert seeds_for_power([1.0, 1.1, 0.9]) == 3


def test_one_sample_p_value_is_the_t_test_against_a_number_and_the_paired_test_of_differences():
    values = np.array([0.05, 0.06, 0.07])
    assert one_sample_p_value(values, 0.5) == pytest.approx(scipy_stats.ttest_1samp(values, 0.5).pvalue, rel=1e-12)
    # mean 0.06, sd 0.01, se 0.01 / sqrt(3): t = (0.06 - 0.5) / se = -76.2 on 2 degrees of freedom
    assert one_sample_p_value(values, 0.5) == pytest.approx(2 * scipy_stats.t.cdf(-0.44 * math.sqrt(3) / 0.01, 2))
    assert one_sample_p_value([0.2, 0.2, 0.2]) is None and one_sample_p_value([0.2]) is None
    a, b = np.array([3.0, 3.1, 3.05, 3.2]), np.array([3.1, 3.15, 3.1, 3.3])
    assert paired_p_value(a, b) == one_sample_p_value(a - b) == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue)


def test_mcnemar_exact_on_hand_counted_discordant_pairs():
    # 6 discordant pairs, all (1, 0): under no difference each is a coin flip, so the two-sided
    # exact p is 2 * 0.5**6 = 0.03125. Concordant pairs (1, 1) and (0, 0) carry no information.
    a = np.array([1, 1, 1, 1, 1, 1, 1, 0, 0])
    b = np.array([0, 0, 0, 0, 0, 0, 1, 0, 0])
    assert discordant_pairs(a, b) == (6, 0) and discordant_pairs(b, a) == (0, 6)
    assert mcnemar_exact(a, b) == pytest.approx(2 * 0.5 ** 6) == pytest.approx(mcnemar_exact(b, a))
    # 5 one way, 1 the other: p = 2 * P(X <= 1), X ~ Binomial(6, 1/2) = 2 * (1 + 6) / 64
    assert mcnemar_exact([1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 0, 1]) == pytest.approx(14 / 64)
    assert mcnemar_exact([1, 0, 1], [1, 0, 1]) is None  # no discordant pair: nothing to test


def test_mcnemar_pairs_for_power_is_the_exact_binomial_power():
    # Every pair (1, 0) with probability 1/2, else concordant: the test rejects once 6 pairs are
    # discordant (2 * 0.5**6 < 0.05 <= 2 * 0.5**5). P(Binomial(15, 1/2) >= 6) = 1 - 4944/32768
    # = 0.849 reaches 80%; P(Binomial(14, 1/2) >= 6) = 1 - 3473/16384 = 0.788 does not.
    assert mcnemar_pairs_for_power(0.5, 0.0, 0.05) == 15
    assert mcnemar_pairs_for_power(0.5, 0.0, 0.05, power=0.85) == 16  # 1 - 6885/65536 = 0.895

    def power(n, p10, p01, alpha=0.05):  # by brute force over every outcome, with binomtest
        return sum(scipy_stats.multinomial.pmf([n10, n01, n - n10 - n01], n, [p10, p01, 1 - p10 - p01])
                   for n10 in range(n + 1) for n01 in range(n + 1 - n10)
                   if n10 + n01 and scipy_stats.binomtest(n10, n10 + n01, 0.5).pvalue < alpha)

    n = mcnemar_pairs_for_power(0.7, 0.1, 0.05)
    assert power(n - 1, 0.7, 0.1) < 0.8 <= power(n, 0.7, 0.1)
    assert mcnemar_pairs_for_power(0.3, 0.3, 0.05) is None  # no effect: no count tells
    assert mcnemar_pairs_for_power(0.01, 0.0, 0.05, max_pairs=50) is None  # too rare to tell in 50


def test_tost_within_the_margin_shows_equivalence_and_beyond_it_refutes_it():
    d = np.array([0.01, -0.01, 0.01, -0.01])  # mean 0, sd 0.01 * sqrt(4/3), se = sd / 2
    se = np.std(d, ddof=1) / 2
    inside = tost(d, margin=0.03)
    # Both one-sided tests have t = 0.03 / se = 5.2 on 3 degrees of freedom.
    assert inside.within and inside.p_value == inside.p_equivalent == pytest.approx(scipy_stats.t.sf(0.03 / se, 3))
    assert inside.p_value < 0.01 and inside.p_beyond > 0.99
    assert inside.interval.confidence == pytest.approx(0.9)
    half = scipy_stats.t.ppf(0.95, 3) * se  # the 90% t interval: inside +-margin, as TOST rejects
    assert (inside.interval.low, inside.interval.high) == pytest.approx((-half, half))
    assert inside.effect_size == pytest.approx(0.03 / np.std(d, ddof=1))

    outside = tost(d + 0.2, margin=0.03)  # mean 0.2, well beyond +0.03
    assert not outside.within and outside.p_equivalent > 0.99
    assert outside.p_value == outside.p_beyond == pytest.approx(scipy_stats.t.sf(0.17 / se, 3))
    assert outside.p_value < 0.001 and outside.effect_size == pytest.approx(0.17 / np.std(d, ddof=1))
    below = tost(d - 0.2, margin=0.03)  # the mirror image: beyond -0.03, the same evidence
    assert not below.within and below.p_beyond == pytest.approx(outside.p_beyond)
    assert tost([0.5, 0.5, 0.5], 0.03) is None and tost([0.1], 0.03) is None  # no spread, no t statistic


def test_tost_cannot_show_equivalence_from_too_few_or_too_noisy_seeds():
    noisy = tost(np.array([0.05, -0.05, 0.05, -0.05]), margin=0.03)  # mean 0, but se 0.029
    assert noisy.within and noisy.p_value > 0.05
    assert noisy.interval.low < -0.03 and noisy.interval.high > 0.03  # the interval is wider than the margin


def test_one_sided_seeds_for_power_is_the_first_count_whose_noncentral_t_power_reaches_the_target():
    for effect in (0.2, 0.5, 0.8, 1.5, 4.0):
        n = one_sided_seeds_for_power(effect)

        def nct_power(k):  # P(T > t_(1-alpha, k-1)) for T noncentral t with nc = effect * sqrt(k)
            return scipy_stats.nct.sf(scipy_stats.t.ppf(0.95, k - 1), k - 1, effect * math.sqrt(k))

        assert nct_power(n) >= 0.8 and (n == 2 or nct_power(n - 1) < 0.8), effect
        assert one_sided_power(effect, n) == pytest.approx(nct_power(n))
    assert one_sided_seeds_for_power(0.5) == 27  # G*Power, one-tailed one-sample t-test, d = 0.5


def test_one_sided_seeds_for_power_is_monotone_and_below_the_two_sided_count():
    effects = np.geomspace(0.05, 5, 25)
    counts = [one_sided_seeds_for_power(e) for e in effects]
    assert all(a >= b for a, b in zip(counts, counts[1:]))  # a larger effect needs no more seeds
    assert counts[0] > 300 and counts[-1] == 3  # d = 0.05 needs hundreds; d = 5 three (two give 1 df)
    assert one_sided_seeds_for_power(0.5, alpha=0.01) > one_sided_seeds_for_power(0.5, alpha=0.05)
    assert one_sided_seeds_for_power(0.5, power=0.9) > one_sided_seeds_for_power(0.5, power=0.8)
    # One tail at alpha is easier to clear than two at alpha / 2 each: fewer seeds than the paired test.
    differences = np.array([-1.0, 1.0, -1.0, 1.0]) / np.std([-1, 1, -1, 1], ddof=1) + 0.5
    assert one_sided_seeds_for_power(0.5) < seeds_for_power(differences) == 34


def test_one_sided_seeds_for_power_is_none_without_an_effect_or_beyond_max_seeds():
    assert one_sided_seeds_for_power(0.0) is None and one_sided_seeds_for_power(-0.3) is None
    assert one_sided_seeds_for_power(1e-3) is None  # about 6 million seeds: more than MAX_SEEDS
    assert one_sided_seeds_for_power(0.05, max_seeds=100) is None
    assert one_sided_seeds_for_power(0.05) <= MAX_SEEDS


def test_varies_is_false_for_no_value_one_value_or_rounding_noise():
    from ablate.analysis.stats import varies  # the one definition (ablate/claims/decide.py imports it)

    assert not varies(np.array([])) and not varies(np.array([2.0])) and not varies(np.array([1.0, 1.0 + 1e-15]))
    assert varies(np.array([1.0, 1.001]))
