"""`report.md`, `summary.csv`, `cells.csv` and `plots/` for a grid folder or a run directory.

    write_report(path, baseline=None, preamble_sections=()) -> Path of report.md

A preamble section (placed right under the title, e.g. a verdict) is markdown text, a
(title, body) pair, or a callable that receives the Analysis and returns markdown.
Everything is computed (and bad input refused) before anything is written.
"""
from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Union

import numpy as np
import pandas as pd

from ablate.analysis import plots
from ablate.analysis.analyse import Analysis, Settings, analyse
from ablate.analysis.cpu_forms import forms_line, mix_note
from ablate.analysis.load import FINISHED
from ablate.analysis.lr_sensitivity import sweep_table
from ablate.analysis.metrics import MAD_TO_STD
from ablate.analysis.outcomes import PLATEAU_MARGIN, SCORING_RULE
from ablate.analysis.plot_jobs import run_plot_jobs
from ablate.analysis.report_plots import REPORT_PLOTS
from ablate.analysis.stats import (BOOTSTRAP_MIN_VALUES, CONTROLS, CORRECTIONS, CORRECTION_SHORT, MEAN_INTERVAL_RULE,
                                   divergence_sentence, format_p)
from ablate.core.rundir import COMPLETED, DIVERGED, FAILED, RUNNING
from ablate.core.safe_files import output_folder, write_text_atomic

REPORT, SUMMARY_CSV, CELLS_CSV, PLOTS_DIR = "report.md", "summary.csv", "cells.csv", "plots"
LR_CSV = "lr_sensitivity.csv"  # written when the runs sweep lr over enough values
LOSS_DIGITS = 4  # losses and their differences in the report table (summary.csv has full precision)
OTHER_DIGITS = 2

Section = Union[str, tuple, Callable[[Analysis], str]]


def write_report(path: str | Path, baseline: str | None = None, preamble_sections: Iterable[Section] = (),
                 settings: Settings = Settings(), dpi: int = 120, analysis: Analysis | None = None) -> Path:
    """Analyse `path` (or use `analysis`, already computed for it) and write report.md,
    summary.csv, cells.csv and plots/ into it. Returns the report's path."""
    analysis = analysis or analyse(path, baseline, settings)
    root = Path(path)
    preamble = [_render_section(s, analysis) for s in preamble_sections]  # may fail: before writing

    # Every output is written to a fresh file and renamed into place: a link planted at an
    # output's name is replaced, never written through (ablate.core.rundir.replace_atomic).
    write_text_atomic(root / SUMMARY_CSV, analysis.summary.to_csv(index=False))
    write_text_atomic(root / CELLS_CSV, analysis.metrics.drop(columns=["path"], errors="ignore").to_csv(index=False))
    if analysis.lr_sweeps:
        write_text_atomic(root / LR_CSV, sweep_table(analysis.lr_sweeps).to_csv(index=False))
    fresh = Path(tempfile.mkdtemp(prefix=".plots-", dir=root))  # a new folder: nothing planted in it
    try:
        written = make_plots(analysis, fresh, dpi)
        try:
            text = render(analysis, preamble, written)
        finally:
            plots.close(written)
        _move_plots(fresh, root / PLOTS_DIR)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    out = root / REPORT
    write_text_atomic(out, text)
    return out


def _move_plots(fresh: Path, plots_dir: Path) -> None:
    """Rename the plots made in `fresh` into `plots_dir` (a rename replaces a link at a
    plot's name, never its target); a `plots_dir` that is a link is replaced by a folder."""
    output_folder(plots_dir)
    for path in sorted(fresh.iterdir()):
        os.replace(path, plots_dir / path.name)


def make_plots(analysis: Analysis, out_dir: Path, dpi: int = 120, processes: int | None = None) -> list[plots.Plot]:
    """Every registered report plot (analysis/report_plots.py) the runs have data for (per-layer
    ones need probes), with one Style, the
    kinds drawn side by side in forked processes (analysis/plot_jobs.py; `processes=1`: here,
    one after another, and the figures are kept)."""
    runs, metrics = analysis.runs, analysis.metrics
    if metrics.empty:
        return []
    style = plots.make_style(metrics, runs.option_axes)
    registered = REPORT_PLOTS.values()
    jobs = [functools.partial(p.draw, analysis, style, out_dir, dpi) for p in registered]
    drawn = run_plot_jobs(jobs, processes, costs=[p.cost for p in registered])
    return [p for p in drawn if p is not None]


