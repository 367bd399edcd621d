"""The report plots' registry (analysis/report_plots.py): make_plots draws every registered plot
with its declared cost, in registration order, and a name taken twice is refused."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from ablate.analysis import report
from ablate.analysis.report_plots import REPORT_PLOTS, ReportPlot, report_plot
from ablate.core.registry import RegistryError


def test_the_built_in_plots_in_report_order_with_positive_costs():
    assert REPORT_PLOTS.names() == ["loss_curves", "final_loss", "lr_sensitivity", "grad_heatmaps", "probe_heatmaps",
                                    "grad_profiles", "residual_rms"]
    assert all(p.cost > 0 for p in REPORT_PLOTS.values())


def test_a_report_plot_registered_twice_or_without_a_cost_is_refused():
    with pytest.raises(RegistryError, match="report plot 'loss_curves' is registered twice"):
        report_plot("loss_curves", cost=1)(lambda *a: None)
    with pytest.raises(ValueError, match="cost=0"):
        report_plot("free", cost=0)


def test_make_plots_draws_each_registered_plot_with_its_cost(monkeypatch, tmp_path):
    calls = []

    def fake_jobs(jobs, processes, costs=None):
        fake_jobs.costs = list(costs)
        return [job() for job in jobs]

    def draw(name):
        return lambda analysis, style, out_dir, dpi: calls.append((name, out_dir, dpi)) or (None if name == "b" else name)

    fresh = type(REPORT_PLOTS)("report plot")
    fresh.register("a", ReportPlot(draw("a"), 2.0))
    fresh.register("b", ReportPlot(draw("b"), 5.0))
    monkeypatch.setattr(report, "REPORT_PLOTS", fresh)
    monkeypatch.setattr(report, "run_plot_jobs", fake_jobs)
    monkeypatch.setattr(report.plots, "make_style", lambda metrics, axes: "style")
    analysis = SimpleNamespace(runs=SimpleNamespace(option_axes=()), metrics=SimpleNamespace(empty=False))
    drawn = report.make_plots(analysis, Path(tmp_path), dpi=50)
    assert calls == [("a", tmp_path, 50), ("b", tmp_path, 50)]
    assert fake_jobs.costs == [2.0, 5.0]
    assert drawn == ["a"]  # a plot without data (None) is left out
