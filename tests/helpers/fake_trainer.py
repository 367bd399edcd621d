"""A fake trainer behind the real run_cell, and the small grid files the scheduling tests
(tests/ablate/grid/, tests/ablate/backends/test_local.py) run it on: no training, markers in a
cell's options make it fail or die."""
import json
import os
import textwrap
import time
from pathlib import Path

from ablate.cli import build_parser
from ablate.core.rundir import write_json_atomic
from ablate.engine.cell import run_cell
from ablate.grid.runner import GridRunOptions


def write_grid(tmp_path, text, name="g.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _fake_train(cell, run_dir, quiet=True, plan=None):
    """A trainer stand-in: records who ran it, fails or dies on marker option values."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "attempts", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"),
                            "threads": plan.cfg.threads}) + "\n")
    if cell.options.get("min_lr_ratio") == 0.123:
        raise RuntimeError("injected failure")
    if cell.options.get("beta1") == 0.123:
        os._exit(3)  # the worker process dies mid-cell
    time.sleep(float(cell.options.get("weight_decay", 0.1)))  # weight_decay doubles as seconds of "training"
    summary = {"status": "completed", "final_loss": 1.0 + cell.options.get("seed", 0), "final_val_loss": 1.5,
               "diverged_at_step": None, "steps": 1, "wall_time_s": 0.0, "error": None}
    write_json_atomic(run_dir / "summary.json", summary)
    return summary


def fake_cell(cell, out_root, retries=0, quiet=True, execution=None):
    """The real run_cell (skip, lock, retry, failed summary) around the fake trainer.
    Importable by name, so spawned workers can run it."""
    import ablate.engine.train

    real = ablate.engine.train.train
    ablate.engine.train.train = _fake_train
    try:
        return run_cell(cell, out_root, retries, quiet, execution)
    finally:
        ablate.engine.train.train = real


def attempts(run_dir):
    path = Path(run_dir) / "attempts"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def grid_args(*argv):
    return GridRunOptions.from_args(build_parser().parse_args(["grid", *map(str, argv)]))


SMALL = """
    name = "small"
    [base]
    weight_decay = 0.0
    [axes]
    norm = ["pre", "post"]
    seed = [0, 1, 2]
"""
