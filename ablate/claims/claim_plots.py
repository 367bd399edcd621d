"""The plots beside a claim's verdict: what it found and why, each at a glance.

    write_claim_plots(claim, ctx, out_dir) -> {"what": [png, svg], "why": [png, svg]}

"What": `plots/claim_<name>.png` (and .svg), the claim's `plot` kind with its `plot_params`
(`plot = "lr_curve"`, `plot_params = { split = "norm" }`): the result, e.g. loss against lr.
"Why": `plots/claim_<name>_why.png`, its `why_plot` kind with `why_params`: the mechanism
behind it, e.g. the per-layer gradient profile of the variant that fails. Every kind reads the
cell_metrics frame (and the logged steps), so a new claim reuses a kind rather than writing a
plot. Common params: `split` (the axis whose values get a colour each), `at` (a selector,
ablate/claims/selection.py: only these cells are drawn), `facet` (an axis with a panel per value).

    @plot_kind("my_kind")
    def my_kind(ctx, metrics, params) -> ClaimFigure | None:   # None: the runs lack its data
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ablate.analysis.labels import label_of, short_labels  # noqa: E402
from ablate.analysis.load import DONE, layer_columns  # noqa: E402
from ablate.analysis.plot_jobs import run_plot_jobs  # noqa: E402
from ablate.analysis.plots import (DIVERGED_COLOUR, ENTROPY_COLOUR, FAST_DRAWING, Layout, Plot, finish_panels,  # noqa: E402
                                   styled, log_x, log_y, panel_figure, panel_title, save_figure)
from ablate.claims.claim_measures import GRAD_FLOOR  # noqa: E402  (a 0 gradient is drawn there)
from ablate.claims.selection import select  # noqa: E402
from ablate.core.registry import Registry  # noqa: E402

COMPLETED, DIVERGED = DONE  # summary.json's words, as analysis/load.py declares them
SEED_ALPHA = 0.35  # each seed's thin line behind the mean
PLOTS: Registry = Registry("plot kind")


@dataclass
class ClaimFigure:
    """What a kind drew: the figure, its data panels, their layout, and a title naming what is
    shown (the writer puts the claim's name before it)."""

    figure: plt.Figure
    axes: list
    layout: Layout
    title: str


def plot_kind(name: str):
    """Register a plot kind under `name`; a name already taken is refused (RegistryError, a ValueError)."""
    return PLOTS.register(name)


def write_claim_plots(claim, ctx, out_dir: Path, dpi: int = 110) -> dict:
    """Draw the claim's "what" plot (claim.plot) and its "why" plot (claim.why_plot) into
    out_dir: {"what": [png, svg], "why": [png, svg]}, [] for a plot the claim does not declare
    or the runs lack the data of."""
    why_kind = getattr(claim, "why_plot", None)
    jobs = {  # drawn side by side (analysis/plot_jobs.py); each returns its files
        "what": lambda: _write(claim, ctx, claim.plot, dict(claim.plot_params), Path(out_dir) / f"claim_{claim.name}",
                               claim.statement, dpi),
        "why": lambda: _write(claim, ctx, why_kind, dict(getattr(claim, "why_params", None) or {}),
                              Path(out_dir) / f"claim_{claim.name}_why", None, dpi),
    }
    done = run_plot_jobs([lambda kind=kind, job=job: Plot(kind, None, job(), "") for kind, job in jobs.items()])
    return {plot.name: plot.paths for plot in done}


def write_claim_plot(claim, ctx, out_dir: Path, dpi: int = 110) -> list[Path]:
    """The "what" plot alone (see write_claim_plots)."""
    return _write(claim, ctx, claim.plot, dict(claim.plot_params), Path(out_dir) / f"claim_{claim.name}",
                  claim.statement, dpi)


def _write(claim, ctx, kind: str | None, params: dict, stem: Path, statement: str | None, dpi: int) -> list[Path]:
    title = f"{claim.name}: {statement}" if statement else f"{claim.name}, why"
    drawn = claim_figure(ctx, kind, params, title)
    if drawn is None:
        return []
    stem.parent.mkdir(parents=True, exist_ok=True)
    try:
        with plt.rc_context(FAST_DRAWING):
            return [save_figure(drawn.figure, stem.with_suffix(".png"), dpi),
                    save_figure(drawn.figure, stem.with_suffix(".svg"))]
    finally:
        plt.close(drawn.figure)


@styled
def claim_figure(ctx, kind: str | None, params: dict, title: str) -> ClaimFigure | None:
    """Kind `kind` drawn on the cells params["at"] selects, with its title and legend placed;
    `title` goes first, then (after ": ", when it ends in "why") what the kind shows. None when
    there is no kind or the runs lack its data. The caller closes the figure."""
    if not kind:
        return None
    metrics = ctx.metrics
    if params.get("at"):
        metrics = metrics[select(metrics, params["at"])]
    if metrics.empty or params.get("split") not in metrics:
        return None
    drawn = PLOTS[kind](ctx, metrics, params)
    if drawn is None:
        return None
    full = f"{title}: {drawn.title}" if title.endswith("why") else title
    finish_panels(drawn.figure, drawn.axes, full, drawn.layout)
    return drawn


# ------------------------------------------------------------------------------- helpers


def _values(metrics: pd.DataFrame, split: str) -> list:
    return list(dict.fromkeys(metrics[split].tolist()))


def _colours(metrics: pd.DataFrame, split: str) -> dict:
    """One colour per value of the split axis, the same in every panel."""
    values = _values(metrics, split)
    return dict(zip(values, sns.color_palette("colorblind", max(len(values), 1))))


def _split_labels(metrics: pd.DataFrame, axis: str) -> dict:
    """value -> its short label (`post`, `residual false`, `lr 1e-2`)."""
    return short_labels(metrics, [axis], by=axis, constant=True)


def _facets(metrics: pd.DataFrame, facet: str | None) -> list[tuple[str, pd.DataFrame]]:
    """(title, cells) per value of the facet axis, or one untitled panel."""
    if facet not in metrics:
        return [("", metrics)]
    titles = _split_labels(metrics, facet)
    return [(titles[v], metrics[metrics[facet] == v]) for v in _values(metrics, facet)]


def _entropy(ax, metrics: pd.DataFrame) -> None:
    if "unigram_entropy" in metrics:
        for e in pd.to_numeric(metrics["unigram_entropy"], errors="coerce").dropna().unique():
            ax.axhline(e, color=ENTROPY_COLOUR, ls=":", lw=1, label=f"unigram entropy {e:.2f}")


def _mean_band(values: np.ndarray) -> tuple[float, float, float]:
    values = values[np.isfinite(values)]
    if not values.size:
        return np.nan, np.nan, np.nan
    return float(values.mean()), float(values.min()), float(values.max())


def _at(params: dict) -> str:
    """`at lr 1e-2, warmup 0` for the cells a plot was restricted to, or nothing."""
    return f" at {label_of(params['at'])}" if params.get("at") else ""


def log_mean(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """Geometric mean over `axis`, ignoring NaN: the mean of gradient norms spanning 15 decades
    that a log axis shows as the middle of the seeds' lines."""
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a column with no seed: NaN, as wanted
        return np.exp(np.nanmean(np.log(values), axis=axis))


# ------------------------------------------------------------------------------- the "what" kinds


@plot_kind("lr_curve")
def lr_curve(ctx, metrics, params):
    """Final val loss against lr (log x), one line per split value, one panel per facet value."""
    split = params["split"]
    panels, colours, labels = _facets(metrics, params.get("facet")), _colours(metrics, split), _split_labels(metrics, split)
    fig, axes, spec = panel_figure(len(panels), sharey=True, panel=(4.6, 3.4))
    for ax, (title, cells) in zip(axes, panels):
        for value in _values(cells, split):
            mine = cells[cells[split] == value]
            lrs = sorted(mine["lr"].unique())
            stats = [_mean_band(mine.loc[(mine["lr"] == lr) & (mine["status"] == COMPLETED),
                                         "final_val_loss"].to_numpy(dtype=float)) for lr in lrs]
            ax.plot(lrs, [s[0] for s in stats], marker="o", color=colours[value], label=labels[value])
            ax.fill_between(lrs, [s[1] for s in stats], [s[2] for s in stats], alpha=0.2, color=colours[value])
            gone = mine[mine["status"] == DIVERGED]
            if len(gone):
                ax.scatter(gone["lr"], [0.97] * len(gone), marker="x", color=DIVERGED_COLOUR,
                           transform=ax.get_xaxis_transform(), label="diverged seed", clip_on=False)
        _entropy(ax, cells)
        log_x(ax, cells["lr"])
        ax.set_xlabel("learning rate (log scale)")
        panel_title(ax, title, spec)
    axes[0].set_ylabel("final validation loss (nats)")
    return ClaimFigure(fig, axes, spec, "final validation loss against learning rate" + _at(params))


@plot_kind("layer_profile")
def layer_profile(ctx, metrics, params):
    """A per-layer metric at step 0 (and, for gradients, its median over training), one line
    per split value: mean over seeds, the band spans the seeds."""
    split, metric = params["split"], params.get("metric", "grad_norm")
    steps = ctx.runs.steps
    columns = layer_columns(steps, metric)
    if not columns:
        return None
    phases = ["init"] if params.get("phase") == "init" else ["init", "train"]
    colours, labels = _colours(metrics, split), _split_labels(metrics, split)
    fig, axes, spec = panel_figure(len(phases), panel=(4.8, 3.4))
    for ax, phase in zip(axes, phases):
        for value in _values(metrics, split):
            ids = metrics.loc[metrics[split] == value, "cell_id"]
            mine = steps[steps["cell_id"].isin(ids)]
            rows = mine[mine["step"] == 0] if phase == "init" else mine[mine["step"] > 0]
            per_cell = rows.groupby("cell_id")[columns].median().to_numpy(dtype=float)
            if not per_cell.size:
                continue
            x = np.arange(len(columns))
            ax.plot(x, np.nanmean(per_cell, axis=0), marker="o", color=colours[value], label=labels[value])
            ax.fill_between(x, np.nanmin(per_cell, axis=0), np.nanmax(per_cell, axis=0), alpha=0.2,
                            color=colours[value])
            if metric == "grad_norm" and "grad_norm/embed" in rows:
                embed = rows.groupby("cell_id")["grad_norm/embed"].median().to_numpy(dtype=float)
                ax.scatter([-1] * len(embed), embed, marker="s", color=colours[value], s=14)
        log_y(ax)
        ax.set_xlabel("layer (0 = input; -1 = embeddings)" if metric == "grad_norm" else "layer (0 = input)")
        ax.set_ylabel(metric.replace("_", " "))
        panel_title(ax, "at initialisation (step 0)" if phase == "init" else "during training (median over steps)",
                    spec)
    return ClaimFigure(fig, axes, spec, f"{metric.replace('_', ' ')} by layer" + _at(params))


@plot_kind("divergence")
def divergence(ctx, metrics, params):
    """Share of seeds that diverged at each lr, one line per split value."""
    split = params["split"]
    colours, labels = _colours(metrics, split), _split_labels(metrics, split)
    fig, axes, spec = panel_figure(1, panel=(5.2, 3.4))
    ax = axes[0]
    for value in _values(metrics, split):
        mine = metrics[(metrics[split] == value) & metrics["status"].isin(DONE)]
        rates = mine.groupby("lr")["status"].apply(lambda s: float((s == DIVERGED).mean()))
        ax.plot(rates.index, rates.to_numpy(), marker="o", color=colours[value], label=labels[value])
    log_x(ax, metrics["lr"])
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel("share of seeds diverged")
    return ClaimFigure(fig, axes, spec, "share of seeds that diverged" + _at(params))


@plot_kind("loss_vs_params")
def loss_vs_params(ctx, metrics, params):
    """Final val loss against parameter count (log x), each seed a dot, the mean a line."""
    split = params["split"]
    done = metrics[metrics["status"] == COMPLETED]
    if done.empty:
        return None
    labels = _split_labels(metrics, split)
    fig, axes, spec = panel_figure(1, panel=(5.2, 3.4), right=0.9)  # room for the last point's label
    ax = axes[0]
    ax.scatter(done["params"], done["final_val_loss"], s=12, alpha=0.5, label="one seed")
    mean = done.groupby("params")["final_val_loss"].mean()
    ax.plot(mean.index, mean.to_numpy(), marker="o", label="mean over seeds")
    for p, value in done.groupby("params")[split].first().items():
        ax.annotate(labels[value], (p, mean[p]), xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters (log scale)")
    ax.set_ylabel("final validation loss (nats)")
    return ClaimFigure(fig, axes, spec, "final validation loss against parameters" + _at(params))


@plot_kind("paired_loss")
def paired_loss(ctx, metrics, params):
    """Final val loss of each seed under each split value, a seed's points joined by a line."""
    split = params["split"]
    done = metrics[metrics["status"] == COMPLETED]
    values = _values(metrics, split)
    if done.empty:
        return None
    labels = _split_labels(metrics, split)
    fig, axes, spec = panel_figure(1, panel=(4.6, 3.4))
    ax = axes[0]
    position = {v: i for i, v in enumerate(values)}
    for seed, mine in done.groupby("seed"):
        mine = mine.sort_values(split, key=lambda s: s.map(position))
        ax.plot(mine[split].map(position), mine["final_val_loss"], marker="o", color="grey", alpha=0.5, lw=1,
                label="one seed")
    means = [done.loc[done[split] == v, "final_val_loss"].mean() for v in values]
    ax.plot(range(len(values)), means, marker="D", color="black", lw=2, label="mean over seeds")
    ax.set_xticks(range(len(values)), [labels[v] for v in values])
    ax.set_xlim(-0.5, len(values) - 0.5)
    ax.set_ylabel("final validation loss (nats)")
    params_of = done.groupby(split)["params"].first()
    ax.set_xlabel("parameters: " + ", ".join(f"{labels[v]} {int(params_of[v]):,}" for v in values if v in params_of))
    return ClaimFigure(fig, axes, spec, "final validation loss, each seed's pair joined" + _at(params))


# ------------------------------------------------------------------------------- the "why" kinds


def _mid_step(steps: pd.DataFrame, params: dict) -> int:
    """params["step"], else the logged step nearest the middle of the selected cells' run."""
    if params.get("step") is not None:
        return int(params["step"])
    logged = np.unique(steps["step"].to_numpy())
    return int(logged[np.argmin(np.abs(logged - (logged.min() + logged.max()) / 2))])


def _profile_at(steps: pd.DataFrame, columns: list[str], step: int) -> pd.DataFrame:
    """cell_id x layer gradient norms at `step` (cells that logged no finite row there are
    missing), zeros floored so a log axis shows them."""
    rows = steps[steps["step"] == step].drop_duplicates("cell_id", keep="last").set_index("cell_id")[columns]
    rows = rows[np.isfinite(rows.to_numpy(dtype=float)).all(axis=1)]
    return rows.clip(lower=GRAD_FLOOR)


@plot_kind("grad_profile")
def grad_profile(ctx, metrics, params):
    """Per-layer gradient norm (log y, layer 0 = input) at initialisation (step 0) and mid-run
    (params["step"] or the middle logged step), one colour per split value: thin lines per seed,
    the thick line their mean in log space. A panel pair per `facet` value. Cells without a
    finite profile at mid-run (diverged before it) are counted in the legend, not dropped
    silently."""
    split, steps = params["split"], ctx.runs.steps
    columns = layer_columns(steps, "grad_norm")
    steps = steps[steps["cell_id"].isin(metrics["cell_id"])]
    if not columns or steps.empty:
        return None
    mid = _mid_step(steps, params)
    panels = [(title, cells, phase) for title, cells in _facets(metrics, params.get("facet"))
              for phase in ("init", "mid")]
    colours, labels = _colours(metrics, split), _split_labels(metrics, split)
    fig, axes, spec = panel_figure(len(panels), columns=2, sharey=True, title_lines=2, panel=(4.6, 3.4))
    for ax, (title, cells, phase) in zip(axes, panels):
        step = 0 if phase == "init" else mid
        for value in _values(cells, split):
            ids = cells.loc[cells[split] == value, "cell_id"]
            profile = _profile_at(steps[steps["cell_id"].isin(ids)], columns, step)
            missing = len(ids) - len(profile)
            label = f"{labels[value]} (mean of {len(profile)} seeds)"
            if missing:
                label += f"; {missing} without a profile at step {step} (diverged before it)"
            _seed_lines(ax, profile.to_numpy(dtype=float), colours[value], label)
        ax.set_xlabel("layer (0 = input)")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        log_y(ax)
        head = "at initialisation (step 0)" if phase == "init" else f"mid-run (step {step})"
        panel_title(ax, f"{head}, {title}" if title else head, spec)
    for ax in axes[::spec.columns]:
        ax.set_ylabel("gradient norm (L2, log scale)")
    return ClaimFigure(fig, axes, spec, "per-layer gradient norm at initialisation and mid-run" + _at(params))


def _seed_lines(ax, values: np.ndarray, colour, label: str) -> None:
    """Each row of values (a seed) as a thin line, their log-space mean as the labelled line."""
    x = np.arange(values.shape[1]) if values.ndim == 2 else np.array([])
    for row in values:
        ax.plot(x, row, color=colour, lw=0.8, alpha=SEED_ALPHA, label="_seed")
    if len(values):
        ax.plot(x, log_mean(values), color=colour, lw=2, marker="o", ms=3, label=label)
    else:  # the legend still says this value had no profile here
        ax.plot([], [], color=colour, lw=2, label=label)


@plot_kind("attn_logit_growth")
def attn_logit_growth(ctx, metrics, params):
    """The largest attention logit (attn_logit_max/layer_i, max over layers; log y) against
    step, one colour per split value: thin lines per seed, the thick line their mean in log
    space; a diverged seed's line ends in a red x. A panel per `facet` value, 3 a row."""
    split, steps = params["split"], ctx.runs.steps
    columns = layer_columns(steps, "attn_logit_max")
    if not columns:
        return None
    steps = steps[steps["cell_id"].isin(metrics["cell_id"])].dropna(subset=columns, how="all")
    if steps.empty:
        return None
    largest = steps.assign(largest=np.nanmax(steps[columns].to_numpy(dtype=float), axis=1))
    wide = largest.pivot_table(index="cell_id", columns="step", values="largest", aggfunc="last")
    wide = wide.where(wide > 0)  # a log axis: a non-positive largest logit is not drawn
    panels = _facets(metrics, params.get("facet"))
    colours, labels = _colours(metrics, split), _split_labels(metrics, split)
    fig, axes, spec = panel_figure(len(panels), sharey=True, panel=(4.6, 3.4))
    for ax, (title, cells) in zip(axes, panels):
        for value in _values(cells, split):
            mine = cells[cells[split] == value]
            rows = wide.reindex(mine["cell_id"]).dropna(how="all")
            for row in rows.to_numpy(dtype=float):
                ax.plot(wide.columns, row, color=colours[value], lw=0.8, alpha=SEED_ALPHA, label="_seed")
            if len(rows):
                ax.plot(wide.columns, log_mean(rows.to_numpy(dtype=float)), color=colours[value], lw=2,
                        label=f"{labels[value]} (mean of seeds)")
            for cell in mine[mine["status"] == DIVERGED]["cell_id"]:
                series = wide.loc[cell].dropna() if cell in wide.index else pd.Series(dtype=float)
                if len(series):
                    ax.scatter([series.index[-1]], [series.iloc[-1]], marker="x", s=40, color=DIVERGED_COLOUR,
                               zorder=3, label="diverged (last logged value)")
        log_y(ax)
        ax.set_xlabel("step")
        panel_title(ax, title or "all cells", spec)
    for ax in axes[::spec.columns]:
        ax.set_ylabel("largest attention logit (log scale)")
    return ClaimFigure(fig, axes, spec, "largest attention logit over training (max over layers and heads)"
                       + _at(params))
