"""analysis.claim_plots: the "why" kinds draw the right values, the writer's interface, the registry."""
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest

from ablate.analysis.analyse import analyse
from ablate.claims.claim_measures import Context
from ablate.claims.claim_plots import PLOTS, claim_figure, plot_kind, write_claim_plot, write_claim_plots
from tests.helpers.synthetic_runs import write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
N_STEPS, N_LAYER = 9, 3


def grads(variant, seed):
    """[step][layer]: pre flat at 0.1 * (seed + 1); post flat at init, then layer i at
    10 ** -(4 * (top - i)) from step 1 on (the gradient vanishing towards the input)."""
    top = N_LAYER - 1
    if variant == PRE:
        return [[0.1 * (seed + 1)] * N_LAYER for _ in range(N_STEPS)]
    return [[0.1] * N_LAYER] + [[10.0 ** (-4 * (top - i)) for i in range(N_LAYER)] for _ in range(N_STEPS - 1)]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    """pre/post x lr {1e-3, 1e-2} x 2 seeds; post at lr 1e-2 seed 1 diverges at step 2."""
    root = tmp_path_factory.mktemp("claim")
    for variant in (PRE, POST):
        for lr in (1e-3, 1e-2):
            for seed in (0, 1):
                losses = [4.0 - 0.1 * i for i in range(N_STEPS)]
                if variant == POST and lr == 1e-2 and seed == 1:
                    losses = losses[:2] + [float("inf")]
                write_run(root, variant, seed, losses, options={"lr": lr}, n_layer=N_LAYER, probe_every=2,
                          grad_norms=grads(variant, seed)[:len(losses)], unigram_entropy=4.5)
    analysis = analyse(root)
    return Context(analysis.runs, analysis.metrics)


def lines_by_label(ax):
    return {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}


def test_grad_profile_draws_the_seed_mean_in_log_space_at_init_and_mid_run(ctx):
    drawn = claim_figure(ctx, "grad_profile", {"split": "norm", "at": {"lr": 1e-3}}, "prenorm-wins, why")
    try:
        init, mid = drawn.axes
        assert init.get_title() == "at initialisation (step 0)" and mid.get_title() == "mid-run (step 4)"
        assert init.get_yscale() == "log" and init.get_xlabel() == "layer (0 = input)"
        pre, post = lines_by_label(mid)["pre (mean of 2 seeds)"], lines_by_label(mid)["post (mean of 2 seeds)"]
        assert list(pre.get_xdata()) == [0, 1, 2]
        assert pre.get_ydata() == pytest.approx([np.sqrt(0.1 * 0.2)] * 3)  # geometric mean of 0.1 and 0.2
        assert post.get_ydata() == pytest.approx([1e-8, 1e-4, 1.0])
        assert lines_by_label(init)["post (mean of 2 seeds)"].get_ydata() == pytest.approx([0.1] * 3)
        assert len([line for line in mid.lines if line.get_label() == "_seed"]) == 4  # a thin line per seed
        assert "per-layer gradient norm" in drawn.figure.get_suptitle() and "lr 1e-3" in drawn.figure.get_suptitle()
    finally:
        plt.close(drawn.figure)


def test_grad_profile_says_which_cells_diverged_before_mid_run(ctx):
    drawn = claim_figure(ctx, "grad_profile", {"split": "norm", "at": {"lr": 1e-2}, "step": 4}, "why")
    try:
        mid = drawn.axes[1]
        labels = set(lines_by_label(mid))
        assert "post (mean of 1 seeds); 1 without a profile at step 4 (diverged before it)" in labels
        assert "pre (mean of 2 seeds)" in labels
        legend = [t.get_text() for t in drawn.figure.legends[0].get_texts()]
        assert any("diverged before it" in text for text in legend)  # in the figure's legend
    finally:
        plt.close(drawn.figure)


def test_attn_logit_growth_plots_the_largest_logit_over_layers_against_step(ctx):
    drawn = claim_figure(ctx, "attn_logit_growth", {"split": "norm", "facet": "lr"}, "qk-norm, why")
    try:
        assert [ax.get_title() for ax in drawn.axes] == ["lr 1e-3", "lr 1e-2"]
        low, high = drawn.axes
        pre = lines_by_label(low)["pre (mean of seeds)"]
        assert list(pre.get_xdata()) == [0, 2, 4, 6, 8]  # the probe steps
        # synthetic_runs: attn_logit_max/layer_i = 2 + 0.1 * step * (i + 1); the top layer is the max
        assert pre.get_ydata() == pytest.approx([2 + 0.1 * s * N_LAYER for s in (0, 2, 4, 6, 8)])
        assert low.get_yscale() == "log"
        (mark,) = [c for c in high.collections if c.get_label() == "diverged (last logged value)"]
        assert list(mark.get_offsets()[0]) == pytest.approx([2, 2 + 0.1 * 2 * N_LAYER])  # seed 1's last probe
        assert len([line for line in high.lines if line.get_label() == "_seed"]) == 4
    finally:
        plt.close(drawn.figure)


def test_write_claim_plots_writes_what_and_why(ctx, tmp_path):
    claim = SimpleNamespace(name="prenorm-wins", statement="Pre-norm wins.", plot="lr_curve",
                            plot_params={"split": "norm"}, why_plot="grad_profile",
                            why_params={"split": "norm", "at": {"lr": 1e-2}})
    written = write_claim_plots(claim, ctx, tmp_path / "plots")
    assert [p.name for p in written["what"]] == ["claim_prenorm-wins.png", "claim_prenorm-wins.svg"]
    assert [p.name for p in written["why"]] == ["claim_prenorm-wins_why.png", "claim_prenorm-wins_why.svg"]
    assert all(p.stat().st_size > 0 for p in written["what"] + written["why"])
    assert [p.name for p in write_claim_plot(claim, ctx, tmp_path / "again")] == ["claim_prenorm-wins.png",
                                                                                  "claim_prenorm-wins.svg"]


def test_write_claim_plots_skips_quietly_what_the_runs_or_claim_lack(ctx, tmp_path):
    no_why = SimpleNamespace(name="c", statement="s", plot="lr_curve", plot_params={"split": "no_such_axis"})
    assert write_claim_plots(no_why, ctx, tmp_path) == {"what": [], "why": []}  # no why_plot attribute at all
    not_logged = SimpleNamespace(name="c", statement="s", plot=None, plot_params={}, why_plot="layer_profile",
                                 why_params={"split": "norm", "metric": "block_change"})
    assert write_claim_plots(not_logged, ctx, tmp_path) == {"what": [], "why": []}
    assert not list(tmp_path.iterdir())


def test_a_plot_never_writes_through_a_link(ctx, tmp_path):
    target = tmp_path / "elsewhere.png"
    target.write_bytes(b"keep")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "claim_c.png").symlink_to(target)
    claim = SimpleNamespace(name="c", statement="s", plot="divergence", plot_params={"split": "norm"})
    write_claim_plot(claim, ctx, tmp_path / "plots")
    assert target.read_bytes() == b"keep" and not (tmp_path / "plots" / "claim_c.png").is_symlink()


def test_a_plot_kind_name_is_taken_once():
    with pytest.raises(ValueError, match="grad_profile"):
        plot_kind("grad_profile")(lambda ctx, metrics, params: None)
    assert PLOTS["grad_profile"].__name__ == "grad_profile"  # the first one stays