def _render_section(section: Section, analysis: Analysis) -> str:
    if callable(section):
        return section(analysis).strip()
    if isinstance(section, tuple):
        title, body = section
        return f"## {title}\n\n{body.strip()}"
    return str(section).strip()


# ---------------------------------------------------------------- formatting

def fmt(value, digits: int = LOSS_DIGITS, signed: bool = False) -> str:
    """A number as the report shows it; '—' for a missing one (never an invented number).
    Magnitudes of 10^4 and more (a gradient-norm ratio of a dying layer) switch to 3
    significant digits: fixed decimals would print a dozen meaningless digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if abs(value) >= 1e4:
        return f"{value:+.3g}" if signed else f"{value:.3g}"
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _interval(mean, low, high, note: str, signed: bool = False) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "—"
    if low is None or (isinstance(low, float) and math.isnan(low)):
        return f"{fmt(mean, signed=signed)} ({note})"
    return f"{fmt(mean, signed=signed)} [{fmt(low, signed=signed)}, {fmt(high, signed=signed)}]"


def _table(header: list[str], rows: list[list[str]]) -> str:
    escape = lambda text: str(text).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


RESULT_COLUMNS = ["group", "completed", "final val loss [95% CI]", "train loss", "Δ vs baseline [95% CI]", "test",
                  "p", "p adjusted", "diverged", "spikes", "grad-norm max/min (end)", "residual RMS growth"]
TEST_NAMES = {"paired t-test": "paired", "Welch t-test": "Welch"}


def _p_or_dash(p) -> str:
    return format_p(None if p is None or (isinstance(p, float) and math.isnan(p)) else p).replace("no p-value", "—")


def results_rows(summary: pd.DataFrame) -> list[list[str]]:
    """The results table, one row per group, from summary.csv's columns."""
    rows = []
    for r in summary.to_dict("records"):
        test, p, adjusted = "—", "—", "—"
        if r["baseline"] == r["group"]:
            delta = "baseline"
        elif not r["baseline"]:
            delta = "no baseline at these settings"
        else:
            note = ("no interval: one seed" if r["n_pairs"] == 1 else "no seeds in common" if r["n_pairs"] == 0
                    else "no interval")
            delta = _interval(r["delta_vs_baseline"], r["delta_ci_low"], r["delta_ci_high"], note, signed=True)
            test = TEST_NAMES.get(r["test"], "—") if isinstance(r["test"], str) else "—"
            p, adjusted = _p_or_dash(r["p_value"]), _p_or_dash(r["p_adjusted"])
        rate = (f"{r['divergence']} ({r['divergence_rate']:.0%})" if not math.isnan(r["divergence_rate"])
                else r["divergence"])
        rows.append([
            f"`{r['group']}`", f"{r['n_values']} of {r['n_cells']}",
            _interval(r["final_val_loss_mean"], r["final_val_loss_ci_low"], r["final_val_loss_ci_high"], r["interval"]),
            fmt(r.get("final_loss", np.nan)), delta, test, p, adjusted, rate,
            fmt(r.get("spikes", np.nan), OTHER_DIGITS),
            fmt(r.get("grad_ratio_end", np.nan), OTHER_DIGITS), fmt(r.get("rms_growth", np.nan), OTHER_DIGITS),
        ])
    return rows


# ---------------------------------------------------------------- the report

def render(analysis: Analysis, preamble: list[str], written: list[plots.Plot]) -> str:
    runs = analysis.runs
    title = f"# Ablation report: {runs.name}" if runs.kind == "grid" else f"# Run report: {runs.name}"
    parts = [title, *preamble, _what_was_run(analysis), _results(analysis), _comparisons(analysis),
             _lr_sensitivity(analysis), _plots(written), _cells(analysis), _method(analysis)]
    if runs.skipped:
        parts.append("## Warnings\n\n" + "\n".join(f"- {line}" for line in runs.skipped))
    return "\n\n".join(p for p in parts if p) + "\n"


def _values(cells: pd.DataFrame, column: str) -> list:
    if column not in cells:
        return []
    return sorted({v for v in cells[column].tolist() if v is not None and not (isinstance(v, float) and math.isnan(v))},
                  key=str)


def _axis_values(cells: pd.DataFrame, column: str) -> list[str]:
    # None is a real axis value here: `act` of a gated MLP, `norm_type` of norm=none.
    present = cells[column].isna().any()
    return [str(v) for v in _values(cells, column)] + (["none"] if present else [])


