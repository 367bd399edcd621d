"""analysis.lr_sensitivity: LR sensitivity, best lr, basin width and the unstable lr on
synthetic curves whose answers are known by hand; the paired comparison between sweeps; the
report's section."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from ablate.analysis.analyse import analyse
from ablate.analysis.lr_sensitivity import (SENSITIVITY, analyse_sweep, compare_sensitivity, lr_curve, lr_sweeps,
                                            per_seed_sensitivity, sweep_cells)
from ablate.analysis.report import render
from ablate.analysis.stats import PAIRED, mean_interval
from tests.helpers.synthetic_runs import write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
LRS = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
DIVERGED = None  # a curve value: the cell diverged at that lr


def sweep_frame(curves, variant=PRE, init=5.0, extra=None):
    """A cell_metrics-like frame: curves = {seed: [final val loss per lr of LRS[:len]]}; a
    DIVERGED entry is a diverged cell; every cell's loss at initialisation is `init`."""
    rows = []
    for seed, losses in curves.items():
        for lr, loss in zip(LRS, losses):
            group = f"{variant}__lr={lr:g}"
            rows.append({"cell_id": f"{group}__seed={seed}", "group": group, "variant_id": variant, "seed": seed,
                         "lr": lr, "status": "diverged" if loss is DIVERGED else "completed",
                         "final_val_loss": np.nan if loss is DIVERGED else loss, "init_loss": init,
                         "plateau": False, **(extra or {})})
    return pd.DataFrame(rows)


def one_sweep(frame, **kwargs):
    (name, cells), = sweep_cells(frame).items()
    return analyse_sweep(name, cells, **kwargs)


def test_a_flat_curve_has_sensitivity_zero_and_a_basin_over_the_whole_sweep():
    sweep = one_sweep(sweep_frame({0: [2.5] * 5, 1: [2.6] * 5}))
    assert sweep.name == PRE and sweep.lrs == LRS
    assert sweep.sensitivity == 0 and list(sweep.per_seed[SENSITIVITY]) == [0, 0]
    assert sweep.basin == (1e-4, 1.0) and sweep.basin_decades == pytest.approx(4.0) and sweep.basin_open
    assert sweep.unstable_lr is None and sweep.best_loss == pytest.approx(2.55)


def test_a_diverged_lr_counts_at_the_loss_at_initialisation():
    # seed 0: 3.0, 2.5, diverged -> clipped 3.0, 2.5, 5.0: mean 3.5, best 2.5 -> 1.0
    # seed 1: 3.2, 2.6, 6.0 (completed but worse than init) -> 3.2, 2.6, 5.0: 3.6 - 2.6 -> 1.0
    frame = sweep_frame({0: [3.0, 2.5, DIVERGED], 1: [3.2, 2.6, 6.0]})
    curve = lr_curve(frame)
    assert list(curve["clipped"]) == [3.0, 2.5, 5.0, 3.2, 2.6, 5.0]
    assert list(per_seed_sensitivity(curve)[SENSITIVITY]) == pytest.approx([1.0, 1.0])
    sweep = one_sweep(frame)
    assert sweep.sensitivity == pytest.approx(1.0)
    assert sweep.unstable_lr == 1e-2 and sweep.unstable_why == "diverged"
    assert sweep.by_lr.set_index("lr").loc[1e-2, "n_diverged"] == 1


def test_the_init_loss_of_a_diverged_cell_comes_from_its_seeds_other_cells():
    frame = sweep_frame({0: [3.0, 2.5, DIVERGED]})
    frame.loc[frame["status"] == "diverged", "init_loss"] = np.nan  # its metrics never reached step 0
    frame.loc[frame["lr"] == 1e-4, "init_loss"] = 4.0  # the seed's step-0 loss, shared by every lr
    frame.loc[frame["lr"] == 1e-3, "init_loss"] = 4.0
    assert list(lr_curve(frame)["clipped"]) == [3.0, 2.5, 4.0]


