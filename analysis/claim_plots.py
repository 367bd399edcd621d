"""One plot per claim that shows it at a glance: `plots/claim_<name>.png` (and .svg).

A claim names its plot kind (`plot = "lr_curve"`) and the axis that splits the lines
(`plot_params = { split = "norm" }`); every kind reads the cell_metrics frame (and the logged
steps), so a new claim reuses a kind rather than writing a plot.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ablate.analysis.load import DONE, layer_columns  # noqa: E402

DIVERGED = "#d62728"
ENTROPY = "#555555"
PLOTS: dict = {}


def plot_kind(name: str):
    def register(fn):
        PLOTS[name] = fn
        return fn

    return register


def write_claim_plot(claim, ctx, out_dir: Path, dpi: int = 110) -> list[Path]:
    """Draw the claim's plot into out_dir; [] when it has none or the runs lack its data."""
    if not claim.plot:
        return []
    from ablate.analysis.selection import select

    params = dict(claim.plot_params)
    metrics = ctx.metrics
    if params.get("at"):
        metrics = metrics[select(metrics, params["at"])]
    split = params.get("split")
    if metrics.empty or split not in metrics:
        return []
    fig = PLOTS[claim.plot](ctx, metrics, params)
    if fig is None:
        return []
    fig.suptitle(f"{claim.name}: {claim.statement}", fontsize=8, wrap=True)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        path = out_dir / f"claim_{claim.name}.{ext}"
        fig.savefig(path, dpi=dpi)
        paths.append(path)
    plt.close(fig)
    return paths


def write_claim_plots(claim, ctx, out_dir: Path, dpi: int = 110) -> dict:
    """{"what": the claim's plot files, "why": its mechanism plot's files} (empty when it has none)."""
    return {"what": write_claim_plot(claim, ctx, out_dir, dpi), "why": []}


def _values(metrics: pd.DataFrame, split: str) -> list:
    return list(dict.fromkeys(metrics[split].tolist()))


def _entropy(ax, metrics: pd.DataFrame) -> None:
    if "unigram_entropy" in metrics:
        for e in pd.to_numeric(metrics["unigram_entropy"], errors="coerce").dropna().unique():
            ax.axhline(e, color=ENTROPY, ls=":", lw=1, label=f"unigram entropy {e:.2f}")


def _mean_band(values: np.ndarray) -> tuple[float, float, float]:
    values = values[np.isfinite(values)]
    if not values.size:
        return np.nan, np.nan, np.nan
    return float(values.mean()), float(values.min()), float(values.max())


@plot_kind("lr_curve")
def lr_curve(ctx, metrics, params):
    """Final val loss against lr (log x), one line per split value, one panel per facet value."""
    split, facet = params["split"], params.get("facet")
    panels = _values(metrics, facet) if facet in metrics else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), sharey=True, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        cells = metrics if panel is None else metrics[metrics[facet] == panel]
        for value in _values(cells, split):
            mine = cells[cells[split] == value]
            lrs = sorted(mine["lr"].unique())
            stats = [_mean_band(mine.loc[(mine["lr"] == lr) & (mine["status"] == "completed"),
                                         "final_val_loss"].to_numpy(dtype=float)) for lr in lrs]
            line = ax.plot(lrs, [s[0] for s in stats], marker="o", label=f"{split}={value}")[0]
            ax.fill_between(lrs, [s[1] for s in stats], [s[2] for s in stats], alpha=0.2, color=line.get_color())
            gone = mine[mine["status"] == "diverged"]
            if len(gone):
                ax.scatter(gone["lr"], [0.97] * len(gone), marker="x", color=DIVERGED,
                           transform=ax.get_xaxis_transform(), label="diverged seed", clip_on=False)
        _entropy(ax, cells)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("final validation loss (nats)")
        ax.set_title("" if panel is None else f"{facet}={panel}", fontsize=9)
        _legend(ax)
    return fig


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
    fig, axes = plt.subplots(1, len(phases), figsize=(4.8 * len(phases), 3.6), squeeze=False)
    for ax, phase in zip(axes[0], phases):
        for value in _values(metrics, split):
            ids = metrics.loc[metrics[split] == value, "cell_id"]
            mine = steps[steps["cell_id"].isin(ids)]
            rows = mine[mine["step"] == 0] if phase == "init" else mine[mine["step"] > 0]
            per_cell = rows.groupby("cell_id")[columns].median().to_numpy(dtype=float)
            if not per_cell.size:
                continue
            x = np.arange(len(columns))
            line = ax.plot(x, np.nanmean(per_cell, axis=0), marker="o", label=f"{split}={value}")[0]
            ax.fill_between(x, np.nanmin(per_cell, axis=0), np.nanmax(per_cell, axis=0), alpha=0.2,
                            color=line.get_color())
            if metric == "grad_norm" and "grad_norm/embed" in rows:
                embed = rows.groupby("cell_id")["grad_norm/embed"].median().to_numpy(dtype=float)
                ax.scatter([-1] * len(embed), embed, marker="s", color=line.get_color(), s=14)
        ax.set_yscale("log")
        ax.set_xlabel("layer (0 = input; -1 = embeddings)" if metric == "grad_norm" else "layer (0 = input)")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title("at initialisation (step 0)" if phase == "init" else "during training (median over steps)",
                     fontsize=9)
        _legend(ax)
    return fig


