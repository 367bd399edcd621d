"""The readers the grid tests poll run folders with (tests/helpers/live_files.py)."""
from tests.ablate.commands import test_grid
from tests.helpers import cluster_helpers


def test_the_grid_run_tests_readers_tolerate_a_line_being_written(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "loss": 4.0}\n{"step": 1, "loss": 3.9}\n{"step": 2, "lo')
    assert test_grid.metrics_steps(tmp_path) == [0, 1]
    assert [r["step"] for r in cluster_helpers.metrics(tmp_path)] == [0, 1]
    assert cluster_helpers.logged_steps(tmp_path) == 2