def test_best_lr_basin_width_and_its_tolerance():
    # mean curve 3.0, 2.55, 2.5, 2.58, 3.5: best 1e-2; within 0.1 nats: 1e-3..1e-1 = 2 decades,
    # closed on both sides; within 0.04: 1e-2 alone (0 decades).
    frame = sweep_frame({0: [2.9, 2.50, 2.45, 2.53, 3.4], 1: [3.1, 2.60, 2.55, 2.63, 3.6]})
    sweep = one_sweep(frame)
    assert sweep.best_lr == 1e-2 and sweep.best_loss == pytest.approx(2.5) and sweep.best_for == 2
    assert sweep.best_interval == mean_interval([2.45, 2.55])  # the t interval: 2 seeds
    assert sweep.basin == (1e-3, 1e-1) and sweep.basin_decades == pytest.approx(2.0) and not sweep.basin_open
    narrow = one_sweep(frame, tolerance=0.04)
    assert narrow.basin == (1e-2, 1e-2) and narrow.basin_decades == 0
    # Wortsman's sensitivity, per seed: mean of the curve minus its minimum.
    expected = [np.mean([2.9, 2.50, 2.45, 2.53, 3.4]) - 2.45, np.mean([3.1, 2.60, 2.55, 2.63, 3.6]) - 2.55]
    assert list(sweep.per_seed[SENSITIVITY]) == pytest.approx(expected)
    assert sweep.sensitivity == pytest.approx(np.mean(expected))
    ci = mean_interval(sweep.per_seed[SENSITIVITY])
    assert (sweep.sensitivity_interval.low, sweep.sensitivity_interval.high) == pytest.approx((ci.low, ci.high))


def test_a_plateau_above_the_best_lr_is_unstable_one_below_it_is_undertraining():
    frame = sweep_frame({0: [3.2, 2.5, 2.4, 3.2, 2.6]})
    frame.loc[frame["lr"].isin([1e-4, 1e-1]), "plateau"] = True
    sweep = one_sweep(frame)
    assert sweep.best_lr == 1e-2 and sweep.unstable_lr == 1e-1 and sweep.unstable_why == "plateaued"
    assert one_sweep(frame.assign(plateau=frame["lr"] == 1e-4)).unstable_lr is None


def test_seeds_without_a_result_at_every_lr_enter_no_sensitivity():
    frame = sweep_frame({0: [3.0, 2.5, 2.8], 1: [3.1, 2.6, 2.9]})
    frame.loc[(frame["seed"] == 1) & (frame["lr"] == 1e-2), "status"] = "running"
    sweep = one_sweep(frame)
    assert list(sweep.per_seed["seed"]) == [0] and sweep.sensitivity == pytest.approx(np.mean([3.0, 2.5, 2.8]) - 2.5)
    assert sweep.sensitivity_interval is None  # one seed: no interval


def test_sweeps_need_three_learning_rates_and_split_by_the_other_options():
    two = sweep_frame({0: [3.0, 2.5]})
    assert sweep_cells(two) == {} and lr_sweeps(two) == []
    frame = pd.concat([sweep_frame({0: [3.0, 2.5, 2.8]}, extra={"warmup": 0}),
                       sweep_frame({0: [3.1, 2.6, 2.7]}, extra={"warmup": 100})])
    frame["group"] = frame["group"] + "__warmup=" + frame["warmup"].astype(str)
    sweeps = lr_sweeps(frame, option_axes=["lr", "warmup"])
    assert [s.name for s in sweeps] == [f"{PRE}__warmup=0", f"{PRE}__warmup=100"]
    assert [s.setting for s in sweeps] == [{"warmup": 0}, {"warmup": 100}]


