"""Reads run directories: loading, stability metrics, statistics, plots, reports.

The notebook API (docs/results.md, "In a notebook"):

    from ablate.analysis import load_runs, cell_metrics, group_stats, paired_comparison
    runs = load_runs("runs/prenorm-wins")   # runs.cells: one row per cell; runs.steps: per logged step

Names are imported on first use, so `import ablate.analysis.load` (as `ablate export` does)
does not pay for scipy and matplotlib.
"""
from __future__ import annotations

import importlib

# name -> the module of this package that defines it
_EXPORTS = {
    "load_runs": "load", "Runs": "load", "RunsError": "load", "layer_columns": "load",
    "cell_metrics": "metrics", "layer_profiles": "metrics", "final_loss": "metrics", "spike_mask": "metrics",
    "plateaued": "outcomes", "PLATEAU_MARGIN": "outcomes", "outcome_of": "outcomes",
    "bootstrap_ci": "stats", "mean_interval": "stats", "welch_p_value": "stats", "paired_p_value": "stats",
    "finished_values": "stats",
    "group_stats": "stats", "paired_comparison": "stats", "compare_to_baseline": "stats",
    "Comparison": "stats", "Interval": "stats", "adjust_p_values": "stats", "holm": "stats", "correct": "stats",
    "seeds_for_power": "stats", "paired_power": "stats",
    "lr_sweeps": "lr_sensitivity", "analyse_sweep": "lr_sensitivity", "Sweep": "lr_sensitivity",
    "lr_curve": "lr_sensitivity", "per_seed_sensitivity": "lr_sensitivity", "compare_sensitivity": "lr_sensitivity",
    "sweep_table": "lr_sensitivity",
    "write_report": "report",
}
# Not `analyse`: a function named like its module would be replaced by the module on the package
# whenever ablate.analysis.analyse is imported. Use `from ablate.analysis.analyse import analyse`.
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
