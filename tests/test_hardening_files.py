"""Run files that are not files, and export folders that are links: a FIFO where `grid` or
`train` reads a run file is refused in one line (exit 2), as any other damaged file, instead of
blocking the reader forever; a link planted at export's default folders is replaced, never
written through; report and export name a cell whose metrics they cannot read; a long group
name does not fail a TensorBoard export. Commands that could hang run as child processes under
a timeout."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ablate.cli import main
from cli_lines import one_line
from synthetic_runs import write_grid, write_run

TIMEOUT = 300  # a FIFO used to block the reader forever
TRAIN = ["train", "--steps", "6", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
         "--final-eval-batches", "1", "--checkpoint-every", "2", "--device", "cpu", "--threads", "1", "--quiet"]


def child(args, tmp_path, timeout=TIMEOUT):
    environment = {**os.environ, "ABLATE_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "ablate", *args], capture_output=True, text=True, env=environment,
                          timeout=timeout, cwd=tmp_path)


def fifo_at(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A run stopped after its step-2 checkpoint (as Ctrl-C leaves it): config.json,
    metrics.jsonl and checkpoint.pt, and no summary.json."""
    import ablate.train

    root = tmp_path_factory.mktemp("stopped")
    os.environ["ABLATE_CACHE"], old = str(root / "cache"), os.environ.get("ABLATE_CACHE")
    real, received = ablate.train.lr_at, []

    def lr_at(step, *args, **kwargs):
        if step == 2:
            received.append(2)
        return real(step, *args, **kwargs)

    import contextlib

    @contextlib.contextmanager
    def signals():
        yield received

    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(ablate.train, "lr_at", lr_at)
        mp.setattr(ablate.train, "_graceful_signals", signals)
        assert main([*TRAIN, "--out", str(root / "run")]) == 130
    finally:
        mp.undo()
        if old is None:
            del os.environ["ABLATE_CACHE"]
        else:
            os.environ["ABLATE_CACHE"] = old
    (run_dir,) = (root / "run").iterdir()
    assert (run_dir / "checkpoint.pt").is_file() and not (run_dir / "summary.json").exists()
    return root


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl", "checkpoint.pt"])
def test_resuming_a_run_with_a_fifo_for_a_file_is_refused_in_one_line(name, stopped_run, tmp_path):
    import shutil

    shutil.copytree(stopped_run, tmp_path, dirs_exist_ok=True, symlinks=True)
    (run_dir,) = (tmp_path / "run").iterdir()
    fifo_at(run_dir / name)
    done = child([*TRAIN, "--out", str(tmp_path / "run")], tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"{run_dir / name} cannot be" in one_line(done.stderr) and "not a regular file" in done.stderr


GRID = """\
name = "g"
[base]
model = "tiny"
layers = 2
batch_size = 2
seq_len = 16
eval_batches = 1
final_eval_batches = 1
threads = 1
steps = 2
[axes]
seed = [0]
"""


@pytest.fixture(scope="module")
def grid_done(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    (root / "g.toml").write_text(GRID)
    done = child(["grid", str(root / "g.toml"), "--out", str(root / "out"), "--workers", "1", "--quiet"], root)
    assert done.returncode == 0, done.stderr
    return root


@pytest.mark.parametrize("name", ["cell config.json", "grid.json"])
def test_rerunning_a_grid_with_a_fifo_for_a_file_does_not_hang(name, grid_done, tmp_path):
    import shutil

    shutil.copytree(grid_done, tmp_path, dirs_exist_ok=True, symlinks=True)
    out = tmp_path / "out"
    (cell,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if name == "grid.json":  # damaged grid.json: rewritten by the run, as before
        fifo_at(out / "grid.json")
        done = child(["grid", str(tmp_path / "g.toml"), "--out", str(out), "--workers", "1", "--quiet"], tmp_path)
        assert done.returncode == 0, done.stderr
        assert json.loads((out / "grid.json").read_text())["counts"] == {"completed": 1}
    else:  # a damaged cell file: the grid is refused before anything trains
        fifo_at(cell / "config.json")
        done = child(["grid", str(tmp_path / "g.toml"), "--out", str(out), "--workers", "1", "--quiet"], tmp_path)
        assert done.returncode == 2, done.stderr
        assert f"{cell / 'config.json'} cannot be read" in one_line(done.stderr)