def test_lr_sensitivity_is_compared_between_sweeps_paired_by_seed():
    pre = sweep_frame({0: [3.0, 2.5, 2.6], 1: [3.1, 2.6, 2.8], 2: [3.0, 2.55, 2.7]})
    post = sweep_frame({0: [2.8, 3.9, DIVERGED], 1: [2.9, 4.0, DIVERGED], 2: [2.85, 4.2, DIVERGED]}, variant=POST)
    frame = pd.concat([pre, post], ignore_index=True)
    sweeps = lr_sweeps(frame)
    baseline_of = {g: g.replace(POST, PRE) for g in frame["group"].unique()}
    (c,) = compare_sensitivity(sweeps, baseline_of)
    by_name = {s.name: s.per_seed.set_index("seed")[SENSITIVITY] for s in sweeps}
    diffs = (by_name[POST] - by_name[PRE]).to_numpy()
    assert (c.group, c.baseline, c.test) == (POST, PRE, PAIRED) and c.seeds == (0, 1, 2)
    assert c.mean_diff == pytest.approx(diffs.mean())
    assert c.p_value == pytest.approx(scipy_stats.ttest_rel(by_name[POST], by_name[PRE]).pvalue)
    assert c.sentence().startswith(f"`{POST}` has a higher LR sensitivity than `{PRE}` by")


@pytest.fixture(scope="module")
def lr_grid(tmp_path_factory):
    """3 lrs x 2 variants x 2 seeds on disk; post-norm diverges at lr 0.1 in seed 1 and sits on
    the unigram plateau (3.3 nats, entropy 3.4) at 0.1 in seed 0."""
    root = tmp_path_factory.mktemp("lr")
    finals = {PRE: {1e-3: 2.9, 1e-2: 2.5, 1e-1: 2.6}, POST: {1e-3: 2.7, 1e-2: 2.9, 1e-1: 3.2}}
    for variant, by_lr in finals.items():
        for lr, final in by_lr.items():
            for seed in (0, 1):
                losses = [4.0, 3.6] + [final + 0.02 * seed * (1 + 10 * lr)] * 10
                if variant == POST and lr == 1e-1 and seed == 1:
                    losses[6:] = [9.0] + [float("inf")] * 5
                write_run(root, variant, seed, losses, options={"lr": lr}, planned_steps=12, unigram_entropy=3.4)
    return root


def test_analyse_finds_the_sweeps_of_a_grid_and_the_report_states_them(lr_grid):
    analysis = analyse(lr_grid)
    assert [s.name for s in analysis.lr_sweeps] == [PRE, POST]
    post = analysis.lr_sweeps[1]
    # post, seed 0: val = final + 0.1: 2.8, 3.0, 3.3 (plateaued: scored min(loss, entropy 3.4) = 3.3,
    # no jump at the plateau line); seed 1: 2.8202, 3.022, diverged -> the entropy 3.4
    assert post.best_lr == 1e-3 and post.unstable_lr == 0.1 and post.unstable_why == "diverged and plateaued"
    assert post.per_seed[SENSITIVITY].tolist() == pytest.approx(
        [np.mean([2.8, 3.0, 3.3]) - 2.8, np.mean([2.8202, 3.022, 3.4]) - 2.8202])
    assert len(analysis.lr_comparisons) == 1 and analysis.lr_comparisons[0].correction == "bh"
    text = render(analysis, [], [])
    section = text.split("## Learning-rate sensitivity")[1].split("\n## ")[0]
    assert "Wortsman et al. 2023" in section and "within 0.1 nats of the best" in section
    assert f"| `{POST}` | 0.001, 0.01, 0.1 | 2 | 0.001 (best for 2 of 2 seeds) |" in section
    assert "0.1 (diverged and plateaued)" in section and "≥ 0.00 (0.001 to 0.001)" in section
    assert f"`{POST}` has a higher LR sensitivity than `{PRE}`" in section or "No significant difference" in section
    assert math.isfinite(analysis.lr_sweeps[0].sensitivity)