def _what_was_run(analysis: Analysis) -> str:
    runs, cells = analysis.runs, analysis.metrics
    counts = cells["status"].value_counts().to_dict() if not cells.empty else {}
    status = ", ".join(f"{counts[s]} {s}" for s in (*FINISHED, RUNNING) if counts.get(s))
    if runs.pending:
        status += f"{', ' if status else ''}{len(runs.pending)} pending (not started)"
    lines = [f"- folder: `{runs.root}`"]
    if runs.grid:
        lines.append(f"- grid: `{runs.grid.get('name')}` from `{runs.grid.get('source')}`"
                     + (f", updated {runs.grid['updated']}" if runs.grid.get("updated") else ""))
    lines.append(f"- cells: {len(cells) + len(runs.pending)} ({status or 'none started'})")
    if cells.empty:
        return "## What was run\n\n" + "\n".join(lines)
    models = cells.drop_duplicates("model")
    lines.append("- model: " + "; ".join(f"`{m.model}` ({m.n_layer} layers, d_model {m.d_model})"
                                         for m in models.itertuples()))
    params = cells.drop_duplicates("variant_id")[["variant_id", "params"]].dropna()
    if not params.empty:
        lines.append("- parameters: " + ", ".join(f"`{p.variant_id}` {int(p.params):,}" for p in params.itertuples()))
    for label, column in [("steps", "planned_steps"), ("learning rate", "lr"), ("warmup steps", "warmup"),
                          ("seeds", "seed"), ("kernels", "kernels"), ("device", "device")]:
        values = _values(cells, column)
        if values:
            lines.append(f"- {label}: {', '.join(str(v) for v in values)}")
    if runs.varying_axes:
        lines.append("- varied: " + "; ".join(f"{a} = {', '.join(_axis_values(cells, a))}" for a in runs.varying_axes))
    fingerprints = _values(cells, "data_fingerprint")
    lines.append(f"- data fingerprint: {', '.join(f'`{f}`' for f in fingerprints) or 'not recorded'}")
    cpu_forms = forms_line(cells)
    if cpu_forms:
        lines.append(f"- CPU kernel forms: {cpu_forms}")
    commits = _values(cells, "git_commit")
    lines.append(f"- harness commit: {', '.join(f'`{c}`' for c in commits) or 'not recorded (outside a git checkout)'}")
    if analysis.baseline.name and len(analysis.groups) > 1:
        lines.append(f"- baseline: {analysis.baseline.describe()}")
    warnings = []
    if len(fingerprints) > 1:
        warnings.append(f"**The cells trained on {len(fingerprints)} different data sets** (fingerprints above): "
                        "differences between them are not the variant alone.")
    if len(commits) > 1:
        warnings.append(f"The cells ran on {len(commits)} different harness commits.")
    if mixed_forms := mix_note(cells):
        warnings.append(f"**{mixed_forms}**")
    return "## What was run\n\n" + "\n".join(lines) + ("\n\n" + "\n\n".join(warnings) if warnings else "")


def _results(analysis: Analysis) -> str:
    summary = analysis.summary
    if summary.empty:
        return "## Results\n\nNo cell has started yet: nothing to report."
    s = analysis.settings
    text = ["## Results",
            "Final val loss is the validation loss on the held-out set at the end of training (nats), averaged over "
            f"completed seeds with a {s.confidence:.0%} interval ({MEAN_INTERVAL_RULE}); *train loss* is the mean "
            f"training loss of the last {s.last_k} logged steps. Δ is the group minus its baseline in final val loss "
            "(negative = lower than the baseline), paired by seed where the seeds pair (*test* paired), else the "
            f"difference of the means (*test* Welch); *p adjusted* is corrected for the {_n_tests(analysis)} tests "
            f"of this report together ({CORRECTIONS[s.correction]}). Diverged seeds have no final loss and are counted "
            "under *diverged*. The same numbers, unrounded, are in `summary.csv` (per cell: `cells.csv`).",
            _table(RESULT_COLUMNS, results_rows(summary))]
    running = int(summary["n_running"].sum())
    failed = int(summary["n_failed"].sum())
    if running:
        text.append(f"{running} cell(s) are still running (or were interrupted): their curves are plotted, "
                    "but they enter no statistic until they finish.")
    if failed:
        text.append(f"{failed} cell(s) failed with an error (see Cells): they enter no statistic.")
    return "\n\n".join(text)


