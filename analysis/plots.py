"""Comparison plots (seaborn style, matplotlib's Agg backend), each written as PNG and SVG.

Every plot function takes frames and an output folder and returns a `Plot` (its figure, the
files written, a one-line caption), or None when the runs lack the metrics it needs (e.g.
per-layer plots for runs trained with probes = false). The caller closes the figure.

Colours: one `Style` maps each variant to one colour, shared by every plot of a report.
When a grid has a single variant, the groups (its option settings) get the colours instead.
Option axes that vary (lr, warmup, ...) become facet panels. Every loss plot draws the
corpus's unigram entropy (the loss of a model that ignores context) as a labelled line, so a
run stuck on that plateau is visible at a glance.
"""
from __future__ import annotations

import copy
import functools
import re
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window (and work without a display)

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.cm import ScalarMappable  # noqa: E402
from matplotlib.colors import LogNorm, Normalize  # noqa: E402
from matplotlib.ticker import LogFormatterSciNotation, MaxNLocator, NullLocator  # noqa: E402
from scipy import stats as scipy_stats  # noqa: E402

from ablate.analysis.labels import label_of, short_labels  # noqa: E402
from ablate.analysis.load import SETTING_KEYS, VARIANT_AXES, layer_columns  # noqa: E402
from ablate.analysis.metrics import PHASES  # noqa: E402
from ablate.analysis.stats import MEAN_INTERVAL_RULE  # noqa: E402
from ablate.core.probe_registry import layer_heatmaps  # noqa: E402
from ablate.core.rundir import COMPLETED, DIVERGED, RUNNING
from ablate.core.safe_files import replace_atomic  # noqa: E402

PANEL_SIZE = (4.6, 3.2)  # inches per facet panel
DIVERGED_COLOUR = "#d62728"
HEATMAP_CMAP = "viridis"
PHASE_TITLES = {"init": "at initialisation", "mid": "mid-run", "end": "at the end"}
ENTROPY_COLOUR = "#555555"
RAW_ALPHA = 0.25  # the unsmoothed curve, drawn faintly behind the smoothed one
# Per-layer heatmaps drawn side by side: probe -> (title, colour-bar label, log colour scale), for
# every per-layer probe that declares a heatmap (ablate/core/probe_registry.py).
PROBE_TITLE_SIZE = 8
LAYER_HEATMAPS = {name: (h.title, h.label, h.log) for name, h in layer_heatmaps().items()}


def unigram_entropies(cells: pd.DataFrame) -> list[float]:
    """The distinct unigram entropies (nats/token) recorded for these cells' data."""
    if "unigram_entropy" not in cells:
        return []
    values = pd.to_numeric(cells["unigram_entropy"], errors="coerce").dropna().unique()
    return sorted(float(v) for v in values)


