"""analysis.load: run directories into frames, tolerant of live and crashed runs."""
import json
import re
import math
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_runs import write_grid, write_run

from ablate.analysis.load import RunsError, layer_columns, load_runs

REPO = Path(__file__).resolve().parents[1]


def test_a_grid_loads_into_one_row_per_cell_and_one_per_cell_and_step(tmp_path):
    a = write_run(tmp_path, "pre.layernorm.gelu.dense.res", 0, [4.0, 3.0, 2.0], options={"lr": 1e-3})
    b = write_run(tmp_path, "post.layernorm.gelu.dense.res", 0, [4.0, 3.5], options={"lr": 3e-3}, n_layer=3,
                  planned_steps=3)  # both planned 3 steps: only lr (and the variant) differ
    write_grid(tmp_path, [a, b])
    runs = load_runs(tmp_path)

    assert runs.kind == "grid" and runs.name == "synthetic"
    assert sorted(runs.cells["cell_id"]) == sorted([a.cell_id, b.cell_id])
    assert len(runs.steps) == 3 + 2
    cell = runs.cells.set_index("cell_id").loc[b.cell_id]
    assert (cell["group"], cell["seed"], cell["status"]) == (b.group, 0, "completed")
    assert (cell["norm"], cell["norm_type"], cell["mlp"], cell["lr"]) == ("post", "layernorm", "dense", 3e-3)
    # variant axes and the grid's option axes are columns, so plots can facet by them
    assert {"norm", "norm_type", "act", "mlp", "residual", "lr", "seed"} <= set(runs.axis_columns)
    assert runs.varying_axes == ["norm", "lr"] and runs.option_axes == ["lr"]
    assert layer_columns(runs.steps, "grad_norm") == ["grad_norm/layer_0", "grad_norm/layer_1", "grad_norm/layer_2"]
    assert list(runs.steps[runs.steps["cell_id"] == a.cell_id]["loss"]) == [4.0, 3.0, 2.0]


def test_null_metrics_become_nan_and_a_diverged_run_is_marked(tmp_path):
    run = write_run(tmp_path, seed=1, losses=[3.0, 2.5, float("inf"), float("nan")])
    assert run.metrics[2]["loss"] is None  # written as null, never NaN
    runs = load_runs(tmp_path)
    cell = runs.cells.iloc[0]
    assert cell["status"] == "diverged" and cell["diverged_at_step"] == 2
    losses = list(runs.steps["loss"])
    assert losses[:2] == [3.0, 2.5] and math.isnan(losses[2]) and math.isnan(losses[3])


def test_a_truncated_last_metrics_line_is_skipped_with_a_warning(tmp_path):
    run = write_run(tmp_path, losses=[4.0, 3.0, 2.0, 1.5], status="running", truncate_last_line=True)
    with pytest.warns(UserWarning, match="last line of metrics.jsonl"):
        runs = load_runs(tmp_path)
    assert list(runs.steps["step"]) == [0, 1, 2]
    assert runs.cells.iloc[0]["status"] == "running"
    assert runs.cells.iloc[0]["logged_steps"] == 3
    assert any(run.cell_id in line for line in runs.skipped)


def test_a_running_grid_lists_running_and_pending_cells(tmp_path):
    done = write_run(tmp_path, seed=0)
    live = write_run(tmp_path, seed=1, status="running")
    (tmp_path / "pre.layernorm.gelu.dense.res__seed=3").mkdir()  # created, nothing written yet
    write_grid(tmp_path, [done, live], pending=["pre.layernorm.gelu.dense.res__seed=2",
                                                 "pre.layernorm.gelu.dense.res__seed=3"])
    runs = load_runs(tmp_path)
    assert dict(zip(runs.cells["cell_id"], runs.cells["status"])) == {done.cell_id: "completed", live.cell_id: "running"}
    assert runs.pending == ["pre.layernorm.gelu.dense.res__seed=2", "pre.layernorm.gelu.dense.res__seed=3"]
    assert runs.grid["name"] == "synthetic"


def test_a_grid_folder_without_grid_json_and_a_grid_with_nothing_started(tmp_path):
    write_run(tmp_path / "g", seed=0)
    write_run(tmp_path / "g", seed=1)
    assert len(load_runs(tmp_path / "g").cells) == 2

    write_grid(tmp_path / "empty", [], pending=["pre.layernorm.gelu.dense.res__seed=0"])
    empty = load_runs(tmp_path / "empty")
    assert empty.cells.empty and empty.steps.empty and empty.pending == ["pre.layernorm.gelu.dense.res__seed=0"]


def test_a_single_run_directory(tmp_path):
    run = write_run(tmp_path, seed=4, axes={})
    runs = load_runs(run.path)
    assert runs.kind == "run" and runs.name == run.cell_id
    assert list(runs.cells["cell_id"]) == [run.cell_id] and runs.varying_axes == []


def test_probes_off_means_no_layer_columns(tmp_path):
    write_run(tmp_path, probes=False)
    runs = load_runs(tmp_path)
    assert runs.layer_count() == 0 and "grad_norm" in runs.steps


@pytest.mark.parametrize("make, expected", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: (p / "file.txt").write_text("x") and p / "file.txt", "not a folder"),
    (lambda p: (p / "emptydir").mkdir() or p / "emptydir", "not a run or grid folder"),
])
def test_what_is_not_a_run_or_grid_folder_is_refused(tmp_path, make, expected):
    path = make(tmp_path)
    with pytest.raises(RunsError, match=expected) as e:
        load_runs(path)
    assert str(path) in str(e.value) and "valid:" in str(e.value) and "\n" not in str(e.value)


def test_analysis_never_imports_torch_or_the_engine():
    code = ("import sys, ablate.analysis.load, ablate.analysis.metrics, ablate.analysis.stats, "
            "ablate.analysis.plots, ablate.analysis.report; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'torch' or "
            "(m.startswith('ablate.') and not m.startswith('ablate.analysis'))]; "
            "print(json.dumps(bad))").replace("import sys,", "import json, sys,")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    for source in (REPO / "analysis").glob("*.py"):
        text = source.read_text()
        engine = re.findall(r"(?:from|import) ablate\.(?!analysis\b)", text)
        assert "import torch" not in text and not engine, source
