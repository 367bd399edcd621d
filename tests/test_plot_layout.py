"""Every plot kind, report and claim, on a grid with long cell ids: no two texts overlap, none
leaves the figure, and every text stays readable with the figure scaled to 1,600 px wide.
Measured from matplotlib's own text extents after a draw."""
import itertools
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest

from ablate.analysis.analyse import analyse
from ablate.analysis.report import make_plots
from ablate.claims.claim_measures import Context
from ablate.claims.claim_plots import PLOTS, claim_figure
from tests.helpers.synthetic_runs import write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
PAGE_PX, MIN_PX = 1600, 8  # a text under 8 px high at 1,600 px wide is not readable
CLAIM_PARAMS = {  # each claim kind with the params a claim would give it
    "lr_curve": {"split": "norm", "facet": "warmup"},
    "layer_profile": {"split": "norm", "metric": "grad_norm"},
    "divergence": {"split": "norm"},
    "loss_vs_params": {"split": "norm"},
    "paired_loss": {"split": "norm", "at": {"lr": 1e-2, "warmup": 50}},
    "grad_profile": {"split": "norm", "at": {"lr": 1e-2}, "facet": "warmup"},
    "attn_logit_growth": {"split": "norm", "facet": "lr", "at": {"warmup": 0}},
}


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """pre/post x lr {1e-3, 1e-2, 3e-2} x warmup {0, 50} x 2 seeds, with init, schedule and steps
    in the ids: `post.layernorm.gelu.dense.res__init=gpt2__lr=0.01__schedule=constant__steps=8__
    warmup=50__seed=1`; post at lr 3e-2 without warmup diverges in seed 1."""
    root = tmp_path_factory.mktemp("long_ids")
    for variant, lr, warmup, seed in itertools.product((PRE, POST), (1e-3, 1e-2, 3e-2), (0, 50), (0, 1)):
        losses = [5.0 - 0.2 * i - 10 * lr + 0.02 * seed for i in range(8)]
        if variant == POST and lr == 3e-2 and warmup == 0 and seed == 1:
            losses[5:] = [float("inf")] * 3
        write_run(root, variant, seed, losses, options={"lr": lr, "warmup": warmup, "init": "gpt2", "steps": 8,
                                                       "schedule": "constant"},
                  n_layer=3, probe_every=2, unigram_entropy=4.4)
    return analyse(root), root


@pytest.fixture(scope="module")
def report_figures(grid):
    analysis, root = grid
    made = make_plots(analysis, root / "plots", dpi=20, processes=1)  # here: the tests read the figures
    yield {p.name: p.figure for p in made}
    for plot in made:
        plt.close(plot.figure)


def texts(fig):
    """(what, bbox in pixels, font size) of every visible, non-empty text and legend, the figure
    drawn first so tick labels sit where they are drawn."""
    fig.set_dpi(40)  # extents scale with dpi; a small one draws fast
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    found = []

    def add(what, artist, size):
        empty = isinstance(artist, plt.Text) and not artist.get_text().strip()
        if artist is not None and artist.get_visible() and not empty:
            found.append((what, artist.get_window_extent(renderer), size))

    for text in fig.texts:
        add(f"figure text {text.get_text()[:30]!r}", text, text.get_fontsize())
    for legend in fig.legends:
        add("figure legend", legend, min(t.get_fontsize() for t in legend.get_texts()))
    for index, ax in enumerate(fig.axes):
        if not ax.get_visible() or not ax.axison and not ax.get_title():
            continue
        where = f"axes {index} ({ax.get_title()[:25]!r})"
        for title in (ax.title, ax._left_title, ax._right_title):
            add(f"{where} title", title, title.get_fontsize())
        if ax.axison:
            for axis, name in ((ax.xaxis, "x"), (ax.yaxis, "y")):
                add(f"{where} {name} label", axis.label, axis.label.get_fontsize())
                low, high = sorted(axis.get_view_interval())
                for tick in axis.get_major_ticks():
                    if low - 1e-9 * abs(high - low) <= tick.get_loc() <= high + 1e-9 * abs(high - low):
                        add(f"{where} {name} tick {tick.label1.get_text()!r}", tick.label1, tick.label1.get_fontsize())
        for text in ax.texts:
            add(f"{where} note {text.get_text()!r}", text, text.get_fontsize())
        if ax.get_legend() is not None:
            add(f"{where} legend", ax.get_legend(), min(t.get_fontsize() for t in ax.get_legend().get_texts()))
    return found


def layout_problems(fig) -> list[str]:
    found = texts(fig)
    box = fig.bbox
    problems = [f"{what} leaves the figure" for what, bb, _ in found
                if bb.x0 < box.x0 - 1 or bb.y0 < box.y0 - 1 or bb.x1 > box.x1 + 1 or bb.y1 > box.y1 + 1]
    width_in = fig.get_size_inches()[0]
    problems += [f"{what}: {size:.1f} pt is {size / 72 * PAGE_PX / width_in:.1f} px at {PAGE_PX} px wide"
                 for what, _, size in found if size / 72 * PAGE_PX / width_in < MIN_PX]
    shrunk = [(what, bb.expanded(1, 1).shrunk(1, 1).padded(-0.5)) for what, bb, _ in found]
    for (a, box_a), (b, box_b) in itertools.combinations(shrunk, 2):
        if box_a.overlaps(box_b):
            problems.append(f"{a} overlaps {b}")
    return problems


REPORT_PLOTS = ["loss_curves", "final_loss", "lr_sensitivity", "grad_norm_heatmaps", "probe_heatmaps",
                "grad_norm_profiles", "residual_rms"]


@pytest.mark.slow
@pytest.mark.parametrize("name", REPORT_PLOTS)
def test_report_plot_texts_neither_overlap_nor_leave_the_figure(report_figures, name):
    fig = report_figures[name]
    assert layout_problems(fig) == []
    assert not any("__" in t.get_text() or ".layernorm." in t.get_text()  # never a cell id
                   for t in fig.findobj(plt.Text))


def test_every_claim_plot_kind_is_checked():
    assert set(CLAIM_PARAMS) == set(PLOTS)  # a new kind needs its params here


@pytest.mark.parametrize("kind", sorted(CLAIM_PARAMS))
def test_claim_plot_texts_neither_overlap_nor_leave_the_figure(grid, kind):
    analysis, _ = grid
    ctx = Context(analysis.runs, analysis.metrics)
    drawn = claim_figure(ctx, kind, CLAIM_PARAMS[kind], "prenorm-wins: " + "a long statement of the claim " * 6)
    assert drawn is not None, kind
    try:
        assert layout_problems(drawn.figure) == []
        assert not any("__" in t.get_text() or ".layernorm." in t.get_text() for t in drawn.figure.findobj(plt.Text))
    finally:
        plt.close(drawn.figure)


def test_the_check_finds_overlapping_and_escaping_texts():
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_title("a title")
    ax.text(0.5, 1.0, "on the title", transform=ax.transAxes, ha="center", va="bottom", fontsize=12)
    fig.text(0.99, 0.5, "runs off the right edge")
    problems = layout_problems(fig)
    plt.close(fig)
    assert any("overlaps" in p and "on the title" in p for p in problems)
    assert any("runs off" in p and "leaves the figure" in p for p in problems)


def test_the_check_finds_text_too_small_for_a_page():
    fig, ax = plt.subplots(figsize=(40, 3))  # 40 inches scaled to 1,600 px: 10 pt is 5.6 px
    ax.set_xlabel("step", fontsize=10)
    problems = layout_problems(fig)
    plt.close(fig)
    assert any("x label" in p and "px at 1600" in p for p in problems)
