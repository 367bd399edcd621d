"""analysis.stats: intervals, paired comparisons and divergence rates across seeds."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from ablate.analysis.stats import bootstrap_ci, group_stats, paired_comparison, welch_p_value

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
RMS, ONE = "pre.rmsnorm.gelu.dense.res", "pre.layernorm.swiglu.res"


def cells_frame(rows):
    """A minimal cell_metrics frame: (group, seed, status, final_loss)."""
    frame = pd.DataFrame(rows, columns=["group", "seed", "status", "final_loss"])
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


def test_fewer_than_two_values_have_no_interval_and_no_p_value():
    assert bootstrap_ci([3.0]) is None and bootstrap_ci([]) is None
    assert welch_p_value([1.0], [1.0, 2.0]) is None
    same = bootstrap_ci([2.0, 2.0, 2.0])
    assert (same.low, same.high) == (2.0, 2.0)


def test_group_stats_counts_means_and_divergence_rate(cells):
    table = group_stats(cells, seed=0).set_index("group")
    pre = table.loc[PRE]
    assert pre["final_loss_mean"] == pytest.approx(3.05)
    assert pre["final_loss_std"] == pytest.approx(np.std([3.0, 3.1, 3.05], ddof=1))
    assert pre["final_loss_ci_low"] <= 3.05 <= pre["final_loss_ci_high"]
    assert (pre["n_completed"], pre["divergence"], pre["divergence_rate"]) == (3, "0/3", 0.0)

    rms = table.loc[RMS]  # the running seed 3 enters no statistic; the diverged one is counted
    assert (rms["n_cells"], rms["n_completed"], rms["n_diverged"], rms["n_running"]) == (4, 2, 1, 1)
    assert rms["final_loss_mean"] == pytest.approx(2.55) and rms["seeds"] == "0,1"
    assert rms["divergence"] == "1/3" and rms["divergence_rate"] == pytest.approx(1 / 3)

    one = table.loc[ONE]  # one seed: a mean, but no interval
    assert one["final_loss_mean"] == 2.90
    assert math.isnan(one["final_loss_ci_low"]) and math.isnan(one["final_loss_ci_high"])
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
    expected = scipy_stats.bootstrap((diffs,), np.mean, method="percentile", n_resamples=9999,
                                     rng=np.random.default_rng(0)).confidence_interval
    assert (c.ci_low, c.ci_high) == pytest.approx((expected.low, expected.high))
    assert c.p_value == pytest.approx(welch_by_hand([3.20, 3.35, 3.15], [3.00, 3.10, 3.05]))
    t_paired = diffs.mean() / (diffs.std(ddof=1) / math.sqrt(3))  # the paired test, kept in summary.csv
    assert c.p_value_paired == pytest.approx(2 * scipy_stats.t.sf(abs(t_paired), 2))
    assert c.p_value > 0.05 and not c.significant()
    assert c.sentence().startswith(f"No significant difference between `{POST}` and `{PRE}`")
    assert f"p={c.p_value:.2f}" in c.sentence()


def test_a_significant_difference_reads_as_lower_with_its_interval(cells):
    c = paired_comparison(cells, RMS, PRE)  # only seeds 0 and 1 completed in both
    assert c.seeds == (0, 1)
    assert c.mean_diff == pytest.approx(((2.50 - 3.00) + (2.60 - 3.10)) / 2)
    assert c.p_value == pytest.approx(welch_by_hand([2.50, 2.60], [3.00, 3.10]))
    c3 = paired_comparison(cells_frame([(RMS, s, "completed", v) for s, v in enumerate([2.50, 2.60, 2.54])]
                                       + [(PRE, s, "completed", v) for s, v in enumerate([3.00, 3.10, 3.05])]),
                           RMS, PRE)
    assert c3.p_value == pytest.approx(welch_by_hand([2.50, 2.60, 2.54], [3.00, 3.10, 3.05])) and c3.significant()
    sentence = c3.sentence()
    assert sentence.startswith(f"`{RMS}` has a lower final loss than `{PRE}` by 0.5033 nats")
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
    assert all_diverged.sentence() == f"`{ONE}` has no completed seed, so its final loss cannot be compared with `{PRE}`."
