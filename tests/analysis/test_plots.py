"""analysis.plots: every file is written, is a real PNG (and SVG), and draws what it should."""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from ablate.analysis.analyse import analyse
from ablate.analysis.plots import (PlainLogFormatter, _layer_map, _plain_log_labels, ema, make_style,
                                   plot_grad_heatmaps, plot_grad_profiles, plot_loss_curves, plot_probe_heatmaps,
                                   plot_residual_rms)
from ablate.analysis.report import make_plots
from tests.helpers.synthetic_runs import write_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
N_STEPS, N_LAYER = 12, 3
LRS = (1e-3, 1e-2, 1e-1)
LR_PLOTS = {"loss_curves", "final_loss", "lr_sensitivity", "grad_norm_heatmaps", "probe_heatmaps",
            "grad_norm_profiles", "residual_rms"}
ENTROPY = 3.6


@pytest.fixture(scope="module")
def lr_plots(tmp_path_factory):
    """Every report plot, drawn once, of a 3-lr x 2-variant x 2-seed grid with the stability
    probes logged every 3 steps; post-norm at lr 0.1 diverges at step 6 in seed 1."""
    root = tmp_path_factory.mktemp("lr_grid")
    for variant in (PRE, POST):
        for lr in LRS:
            for seed in (0, 1):
                losses = [4.0 - 0.1 * i - 2 * lr + 0.01 * seed for i in range(N_STEPS)]
                if variant == POST and lr == 1e-1 and seed == 1:
                    losses[6:] = [9.0] + [float("inf")] * (N_STEPS - 7)
                write_run(root, variant, seed, losses, options={"lr": lr}, n_layer=N_LAYER, probe_every=3,
                          unigram_entropy=ENTROPY)
    analysis = analyse(root)
    made = make_plots(analysis, root / "plots", dpi=30, processes=1)  # here: the tests read the figures
    yield analysis, {p.name: p for p in made}
    for plot in made:
        plt.close(plot.figure)


@pytest.fixture(scope="module")
def analysis(lr_plots):
    return lr_plots[0]


@pytest.fixture(scope="module")
def plots(lr_plots):
    return lr_plots[1]


@pytest.fixture(scope="module")
def style(analysis):
    return make_style(analysis.metrics, analysis.runs.option_axes)


def titled(plot):
    return [ax for ax in plot.figure.axes if ax.get_title()]


def data_axes(fig):
    """Axes that draw data (not colour bars, not switched-off panels)."""
    return [ax for ax in fig.axes if ax.axison and not hasattr(ax, "_colorbar")
            and (ax.lines or ax.collections or ax.images)]


def labelled(ax, which):
    """The axis is labelled, or shares its scale with a labelled panel (shared y in a row)."""
    get = (lambda a: a.get_xlabel()) if which == "x" else (lambda a: a.get_ylabel())
    shared = ax.get_shared_x_axes() if which == "x" else ax.get_shared_y_axes()
    return any(get(a) for a in shared.get_siblings(ax))


def test_every_plot_of_an_lr_grid_is_written_with_labelled_axes(plots):
    assert set(plots) == LR_PLOTS
    for name, plot in plots.items():
        png, svg = plot.paths
        assert png.read_bytes().startswith(PNG_SIGNATURE) and svg.read_text()[:2000].count("<svg") == 1, name
        assert plot.figure.get_suptitle() or plot.figure.axes[0].get_title(), name  # every plot has a title
        axes = data_axes(plot.figure)
        assert axes, name
        for ax in axes:
            assert labelled(ax, "x") and labelled(ax, "y"), (name, ax.get_title())
        assert plot.caption


def test_style_colours_variants_and_facets_by_the_varying_option(style):
    assert style.hue == "variant_id" and style.facets == ("lr",)
    assert set(style.palette) == {PRE, POST} and style.palette[PRE] != style.palette[POST]


def test_loss_curves_one_mean_line_per_variant_per_panel_plus_each_diverged_seed(plots, style):
    axes = titled(plots["loss_curves"])
    assert [ax.get_title() for ax in axes] == ["lr 1e-3", "lr 1e-2", "lr 1e-1"]
    curves = [[line for line in ax.lines if line.get_label() in ("pre", "post", "post (diverged)")] for ax in axes]
    assert [len(c) for c in curves] == [2, 2, 3]  # lr=0.1: + the diverged seed's own dashed line
    assert curves[2][-1].get_linestyle() == "--"
    colours = {line.get_label(): line.get_color() for line in curves[0]}
    assert colours["pre"] == style.palette[PRE]  # the same colour for the same variant everywhere
    assert axes[0].get_xlabel() == "step" and "nats" in axes[0].get_ylabel()


