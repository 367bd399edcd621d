"""Resuming trusts nothing on disk: a checkpoint cannot run code, a damaged one is refused in one
line, and a damaged metrics file loses no valid row."""
import json

import pytest
import torch

import ablate.train as T
from ablate.cell import Cell
from ablate.cli import main
from ablate.errors import ConfigError

from tests.helpers.interrupting import interrupted_at

OPTIONS = {"layers": 2, "steps": 6, "checkpoint_every": 3, "probes": False, "eval_batches": 1,
           "final_eval_batches": 1}


class Payload:
    """Unpickling this runs code: the side effect a planted checkpoint would cause."""

    def __reduce__(self):
        return (open, ("/tmp/ablate-planted-pickle-ran", "w"))


def _interrupted_run(tmp_path, monkeypatch, stop_at=2):
    cell = Cell.from_options(OPTIONS)
    run_dir = tmp_path / cell.id
    with interrupted_at(monkeypatch, stop_at), pytest.raises(T.Interrupted):
        T.train(cell, run_dir)
    return cell, run_dir


def test_a_planted_pickle_in_a_checkpoint_never_runs(tmp_path, monkeypatch):
    import os

    marker = "/tmp/ablate-planted-pickle-ran"
    if os.path.exists(marker):
        os.unlink(marker)
    cell, run_dir = _interrupted_run(tmp_path, monkeypatch)
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    ckpt["extra"] = Payload()  # what an attacker adds to a real checkpoint
    torch.save(ckpt, run_dir / "checkpoint.pt")
    with pytest.raises(ConfigError) as e:
        T.train(cell, run_dir)
    assert not os.path.exists(marker)  # the payload did not execute
    assert "checkpoint.pt cannot be resumed from" in str(e.value) and "\n" not in str(e.value)
    assert "remove it" in str(e.value)


def test_a_genuine_checkpoint_loads_with_weights_only(tmp_path, monkeypatch):
    cell, run_dir = _interrupted_run(tmp_path, monkeypatch)
    with open(run_dir / "checkpoint.pt", "rb") as f:
        assert b"__reduce__" not in f.read()
    torch.load(run_dir / "checkpoint.pt", weights_only=True)  # raises if it needed arbitrary unpickling
    summary = T.train(cell, run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 6


def test_a_garbage_metrics_line_on_resume_keeps_every_valid_row(tmp_path, monkeypatch, capsys):
    reference = T.train(Cell.from_options(OPTIONS), tmp_path / "ref")
    ref_rows = [json.loads(x) for x in (tmp_path / "ref" / "metrics.jsonl").read_text().splitlines()]
    cell, run_dir = _interrupted_run(tmp_path / "run", monkeypatch)
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    # garbage in the middle, a JSON list, an object without a step, and a line cut short at the end
    path.write_text("\n".join([lines[0], "@@garbage@@", "[1, 2]", '{"loss": 1.0}', lines[1], lines[2], '{"step": 3, "lo'])
                    + "\n")
    summary = T.train(cell, run_dir)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref_rows]
    assert summary["final_loss"] == reference["final_loss"]
    assert "skipped 4 unreadable line(s)" in capsys.readouterr().err


def test_symlinked_temporaries_in_a_run_folder_never_clobber_their_targets(tmp_path, monkeypatch):
    """checkpoint.tmp and metrics.tmp were fixed names the trainer wrote through; a link planted
    there must leave its target alone, through a checkpoint and a resume."""
    cell, run_dir = _interrupted_run(tmp_path, monkeypatch)
    targets = {}
    for name in ("checkpoint.tmp", "metrics.tmp", ".checkpoint.pt.tmp"):
        target = tmp_path / f"precious-{name.strip('.')}"
        target.write_text("keep me")
        (run_dir / name).unlink(missing_ok=True)
        (run_dir / name).symlink_to(target)
        targets[name] = target
    summary = T.train(cell, run_dir)
    assert summary["status"] == "completed"
    for name, target in targets.items():
        assert target.read_text() == "keep me", name


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_one_line_exit_2_no_result_and_a_clean_resume(tmp_path, monkeypatch,
                                                                                       capsys):
    import errno

    import torch

    real_save, saves = torch.save, []

    class FullDisk:
        """A file on a disk that fills up: torch.save wraps the OSError in its own RuntimeError."""

        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 4096:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(data)

        def flush(self):
            self.f.flush()

    def save(obj, f, *args, **kwargs):
        saves.append(1)
        return real_save(obj, FullDisk(f) if len(saves) == 2 else f, *args, **kwargs)  # the second checkpoint

    monkeypatch.setattr(torch, "save", save)
    args = ["train", "--layers", "2", "--steps", "6", "--checkpoint-every", "2", "--eval-batches", "1",
            "--final-eval-batches", "1", "--quiet", "--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no space left on device" in err.lower()
    (run_dir,) = (tmp_path / "o").iterdir()
    assert not (run_dir / "summary.json").exists() and not list(run_dir.glob("error-attempt*"))
    assert not list(run_dir.glob(".*.tmp"))
    monkeypatch.setattr(torch, "save", real_save)  # space freed
    assert main(args) == 0
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(6))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