def _comparisons(analysis: Analysis) -> str:
    sentences = [c.sentence() for c in analysis.comparisons]
    summary = analysis.summary
    if not summary.empty:
        by_group = summary.set_index("group", drop=False)
        for row in summary.itertuples(index=False):
            if not row.baseline and analysis.baseline.kind == "variant":
                sentences.append(f"`{row.group}`: the baseline variant did not run at these settings, "
                                 "so there is no comparison.")
            base = by_group.loc[row.baseline] if row.baseline in by_group.index else None
            sentence = divergence_sentence(by_group.loc[row.group], base)
            if sentence:
                sentences.append(sentence)
    if not sentences:
        return "## Comparisons\n\nOnly one group ran: there is nothing to compare it with."
    s = analysis.settings
    lead = (f"Final validation loss against the baseline; significant means {CORRECTION_SHORT[s.correction]}-adjusted "
            f"p < {s.alpha:g} ({CORRECTIONS[s.correction]} over this report's {_n_tests(analysis)} tests).")
    return "## Comparisons\n\n" + lead + "\n\n" + "\n".join(f"- {s}" for s in sentences)


def _n_tests(analysis: Analysis) -> int:
    """The size of the family the p-values were corrected over (comparisons with a p-value)."""
    return sum(c.p_value is not None for c in [*analysis.comparisons, *analysis.lr_comparisons])


LR_COLUMNS = ["sweep", "learning rates", "seeds", "best lr", "best loss [95% CI]", "LR sensitivity [95% CI]",
              "basin (decades)", "first unstable lr"]


def _lr_rows(analysis: Analysis) -> list[list[str]]:
    rows = []
    for sw in analysis.lr_sweeps:
        note = "no interval: one seed" if len(sw.curve.loc[sw.curve["lr"] == sw.best_lr]) == 1 else "no interval"
        best = "—" if sw.best_loss is None else _interval(sw.best_loss, *_bounds(sw.best_interval), note)
        sensitivity = ("— (no seed has every lr)" if sw.sensitivity is None
                       else _interval(sw.sensitivity, *_bounds(sw.sensitivity_interval), "no interval: one seed"))
        if sw.basin is None:
            width = "—"
        else:
            width = (f"{'≥ ' if sw.basin_open else ''}{sw.basin_decades:.2f} ({sw.basin[0]:g} to {sw.basin[1]:g})")
        unstable = f"{sw.unstable_lr:g} ({sw.unstable_why})" if sw.unstable_lr is not None else "none in the sweep"
        best_lr = "—" if sw.best_lr is None else f"{sw.best_lr:g} (best for {sw.best_for} of {sw.n_seeds} seeds)"
        rows.append([f"`{sw.name}`", ", ".join(f"{lr:g}" for lr in sw.lrs), str(sw.n_seeds), best_lr, best,
                     sensitivity, width, unstable])
    return rows


def _bounds(interval) -> tuple:
    return (interval.low, interval.high) if interval is not None else (None, None)


def _lr_sensitivity(analysis: Analysis) -> str:
    if not analysis.lr_sweeps:
        return ""
    s = analysis.settings
    text = [
        "## Learning-rate sensitivity",
        f"For every set of cells that differ only in learning rate and seed ({s.min_lrs} or more learning rates): "
        "*LR sensitivity* (Wortsman et al. 2023) is the mean over the swept learning rates of min(scored loss, "
        "loss at initialisation) minus the best of them, per seed, averaged over the seeds that have a result at "
        f"every lr, with a {s.confidence:.0%} interval ({MEAN_INTERVAL_RULE}); a failed training run counts one way "
        f"whichever way it failed: {SCORING_RULE}; 0 means the loss does not depend on the learning rate. "
        "*Best lr* minimises the mean of "
        "that clipped loss over seeds; *best loss* is its value there. The *basin* is the run of swept learning "
        f"rates around the best whose mean loss stays within {s.basin_tolerance:g} nats of the best, in decades "
        "(≥ where it reaches the end of the sweep). *First unstable lr* is the smallest lr at which a seed "
        f"diverged, or plateaued (final val loss within {PLATEAU_MARGIN:g} nats of the unigram entropy) above the "
        "best lr.",
        _table(LR_COLUMNS, _lr_rows(analysis)),
        f"Unrounded, with each sweep's settings: `{LR_CSV}`.",
    ]
    if analysis.lr_comparisons:
        text.append("LR sensitivity against the baseline's sweep, paired by seed (the same seed gives both the same "
                    f"batches), p-values adjusted with the rest of the report ({CORRECTION_SHORT[s.correction]}):")
        text.append("\n".join(f"- {c.sentence()}" for c in analysis.lr_comparisons))
    text.append("The loss-against-learning-rate plot is `plots/lr_sensitivity.png` (under Plots).")
    return "\n\n".join(text)