def test_grad_heatmaps_one_panel_per_group_with_layer_by_step_cells(plots):
    fig = plots["grad_norm_heatmaps"].figure
    images = [image for ax in fig.axes if ax.get_title() for image in ax.images]
    assert len(images) == 6  # 6 groups
    assert all(image.get_array().shape == (N_LAYER, N_STEPS) for image in images)
    assert any("gradient norm" in ax.get_xlabel() for ax in fig.axes)  # the shared colour bar, under the panels


def test_heatmap_bins_long_runs_into_at_most_max_columns(analysis):
    ids = analysis.metrics["cell_id"].iloc[:2]
    wide = _layer_map(analysis.runs.steps, ids, "grad_norm", max_columns=5)
    assert wide.shape == (N_LAYER, 5) and list(wide.columns) == [0, 3, 6, 8, 10]  # each bin by its first step
    assert wide.iloc[0, 0] == pytest.approx((1.0 + 2 ** -0.5 + 3 ** -0.5) / 3)  # layer 0, steps 0-2 averaged


def test_grad_profiles_init_mid_end_one_line_per_variant(plots):
    axes = titled(plots["grad_norm_profiles"])
    assert len(axes) == 3 * 3  # (lr settings) x (init, mid, end)
    assert all(len(ax.lines) == 2 for ax in axes)
    assert all(len(line.get_xdata()) == N_LAYER for ax in axes for line in ax.lines)
    assert axes[0].get_yscale() == "log" and "layer" in axes[0].get_xlabel()


def test_residual_rms_by_depth(plots):
    assert [len(ax.lines) for ax in titled(plots["residual_rms"])] == [2, 2, 2]


def test_final_loss_intervals_and_diverged_marks(plots):
    ax = plots["final_loss"].figure.axes[0]
    assert len(ax.containers) == 6  # one mean with its interval per group
    diverged = [c for c in ax.collections if c.get_label() == "diverged"]
    assert len(diverged) == 1 and len(diverged[0].get_offsets()) == 1
    dots = [c for c in ax.collections if c.get_label() == "one seed"]
    assert sum(len(c.get_offsets()) for c in dots) == 11  # every completed seed
    assert "validation loss" in ax.get_xlabel() and "nats" in ax.get_xlabel()


def test_plots_needing_probes_are_skipped_without_them(tmp_path):
    write_run(tmp_path, probes=False)
    a = analyse(tmp_path)
    style = make_style(a.metrics)
    assert plot_grad_heatmaps(a.runs.steps, a.metrics, tmp_path, style) is None
    assert plot_probe_heatmaps(a.runs.steps, a.metrics, tmp_path, style) is None
    assert plot_grad_profiles(a.grad_profiles, a.metrics, tmp_path, style) is None
    assert plot_residual_rms(a.act_profiles, a.metrics, tmp_path, style) is None


def test_the_lr_plot_is_log_x_with_diverged_marks_and_the_entropy_line(plots):
    (ax,) = data_axes(plots["lr_sensitivity"].figure)
    assert ax.get_xscale() == "log" and "learning rate" in ax.get_xlabel() and "nats" in ax.get_ylabel()
    means = [line for line in ax.lines if line.get_label() in ("pre", "post")]
    assert sorted(len(line.get_xdata()) for line in means) == [3, 3]
    diverged = [c for c in ax.collections if c.get_label() == "diverged (no final loss)"]
    assert len(diverged) == 1 and diverged[0].get_offsets()[0][0] == pytest.approx(0.1)
    entropy = [line for line in ax.lines if line.get_label().startswith("unigram entropy")]
    assert len(entropy) == 1 and list(entropy[0].get_ydata()) == [ENTROPY, ENTROPY]


def test_every_loss_plot_draws_the_unigram_entropy(plots):
    for name in ("loss_curves", "final_loss", "lr_sensitivity"):
        lines = [line for ax in plots[name].figure.axes for line in ax.lines]
        assert any(line.get_label() == f"unigram entropy {ENTROPY:.3f} nats" for line in lines), name


def test_a_diverged_run_is_marked_at_the_step_it_diverged(plots):
    ax = [a for a in plots["loss_curves"].figure.axes if a.get_title() == "lr 1e-1"][0]
    (mark,) = [c for c in ax.collections if c.get_label() == "divergence"]
    step, loss = mark.get_offsets()[0]
    assert step == 6 and loss == pytest.approx(ax.get_ylim()[1])  # 9.0 is above the axis: marked at its top


