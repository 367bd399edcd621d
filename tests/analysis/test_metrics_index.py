"""analysis/metrics_index.py: a metrics.jsonl indexed, then read again one row at a time, as
`ablate export` reads it (the rows never held in memory together)."""
import json
import os
import tracemalloc
import warnings

import pytest

from ablate.analysis.metrics_index import MetricsIndex
from tests.helpers.synthetic_runs import write_run


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_each_step_is_read_once_from_its_last_line_in_step_order_bad_lines_named(tmp_path):
    path = write_lines(tmp_path / "metrics.jsonl", [
        json.dumps({"step": 0, "loss": 4.0}),
        json.dumps({"step": 1, "loss": 3.9}),
        "garbage",
        json.dumps({"step": 2, "loss": 3.8, "grad_norm/layer_0": 1.0}),
        json.dumps({"step": 1, "loss": 3.7}),  # a resume continued from step 1: this line is the run's
        json.dumps({"step": 2**63, "loss": 1.0}),
        json.dumps({"step": 3, "loss": None}),
        '{"step": 4, "lo',
    ])
    skipped = []
    with pytest.warns(UserWarning), MetricsIndex.open(path, "cell", skipped) as metrics:
        assert list(metrics.steps) == [0, 1, 2, 3] and metrics.last_step == 3
        assert metrics.keys == {"loss", "grad_norm/layer_0"}
        assert [(r["step"], r["loss"]) for r in metrics.rows_after(0)] == [(1, 3.7), (2, 3.8), (3, None)]
        assert list(metrics.steps_after(2)) == [3] and list(metrics.rows_after(3)) == []
    assert any("line 3" in s for s in skipped) and any("last line" in s for s in skipped)
    assert any(str(2**63) in s and "64-bit" in s for s in skipped)


def test_a_missing_file_is_an_empty_index(tmp_path):
    with MetricsIndex.open(tmp_path / "metrics.jsonl", "cell", []) as metrics:
        assert metrics.last_step is None and list(metrics.rows_after(-1)) == [] and metrics.keys == set()


def test_a_file_replaced_after_indexing_is_read_as_it_was_indexed(tmp_path):
    path = write_lines(tmp_path / "metrics.jsonl", [json.dumps({"step": s, "loss": 4.0 - s}) for s in range(3)])
    with MetricsIndex.open(path, "cell", []) as metrics:
        replacement = write_lines(tmp_path / "new", [json.dumps({"step": s, "loss": 99.0, "x": "longer line"})
                                                     for s in range(3)])
        os.replace(replacement, path)  # a resume's rewrite of the file, between the two reads
        assert [r["loss"] for r in metrics.rows_after(-1)] == [4.0, 3.0, 2.0]


def test_a_tensorboard_export_holds_no_more_than_a_few_rows_of_a_big_metrics_file(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.plugins.hparams import summary_v2  # noqa: F401  (imports before the count starts)
    from tensorboard.summary.writer import record_writer  # noqa: F401
    from ablate.analysis.export import export_tensorboard
    runs = tmp_path / "runs"
    run = write_run(runs, seed=0, losses=[4.0], probes=False)
    row = {f"metric_{k}": 1.0 + k for k in range(40)}
    with open(run.path / "metrics.jsonl", "w") as f:
        for step in range(501):
            f.write(json.dumps({"step": step, **row}) + "\n")
    size = (run.path / "metrics.jsonl").stat().st_size  # about 0.4 MB; held as rows, about 6x that was counted here
    tracemalloc.start()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert export_tensorboard(runs, tmp_path / "tb").updated
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 3, (peak, size)  # here: about size / 7 (mostly the index); held as rows, 6x size
    assert len(list((tmp_path / "tb").rglob("events.out.tfevents.*steps-0-500*"))) == 1