def _plots(written: list[plots.Plot]) -> str:
    if not written:
        return ""
    blocks = ["## Plots"]
    for plot in written:
        png, svg = plot.paths
        blocks.append(f"![{plot.name}]({PLOTS_DIR}/{png.name})\n\n{plot.caption} "
                      f"([SVG]({PLOTS_DIR}/{svg.name}))")
    return "\n\n".join(blocks)


def _cells(analysis: Analysis) -> str:
    cells = analysis.metrics
    if cells.empty:
        return ""
    rows = []
    for c in cells.itertuples(index=False):
        progress = f"{c.logged_steps}/{fmt(c.planned_steps, 0)}"
        if c.status == DIVERGED:
            note = f"diverged at step {fmt(c.diverged_at_step, 0)}"
        elif c.status == FAILED:
            note = f"failed: {c.error}"
        elif c.status == RUNNING:
            note = "running (no summary.json yet)"
        else:
            note = ""
        if c.status == COMPLETED and _true(getattr(c, "plateau", False)):
            note = "plateau: final val loss near the unigram entropy"
        missing = getattr(c, "missing_steps", None)
        if isinstance(missing, list) and missing:
            gap = (f"no metrics row for step{'s' if len(missing) > 1 else ''} "
                   f"{', '.join(map(str, missing[:10]))}{' ...' if len(missing) > 10 else ''} (lost on a resume)")
            note = f"{note}; {gap}" if note else gap
        rows.append([f"`{c.cell_id}`", c.status, getattr(c, "outcome", ""), progress, fmt(c.final_val_loss),
                     fmt(c.final_loss), fmt(c.spikes, 0), fmt(c.max_grad_norm, OTHER_DIGITS), note])
    text = "## Cells\n\n" + _table(["cell", "status", "outcome", "steps logged / planned", "final val loss",
                                    "train loss", "spikes", "max grad norm", "note"], rows)
    if analysis.runs.pending:
        text += "\n\nNot started yet: " + ", ".join(f"`{c}`" for c in analysis.runs.pending)
    return text


def _true(value) -> bool:
    """A flag from a frame column that may hold NaN where a cell had no metrics."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def _method(analysis: Analysis) -> str:
    s = analysis.settings
    return "\n".join([
        "## Method",
        "",
        "- **Final val loss** (what every comparison uses): the validation loss on the fixed held-out set at the "
        f"end of training (summary.json `final_val_loss`); **train loss**: the mean training loss of the last "
        f"{s.last_k} logged steps. A cell that diverged or failed has neither.",
        f"- **Spike**: a logged step whose loss exceeds the median of the {s.spike_window} logged losses before it "
        f"by more than {s.spike_z:g} robust standard deviations ({MAD_TO_STD} × median absolute deviation).",
        "- **Grad-norm spread**: max/min ratio (and coefficient of variation, in summary.csv) of the per-layer "
        "gradient norms at the last logged step where all are finite; init and mid-run values are in cells.csv.",
        "- **Residual RMS growth**: RMS of the residual stream after the last block divided by that after block 0, "
        "at the end of training.",
        f"- **Intervals**: a group's own mean has a {s.confidence:.0%} interval over its completed seeds: "
        f"Student's t interval below {BOOTSTRAP_MIN_VALUES} seeds, where a percentile bootstrap covers far less than "
        "it claims (about 76% at 3 seeds, where it is the seeds' range, 90% at 10), and from there on the "
        f"percentile bootstrap (scipy.stats.bootstrap, {s.n_resamples} resamples, seed {s.seed}); with one seed "
        "there is none. A comparison's interval is the t interval of the same test whose p-value "
        "it reports, so the two never disagree.",
        "- **Comparisons**: paired by seed (the same seed gives the same initial weights and batches) over the seeds "
        "that completed in both groups, with a two-sided paired t-test on the per-seed differences; where the "
        "groups share fewer than two seeds, or train on different batches (model, batch size, context or data "
        "differ), the difference of the two means with a two-sided Welch t-test instead. The p-values of all the "
        f"report's tests (final val loss and LR sensitivity) are corrected together with {CORRECTIONS[s.correction]} "
        f"({CONTROLS[s.correction]}); significant below {s.alpha:g} after correction. A *no significant "
        "difference* states how many paired "
        f"seeds would detect the observed mean difference with {s.power:.0%} power (two-sided paired t-test at "
        f"{s.alpha:g}, the observed spread of the differences, noncentral t: `seeds_for_power` in summary.csv). "
        "**Divergence rate**: diverged / (completed + diverged).",
    ])
