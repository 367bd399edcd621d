"""The "pre-norm wins" verdict as a report section, and the experiment's own plots."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ablate.analysis import plots
from ablate.analysis.analyse import Analysis
from ablate.analysis.load import layer_columns
from ablate.analysis.stats import CORRECTIONS, DEFAULT_CORRECTION
from ablate.analysis.prenorm import (ALPHA, PLATEAU_MARGIN, PRE, POST, SettingVerdict, format_p, gap_sentences,
                              init_profiles, setting_verdicts, xiong_sentence)

CLAIM = ("post-norm (the 2017 transformer) trains badly without learning-rate warmup at depth and a high "
         "learning rate, its gradients misbehave layer by layer, and pre-norm trains stably")


def _table(verdicts: list[SettingVerdict]) -> str:
    rows = ["| setting | pre-norm final val loss [95% CI] | post-norm final val loss [95% CI] | post - pre [95% CI] "
            "| paired p | adjusted p | verdict |",
            "|---|---|---|---|---|---|---|"]
    for v in verdicts:
        diff = "—" if v.diff_mean is None else (
            f"{v.diff_mean:+.3f}" + (f" [{v.diff_interval.low:+.3f}, {v.diff_interval.high:+.3f}]" if v.diff_interval else " (no interval)"))
        p = "—" if v.p_value is None else format_p(v.p_value)
        adjusted = "—" if v.p_adjusted is None else format_p(v.p_adjusted)
        rows.append(f"| {v.label()} | {v.pre.describe()} | {v.post.describe()} | {diff} | {p} | {adjusted} "
                    f"| {v.outcome} |")
    return "\n".join(rows)


def _high_lr_no_warmup(verdicts: list[SettingVerdict]) -> list[SettingVerdict]:
    top = max(v.setting["lr"] for v in verdicts)
    low_w = min(v.setting["warmup"] for v in verdicts)
    return [v for v in verdicts if v.setting["lr"] == top and v.setting["warmup"] == low_w]


def _agreement(verdicts: list[SettingVerdict], gaps: list[str], xiong: str, spread: dict) -> list[str]:
    lines = []
    for v in _high_lr_no_warmup(verdicts):
        plateau = len(v.post.plateaued)
        if v.outcome == "pre-norm wins":
            extra = (f"; post-norm sat on the unigram plateau in {plateau}/{v.post.n_trained} seeds" if plateau else "")
            lines.append(f"**Agrees**: at {v.label()} pre-norm trains better than post-norm{extra}.")
        elif v.outcome == "not enough seeds to tell":
            lines.append(f"**Cannot tell** at {v.label()}: {v.reason}.")
        else:
            stuck = (f" (plateau: post-norm {len(v.post.plateaued)}/{v.post.n_trained} seeds, pre-norm "
                     f"{len(v.pre.plateaued)}/{v.pre.n_trained}; diverged: {len(v.post.diverged)} vs {len(v.pre.diverged)})")
            lines.append(f"**Does not agree**: at {v.label()} the outcome is {v.outcome!r}, not a pre-norm win{stuck}.")
    closing = [g for g in gaps if g.startswith("With warmup")]
    for g in closing:
        verdict = ("**Agrees**" if "it closes" in g else "**Cannot tell**" if "cannot tell" in g or "no gap" in g
                   else "**Does not agree**")
        lines.append(f"{verdict} that warmup rescues post-norm: {g[0].lower() + g[1:]}")
    if any(v.outcome == "post-norm wins" for v in verdicts):
        wins = ", ".join(v.label() for v in verdicts if v.outcome == "post-norm wins")
        lines.append(f"**Nuance**: post-norm is significantly *better* at {wins}, as Liu et al. (2020) report for "
                     "post-norm that converges; \"pre-norm wins\" is not true in every setting.")
    lines.append(("**Agrees**" if xiong.startswith("This agrees") else "**Does not agree**")
                 + " on gradients at initialisation: " + xiong[0].lower() + xiong[1:])
    if PRE in spread and POST in spread:
        pre, post = spread[PRE], spread[POST]
        if post > 10 * pre:
            lines.append(f"**Agrees** that post-norm's gradients misbehave layer by layer during training: by the end, "
                         f"its per-layer gradient norms span {post:.3g}x (max/min) against pre-norm's {pre:.3g}x.")
        else:
            lines.append(f"**Does not agree** that post-norm's gradients misbehave layer by layer during training: by the "
                         f"end its per-layer gradient norms span {post:.3g}x (max/min), pre-norm's {pre:.3g}x.")
    return lines


def verdict_section(analysis: Analysis, alpha: float = ALPHA, verdicts: list[SettingVerdict] | None = None) -> str:
    """Markdown for the top of report.md. Every sentence is derived from the numbers.
    `verdicts` (from setting_verdicts at the same alpha) saves computing them again."""
    metrics = analysis.metrics
    if metrics.empty or not {PRE, POST} <= set(metrics["norm"].dropna()):
        return "## Verdict\n\nThe grid has no pre-norm and post-norm cells to compare yet."
    verdicts = verdicts if verdicts is not None else setting_verdicts(metrics, alpha)
    gaps = gap_sentences(verdicts)
    start = _high_lr_no_warmup(verdicts)
    cells = metrics[metrics["cell_id"].isin(_setting_cells(metrics, start[0].setting))] if start else metrics
    profiles = init_profiles(analysis.runs, cells)
    xiong = xiong_sentence(profiles)
    seeds = sorted(metrics["seed"].dropna().unique())
    lines = [
        "## Verdict: does pre-norm win?",
        "",
        f"The claim under test: {CLAIM}. Pre-norm and post-norm cells share everything else, and each seed "
        f"gives both the same initial weights and batches, so they are compared seed by seed "
        f"({len(seeds)} seed{'s' if len(seeds) != 1 else ''}). A verdict needs a paired t-test p < {alpha} over seeds after "
        f"correcting the {len(verdicts)} settings' p-values together ({CORRECTIONS[DEFAULT_CORRECTION]}), or one "
        "placement diverging in every seed and the other in none; final val loss is the validation loss on the "
        "held-out set at the end of training, in nats. *Plateau* counts completed seeds whose final val loss stayed "
        f"within {PLATEAU_MARGIN} nats of the corpus's unigram entropy, i.e. learnt almost nothing from context.",
        "",
        _table(verdicts),
        "",
        *[f"- {v.sentence()}" for v in verdicts],
        "",
        "### Does the gap close?",
        "",
        *([f"- {g}" for g in gaps] or ["- The grid lacks the settings to say."]),
        "",
        "### Gradient norms at initialisation",
        "",
        f"Per-layer gradient norm of the MLP (FFN) parameters at step 0{_setting_note(start)}, mean over seeds:",
        "",
        *[f"- {p.sentence()}." for p in profiles],
        f"- {xiong}",
        *_training_spread(metrics, start),
        "",
        "### Where the result agrees with the claim, and where it does not",
        "",
        *[f"- {line}" for line in _agreement(verdicts, gaps, xiong, _end_spread(metrics, start))],
        "",
        "Plots for this experiment: `plots/prenorm_final_loss.png` (final loss by setting), "
        "`plots/prenorm_init_and_heatmaps.png` (init profiles and gradient-norm heatmaps side by side) and, "
        "below, the loss curves of pre vs post per setting (`plots/loss_curves.png`).",
        "",
        "![final loss by setting](plots/prenorm_final_loss.png)",
        "",
        "![gradient norms](plots/prenorm_init_and_heatmaps.png)",
    ]
    return "\n".join(lines)


def _end_spread(metrics: pd.DataFrame, start: list[SettingVerdict]) -> dict:
    """Mean over seeds of the end-of-training max/min ratio of per-layer gradient norms."""
    if not start or "grad_ratio_end" not in metrics:
        return {}
    cells = metrics[metrics["cell_id"].isin(_setting_cells(metrics, start[0].setting))]
    out = {}
    for placement in (PRE, POST):
        ratio = pd.to_numeric(cells.loc[cells["norm"] == placement, "grad_ratio_end"], errors="coerce").dropna()
        if not ratio.empty:
            out[placement] = float(ratio.mean())
    return out


def _training_spread(metrics: pd.DataFrame, start: list[SettingVerdict]) -> list[str]:
    """How uneven the per-layer gradient norms became by the end of training."""
    spread = _end_spread(metrics, start)
    if len(spread) < 2:
        return []
    return [f"- By the end of training ({start[0].label()}), the max/min ratio of the per-layer gradient norms "
            f"(whole blocks) is pre-norm {spread[PRE]:.3g}x vs post-norm {spread[POST]:.3g}x, mean over seeds: "
            "see the heatmaps below for which layers starve."]


def _setting_note(start: list[SettingVerdict]) -> str:
    return f" ({start[0].label()})" if start else ""


def _setting_cells(metrics: pd.DataFrame, setting: dict) -> list[str]:
    mask = np.ones(len(metrics), dtype=bool)
    for key, value in setting.items():
        mask &= (metrics[key] == value).to_numpy()
    return list(metrics.loc[mask, "cell_id"])


@plots._styled
def plot_final_loss_by_setting(analysis: Analysis, verdicts: list[SettingVerdict], out_dir: Path,
                               dpi: int = 120) -> plots.Plot | None:
    """Final loss against warmup, one panel per learning rate (and depth), pre vs post:
    mean over seeds with its 95% interval, each seed a dot, diverged seeds as red x at the top."""
    metrics = analysis.metrics
    if not verdicts:
        return None
    style = plots.make_style(metrics)
    panel_keys = sorted({tuple((k, v) for k, v in vd.setting.items() if k != "warmup") for vd in verdicts})
    fig, axes = plots._grid(1, len(panel_keys), sharey=True)
    warmups = sorted({vd.setting["warmup"] for vd in verdicts})
    for ax, key in zip(axes.ravel(), panel_keys):
        for offset, placement in ((-0.08, PRE), (0.08, POST)):
            variant = metrics.loc[metrics["norm"] == placement, "variant_id"].iloc[0]
            colour = style.colour(variant) if style.hue == "variant_id" else None
            xs, means, lows, highs = [], [], [], []
            for i, w in enumerate(warmups):
                vd = next((v for v in verdicts if v.setting == {**dict(key), "warmup": w}), None)
                if vd is None:
                    continue
                side = vd.pre if placement == PRE else vd.post
                if side.losses:
                    ax.scatter([i + offset] * len(side.losses), list(side.losses.values()), s=12, alpha=0.5, color=colour)
                if side.mean is not None:
                    xs.append(i + offset)
                    means.append(side.mean)
                    lows.append(side.mean - (side.interval.low if side.interval else side.mean))
                    highs.append((side.interval.high if side.interval else side.mean) - side.mean)
                if side.diverged:  # no final loss: at the top of the panel
                    ax.scatter([i + offset] * len(side.diverged), [0.97] * len(side.diverged), marker="x",
                               color=plots.DIVERGED_COLOUR, label="diverged seed", transform=ax.get_xaxis_transform(),
                               clip_on=False)
            ax.errorbar(xs, means, yerr=[lows, highs], marker="o", capsize=4, color=colour, label=f"{placement}-norm")
        plots.draw_unigram_entropy(ax, metrics)
        ax.set_xticks(range(len(warmups)), [str(int(w)) for w in warmups])
        ax.set_xlabel("warmup (steps)")
        ax.set_ylabel("final validation loss (nats)")
        ax.set_title(", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in key), fontsize=9)
    plots._finish(fig, axes, "Pre- vs post-norm: final validation loss by learning rate and warmup (mean, 95% CI, seeds as dots)")
    caption = ("Final validation loss of pre- and post-norm per learning rate (panels) and warmup (x), mean over seeds "
               "with a 95% bootstrap interval; diverged seeds as a red x at the top; the dotted line is the unigram "
               "entropy.")
    return plots.Plot("prenorm_final_loss", fig, plots._save(fig, out_dir, "prenorm_final_loss", dpi), caption)


@plots._styled
def plot_init_and_heatmaps(analysis: Analysis, verdicts: list[SettingVerdict], out_dir: Path,
                           dpi: int = 120) -> plots.Plot | None:
    """Left: per-layer MLP gradient norm at step 0 for pre and post. Right: layer x step
    gradient-norm heatmaps of both at the high learning rate without warmup, shared log scale."""
    from matplotlib.colors import LogNorm

    runs, metrics = analysis.runs, analysis.metrics
    start = _high_lr_no_warmup(verdicts)
    if not start or not layer_columns(runs.steps, "grad_norm"):
        return None
    cells = metrics[metrics["cell_id"].isin(_setting_cells(metrics, start[0].setting))]
    profiles = init_profiles(runs, cells)
    style = plots.make_style(metrics)
    fig, axes = plots._grid(1, 3)
    ax = axes[0, 0]
    for p in profiles:
        variant = cells.loc[cells["norm"] == p.placement, "variant_id"].iloc[0]
        ax.plot(range(len(p.values)), p.values, marker="o", label=f"{p.placement}-norm",
                color=style.colour(variant) if style.hue == "variant_id" else None)
    ax.set_yscale("log")
    ax.set_xlabel("layer (0 = input)")
    ax.set_ylabel("MLP gradient norm at step 0 (L2)")
    ax.set_title("at initialisation", fontsize=9)
    columns = layer_columns(runs.steps, "grad_norm")
    maps = []
    for placement in (PRE, POST):
        ids = cells.loc[(cells["norm"] == placement) & cells["status"].isin(["completed", "running", "diverged"]), "cell_id"]
        mean = runs.steps[runs.steps["cell_id"].isin(ids)].groupby("step")[columns].mean()
        maps.append((placement, mean.T.to_numpy(dtype=float)))
    values = np.concatenate([m.ravel() for _, m in maps])
    values = values[np.isfinite(values) & (values > 0)]
    norm = LogNorm(vmin=values.min(), vmax=values.max()) if values.size else None
    image = None
    for ax, (placement, grid) in zip(axes[0, 1:], maps):
        image = ax.imshow(np.where(grid > 0, grid, np.nan), aspect="auto", origin="lower", norm=norm, cmap=plots.HEATMAP_CMAP,
                          interpolation="nearest")
        ax.set_title(f"{placement}-norm, {start[0].label()}", fontsize=9)
        ax.set_xlabel("step")
        ax.set_ylabel("layer (0 = input)")
        ax.grid(False)
    plots._finish(fig, axes, "Gradient norms by layer: at initialisation, and over training (log colour scale)")
    if image is not None:
        fig.colorbar(image, ax=list(axes[0, 1:]), label="gradient norm (L2)", fraction=0.05)
    caption = "Per-layer gradient norms: MLP parameters at step 0 (left) and whole blocks over training (right)."
    return plots.Plot("prenorm_init_and_heatmaps", fig, plots._save(fig, out_dir, "prenorm_init_and_heatmaps", dpi), caption)


def write_prenorm_plots(analysis: Analysis, out_dir: Path, verdicts: list[SettingVerdict] | None = None,
                        dpi: int = 120) -> list[Path]:
    verdicts = verdicts if verdicts is not None else setting_verdicts(analysis.metrics)
    made = [plot_final_loss_by_setting(analysis, verdicts, out_dir, dpi),
            plot_init_and_heatmaps(analysis, verdicts, out_dir, dpi)]
    made = [m for m in made if m is not None]
    try:
        return [p for m in made for p in m.paths]
    finally:
        plots.close(made)
