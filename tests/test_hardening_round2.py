"""Hardening, round two (issue 25): plugins edited under a run, a grid file's imports, exports
that must stay inside --out, a full disk, planted links, FIFOs and lost metrics lines."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_runs import write_grid, write_run

from ablate.cli import main

REPO = Path(__file__).resolve().parents[1]
V = "pre.layernorm.gelu.dense.res"


def run_cli(*args, cwd=None, env=None, timeout=60):
    """`python -m ablate ...` in a child process (a hang is a failure, not a stuck suite)."""
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, args)], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True)


# ----------------------------------------------------------------------------- item 9: status


def test_status_returns_when_a_cells_metrics_is_a_fifo(tmp_path):
    running = write_run(tmp_path, V, 0, [4.0, 3.8], status="running", planned_steps=10)
    write_grid(tmp_path, [running], base={"model": "tiny", "steps": 10})
    (running.path / "metrics.jsonl").unlink()
    os.mkfifo(running.path / "metrics.jsonl")  # nobody ever writes it: opening it to read would block
    os.unlink(running.path / "config.json")
    os.mkfifo(running.path / "config.json")
    result = run_cli("status", tmp_path, timeout=20)
    assert result.returncode == 0, result.stderr
    assert "1 cell: " in result.stdout and "interrupted" in result.stdout