def test_probe_heatmaps_sit_beside_the_gradient_norms_on_the_probe_steps(plots):
    fig = plots["probe_heatmaps"].figure
    titles = [ax.get_title().split("\n") for ax in fig.axes if ax.get_title()]
    assert [t[0] for t in titles[:3]] == ["gradient norm", "attention logit max", "token cosine similarity"]
    assert [t[1] for t in titles[:6]] == ["pre, lr 1e-3"] * 3 + ["post, lr 1e-3"] * 3  # the group, short
    images = [ax.images[0].get_array() for ax in data_axes(fig)]
    assert len(images) == 6 * 3  # 6 groups x (grad norm, attn logit max, cos sim)
    # layer x step: every logged step for the gradient norm, only steps 0, 3, 6, 9 for the probes
    assert [images[i].shape for i in range(3)] == [(N_LAYER, N_STEPS), (N_LAYER, 4), (N_LAYER, 4)]
    assert images[1][1, 1] == pytest.approx(2 + 0.1 * 3 * 2)  # attn_logit_max/layer_1 at step 3


def test_loss_curves_are_smoothed_with_the_raw_mean_faint_behind(analysis, style, tmp_path):
    cells = analysis.metrics[analysis.metrics["lr"] == 1e-3]  # one panel is enough
    plot = plot_loss_curves(analysis.runs.steps, cells, tmp_path, style, smooth=4, dpi=20)
    (ax,) = [a for a in plot.figure.axes if a.get_title() == "lr 1e-3"]
    raw = [line for line in ax.lines if line.get_label() == "_raw"]
    smooth = [line for line in ax.lines if line.get_label() == "pre"]
    assert len(raw) == 2 and all(line.get_alpha() < 0.5 for line in raw)
    expected = [4.0 - 0.1 * i - 2e-3 + 0.005 for i in range(N_STEPS)]  # mean of the two seeds' losses
    assert list(raw[0].get_ydata()) == pytest.approx(expected)
    ema = [expected[0]]
    weight, total = 1.0, expected[0]
    for value in expected[1:]:  # pandas' adjusted EMA with span 4: alpha = 2 / (4 + 1)
        weight = 1 + (1 - 0.4) * weight
        total = value + (1 - 0.4) * total
        ema.append(total / weight)
    assert list(smooth[0].get_ydata()) == pytest.approx(ema)
    plt.close(plot.figure)


def test_the_ema_stops_where_a_run_stops():
    wide = pd.DataFrame([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, np.nan, np.nan]])  # seed 1 still running
    smoothed = ema(wide, 3)  # alpha = 2 / (3 + 1) = 0.5, pandas' adjusted form
    assert list(smoothed.iloc[0]) == pytest.approx([1.0, 5 / 3, 17 / 7, 49 / 15])
    assert smoothed.iloc[1, :2].tolist() == pytest.approx([1.0, 5 / 3]) and smoothed.iloc[1, 2:].isna().all()
    assert ema(wide, 1) is wide  # span 1: raw


def test_log_axes_are_labelled_in_plain_text_as_matplotlib_would_in_mathtext(plots):
    """Saved figures label log axes 10⁻⁵, 2×10⁻³ (superscript digits), not mathtext: the same
    ticks and words, without a mathtext parse and layout per label."""
    profiles = plots["grad_norm_profiles"].figure
    labels = [t.get_text() for ax in profiles.axes if ax.get_yscale() == "log" for t in ax.get_yticklabels()]
    assert labels and not any("$" in label for label in labels)
    assert any(label.startswith("10") and label[2:] and set(label[2:]) <= set("⁰¹²³⁴⁵⁶⁷⁸⁹⁻") for label in labels)
    bars = [ax for ax in plots["grad_norm_heatmaps"].figure.axes if ax.get_xscale() == "log"]  # the colour bar
    assert bars and all("$" not in t.get_text() for ax in bars for t in ax.get_xticklabels())
    fig, (wide, narrow) = plt.subplots(1, 2)
    wide.set_yscale("log"), wide.set_ylim(1e-6, 1e2)
    narrow.set_yscale("log"), narrow.set_ylim(1.5e-3, 6e-3)  # within a decade: non-decades labelled too
    _plain_log_labels(fig)
    fig.canvas.draw()
    assert isinstance(wide.yaxis.get_major_formatter(), PlainLogFormatter)
    assert {"10⁻⁵", "10⁰", "10²"} <= {t.get_text() for t in wide.get_yticklabels()}
    assert "2×10⁻³" in {t.get_text() for t in narrow.get_yticklabels(minor=True)}
    plt.close(fig)