@plot_kind("divergence")
def divergence(ctx, metrics, params):
    """Share of seeds that diverged at each lr, one line per split value."""
    split = params["split"]
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    for value in _values(metrics, split):
        mine = metrics[(metrics[split] == value) & metrics["status"].isin(DONE)]
        rates = mine.groupby("lr")["status"].apply(lambda s: float((s == "diverged").mean()))
        ax.plot(rates.index, rates.to_numpy(), marker="o", label=f"{split}={value}")
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("learning rate")
    ax.set_ylabel("share of seeds diverged (non-finite loss)")
    _legend(ax)
    return fig


@plot_kind("loss_vs_params")
def loss_vs_params(ctx, metrics, params):
    """Final val loss against parameter count (log x), each seed a dot, the mean a line."""
    split = params["split"]
    done = metrics[metrics["status"] == "completed"]
    if done.empty:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    ax.scatter(done["params"], done["final_val_loss"], s=12, alpha=0.5)
    mean = done.groupby("params")["final_val_loss"].mean()
    ax.plot(mean.index, mean.to_numpy(), marker="o")
    for p, value in done.groupby("params")[split].first().items():
        ax.annotate(f"{split}={value:g}" if isinstance(value, float) else f"{split}={value}", (p, mean[p]),
                    xytext=(4, 4), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("final validation loss (nats)")
    return fig


@plot_kind("paired_loss")
def paired_loss(ctx, metrics, params):
    """Final val loss of each seed under each split value, a seed's points joined by a line."""
    split = params["split"]
    done = metrics[metrics["status"] == "completed"]
    values = _values(metrics, split)
    if done.empty:
        return None
    fig, ax = plt.subplots(figsize=(4.6, 3.6))
    position = {v: i for i, v in enumerate(values)}
    for seed, mine in done.groupby("seed"):
        mine = mine.sort_values(split, key=lambda s: s.map(position))
        ax.plot(mine[split].map(position), mine["final_val_loss"], marker="o", color="grey", alpha=0.5, lw=1)
    means = [done.loc[done[split] == v, "final_val_loss"].mean() for v in values]
    ax.plot(range(len(values)), means, marker="D", color="black", lw=2, label="mean over seeds")
    ax.set_xticks(range(len(values)), [f"{split}={v}" for v in values])
    ax.set_xlim(-0.5, len(values) - 0.5)
    ax.set_ylabel("final validation loss (nats)")
    params_of = done.groupby(split)["params"].first()
    ax.set_xlabel("parameters: " + ", ".join(f"{v} {int(params_of[v]):,}" for v in values if v in params_of))
    _legend(ax)
    return fig


def _legend(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        unique = dict(zip(labels, handles))
        ax.legend(unique.values(), unique.keys(), fontsize=7)


# Placeholders until the mechanism plots land (issue 28): no figure, so the report shows none.
@plot_kind("grad_profile")
def grad_profile(ctx, metrics, params):
    return None


@plot_kind("attn_logit_growth")
def attn_logit_growth(ctx, metrics, params):
    return None
