"""ablate/ladder/scaling.py: the trend of an effect against model size, its prediction interval, sign
changes, and compute multipliers read on validation curves."""
import math

import numpy as np
import pytest

from ablate.ladder import scaling


SIZES = [1e4, 4e4, 1.6e5, 6.4e5, 2.56e6]


def _effects(slope, intercept, se, rng):
    return [intercept + slope * math.log10(n) + rng.normal(0, se) for n in SIZES]


def test_a_known_slope_is_recovered_within_its_interval_and_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    inside = 0
    for _ in range(400):
        effects = _effects(0.05, -0.1, 0.01, rng)
        trend = scaling.fit_trend(SIZES, effects, [0.01] * 5, df=1000)
        lo, hi = trend.slope_interval()
        inside += lo <= 0.05 <= hi
    assert 0.92 <= inside / 400 <= 0.98
    trend = scaling.fit_trend(SIZES, _effects(0.05, -0.1, 0.001, np.random.default_rng(1)), [0.001] * 5, df=4)
    assert trend.slope == pytest.approx(0.05, abs=0.003) and trend.intercept == pytest.approx(-0.1, abs=0.02)


def test_the_prediction_interval_covers_what_a_new_rung_measures():
    rng = np.random.default_rng(2)
    covered = 0
    for _ in range(400):
        effects = _effects(0.05, 0.0, 0.02, rng)
        trend = scaling.fit_trend(SIZES[:4], effects[:4], [0.02] * 4, df=1000)
        _, lo, hi = trend.predict(SIZES[4])
        covered += lo <= effects[4] <= hi
    assert 0.92 <= covered / 400 <= 0.99


def test_scatter_beyond_the_standard_errors_widens_the_intervals():
    tight = scaling.fit_trend(SIZES, [0.0, 0.01, 0.02, 0.03, 0.04], [0.01] * 5, df=10)
    scattered = scaling.fit_trend(SIZES, [0.0, 0.08, -0.05, 0.1, 0.04], [0.01] * 5, df=10)
    assert tight.birge == 1.0 and scattered.birge > 5
    assert np.ptp(scattered.slope_interval()) > np.ptp(tight.slope_interval())


def test_trend_words_and_sign_changes():
    growing = scaling.fit_trend(SIZES, [-0.01, -0.02, -0.03, -0.04, -0.05], [0.001] * 5, df=4)
    assert scaling.trend_word(growing, expected_sign=-1) == scaling.GROWING
    assert scaling.trend_word(growing, expected_sign=+1) == scaling.SHRINKING
    flat = scaling.fit_trend(SIZES, [0.03, 0.01, 0.04, 0.02, 0.03], [0.05] * 5, df=2)
    assert scaling.trend_word(flat, expected_sign=1) == scaling.FLAT
    assert scaling.sign_changes(SIZES[:3], [0.1, 0.02, -0.05]) == [(4e4, 1.6e5)]
    assert scaling.sign_changes(SIZES[:3], [0.1, 0.02, 0.05]) == []


def test_an_exact_effect_is_fitted_without_weights():
    trend = scaling.fit_trend(SIZES[:3], [1.0, 2.0, 3.0], [0.0] * 3, df=2)
    assert trend.slope == pytest.approx(1 / math.log10(4)) and trend.noise == 0.0


def _curve(multiplier, steps=1000, every=50):
    """A power-law validation curve of an arm worth `multiplier` times the baseline's compute."""
    s = np.arange(every, steps + 1, every, dtype=float)
    return s, 2.0 + 5.0 * (multiplier * s) ** -0.5


def test_a_better_arm_is_read_on_its_own_curve_with_the_known_multiplier():
    r = scaling.reach(_curve(1.0), _curve(2.0), 1.0, 1.0)
    assert r.how == "other" and r.factor == pytest.approx(2.0, rel=0.03)


def test_a_worse_arm_is_read_on_the_baselines_curve():
    r = scaling.reach(_curve(1.0), _curve(0.5), 1.0, 1.0)
    assert r.how == "baseline" and r.factor == pytest.approx(0.5, rel=0.03)


def test_flops_per_step_enter_the_multiplier():
    r = scaling.reach(_curve(1.0), _curve(0.5), 1.0, 2.0)  # the other arm costs twice as much a step
    assert r.factor == pytest.approx(0.25, rel=0.03)


def test_not_reached_is_said_not_extrapolated():
    s = np.array([50.0, 100.0])
    base, other = (s, np.array([3.0, 2.9])), (s, np.array([2.0, 1.9]))  # the other arm starts below the end
    r = scaling.reach(base, other, 1.0, 1.0)
    assert r.factor is None and r.how == "not reached"
    summary = scaling.multiplier_summary([r, r])
    assert summary["factor"] is None and summary["measured"] == 0


def test_multiplier_summary_is_a_geometric_mean_with_a_t_interval():
    reaches = [scaling.Reach(f, "other", 10.0) for f in (1.5, 2.0, 2.5)]
    s = scaling.multiplier_summary(reaches)
    assert s["factor"] == pytest.approx((1.5 * 2.0 * 2.5) ** (1 / 3))
    assert s["low"] < s["factor"] < s["high"]
