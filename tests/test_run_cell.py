"""ablate.cell.run_cell: a cell recorded failed is tried again on a rerun."""
from __future__ import annotations

import json
from pathlib import Path

import ablate.train
from ablate.cli import main


BASE = ["train", "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
        "--device", "cpu", "--threads", "1", "--quiet"]


CELL = "pre.layernorm.gelu.dense.res__batch_size=2__seq_len=16__steps=3__seed=0"


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_a_failed_run_is_tried_again_on_rerun_and_its_rerun_never_exits_0(tmp_path, capsys, monkeypatch):
    real = ablate.train.train
    monkeypatch.setattr(ablate.train, "train", lambda *a, **k: (_ for _ in ()).throw(MemoryError("injected")))
    args = [*BASE, "--out", str(tmp_path)]
    run_dir = tmp_path / CELL
    assert main(args) == 1
    assert summary(run_dir)["status"] == "failed"
    capsys.readouterr()
    assert main(args) == 1  # was: "already finished (failed); nothing to do", exit 0
    err = capsys.readouterr().err
    assert "failed before (MemoryError: injected); trying again" in err and "failed: MemoryError" in err
    assert summary(run_dir)["attempts"] == 2
    monkeypatch.setattr(ablate.train, "train", real)
    assert main(args) == 0
    assert summary(run_dir)["status"] == "completed"
    # Nothing of the failed attempts is lost.
    assert sorted(p.name for p in run_dir.glob("error-attempt*")) == ["error-attempt0.txt", "error-attempt1.txt"]
    assert all("MemoryError: injected" in p.read_text() for p in run_dir.glob("error-attempt*"))
    assert [json.loads((run_dir / f"summary.failed-{k}.json").read_text())["attempts"] for k in (0, 1)] == [1, 2]
    capsys.readouterr()
    assert main(args) == 0 and "already finished (completed)" in capsys.readouterr().out  # completed: never again
