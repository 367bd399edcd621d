"""A ladder's two pictures: each clause's effect against model size (per-rung intervals, the
fitted trend, its extrapolation to ANDREA-120M drawn dashed and labelled as one), and every
rung's final validation loss against learning rate on one page."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import textwrap

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ablate.analysis.plots import log_x, save_figure  # noqa: E402
from ablate.core.safe_files import output_folder  # noqa: E402


def _columns(n: int) -> int:
    return min(n, 3)


def effects_figure(summary: dict):
    clauses = summary["clauses"]
    cols = _columns(len(clauses))
    rows = math.ceil(len(clauses) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, c in zip(axes.flat, clauses):
        pts = [r for r in c["rows"] if r["effect"] is not None]
        x = np.array([r["size"] for r in pts], dtype=float)
        y = np.array([r["effect"] for r in pts], dtype=float)
        err = np.array([[r["effect"] - r["low"], r["high"] - r["effect"]] for r in pts], dtype=float).T
        ax.errorbar(x, y, yerr=err if len(pts) else None, fmt="o", color="C0", capsize=3, label="measured (95% CI)")
        ax.axhline(c["null"], color="0.5", lw=0.8)
        t = c.get("trend")
        if t and len(pts):
            top = max([x.max(), *[p["size"] for p in c["predictions"].values()]])
            inside = np.geomspace(x.min(), x.max(), 20)
            beyond = np.geomspace(x.max(), top, 20)
            line = lambda s: c["null"] + t["intercept"] + t["slope"] * np.log10(s)  # noqa: E731
            ax.plot(inside, line(inside), color="C1", label="fitted trend")
            ax.plot(beyond, line(beyond), color="C1", ls="--", label="extrapolation")
            for name, p in c["predictions"].items():
                ax.errorbar([p["size"]], [p["effect"]], yerr=[[p["effect"] - p["low"]], [p["high"] - p["effect"]]],
                            fmt="s", mfc="none", color="C1", capsize=3)
                ax.annotate(f"{name}\n(extrapolated)", (p["size"], p["effect"]), fontsize=7,
                            textcoords="offset points", xytext=(4, 4))
        log_x(ax, [r["size"] for r in c["rows"]])  # a rung without a value still spans the sizes
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels collide on a short span
        ax.set_xlabel("non-embedding parameters")
        ax.set_ylabel(f"{c['measure']}, a - b")
        ax.set_title("\n".join(_wrap(c["label"], 52)), fontsize=8)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(clauses):]:
        ax.set_visible(False)
    fig.suptitle(f"{summary['claim']}: effect against model size", fontsize=10)
    fig.tight_layout()
    return fig


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width) or [""]


def lr_figure(summary: dict, rungs: list[dict]):
    """Mean scored final validation loss over seeds against lr, one panel per rung, a line per
    setting of the rung's other varying axes."""
    fig, axes = plt.subplots(1, len(rungs), figsize=(4.6 * len(rungs), 3.6), squeeze=False)
    for ax, rung in zip(axes.flat, rungs):
        m = rung["metrics"]
        if "lr" not in m or "scored_loss" not in m:  # no cell of the rung left a config: an empty panel
            m = m.iloc[0:0].assign(lr=[], scored_loss=[])
        others = [a for a in rung["runs"].varying_axes if a not in ("lr", "seed") and a in m]
        groups = list(m.groupby(others, dropna=False)) if others else [((), m)]
        names = [", ".join(f"{a} {v}" for a, v in zip(others, k if isinstance(k, tuple) else (k,)))
                 for k, _ in groups] if others else ["all"]
        for name, (_, g) in zip(names, groups):
            curve = g.groupby("lr")["scored_loss"].mean().sort_index()
            ax.plot(curve.index, curve.values, marker="o", label=name)
        log_x(ax, m["lr"])  # a rung whose every cell failed has no point to span
        ax.set_xlabel("learning rate")
        ax.set_title(f"{rung['record']['name']} ({rung['record']['size']:,} params)", fontsize=9)
        ax.set_ylabel("final val loss (failed runs: unigram entropy)")
        ax.legend(fontsize=6)
    fig.suptitle(f"{summary['claim']}: loss against learning rate at each rung", fontsize=10)
    fig.tight_layout()
    return fig


def write_ladder_plots(summary: dict, folder: Path) -> dict:
    folder = output_folder(folder)  # a link planted at plots/ is replaced, as `report` does, never written through
    out = {}
    for name, make in (("effects", lambda: effects_figure(summary)),
                       ("lr", lambda: lr_figure(summary, summary["_rungs"]))):
        fig = make()
        out[name] = str(save_figure(fig, folder / f"ladder_{name}.png"))
        plt.close(fig)
    return out
