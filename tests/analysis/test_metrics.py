"""analysis.metrics: every stability metric equals its hand-computed value."""
import math

import numpy as np
import pytest

from ablate.analysis.load import load_runs
from ablate.analysis.metrics import cell_metrics, layer_profiles, spike_mask, spread
from tests.helpers.synthetic_runs import write_run


def test_final_loss_is_the_mean_of_the_last_k_logged_losses(tmp_path):
    losses = [5.0, 4.0, 3.0, 2.5, 2.0, 1.9, 1.8]
    write_run(tmp_path, losses=losses, val_loss={3: 2.9, 6: 2.1})
    runs = load_runs(tmp_path)
    row = cell_metrics(runs, last_k=3).iloc[0]
    assert row["final_loss"] == pytest.approx((2.0 + 1.9 + 1.8) / 3)
    assert row["final_val_loss"] == pytest.approx(2.1)
    assert cell_metrics(runs, last_k=100).iloc[0]["final_loss"] == pytest.approx(sum(losses) / len(losses))


def test_the_summary_final_loss_agrees_with_the_metrics_at_k_10(tmp_path):
    losses = [4.0 - 0.1 * i for i in range(15)]
    write_run(tmp_path, losses=losses)
    row = cell_metrics(load_runs(tmp_path), last_k=10).iloc[0]
    assert row["final_loss"] == pytest.approx(row["summary_final_loss"]) == pytest.approx(np.mean(losses[-10:]))


def test_a_diverged_cell_has_no_final_loss_but_keeps_its_step_and_max_grad_norm(tmp_path):
    write_run(tmp_path, losses=[3.0, 2.8, 7.0, float("inf")], grad_norm=[1.0, 2.0, 50.0, float("inf")])
    row = cell_metrics(load_runs(tmp_path)).iloc[0]
    assert row["status"] == "diverged" and row["diverged_at_step"] == 2
    assert math.isnan(row["final_loss"]) and math.isnan(row["final_val_loss"])
    assert row["max_grad_norm"] == 50.0  # the largest finite one


def test_spike_z_score_by_hand():
    # history 1..5: median 3, |deviations| 2,1,0,1,2 -> MAD 1 -> robust std 1.4826;
    # the last loss, 10, is (10 - 3) / 1.4826 = 4.7214 robust stds above the median.
    series = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0]
    z = (10.0 - 3.0) / (1.4826 * 1.0)
    assert list(spike_mask(series, z=z - 0.01)) == [False] * 5 + [True]
    assert not spike_mask(series, z=z + 0.01).any()


def test_spike_count_of_a_hand_made_series(tmp_path):
    # Noise of +-0.01 around 3.0 (robust std 1.4826 * 0.01); real spikes of +1.0 at steps 10
    # and 25; a +0.05 bump at 18 (about 4 robust stds) is not a spike at z = 5; a jump at
    # step 2 has too little history (fewer than 5 earlier losses) to be judged.
    losses = [3.0 + 0.01 * (-1) ** i for i in range(40)]
    losses[2] += 1.0
    losses[10] += 1.0
    losses[25] += 1.0
    losses[18] += 0.05
    mask = spike_mask(losses, z=5.0, window=20)
    assert list(np.flatnonzero(mask)) == [10, 25]
    write_run(tmp_path, losses=losses)
    assert cell_metrics(load_runs(tmp_path), spike_z=5.0).iloc[0]["spikes"] == 2


def test_spread_ratio_and_coefficient_of_variation():
    ratio, cv = spread([1.0, 2.0, 4.0])
    mean = 7 / 3
    population_std = math.sqrt(((1 - mean) ** 2 + (2 - mean) ** 2 + (4 - mean) ** 2) / 3)
    assert ratio == 4.0 and cv == pytest.approx(population_std / mean) == pytest.approx(math.sqrt(14) / 7)
    assert all(math.isnan(x) for x in spread([1.0, 0.0]))  # a zero norm has no finite ratio


@pytest.fixture
def profiled(tmp_path):
    # 9 steps, 3 layers: init (step 0) [1,2,4], halfway (step 4) [2,2,2], end (step 8) [1,1,3].
    # Step 7 has an infinite layer: rows with a non-finite layer are never a phase.
    grads = [[1.0, 1.5, 1.0]] * 9
    grads[0], grads[4], grads[8] = [1.0, 2.0, 4.0], [2.0, 2.0, 2.0], [1.0, 1.0, 3.0]
    grads[7] = [1.0, float("inf"), 1.0]
    acts = [[1.0, 1.0, 1.0]] * 8 + [[1.0, 2.0, 8.0]]
    write_run(tmp_path, losses=[3.0] * 9, grad_norms=grads, act_norms=acts, n_layer=3,
              grad_norm=[1.0, 2.0, 3.0, 9.5, 1.0, float("nan"), 1.0, 1.0, 1.0])
    return load_runs(tmp_path)


def test_gradient_profile_spread_at_init_mid_and_end(profiled):
    row = cell_metrics(profiled).iloc[0]
    assert row["grad_ratio_init"] == 4.0 and row["grad_cv_init"] == pytest.approx(math.sqrt(14) / 7)
    assert row["grad_ratio_mid"] == 1.0 and row["grad_cv_mid"] == 0.0
    # [1, 1, 3]: mean 5/3, population std 2*sqrt(2)/3 -> cv 2*sqrt(2)/5
    assert row["grad_ratio_end"] == 3.0 and row["grad_cv_end"] == pytest.approx(2 * math.sqrt(2) / 5)
    assert row["max_grad_norm"] == 9.5


def test_layer_profiles_pick_the_phase_steps(profiled):
    profiles = layer_profiles(profiled, "grad_norm")
    steps = profiles.groupby("phase")["step"].first().to_dict()
    assert steps == {"init": 0, "mid": 4, "end": 8}
    end = profiles[profiles["phase"] == "end"].sort_values("layer")["value"].tolist()
    assert end == [1.0, 1.0, 3.0]


def test_residual_rms_growth_with_depth(profiled):
    row = cell_metrics(profiled).iloc[0]
    assert row["rms_growth"] == 8.0  # 8 / 1 from layer 0 to layer 2
    assert row["rms_growth_per_layer"] == pytest.approx(8.0 ** 0.5)  # over 2 layer steps


def test_a_cell_without_metrics_or_probes_gets_nan_not_an_error(tmp_path):
    write_run(tmp_path, seed=0, losses=[], status="running")
    write_run(tmp_path, seed=1, probes=False)
    rows = cell_metrics(load_runs(tmp_path)).set_index("seed")
    assert math.isnan(rows.loc[0, "final_loss"]) and math.isnan(rows.loc[1, "grad_ratio_end"])
    assert rows.loc[1, "final_loss"] > 0
