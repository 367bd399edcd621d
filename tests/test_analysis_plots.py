"""analysis.plots: every file is written, is a real PNG (and SVG), and draws what it should."""
import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import QuadMesh
from synthetic_runs import write_run

from ablate.analysis.analyse import analyse
from ablate.analysis.plots import (make_style, plot_final_loss, plot_grad_heatmaps, plot_grad_profiles, plot_loss_curves,
                            plot_residual_rms)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
N_STEPS, N_LAYER = 12, 3


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    """2 variants x 2 learning rates x 2 seeds; post at lr=0.01 diverges on seed 1."""
    root = tmp_path_factory.mktemp("grid")
    for variant in (PRE, POST):
        for lr in (1e-3, 1e-2):
            for seed in (0, 1):
                losses = [4.0 - 0.1 * i + 0.01 * seed for i in range(N_STEPS)]
                if variant == POST and lr == 1e-2 and seed == 1:
                    losses[8:] = [9.0, float("inf"), float("inf"), float("inf")]
                write_run(root, variant, seed, losses, options={"lr": lr}, n_layer=N_LAYER)
    return analyse(root)


@pytest.fixture(scope="module")
def style(analysis):
    return make_style(analysis.metrics, analysis.runs.option_axes)


def check_files(plot):
    png, svg = plot.paths
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000, png
    assert svg.suffix == ".svg" and "<svg" in svg.read_text()[:2000]
    fig = plot.figure
    assert fig.get_suptitle() or fig.axes[0].get_title()  # every plot has a title
    plt.close(fig)


def test_style_colours_variants_and_facets_by_the_varying_option(analysis, style):
    assert style.hue == "variant_id" and style.facets == ("lr",)
    assert set(style.palette) == {PRE, POST} and style.palette[PRE] != style.palette[POST]


def test_loss_curves_one_mean_line_per_variant_per_panel_plus_each_diverged_seed(analysis, style, tmp_path):
    plot = plot_loss_curves(analysis.runs.steps, analysis.metrics, tmp_path, style, dpi=50)
    axes = [ax for ax in plot.figure.axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["lr=0.001", "lr=0.01"]
    assert [len(ax.lines) for ax in axes] == [2, 3]  # lr=0.01: + the diverged seed's own dashed line
    assert axes[1].lines[-1].get_linestyle() == "--"
    colours = {line.get_label(): line.get_color() for line in axes[0].lines}
    assert colours[PRE] == style.palette[PRE]  # the same colour for the same variant everywhere
    assert axes[0].get_xlabel() == "step" and "nats" in axes[0].get_ylabel()
    check_files(plot)


def test_grad_heatmaps_one_panel_per_group_with_layer_by_step_cells(analysis, style, tmp_path):
    plot = plot_grad_heatmaps(analysis.runs.steps, analysis.metrics, tmp_path, style, dpi=50)
    meshes = [c for ax in plot.figure.axes if ax.get_title() for c in ax.collections if isinstance(c, QuadMesh)]
    assert len(meshes) == 4  # 4 groups
    assert all(m.get_array().size == N_LAYER * N_STEPS for m in meshes)
    assert any("gradient norm" in ax.get_ylabel() for ax in plot.figure.axes)  # the shared colour bar
    check_files(plot)


def test_heatmap_bins_long_runs_into_at_most_max_columns(analysis, style, tmp_path):
    plot = plot_grad_heatmaps(analysis.runs.steps, analysis.metrics, tmp_path, style, max_columns=5, dpi=30)
    meshes = [c for ax in plot.figure.axes if ax.get_title() for c in ax.collections if isinstance(c, QuadMesh)]
    assert all(m.get_array().size == N_LAYER * 5 for m in meshes)
    plt.close(plot.figure)


def test_grad_profiles_init_mid_end_one_line_per_variant(analysis, style, tmp_path):
    plot = plot_grad_profiles(analysis.grad_profiles, analysis.metrics, tmp_path, style, dpi=50)
    axes = [ax for ax in plot.figure.axes if ax.get_title()]
    assert len(axes) == 2 * 3  # (lr settings) x (init, mid, end)
    assert all(len(ax.lines) == 2 for ax in axes)
    assert all(len(line.get_xdata()) == N_LAYER for ax in axes for line in ax.lines)
    assert axes[0].get_yscale() == "log" and "layer" in axes[0].get_xlabel()
    check_files(plot)


def test_residual_rms_by_depth(analysis, style, tmp_path):
    plot = plot_residual_rms(analysis.act_profiles, analysis.metrics, tmp_path, style, dpi=50)
    axes = [ax for ax in plot.figure.axes if ax.get_title()]
    assert [len(ax.lines) for ax in axes] == [2, 2]
    check_files(plot)


def test_final_loss_intervals_and_diverged_marks(analysis, style, tmp_path):
    plot = plot_final_loss(analysis.metrics, analysis.summary, tmp_path, style, dpi=50)
    ax = plot.figure.axes[0]
    assert len(ax.containers) == 4  # one mean with its interval per group
    diverged = [c for c in ax.collections if c.get_label() == "diverged"]
    assert len(diverged) == 1 and len(diverged[0].get_offsets()) == 1
    dots = [c for c in ax.collections if c.get_label() == "one seed"]
    assert sum(len(c.get_offsets()) for c in dots) == 7  # every completed seed
    assert "nats" in ax.get_xlabel()
    check_files(plot)


def test_plots_needing_probes_are_skipped_without_them(tmp_path):
    write_run(tmp_path, probes=False)
    a = analyse(tmp_path)
    style = make_style(a.metrics)
    assert plot_grad_heatmaps(a.runs.steps, a.metrics, tmp_path, style) is None
    assert plot_grad_profiles(a.grad_profiles, a.metrics, tmp_path, style) is None
    assert plot_residual_rms(a.act_profiles, a.metrics, tmp_path, style) is None
