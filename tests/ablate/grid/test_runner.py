"""The grid runner as a library (ablate.grid.runner), the one backend interface, and cells that
hold their resolved config with the execution settings apart."""
import json
import pickle
import textwrap
from pathlib import Path

import pytest

from ablate.backends import BACKENDS, backend_class, local
from ablate.backends.base import Backend
from ablate.cli import build_parser
from ablate.core.errors import ConfigError
from ablate.engine.cell import Cell, CellResources
from ablate.engine.train import plan_run
from ablate.grid.runner import GridRunOptions, run_checked_grid, run_grid
from ablate.grid.spec import load_grid
from tests.helpers.fake_trainer import fake_cell, write_grid
from tests.helpers.repo import REPO

PACKAGE = REPO / "ablate"


def test_every_backend_implements_the_one_interface():
    for name in BACKENDS:
        try:
            cls = backend_class(name)
        except ImportError:  # pragma: no cover (the module imports its extra lazily; it should not fail)
            pytest.fail(f"backend {name} does not import without its extra")
        assert issubclass(cls, Backend) and cls.name == name
        for method in ("describe", "run"):
            assert getattr(cls, method) is not getattr(Backend, method), f"{name} lacks {method}"


def test_contradictory_execution_options_are_refused_when_made():
    with pytest.raises(ConfigError, match="--workers is for --backend local"):
        GridRunOptions(backend="ray", workers=2)
    with pytest.raises(ConfigError, match="unknown backend 'mpi'"):
        GridRunOptions(backend="mpi")
    with pytest.raises(ConfigError, match="--retries -1"):
        GridRunOptions(retries=-1)


def test_run_grid_runs_a_grid_from_python_as_the_command_does(tmp_path, capsys):
    path = write_grid(tmp_path, "[base]\nweight_decay = 0.0\n[axes]\nnorm = ['pre', 'post']\nseed = [0, 1]\n")
    out = tmp_path / "out"
    assert run_grid(path, out, GridRunOptions(workers=0, quiet=True), cell_fn=fake_cell) == 0
    text = capsys.readouterr().out
    assert "4 to run on this process" in text and "4 completed" in text.splitlines()[-1]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(c.id for c in load_grid(path).cells)
    # A rerun trains nothing; another grid's folder is refused before anything is written.
    assert run_grid(path, out, GridRunOptions(workers=0, quiet=True), cell_fn=fake_cell) == 0
    assert "nothing to run" in capsys.readouterr().out
    other = write_grid(tmp_path, "name = 'other'\n[axes]\nseed = [0]\n", name="other.toml")
    with pytest.raises(ConfigError, match="holds grid 'g'"):
        run_grid(other, out, GridRunOptions(workers=0), cell_fn=fake_cell)


def test_a_cell_holds_its_resolved_config_and_a_setting_is_shared_by_its_seeds(tmp_path):
    cell = Cell.from_options({"lr": "3e-3", "seed": "2", "steps": 5})
    assert cell.config.lr == 0.003 and cell.config.seed == 2 and cell.seed == 2
    assert cell.options == {"lr": 0.003, "seed": 2, "steps": 5}  # the user's options, resolved
    grid = load_grid(write_grid(tmp_path, "[axes]\nnorm = ['pre', 'post']\nseed = [0, 1, 2]\n"))
    by_norm = {}
    for c in grid.cells:
        by_norm.setdefault(c.config.norm, []).append(c)
        assert c.config.seed == c.seed and c.id.endswith(f"__seed={c.seed}")
    assert all(len({id(c.setting) for c in cells}) == 1 for cells in by_norm.values())


def test_a_pickled_cell_carries_fields_not_cached_specs():
    cell = Cell.from_options({"norm": "post", "steps": 5})
    assert cell.setting.spec is not None  # cached on the config here
    again = pickle.loads(pickle.dumps(cell))
    assert "spec" not in vars(again.setting) and "size" not in vars(again.setting)
    assert again == cell and again.config.spec.id == cell.config.spec.id


def test_execution_threads_reach_the_plan_and_yield_to_the_cells_own():
    cell = Cell.from_options({"steps": 2, "batch_size": 2, "seq_len": 16})
    assert plan_run(cell, CellResources(3)).cfg.threads == 3
    assert plan_run(cell).cfg.threads is None
    pinned = Cell.from_options({"steps": 2, "batch_size": 2, "seq_len": 16, "threads": 1})
    assert plan_run(pinned, CellResources(3)).cfg.threads == 1
    assert cell.id == pinned.id  # threads never names a run


def losses(run_dir: Path) -> list:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_rerun_with_fewer_cells_left_keeps_the_recorded_thread_count(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(local, "cpu_count", lambda: 2)  # as on a 2-core machine, wherever this runs
    path = tmp_path / "g.toml"
    path.write_text(textwrap.dedent("""
        [base]
        layers = 2
        batch_size = 4
        seq_len = 32
        eval_batches = 1
        steps = 6
        [axes]
        seed = [0, 1, 2]
    """))
    grid = load_grid(path)
    args = GridRunOptions.from_args(build_parser().parse_args(["grid", str(path), "--workers", "2", "--quiet"]))
    out = tmp_path / "out"
    assert run_checked_grid(grid, out, args) == 0
    assert "3 to run on 2 workers, 1 thread each" in capsys.readouterr().out
    last = out / grid.cells[-1].id
    reference = losses(last)
    assert json.loads((last / "config.json").read_text())["train"]["threads"] == 1
    assert all(c["threads"] == 1 for c in json.loads((out / "grid.json").read_text())["cells"])
    # As if the first run had stopped before this cell started: one cell left, two workers.
    for item in last.iterdir():
        item.unlink()
    assert run_checked_grid(grid, out, args) == 0
    assert "1 to run on 1 worker, 1 thread each" in capsys.readouterr().out  # was: 2 threads
    assert json.loads((last / "config.json").read_text())["train"]["threads"] == 1
    assert losses(last) == reference