def draw_unigram_entropy(ax, cells: pd.DataFrame, vertical: bool = False) -> None:
    """The unigram-entropy line, labelled on the plot and in the legend (nothing when the
    data recorded none, e.g. token shards)."""
    for entropy in unigram_entropies(cells):
        label = f"unigram entropy {entropy:.3f} nats"
        if vertical:
            ax.axvline(entropy, color=ENTROPY_COLOUR, ls=":", lw=1.1, label=label)
            ax.annotate("unigram", (entropy, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                        textcoords="offset points", fontsize=7, color=ENTROPY_COLOUR)
        else:
            ax.axhline(entropy, color=ENTROPY_COLOUR, ls=":", lw=1.1, label=label)
            ax.annotate("unigram entropy", (0.0, entropy), xycoords=("axes fraction", "data"), xytext=(3, 2),
                        textcoords="offset points", fontsize=7, color=ENTROPY_COLOUR)


@dataclass
class Plot:
    name: str
    figure: plt.Figure | None  # None when drawn in a child process (analysis/plot_jobs.py)
    paths: list[Path]
    caption: str


@dataclass(frozen=True)
class Style:
    """What colours the lines (`hue`: a cells column), the colour of each value, the option
    axes that split the plots into panels, and the short label (analysis/labels.py) of each hue
    value and of each group: plots never show a full cell id."""

    hue: str
    palette: dict
    facets: tuple[str, ...] = field(default_factory=tuple)
    labels: dict = field(default_factory=dict)  # hue value -> label inside a panel
    group_labels: dict = field(default_factory=dict)  # group -> label naming every varying axis

    def colour(self, value) -> tuple:
        return self.palette[value]

    def label(self, value) -> str:
        return self.labels.get(value, str(value))

    def group_label(self, group) -> str:
        return self.group_labels.get(group, str(group))


def make_style(cells: pd.DataFrame, option_axes=()) -> Style:
    """Colour by variant when several variants ran (with a panel per setting of the varying
    `option_axes`), else by group (one panel). The colours depend only on the sorted names,
    so a variant keeps its colour in every plot, and in every report of the same variants."""
    variants = sorted(cells["variant_id"].dropna().unique())
    axes = (*VARIANT_AXES, *option_axes, *SETTING_KEYS)  # short_labels keeps the varying ones
    if len(variants) > 1:
        hue, facets = "variant_id", tuple(a for a in option_axes if a in cells)
        labels = short_labels(cells, VARIANT_AXES, by="variant_id")
    else:
        hue, facets = "group", ()
        labels = short_labels(cells, axes, by="group")
    values = sorted(cells[hue].dropna().unique())
    colours = sns.color_palette("colorblind" if len(values) <= 10 else "husl", max(len(values), 1))
    return Style(hue, dict(zip(values, colours)), facets, labels, short_labels(cells, axes, by="group"))


def _panels(cells: pd.DataFrame, style: Style) -> list[tuple[str, pd.DataFrame]]:
    """(label, cells) per combination of the facet axes, in sorted order; the label names the
    facet values (`lr 1e-2, warmup 50`)."""
    if not style.facets:
        return [("", cells)]
    keyed = cells.assign(_panel=list(zip(*(cells[a] for a in style.facets))))
    titles = short_labels(keyed, style.facets, by="_panel", constant=True)
    return [(titles[key], members.drop(columns="_panel"))
            for key, members in keyed.groupby("_panel", sort=True, dropna=False)]


def _curve_cells(members: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The cells a group's averaged curve is drawn from: those that did not diverge or fail
    (a diverged run's blow-up would swamp the mean); if every one diverged, those instead,
    flagged so the line is drawn dashed."""
    healthy = members[members["status"].isin([COMPLETED, RUNNING])]
    if not healthy.empty:
        return healthy, False
    return members[members["status"] == DIVERGED], True


MAX_PANELS_PER_ROW = 3  # 3 panels of PANEL_SIZE: about 14 inches, readable scaled to 1,600 px
CHAR_WIDTH = 0.6  # DejaVu Sans's widest common glyphs, in ems: text width estimates err wide
TITLE_SIZE, PANEL_TITLE_SIZE, LEGEND_SIZE = 11, 9, 8


def text_inches(text: str, fontsize: float) -> float:
    """A generous estimate of a line's width: the layouts reserve room from it, without
    measuring (measuring every text is what makes tight_layout take seconds on a big grid)."""
    return len(text) * CHAR_WIDTH * fontsize / 72


def wrap(text: str, inches: float, fontsize: float) -> str:
    """`text` broken at spaces into lines no wider than `inches`."""
    chars = max(8, int(inches / (CHAR_WIDTH * fontsize / 72)))
    return "\n".join(textwrap.wrap(text, chars, break_on_hyphens=False)) if text else text


@dataclass
class Layout:
    """Panels placed in inches: every margin holds its text (tick labels, axis labels, titles,
    the legend band) at any number of panels, and panels wrap into rows of `columns`."""

    n: int
    columns: int = MAX_PANELS_PER_ROW
    panel: tuple = PANEL_SIZE
    left: float = 0.95  # y tick labels and the y label
    right: float = 0.3
    gap_x: float = 0.95  # the next panel's y tick labels and y label
    title_lines: int = 1  # of each panel's title
    top: float = 0.45  # the figure title (grows with its lines)
    bottom: float = 0.62  # x tick labels and the x label of the last row
    legend: float = 0.0  # the band under the panels for the figure legend
    extra_bottom: float = 0.0  # a band for colour bars, under the legend

    def __post_init__(self):
        self.columns = max(1, min(self.columns, self.n))

    @property
    def rows(self) -> int:
        return -(-self.n // self.columns)

    @property
    def gap_y(self) -> float:
        return self.bottom + 0.1 + 0.19 * self.title_lines

    @property
    def width(self) -> float:
        return self.left + self.columns * self.panel[0] + (self.columns - 1) * self.gap_x + self.right

    @property
    def height(self) -> float:
        return (self.top + 0.19 * self.title_lines + self.rows * self.panel[1] + (self.rows - 1) * self.gap_y
                + self.bottom + self.legend + self.extra_bottom)

    def rect(self, index: int) -> tuple:
        """(left, bottom, width, height) of panel `index` as fractions of the figure."""
        row, column = divmod(index, self.columns)
        x = self.left + column * (self.panel[0] + self.gap_x)
        y_top = self.top + 0.19 * self.title_lines + row * (self.panel[1] + self.gap_y)
        y = self.height - y_top - self.panel[1]
        return x / self.width, y / self.height, self.panel[0] / self.width, self.panel[1] / self.height

    def place(self, fig: plt.Figure, axes) -> None:
        fig.set_size_inches(self.width, self.height)
        for index, ax in enumerate(axes):
            ax.set_position(self.rect(index))


def panel_figure(n: int, columns: int = MAX_PANELS_PER_ROW, sharey: bool = False, sharex: bool = False,
                 **layout) -> tuple[plt.Figure, list, Layout]:
    """A figure of `n` panels wrapped into rows (see Layout). With `sharey`, only the first
    column shows the y tick labels, and the panels sit closer."""
    if sharey:
        layout.setdefault("gap_x", 0.3)
    spec = Layout(n, columns, **layout)
    fig = plt.figure(figsize=(spec.width, spec.height))
    axes = []
    for index in range(n):
        first = axes[0] if axes else None
        ax = fig.add_axes(spec.rect(index), sharey=first if sharey else None, sharex=first if sharex else None)
        if sharey and index % spec.columns:
            ax.tick_params(labelleft=False)
        axes.append(ax)
    return fig, axes, spec


def _grid(n_rows: int, n_cols: int, sharey: bool = False, **layout):
    """n_rows x n_cols panels (rows of a table: a row per group, a column per phase or metric)
    as a 2-d array, placed by panel_figure."""
    fig, axes, spec = panel_figure(n_rows * n_cols, n_cols, sharey=sharey, **layout)
    return fig, np.array(axes, dtype=object).reshape(n_rows, n_cols), spec


_SUPERSCRIPTS = str.maketrans("0123456789-\N{MINUS SIGN}", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁻")
_MATH_POWER = re.compile(r"\^\{([^}]*)\}")


class PlainLogFormatter(LogFormatterSciNotation):
    """matplotlib's log-axis tick labels (the same ticks: 10⁻⁵, 2×10⁻³) as plain text with
    superscript digits: the same labels without mathtext, whose parse of the tick labels alone
    was about 7% of a report's drawing under cProfile."""

    def __call__(self, x, pos=None):
        label = super().__call__(x, pos)
        if not (label.startswith("$\\mathdefault{") and label.endswith("}$")):
            return label
        body = label[len("$\\mathdefault{"):-2].replace("\\times", "×").replace("\\;", " ")
        return _MATH_POWER.sub(lambda m: m.group(1).translate(_SUPERSCRIPTS), body)


def _plain_log_labels(fig: plt.Figure) -> None:
    """Every log axis of the figure (panels, colour bars) labelled by PlainLogFormatter."""
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for get, put in ((axis.get_major_formatter, axis.set_major_formatter),
                             (axis.get_minor_formatter, axis.set_minor_formatter)):
                formatter = get()
                if type(formatter) is LogFormatterSciNotation:  # the log scale's own: its settings kept
                    plain = copy.copy(formatter)
                    plain.__class__ = PlainLogFormatter
                    put(plain)


def save_figure(fig: plt.Figure, path: Path, dpi: int | None = None) -> Path:
    """Write the figure to `path` without following a link there (safe_files.replace_atomic:
    a fresh temporary renamed over `path`), its log axes labelled by PlainLogFormatter."""
    path = Path(path)
    _plain_log_labels(fig)
    # A light PNG compression: the default level takes seconds on a tall grid of panels.
    extra = {"pil_kwargs": {"compress_level": 1}} if path.suffix == ".png" else {}
    replace_atomic(path, lambda f: fig.savefig(f, format=path.suffix.lstrip("."), dpi=dpi, **extra), fsync=False)
    return path


def _save(fig: plt.Figure, out_dir: Path, name: str, dpi: int) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [save_figure(fig, out_dir / f"{name}.png", dpi), save_figure(fig, out_dir / f"{name}.svg")]


COLOUR_BAR_BAND = 0.95  # inches under the panels (and legend): a colour bar, its ticks and its label


def _colour_bar(fig: plt.Figure, spec: Layout, columns: tuple[int, int], norm, label: str) -> None:
    """A horizontal colour bar in the band under the panels, spanning panel columns
    columns[0]..columns[1] of the layout (call after finish_panels has placed the panels)."""
    first, last = spec.rect(columns[0]), spec.rect(columns[1])
    bar = fig.add_axes((first[0], 0.55 / spec.height, last[0] + last[2] - first[0], 0.12 / spec.height))
    fig.colorbar(ScalarMappable(norm=norm, cmap=HEATMAP_CMAP), cax=bar, orientation="horizontal", label=label)


def legend_entries(axes) -> dict:
    """label -> handle over the panels, first one of each label ("_..." labels are not shown)."""
    handles: dict[str, object] = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    return handles


def finish_panels(fig: plt.Figure, axes, title: str, spec: Layout) -> None:
    """The figure's title on top (wrapped to its width) and one legend for all panels in a band
    under them, as many columns as its longest entry allows; then every panel in its place."""
    handles = legend_entries(axes)
    longest = max((text_inches(label, LEGEND_SIZE) for label in handles), default=0.0)
    columns = max(1, min(len(handles), int((spec.width - 0.4) // (longest + 0.6)))) if handles else 1
    rows = -(-len(handles) // columns)
    spec.legend = 0.22 * rows + 0.15 if handles else 0.0
    title = wrap(title, spec.width - 0.4, TITLE_SIZE)
    spec.top = 0.2 + 0.22 * (title.count("\n") + 1)
    spec.place(fig, np.ravel(axes))
    fig.suptitle(title, fontsize=TITLE_SIZE, y=1 - 0.1 / spec.height, va="top")
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=columns, frameon=False,
                   fontsize=LEGEND_SIZE, bbox_to_anchor=(0.5, (spec.extra_bottom + 0.05) / spec.height))


def panel_title(ax, text: str, spec: Layout, fontsize: float = PANEL_TITLE_SIZE, **kwargs) -> int:
    """Set a panel's title wrapped to the panel's width; returns its number of lines."""
    text = wrap(text, spec.panel[0], fontsize)
    ax.set_title(text, fontsize=fontsize, **kwargs)
    return text.count("\n") + 1 if text else 0


# A title at a fixed height (matplotlib otherwise measures every tick label to lift it: seconds
# over a big grid; the layouts leave room for it), and SVG text as text rather than outlines.
FAST_DRAWING = {"axes.titley": 1.0, "svg.fonttype": "none"}


def log_y(ax) -> None:
    """A log y axis without minor ticks: they are unlabelled, the grid draws none, and making
    their tick objects is most of the time a log panel takes to draw."""
    ax.set_yscale("log")
    ax.yaxis.set_minor_locator(NullLocator())


def log_x(ax, values) -> None:
    """A log x axis; where the drawn data give it no positive range (every cell of the panel
    diverged or failed: nothing but markers on the axis' own transform, or no point at all), its
    limits come from `values` (the rates the panel swept). Left linear when none is positive."""
    low, high = ax.dataLim.intervalx
    if np.isfinite([low, high]).all() and low > 0:
        ax.set_xscale("log")
        return
    xs = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").to_numpy(dtype=float)
    xs = xs[np.isfinite(xs) & (xs > 0)]
    if xs.size:
        ax.set_xscale("log")
        ax.set_xlim(xs.min() / 1.5, xs.max() * 1.5)


def styled(plot_function):
    """Draw inside seaborn's style without changing the caller's global matplotlib settings."""
    @functools.wraps(plot_function)
    def wrapper(*args, **kwargs):
        with sns.axes_style("whitegrid"), sns.plotting_context("notebook", font_scale=0.8), \
                plt.rc_context(FAST_DRAWING):
            return plot_function(*args, **kwargs)
    return wrapper


def t_band(values: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column mean and t-interval across rows (seeds); the band is NaN where fewer than
    two seeds have a value. A t-interval, not a bootstrap: it is computed at every step, and
    with a handful of seeds it is the wider, more honest of the two."""
    n = np.isfinite(values).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN or one-seed columns: handled below
        mean = np.nanmean(values, axis=0)
        sem = np.nanstd(values, axis=0, ddof=1) / np.sqrt(n)
        half = scipy_stats.t.ppf(0.5 + confidence / 2, np.maximum(n - 1, 1)) * sem
    half[n < 2] = np.nan
    return mean, mean - half, mean + half


def ema(wide: pd.DataFrame, span: int) -> pd.DataFrame:
    """Exponential moving average along the steps (columns) of a cell x step frame; NaN where
    the cell logged nothing (pandas would carry the average on past a run's last step)."""
    if span <= 1:
        return wide
    return wide.T.ewm(span=span, min_periods=1).mean().T.where(wide.notna())


def _divergence_point(series: pd.DataFrame, metric: str, step) -> tuple[float, float] | None:
    """(step, loss) to mark a divergence at: the logged step it diverged at, at its loss if
    finite, else at the last finite loss before it."""
    if step is None or not np.isfinite(float(step)):
        finite = series[np.isfinite(series[metric])]
        return (float(finite["step"].iloc[-1]), float(finite[metric].iloc[-1])) if not finite.empty else None
    before = series[(series["step"] <= step) & np.isfinite(series[metric])]
    if before.empty:
        return None
    return float(step), float(before[metric].iloc[-1])


@styled
def plot_loss_curves(steps: pd.DataFrame, cells: pd.DataFrame, out_dir: Path, style: Style,
                     metric: str = "loss", smooth: int | None = None, dpi: int = 120,
                     name: str = "loss_curves") -> Plot | None:
    """Training loss against step: one line per variant (mean across seeds of each seed's
    EMA-smoothed loss) with a 95% band and the raw mean faint behind it; each diverged cell
    as its own dashed line with a red x at the step it diverged; the unigram entropy as a
    labelled line; a panel per option setting. `smooth` is the EMA span in logged steps
    (default: 2% of the run; 1 = raw)."""
    if steps.empty or metric not in steps:
        return None
    if smooth is None:
        smooth = max(1, steps["step"].nunique() // 50)
    panels = _panels(cells, style)
    fig, axes, spec = panel_figure(len(panels), sharey=True)
    top = -np.inf  # the highest healthy mean or diverged run's first loss, over all panels
    marks = []  # (axes, step, loss) of each divergence, drawn once the y limits are known
    for ax, (label, members) in zip(axes, panels):
        for group, group_cells in members.groupby("group", sort=False):
            colour = style.colour(group_cells[style.hue].iloc[0])
            curve_cells, all_diverged = _curve_cells(group_cells)
            if not all_diverged and not curve_cells.empty:
                wide = steps[steps["cell_id"].isin(curve_cells["cell_id"])].pivot_table(
                    index="cell_id", columns="step", values=metric, dropna=False)
                raw = np.nanmean(wide.to_numpy(dtype=float), axis=0) if smooth > 1 else None
                mean, low, high = t_band(ema(wide, smooth).to_numpy(dtype=float))
                if raw is not None:
                    ax.plot(wide.columns, raw, color=colour, lw=0.6, alpha=RAW_ALPHA, label="_raw")
                ax.plot(wide.columns, mean, color=colour, lw=1.4, label=_label(group_cells, style))
                ax.fill_between(wide.columns, low, high, color=colour, alpha=0.2, lw=0)
                top = max(top, np.nanmax(mean))
            for cell in group_cells[group_cells["status"] == DIVERGED].itertuples():
                series = steps[steps["cell_id"] == cell.cell_id]
                ax.plot(series["step"], series[metric], color=colour, lw=0.9, ls="--",
                        label=f"{_label(group_cells, style)} (diverged)")
                point = _divergence_point(series, metric, getattr(cell, "diverged_at_step", None))
                if point is not None:
                    marks.append((ax, *point))
                    finite = series[np.isfinite(series[metric])]
                    top = max(top, finite[metric].iloc[0])
        draw_unigram_entropy(ax, members)
        panel_title(ax, label or "all cells", spec)
        ax.set_xlabel("step")
    drawn = steps[steps["cell_id"].isin(cells["cell_id"])][metric].to_numpy(dtype=float)
    lowest = np.nanmin(drawn) if np.isfinite(drawn).any() else np.nan
    top = max([top, *unigram_entropies(cells)])
    if np.isfinite(top) and np.isfinite(lowest) and top > lowest:
        # A diverged run's loss can reach 1e30; keep the healthy curves readable. The panels
        # share their y axis, so one limit serves them all.
        axes[0].set_ylim(lowest - 0.05 * (top - lowest), top + 0.05 * (top - lowest))
    ceiling = axes[0].get_ylim()[1]
    for ax, step, loss in marks:  # a divergence above the visible range is marked at its top
        ax.scatter([step], [min(loss, ceiling)], marker="x", s=40, color=DIVERGED_COLOUR, zorder=3,
                   label="divergence", clip_on=False)
    for ax in axes[::spec.columns]:
        ax.set_ylabel(f"training {metric} (nats)")
    finish_panels(fig, axes, "Training loss per variant: mean across seeds, 95% t-band (dashed = a diverged seed)", spec)
    smoothing = (f", each seed smoothed by an EMA of span {smooth} logged steps (the raw mean faint behind)"
                 if smooth > 1 else "")
    caption = (f"Training loss against step, mean across seeds with a 95% t-interval band{smoothing} "
               "(no band where only one seed ran); each diverged seed is a dashed line with a red x at the step "
               "it diverged; the dotted line is the corpus's unigram entropy.")
    return Plot(name, fig, _save(fig, out_dir, name, dpi), caption)


def _label(group_cells: pd.DataFrame, style: Style) -> str:
    return style.label(group_cells[style.hue].iloc[0])


def _bin_columns(wide: pd.DataFrame, max_columns: int) -> pd.DataFrame:
    """Average neighbouring steps into at most `max_columns` columns (a heatmap cell per
    logged step is unreadable for long runs); each bin is labelled by its first step. NaN is
    left out of a bin's mean (a bin of NaN only stays NaN)."""
    if wide.shape[1] <= max_columns:
        return wide
    starts = np.array([b[0] for b in np.array_split(np.arange(wide.shape[1]), max_columns)])
    values = wide.to_numpy(dtype=float)
    finite = np.isfinite(values)
    # One reduceat over the bins instead of a pandas mean per bin: a 200-step run's 100 bins
    # x 14 groups took most of the heatmap's time.
    sums = np.add.reduceat(np.where(finite, values, 0.0), starts, axis=1)
    counts = np.add.reduceat(finite, starts, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return pd.DataFrame(means, index=wide.index, columns=wide.columns[starts])


@styled
def plot_grad_heatmaps(steps: pd.DataFrame, cells: pd.DataFrame, out_dir: Path, style: Style,
                       max_columns: int = 100, dpi: int = 120, name: str = "grad_norm_heatmaps") -> Plot | None:
    """Per-layer gradient norm, layer x step, log colour scale shared by all panels: one
    panel per group (mean across its seeds). Layer 0 (the input side) is at the bottom."""
    if not layer_columns(steps, "grad_norm"):
        return None
    maps = []
    for group, group_cells in cells.groupby("group", sort=False):
        curve_cells, all_diverged = _curve_cells(group_cells)
        wide = _layer_map(steps, curve_cells["cell_id"], "grad_norm", max_columns)
        if wide is None:
            continue
        wide = wide.where(wide > 0)  # a log scale cannot show 0; leave those cells blank
        maps.append((group, group_cells, all_diverged, wide))
    if not maps:
        return None
    values = np.concatenate([m[3].to_numpy(dtype=float).ravel() for m in maps])
    values = values[np.isfinite(values)]
    norm = LogNorm(vmin=values.min(), vmax=values.max()) if values.size else None
    titles = [wrap(style.group_label(group) + (" (all seeds diverged)" if all_diverged else ""), PANEL_SIZE[0],
                   PANEL_TITLE_SIZE) for group, _, all_diverged, _ in maps]
    fig, axes, spec = panel_figure(len(maps), sharey=True, title_lines=max(t.count("\n") + 1 for t in titles),
                                   extra_bottom=COLOUR_BAR_BAND)
    for ax, title, (group, group_cells, all_diverged, wide) in zip(axes, titles, maps):
        _draw_layer_map(ax, wide, norm)
        ax.set_title(title, fontsize=PANEL_TITLE_SIZE, color=style.colour(group_cells[style.hue].iloc[0]))
        ax.set_xlabel("step")
    for ax in axes[::spec.columns]:  # the panels share the layers axis: labelled once a row
        ax.set_ylabel("layer (0 = input)")
    finish_panels(fig, axes, "Per-layer gradient norm over training (mean across seeds, log colour scale)", spec)
    # One colour bar for every panel: they share the scale, so panels compare directly.
    _colour_bar(fig, spec, (0, spec.columns - 1), norm, "gradient norm (L2, log scale)")
    caption = ("Gradient norm of each block's parameters (rows, layer 0 at the bottom) against step (columns, "
               f"at most {max_columns}; neighbouring steps averaged), log colour scale shared by all panels.")
    return Plot(name, fig, _save(fig, out_dir, name, dpi), caption)


def _profile_panels(profiles: pd.DataFrame, cells: pd.DataFrame, style: Style, axes_row, phases,
                    ylabel: str | None = None):
    """Draw one line per group (mean over its curve cells) in each phase's axes."""
    for group, group_cells in cells.groupby("group", sort=False):
        curve_cells, all_diverged = _curve_cells(group_cells)
        mine = profiles[profiles["cell_id"].isin(curve_cells["cell_id"])]
        colour = style.colour(group_cells[style.hue].iloc[0])
        for ax, phase in zip(axes_row, phases):
            line = mine[mine["phase"] == phase].groupby("layer")["value"].mean()
            if line.empty:
                continue
            ax.plot(line.index, line.to_numpy(), marker="o", ms=3, color=colour, ls="--" if all_diverged else "-",
                    label=_label(group_cells, style) + (" (all seeds diverged)" if all_diverged else ""))
    for ax in axes_row:
        log_y(ax)
        ax.set_xlabel("layer (0 = input)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ylabel:
        axes_row[0].set_ylabel(ylabel)


@styled
def plot_grad_profiles(profiles: pd.DataFrame, cells: pd.DataFrame, out_dir: Path, style: Style,
                       dpi: int = 120, name: str = "grad_norm_profiles") -> Plot | None:
    """Per-layer gradient norm at init, mid-run and end (columns), one line per variant;
    a row of panels per option setting."""
    if profiles.empty:
        return None
    panels = _panels(cells, style)
    fig, axes, spec = _grid(len(panels), len(PHASES), sharey=True, title_lines=2 if style.facets else 1)
    for axes_row, (label, members) in zip(axes, panels):
        _profile_panels(profiles, members, style, axes_row, PHASES, "gradient norm (L2, log scale)")
        for ax, phase in zip(axes_row, PHASES):
            ax.set_title(f"{PHASE_TITLES[phase]}" + (f"\n{label}" if label else ""), fontsize=PANEL_TITLE_SIZE)
    finish_panels(fig, axes, "Per-layer gradient norm profile (mean across seeds)", spec)
    caption = ("Gradient norm of each layer at initialisation, mid-run and the end of training, mean across seeds; "
               "a flat profile means every layer learns at a similar rate.")
    return Plot(name, fig, _save(fig, out_dir, name, dpi), caption)


@styled
def plot_residual_rms(act_profiles: pd.DataFrame, cells: pd.DataFrame, out_dir: Path, style: Style,
                      dpi: int = 120, name: str = "residual_rms") -> Plot | None:
    """RMS of the residual stream after each block at the end of training, one line per
    variant; a panel per option setting."""
    if act_profiles.empty:
        return None
    panels = _panels(cells, style)
    fig, axes, spec = panel_figure(len(panels), sharey=True)
    for ax, (label, members) in zip(axes, panels):
        _profile_panels(act_profiles, members, style, [ax], ["end"])
        panel_title(ax, label or "all cells", spec)
    for ax in axes[::spec.columns]:
        ax.set_ylabel("residual-stream RMS (log scale)")
    finish_panels(fig, axes, "Residual-stream RMS by depth at the end of training (mean across seeds)", spec)
    caption = ("RMS of the residual stream after each block at the last logged step; growth with depth shows "
               "as a rising line.")
    return Plot(name, fig, _save(fig, out_dir, name, dpi), caption)


@styled
def plot_final_loss(metrics: pd.DataFrame, group_table: pd.DataFrame, out_dir: Path, style: Style,
                    last_k: int = 10, dpi: int = 120, name: str = "final_loss",
                    value: str = "final_val_loss") -> Plot | None:
    """Final validation loss per group: mean with its interval (stats.mean_interval; a bar only where
    there is an interval), each completed seed as a dot, each diverged seed as a red x at the
    right, the unigram entropy as a labelled vertical line."""
    if group_table.empty:
        return None
    groups = list(group_table["group"])
    names = [style.group_label(g) for g in groups]
    # The y tick labels (a group's short label each) get the room the longest one needs.
    fig, (ax,), spec = panel_figure(1, panel=(6.5, 0.3 + 0.42 * len(groups)),
                                    left=0.55 + max(text_inches(n, 8) for n in names))
    completed = metrics[(metrics["status"] == COMPLETED) & np.isfinite(metrics[value].astype(float))]
    finite = completed[value].astype(float)
    right = max([finite.max() if not finite.empty else 1.0, *unigram_entropies(metrics)])
    span = (right - finite.min()) if len(finite) > 1 else 0.1
    diverged_x = right + 0.08 * span
    for y, row in enumerate(group_table.to_dict("records")):
        members = metrics[metrics["group"] == row["group"]]
        colour = style.colour(members[style.hue].iloc[0])
        seeds = completed[completed["group"] == row["group"]][value].astype(float)
        if not seeds.empty:
            ax.scatter(seeds, np.full(len(seeds), y) + 0.18, s=14, facecolors="none", edgecolors=colour,
                       label="one seed", zorder=2)
            mean, low, high = row[f"{value}_mean"], row[f"{value}_ci_low"], row[f"{value}_ci_high"]
            has_ci = np.isfinite(low)
            # Identical seeds give an interval of width 0, which rounding can make a hair negative.
            xerr = [[max(mean - low, 0.0)], [max(high - mean, 0.0)]] if has_ci else None
            ax.errorbar([mean], [y], xerr=xerr, fmt="o", color=colour, capsize=4, ms=6, zorder=3,
                        label="mean, 95% CI")
            if not has_ci:
                ax.annotate("no interval", (mean, y), xytext=(6, -3), textcoords="offset points", fontsize=7)
        n_div = int(row["n_diverged"])
        if n_div:
            ax.scatter(np.full(n_div, diverged_x), np.full(n_div, y) - 0.18, marker="x", s=40,
                       color=DIVERGED_COLOUR, label="diverged", zorder=3)
            ax.annotate(f"{n_div} diverged", (diverged_x, y), xytext=(6, -3), textcoords="offset points",
                        fontsize=7, color=DIVERGED_COLOUR)
    draw_unigram_entropy(ax, metrics, vertical=True)
    low_x = ax.get_xlim()[0]
    ax.set_xlim(low_x, diverged_x + 0.3 * (diverged_x - low_x))  # room for the "n diverged" notes
    ax.set_yticks(range(len(groups)), names, fontsize=8)
    ax.set_ylabel("group")
    ax.invert_yaxis()  # first group (the baseline) on top
    ax.set_xlabel("final validation loss (nats, held-out set at the end of training)")
    # The legend goes under the axes (by finish_panels), never on the points or the unigram label.
    finish_panels(fig, [ax], "Final validation loss per group: mean and 95% interval across seeds", spec)
    caption = ("Final validation loss (the held-out set at the end of training) per group: the mean with its 95% "
               f"interval ({MEAN_INTERVAL_RULE}), each completed seed as a circle, each diverged seed as a red x; "
               "the dotted line is the corpus's unigram entropy.")
    return Plot(name, fig, _save(fig, out_dir, name, dpi), caption)


@styled
def plot_lr_sensitivity(sweeps, metrics: pd.DataFrame, out_dir: Path, style: Style, dpi: int = 120,
                        name: str = "lr_sensitivity") -> Plot | None:
    """Final validation loss against learning rate (log x), one line per sweep (variant) with
    the mean and a 95% t-interval over completed seeds at each lr; each diverged cell a red x
    at the top of its panel; the unigram entropy as a labelled line; a panel per setting of
    the other option axes. `sweeps`: lr_sensitivity.Sweep objects."""
    if not sweeps:
        return None
    settings = sorted({tuple(sorted((k, str(v)) for k, v in s.setting.items())) for s in sweeps})
    fig, axes, spec = panel_figure(len(settings), sharey=True)
    for ax, setting in zip(axes, settings):
        mine = [s for s in sweeps if tuple(sorted((k, str(v)) for k, v in s.setting.items())) == setting]
        for sweep in mine:
            cells = metrics[metrics["group"].isin(list(sweep.groups.values()))]
            colour = style.colour(cells[style.hue].iloc[0]) if not cells.empty and style.hue in cells else None
            done = sweep.curve[sweep.curve["status"] == COMPLETED]
            wide = done.pivot_table(index="seed", columns="lr", values="loss").reindex(columns=sweep.lrs)
            mean, low, high = t_band(wide.to_numpy(dtype=float))
            # One variant: its sweeps differ in the settings that the panel titles name already.
            label = style.label(sweep.variant_id) if style.hue == "variant_id" else label_of(sweep.setting)
            ax.plot(wide.columns, mean, marker="o", ms=4, color=colour, lw=1.4, label=label)
            ax.fill_between(wide.columns, low, high, color=colour, alpha=0.2, lw=0)
            ax.scatter(done["lr"], done["loss"], s=10, alpha=0.4, color=colour, label="_seed")
            if sweep.best_lr is not None:
                ax.scatter([sweep.best_lr], [sweep.best_loss], marker="*", s=90, color=colour, zorder=4,
                           edgecolors="black", linewidths=0.5, label="best lr")
            diverged = sweep.curve[sweep.curve["status"] == DIVERGED].groupby("lr").size()
            for lr, n in diverged.items():  # at the top of the panel: they have no final loss
                ax.scatter([lr], [0.97], marker="x", s=45, color=DIVERGED_COLOUR, zorder=4, clip_on=False,
                           transform=ax.get_xaxis_transform(), label="diverged (no final loss)")
                ax.annotate(f"{n}", (lr, 0.97), xycoords=ax.get_xaxis_transform(), xytext=(4, -3),
                            textcoords="offset points", fontsize=7, color=DIVERGED_COLOUR)
        draw_unigram_entropy(ax, metrics[metrics["group"].isin([g for s in mine for g in s.groups.values()])])
        log_x(ax, [lr for s in mine for lr in s.lrs])
        ax.set_xlabel("learning rate (log scale)")
        panel_title(ax, label_of(dict(setting)) if setting else "all cells", spec)
    for ax in axes[::spec.columns]:
        ax.set_ylabel("final validation loss (nats)")
    finish_panels(fig, axes, "Final validation loss against learning rate: mean and 95% t-interval across seeds", spec)
    caption = ("Final validation loss against learning rate (log scale), mean over completed seeds with a 95% "
               "t-interval band, each seed a faint dot, the best lr a star; a red x at the top marks diverged cells "
               "(their count beside it); the dotted line is the corpus's unigram entropy.")
    return Plot(name, fig, _save(fig, out_dir, name, dpi), caption)


def _layer_map(steps: pd.DataFrame, cell_ids, metric: str, max_columns: int) -> pd.DataFrame | None:
    """layer x step mean across the cells of a per-layer metric, on the steps that logged it
    (probes run every `probe_every` steps), binned to at most `max_columns`. None when these
    cells never logged it."""
    columns = layer_columns(steps, metric)
    # Only the columns needed: the steps frame holds every metric of every cell.
    rows = steps.loc[steps["cell_id"].isin(cell_ids), ["step", *columns]]
    if not columns or rows.empty:
        return None
    rows = rows.dropna(subset=columns, how="all")
    if rows.empty:
        return None
    mean = rows.groupby("step")[columns].mean()
    wide = mean.T.set_axis(range(len(columns)))
    return _bin_columns(wide, max_columns)


def _draw_layer_map(ax, wide: pd.DataFrame, norm) -> None:
    """A layer x step frame as an image, layer 0 at the bottom, ticks at logged steps. An
    image, not seaborn's heatmap: panels of groups x metrics stay quick to draw and small."""
    ax.imshow(wide.to_numpy(dtype=float), aspect="auto", origin="lower", norm=norm, cmap=HEATMAP_CMAP,
              interpolation="nearest")
    ticks = np.unique(np.linspace(0, wide.shape[1] - 1, min(6, wide.shape[1])).round().astype(int))
    ax.set_xticks(ticks, [str(int(wide.columns[t])) for t in ticks])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(False)


@styled
def plot_probe_heatmaps(steps: pd.DataFrame, cells: pd.DataFrame, out_dir: Path, style: Style,
                        max_columns: int = 60, dpi: int = 120, name: str = "probe_heatmaps") -> Plot | None:
    """Per-layer heatmaps side by side, one row per group: gradient norm, attention logit max
    and token cosine similarity (layer x step; mean across seeds), each metric with its own
    colour scale shared down its column. None when the runs logged neither probe."""
    metrics = [m for m in LAYER_HEATMAPS if layer_columns(steps, m)]
    if not any(m != "grad_norm" for m in metrics):
        return None
    rows = []
    for group, group_cells in cells.groupby("group", sort=False):
        curve_cells, all_diverged = _curve_cells(group_cells)
        maps = {m: _layer_map(steps, curve_cells["cell_id"], m, max_columns) for m in metrics}
        if any(v is not None for v in maps.values()):
            rows.append((group, group_cells, all_diverged, maps))
    if not rows:
        return None
    scales = {}
    for metric in metrics:
        values = np.concatenate([r[3][metric].to_numpy(dtype=float).ravel() for r in rows if r[3][metric] is not None]
                                or [np.array([])])
        log = LAYER_HEATMAPS[metric][2]
        values = values[np.isfinite(values) & ((values > 0) if log else True)]
        if values.size:
            low, high = values.min(), max(values.max(), values.min() + 1e-9)  # a constant map needs a range
            scales[metric] = LogNorm(low, high) if log else Normalize(low, high)
    # Every panel has the model's layers on y: shared, labelled once a row.
    fig, axes, spec = _grid(len(rows), len(metrics), sharey=True, title_lines=3, extra_bottom=COLOUR_BAR_BAND,
                            gap_x=0.35)
    for axes_row, (group, group_cells, all_diverged, maps) in zip(axes, rows):
        # Each panel names its metric and its group: a row of 14 looks alike without both.
        group_title = wrap(style.group_label(group) + (" (all seeds diverged)" if all_diverged else ""),
                           PANEL_SIZE[0], PROBE_TITLE_SIZE).split("\n")[:2]
        for ax, metric in zip(axes_row, metrics):
            title = "\n".join([LAYER_HEATMAPS[metric][0] + ("" if metric in scales else ": not logged"), *group_title])
            if maps[metric] is None or metric not in scales:
                ax.set_axis_off()
                ax.set_title(title, fontsize=PROBE_TITLE_SIZE)
                continue
            wide = maps[metric].where(maps[metric] > 0) if LAYER_HEATMAPS[metric][2] else maps[metric]
            _draw_layer_map(ax, wide, scales[metric])
            ax.set_title(title, fontsize=PROBE_TITLE_SIZE, color=style.colour(group_cells[style.hue].iloc[0]))
            if ax is axes_row[0]:
                ax.set_ylabel("layer (0 = input)", fontsize=8)
            ax.set_xlabel("step", fontsize=8)
    finish_panels(fig, axes, "Per-layer probes over training (mean across seeds): gradient norm, attention logit max, "
            "cosine similarity", spec)
    for column, metric in enumerate(metrics):  # one colour bar under each column
        if metric in scales:
            _colour_bar(fig, spec, (column, column), scales[metric],
                        wrap(LAYER_HEATMAPS[metric][1] + (" (log)" if LAYER_HEATMAPS[metric][2] else ""),
                             PANEL_SIZE[0], 10))
    caption = ("Per-layer probes against step, one row per group (layer 0 at the bottom, at most "
               f"{max_columns} step columns): gradient norm (log colour), the largest attention logit, and the mean "
               "pairwise cosine similarity of token vectors after each block (1 = rank collapse); the probes are "
               "logged every `probe_every` steps, so their columns are those steps only.")
    return Plot(name, fig, _save(fig, out_dir, name, dpi), caption)


def close(plots) -> None:
    for plot in plots:
        if plot is not None and plot.figure is not None:  # plt.close(None) would close the current figure
            plt.close(plot.figure)
