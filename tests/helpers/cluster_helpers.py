"""Shared by the cluster tests (tests/ablate/backends/test_ray_backend.py, test_slurm_backend.py):
tiny grids, running `ablate grid` as a process, and the checks every cell must pass (each step
logged exactly once)."""
import contextlib
import fcntl
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.live_files import complete_lines, complete_rows

# Tiny, fast cells: a 2-block model, short sequences, few eval batches, one torch thread (so a
# cell's bits do not depend on where it runs).
TINY_LAYERS = 2
TINY = """
    [base]
    model = "tiny"
    layers = {layers}
    batch_size = {batch_size}
    seq_len = {seq_len}
    eval_batches = 2
    eval_every = {eval_every}
    checkpoint_every = {checkpoint_every}
    threads = 1
    steps = {steps}
"""
TIMING_KEYS = ("time_s", "tokens_per_s")
# Machine-wide, like what it guards: Ray's address="auto" looks for the Ray instances running on
# this machine, and with a test's own local Ray up at the same moment (tests run two at once)
# it may connect to that one instead of the cluster.
RAY_LOCK = Path(tempfile.gettempdir()) / "ablate-tests-ray.lock"


@contextlib.contextmanager
def one_ray_at_a_time():
    """Held while a test has a Ray instance of its own up, or looks for the running cluster."""
    # Read-only (a lock needs no more, so another user's lock file serves too), never through a link.
    fd = os.open(RAY_LOCK, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


def write_grid(folder: Path, axes: str, *, steps: int, name: str, batch_size: int = 4, seq_len: int = 32,
               checkpoint_every: int = 100_000, imports: tuple[str, ...] = ()) -> Path:
    """A tiny grid file; `imports`: plugin files it names (run only under --trust-imports)."""
    path = folder / f"{name}.toml"
    base = TINY.format(layers=TINY_LAYERS, steps=steps, batch_size=batch_size, seq_len=seq_len,
                       eval_every=max(steps // 2, 1), checkpoint_every=checkpoint_every)
    head = f"imports = {json.dumps(list(imports))}\n" if imports else ""
    path.write_text(head + f'name = "{name}"\n' + textwrap.dedent(base) + "[axes]\n" + textwrap.dedent(axes))
    return path


def metrics(run_dir: Path) -> list[dict]:
    return complete_rows(run_dir / "metrics.jsonl")  # a line still being written is not read


def without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(complete_lines(path)) if path.exists() else 0  # polled while a cell trains


def assert_complete(grid, out: Path, steps: int) -> None:
    """Every cell finished: summary completed, metrics steps 0..steps-1 each exactly once, and
    grid.json agrees."""
    for cell in grid.cells:
        run_dir = out / cell.id
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "completed", (cell.id, summary)
        assert [r["step"] for r in metrics(run_dir)] == list(range(steps)), cell.id
    state = json.loads((out / "grid.json").read_text())
    assert state["counts"] == {"completed": len(grid.cells)}, state["counts"]


def trained_ids(text: str) -> list[str]:
    """Cell ids a grid process reported trained to the end (not skipped, not busy)."""
    return re.findall(r"^\[\d+/\d+\] completed (\S+)  final loss", text, re.M)


def grid_process(*argv, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ablate", "grid", *map(str, argv)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_grid(*argv, timeout: float = 300, env=None) -> tuple[int, str]:
    proc = grid_process(*argv, env=env)
    try:
        text = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"ablate grid {' '.join(map(str, argv))} still running after {timeout} s: "
                             + proc.communicate()[0])
    return proc.returncode, text


def wait_until(predicate, timeout: float, what: str, poll: float = 0.2) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"not within {timeout} s: {what}")


def killable_grid(tmp: Path, name: str, seconds: float = 5.0) -> tuple[Path, int]:
    """A 2-cell grid whose cells train about `seconds` each here, checkpointing six times: a
    kill a third of the way in lands mid-cell. Returns (grid file, steps per cell)."""
    batch_size, seq_len = 8, 64
    steps = int(steps_per_second(tmp, batch_size, seq_len) * seconds)
    path = write_grid(tmp, "seed = [0, 1]\n", steps=steps, name=name, batch_size=batch_size, seq_len=seq_len,
                      checkpoint_every=max(steps // 6, 1))
    return path, steps


def steps_per_second(tmp: Path, batch_size: int, seq_len: int) -> float:
    """This machine's training rate for the tiny cell, now (the cluster tests size a cell that
    must outlast a time limit by it)."""
    steps = 150
    proc = subprocess.run([sys.executable, "-m", "ablate", "train", "--model", "tiny", "--layers", "2",
                           "--batch-size", str(batch_size), "--seq-len", str(seq_len), "--steps", str(steps),
                           "--eval-every", str(steps), "--eval-batches", "2", "--threads", "1",
                           "--out", str(tmp / "calibrate")], capture_output=True, text=True, timeout=120)
    found = re.search(r"completed after \d+ steps in ([\d.]+)s", proc.stdout)
    assert proc.returncode == 0 and found, proc.stdout + proc.stderr
    return steps / max(float(found.group(1)), 1e-3)


def engine_missing(reason: str) -> None:
    """Skip the calling test module: its engine is not running here. Under
    ABLATE_REQUIRE_CLUSTERS=1 (CI, which starts the engines) fail instead: a broken setup must
    not pass as a skip."""
    if os.environ.get("ABLATE_REQUIRE_CLUSTERS"):
        pytest.fail(f"ABLATE_REQUIRE_CLUSTERS is set but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
