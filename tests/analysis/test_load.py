"""analysis.load: run directories into frames, tolerant of live and crashed runs."""
import json
import math

import pytest

from ablate.analysis.load import RunsError, layer_columns, load_runs
from tests.helpers.synthetic_runs import write_grid, write_run


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


# ------------------------------------------------------------------------------ damaged files

@pytest.mark.parametrize("damaged, content", [
    ("config.json", '{"cell_id": "x", "vari'),  # cut mid-write
    ("summary.json", "\x00\x00garbage"),
    ("summary.json", "[1, 2]"),  # JSON, but not an object
    ("config.json", '{"variant": "pre", "train": {}}'),  # a section of the wrong type
])
def test_a_damaged_cell_file_leaves_that_cell_out_and_names_it(tmp_path, damaged, content):
    good = [write_run(tmp_path, seed=s) for s in (0, 1)]
    bad = write_run(tmp_path, seed=2)
    write_grid(tmp_path, [*good, bad])
    (bad.path / damaged).write_text(content)
    with pytest.warns(UserWarning, match=damaged):
        runs = load_runs(tmp_path)
    assert sorted(runs.cells["cell_id"]) == sorted(r.cell_id for r in good)
    assert set(runs.steps["cell_id"]) == {r.cell_id for r in good}
    lines = [line for line in runs.skipped if bad.path.name in line]
    assert len(lines) == 1 and damaged in lines[0] and "\n" not in lines[0]


def test_a_damaged_grid_json_is_named_and_the_cells_are_still_read(tmp_path):
    runs_written = [write_run(tmp_path, seed=s) for s in (0, 1)]
    write_grid(tmp_path, runs_written, pending=["pre.layernorm.gelu.dense.res__seed=9"])
    (tmp_path / "grid.json").write_text('{"name": "synthetic", "cells": [')
    with pytest.warns(UserWarning, match="grid.json"):
        runs = load_runs(tmp_path)
    assert len(runs.cells) == 2 and runs.grid is None
    assert any(line.startswith("grid.json: unreadable") for line in runs.skipped)

    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "grid.json").write_text("not json")
    with pytest.raises(RunsError, match="grid.json is unreadable"), pytest.warns(UserWarning):
        load_runs(tmp_path / "empty")


def test_the_report_of_a_grid_with_a_damaged_cell_reports_the_rest_and_names_it(tmp_path, capsys):
    from ablate.cli import main

    good = [write_run(tmp_path, seed=s, losses=[4.0, 3.0 + 0.1 * s]) for s in (0, 1)]
    bad = write_run(tmp_path, seed=2)
    write_grid(tmp_path, [*good, bad])
    (bad.path / "summary.json").write_text('{"status": "compl')
    assert main(["report", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert bad.cell_id in captured.err and "Traceback" not in captured.err
    report = (tmp_path / "report.md").read_text()
    warning = next(line for line in report.splitlines() if bad.cell_id in line and "summary.json" in line)
    assert warning.startswith("- ") and "cell left out" in warning
    assert all(r.cell_id in report for r in good)


def test_garbage_in_the_middle_of_metrics_keeps_every_valid_row_and_warns_per_line(tmp_path):
    run = write_run(tmp_path, losses=[4.0, 3.5, 3.0, 2.5, 2.0, 1.5], status="running")
    lines = (run.path / "metrics.jsonl").read_bytes().splitlines()
    garbage = [b"{not json", b"[1, 2, 3]", b'{"loss": 1.0}', b"\xff\xfe not utf-8", b""]
    mixed = lines[:2] + garbage[:2] + lines[2:4] + garbage[2:] + lines[4:]
    (run.path / "metrics.jsonl").write_bytes(b"\n".join(mixed) + b"\n")
    with pytest.warns(UserWarning) as caught:
        runs = load_runs(tmp_path)
    assert list(runs.steps["step"]) == [0, 1, 2, 3, 4, 5]  # nothing after the garbage is lost
    assert list(runs.steps["loss"]) == [4.0, 3.5, 3.0, 2.5, 2.0, 1.5]
    messages = [str(w.message) for w in caught]
    assert [m.split(" of ")[0].split("skipped ")[1] for m in messages] == ["line 3", "line 4", "line 7", "line 8"]
    assert all("the rows after it are kept" in m for m in messages)  # the blank line is no row, no warning


def test_same_settings_follow_config_identity_keys_and_old_runs_fall_back(tmp_path):
    identity = ["variant", "norm", "model", "steps", "lr", "optimizer", "z_loss", "seed"]
    a = write_run(tmp_path, seed=0, identity_keys=identity)
    b = write_run(tmp_path, "post.layernorm.gelu.dense.res", 0, identity_keys=identity)
    for run, optimizer in ((a, "adamw"), (b, "muon")):  # the grid did not vary it: an option axis appears
        config = json.loads((run.path / "config.json").read_text())
        config["train"].update(optimizer=optimizer, z_loss=0.0, beta1=0.5 if run is a else 0.9)
        (run.path / "config.json").write_text(json.dumps(config))
    runs = load_runs(tmp_path)
    assert "optimizer" in runs.option_axes  # an identity key that differs
    assert "beta1" not in runs.option_axes  # not an identity key of these runs: not a setting
    assert "seed" not in runs.option_axes and "norm" not in runs.option_axes

    old = tmp_path / "old"
    c = write_run(old, seed=0)
    d = write_run(old, "post.layernorm.gelu.dense.res", 0)
    for run, beta1 in ((c, 0.5), (d, 0.9)):  # no identity_keys: today's tuple, which has beta1
        config = json.loads((run.path / "config.json").read_text())
        config["train"]["beta1"] = beta1
        (run.path / "config.json").write_text(json.dumps(config))
    assert "beta1" in load_runs(old).option_axes

    # an old run beside new ones: an option it predates is no difference
    mixed = tmp_path / "mixed"
    write_run(mixed, seed=0)
    e = write_run(mixed, "post.layernorm.gelu.dense.res", 0, identity_keys=["lr", "optimizer"])
    config = json.loads((e.path / "config.json").read_text())
    config["train"]["optimizer"] = "adamw"
    (e.path / "config.json").write_text(json.dumps(config))
    assert load_runs(mixed).option_axes == []


def test_qk_norm_is_a_variant_axis_and_old_runs_had_none(tmp_path):
    write_run(tmp_path, seed=0)  # written before the axis existed
    config_path = write_run(tmp_path, seed=1).path / "config.json"
    config = json.loads(config_path.read_text())
    config["variant"]["qk_norm"] = "rmsnorm"
    config_path.write_text(json.dumps(config))
    runs = load_runs(tmp_path)
    assert sorted(runs.cells["qk_norm"]) == ["none", "rmsnorm"] and "qk_norm" in runs.varying_axes


def test_a_run_with_a_hundred_metric_columns_loads_without_a_fragmentation_warning(tmp_path):
    """Every report of a 12-block grid with the stability probes printed pandas'
    PerformanceWarning ("DataFrame is highly fragmented") where a plot added a column to the
    steps, after the metric columns had been made numeric one at a time."""
    import warnings

    runs = [write_run(tmp_path, seed=s, losses=[4.0, 3.0, 2.5, 2.2], n_layer=12, probe_every=1) for s in range(2)]
    write_grid(tmp_path, runs)
    loaded = load_runs(tmp_path)
    assert loaded.steps.shape[1] > 100 and loaded.steps["attn_logit_max/layer_11"].dtype == float
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded.steps.assign(largest=1.0)  # as the attention-logit plot adds its column
