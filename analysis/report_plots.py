"""The plots a report draws, registered by name with `@report_plot(name, cost=...)`, in the
order the report shows them.

A report plot is one function `(analysis, style, out_dir, dpi) -> Plot | None` (None: the runs
have no data for it, e.g. per-layer plots of runs without probes). `cost` is its share of the
drawing time, relative to the others (measured on prenorm-wins's 42 cells, in one process):
the report draws its plots side by side in forked processes, the costliest first
(analysis/plot_jobs.py), so the longest does not start last while the other cores idle.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ablate.analysis import plots
from ablate.core.registry import Registry


@dataclass(frozen=True)
class ReportPlot:
    draw: Callable[..., plots.Plot | None]  # (analysis, style, out_dir, dpi)
    cost: float


REPORT_PLOTS: Registry[ReportPlot] = Registry("report plot")


def report_plot(name: str, *, cost: float):
    """Register the decorated function as report plot `name`; a name taken twice is refused."""
    if not cost > 0:
        raise ValueError(f"report plot {name!r}: cost={cost!r}; valid: a positive share of the drawing time")

    def register(draw: Callable) -> Callable:
        REPORT_PLOTS.register(name, ReportPlot(draw, cost), origin=draw.__module__)
        return draw
    return register


@report_plot("loss_curves", cost=11)
def loss_curves(analysis, style, out_dir: Path, dpi: int):
    return plots.plot_loss_curves(analysis.runs.steps, analysis.metrics, out_dir, style, dpi=dpi)


@report_plot("final_loss", cost=5)
def final_loss(analysis, style, out_dir: Path, dpi: int):
    return plots.plot_final_loss(analysis.metrics, analysis.summary, out_dir, style, analysis.settings.last_k, dpi=dpi)


@report_plot("lr_sensitivity", cost=3)
def lr_sensitivity(analysis, style, out_dir: Path, dpi: int):
    return plots.plot_lr_sensitivity(analysis.lr_sweeps, analysis.metrics, out_dir, style, dpi=dpi)


@report_plot("grad_heatmaps", cost=14)
def grad_heatmaps(analysis, style, out_dir: Path, dpi: int):
    return plots.plot_grad_heatmaps(analysis.runs.steps, analysis.metrics, out_dir, style, dpi=dpi)


@report_plot("probe_heatmaps", cost=37)
def probe_heatmaps(analysis, style, out_dir: Path, dpi: int):
    return plots.plot_probe_heatmaps(analysis.runs.steps, analysis.metrics, out_dir, style, dpi=dpi)


@report_plot("grad_profiles", cost=22)
def grad_profiles(analysis, style, out_dir: Path, dpi: int):
    return plots.plot_grad_profiles(analysis.grad_profiles, analysis.metrics, out_dir, style, dpi=dpi)


@report_plot("residual_rms", cost=7)
def residual_rms(analysis, style, out_dir: Path, dpi: int):
    return plots.plot_residual_rms(analysis.act_profiles, analysis.metrics, out_dir, style, dpi=dpi)
