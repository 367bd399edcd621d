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


# ----------------------------------------------------------------------------- item 1: plugins

PLUGIN = """
import torch
from ablate.variants import ACTIVATIONS

@ACTIVATIONS.register("mish_r2")
def mish(x):
    return x * torch.tanh(torch.nn.functional.softplus(x))
"""
TINY = ("--layers", 2, "--steps", 2, "--eval-batches", 1, "--final-eval-batches", 1, "--quiet")


def sha256(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_plugin_edited_between_kill_and_rerun_is_refused_naming_both_hashes(tmp_path):
    plugin = tmp_path / "m.py"
    plugin.write_text(PLUGIN)
    args = ("train", "--import", plugin, "--act", "mish_r2", *TINY, "--out", tmp_path / "o")
    first = run_cli(*args, timeout=300)
    assert first.returncode == 0, first.stderr
    (run_dir,) = (tmp_path / "o").iterdir()
    (run_dir / "summary.json").unlink()  # as if killed before it finished: the rerun resumes it
    before = sha256(plugin)
    plugin.write_text(PLUGIN.replace("softplus(x)", "softplus(x) * 0.5"))
    config = (run_dir / "config.json").read_text()
    rerun = run_cli(*args, timeout=300)
    assert rerun.returncode == 2, rerun.stderr
    assert rerun.stderr.count("\n") == 1 and "Traceback" not in rerun.stderr
    assert str(plugin) in rerun.stderr and before in rerun.stderr and sha256(plugin) in rerun.stderr
    assert (run_dir / "config.json").read_text() == config  # its record is not overwritten
    assert not (run_dir / "summary.json").exists()


# ----------------------------------------------------------------------------- item 2: grid imports

MARKING_PLUGIN = PLUGIN + """
from pathlib import Path
Path(__file__).with_name("RAN").write_text("the plugin ran")
"""


def grid_with_import(tmp_path: Path) -> tuple[Path, Path]:
    plugin = tmp_path / "x.py"
    plugin.write_text(MARKING_PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text('name = "imp"\nimports = ["x.py"]\n[base]\nlayers = 2\nsteps = 2\n[axes]\nact = ["mish_r2", "gelu"]\n')
    return grid, plugin


def test_a_grid_files_import_is_listed_with_its_hash_and_not_run_on_dry_run(tmp_path):
    grid, plugin = grid_with_import(tmp_path)
    dry = run_cli("grid", grid, "--dry-run", "--out", tmp_path / "out", cwd=tmp_path)
    assert not (tmp_path / "RAN").exists()
    assert f"imports {plugin} ({sha256(plugin)}; registers ACTIVATIONS 'mish_r2', not run)" in dry.stderr
    assert dry.returncode == 2 and "--trust-imports" in dry.stderr.splitlines()[-1]
    assert "Traceback" not in dry.stderr
    trusted = run_cli("grid", grid, "--dry-run", "--trust-imports", "--out", tmp_path / "out", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    assert (tmp_path / "RAN").exists() and "pre.layernorm.mish_r2.dense.res" in trusted.stdout
    assert not (tmp_path / "out").exists()


def test_a_grid_files_import_runs_only_with_consent(tmp_path):
    grid, plugin = grid_with_import(tmp_path)
    refused = run_cli("grid", grid, "--out", tmp_path / "out", "--set", "steps=1", cwd=tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "RAN").exists() and not (tmp_path / "out").exists()
    assert sha256(plugin) in refused.stderr and "Traceback" not in refused.stderr
    assert "--trust-imports" in refused.stderr.splitlines()[-1] and f"--import {plugin}" in refused.stderr
    # The same file named on the command line is the user's consent.
    named = run_cli("grid", grid, "--import", plugin, "--dry-run", "--out", tmp_path / "out", cwd=tmp_path)
    assert named.returncode == 0, named.stderr
    assert (tmp_path / "RAN").exists() and "pre.layernorm.mish_r2.dense.res" in named.stdout


def test_a_plugin_file_that_is_not_python_is_one_line(tmp_path):
    plugin = tmp_path / "m.txt"
    plugin.write_text(PLUGIN)
    result = run_cli("variants", "--import", plugin)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "m.txt" in result.stderr and ".py" in result.stderr and "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- item 3: export paths


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.mark.parametrize("kind", ["absolute", "climbing"])
def test_a_tensorboard_export_writes_nothing_outside_out_whatever_the_group_says(tmp_path, kind):
    runs, out = tmp_path / "runs", tmp_path / "a" / "b" / "tb"
    group = str(tmp_path / "x" / "ESCAPE") if kind == "absolute" else "../../../x/ESCAPE"
    write_run(runs, V, 0, group=group)
    write_run(runs, V, 1, group="..")
    before = files_under(tmp_path)
    assert main(["export", str(runs), "--to", "tensorboard", "--out", str(out)]) == 0
    escaped = {p for p in files_under(tmp_path) - before if out not in p.parents and p != out}
    assert escaped <= {tmp_path / "a", tmp_path / "a" / "b"}  # --out's own parents, nothing else
    assert len(list(out.rglob("events.out.tfevents.*.start*"))) == 2


# ----------------------------------------------------------------------------- item 6: planted links


def plant_links(victim_dir: Path, paths: list[Path]) -> dict[Path, Path]:
    """A link at each output path, to a victim file of its own; returns link -> victim."""
    links = {}
    for i, path in enumerate(paths):
        victim = victim_dir / f"victim-{i}"
        victim.write_text("keep me\n")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        path.symlink_to(victim)
        links[path] = victim
    return links


def test_report_outputs_planted_as_links_leave_their_targets_untouched(tmp_path):
    runs, victims = tmp_path / "runs", tmp_path / "victims"
    victims.mkdir()
    write_grid(runs, [write_run(runs, V, s) for s in (0, 1)])
    assert main(["report", str(runs)]) == 0
    outputs = [runs / "report.md", runs / "summary.csv", runs / "cells.csv", *sorted((runs / "plots").iterdir())]
    assert any(p.suffix == ".png" for p in outputs)
    links = plant_links(victims, outputs)
    assert main(["report", str(runs)]) == 0
    assert all(v.read_text() == "keep me\n" for v in links.values())
    assert all(not p.is_symlink() and p.is_file() for p in links)


def test_export_temporaries_planted_as_links_leave_their_targets_untouched(tmp_path):
    runs, out, victims = tmp_path / "runs", tmp_path / "tb", tmp_path / "victims"
    victims.mkdir()
    run = write_run(runs, V, 0)
    run_dir = out / run.group / "seed=0"
    links = plant_links(victims, [run_dir / f".part-{i:06d}.tmp" for i in range(2)] + [out / ".part-000000.tmp"])
    assert main(["export", str(runs), "--to", "tensorboard", "--out", str(out)]) == 0
    assert all(v.read_text() == "keep me\n" for v in links.values())
    assert list(run_dir.glob("events.out.tfevents.*"))


# ----------------------------------------------------------------------------- items 7, 8: export


def clean_env(tmp_path: Path) -> dict:
    """HOME and TMPDIR in an empty folder of the test's, and no W&B settings from outside."""
    home = tmp_path / "home"
    (home / "tmp").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(home), TMPDIR=str(home / "tmp"), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), WANDB_SILENT="true")
    return env


def test_a_wandb_export_leaves_nothing_outside_out(tmp_path):
    pytest.importorskip("wandb")
    runs, out = tmp_path / "runs", tmp_path / "out"
    write_run(runs, V, 0)
    env = clean_env(tmp_path)
    result = run_cli("export", runs, "--to", "wandb", "--out", out, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert list(out.glob("wandb/offline-run-*"))
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "home").rglob("*") if p.is_file())
    assert left == []


@pytest.mark.parametrize("target", ["tensorboard", "wandb"])
def test_export_skips_a_step_out_of_range_with_a_warning(tmp_path, target, monkeypatch):
    pytest.importorskip(target)
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var))
    runs, out = tmp_path / "runs", tmp_path / "out"
    run = write_run(runs, V, 0, status="running")
    with open(run.path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 2**63, "loss": 1.0}) + "\n")
    result = run_cli("export", runs, "--to", target, "--out", out, env={**os.environ, "WANDB_SILENT": "true"},
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and str(2**63) in result.stderr


# ----------------------------------------------------------------------------- item 4: a full disk


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


# ----------------------------------------------------------------------------- item 11: test readers


def test_the_grid_run_tests_readers_tolerate_a_line_being_written(tmp_path):
    import cluster_helpers
    import test_commands_grid

    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "loss": 4.0}\n{"step": 1, "loss": 3.9}\n{"step": 2, "lo')
    assert test_commands_grid.metrics_steps(tmp_path) == [0, 1]
    assert [r["step"] for r in cluster_helpers.metrics(tmp_path)] == [0, 1]
    assert cluster_helpers.logged_steps(tmp_path) == 2


# ----------------------------------------------------------------------------- item 10: a lost line


def test_the_step_of_a_line_dropped_on_resume_is_kept_in_the_record_and_named_in_the_report(tmp_path, capsys):
    import ablate.train as T
    from ablate.cell import Cell, run_cell

    cell = Cell.from_options({"layers": 2, "steps": 6, "checkpoint_every": 2, "eval_batches": 1,
                              "final_eval_batches": 1})
    run_dir = tmp_path / "g" / cell.id
    calls = []

    def killed_after_step_3():
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # after the checkpoint at step 2: the rerun resumes there

    with pytest.raises(KeyboardInterrupt):
        T.train(cell, run_dir, after_step=killed_after_step_3)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = '{"step": 1, "lo'  # damaged mid-file: the resume cannot keep it
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run_cell(cell, tmp_path / "g")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["missing_steps"] == [1]
    assert "step 1" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "g")]) == 0
    report = (tmp_path / "g" / "report.md").read_text()
    assert "no metrics row for step 1" in report


# ----------------------------------------------------------------------------- item 12: smaller


def test_grid_json_counts_never_go_back_with_two_grid_processes_on_one_folder(tmp_path):
    from ablate.grid_state import GridJson

    record = {"name": "two", "cells": [{"id": f"c{i}", "group": f"c{i}", "options": {}} for i in range(3)]}
    a, b = GridJson(tmp_path, record), GridJson(tmp_path, record)  # one per grid process
    a.write(), b.write()
    seen = []
    for i, writer in ((0, b), (1, a), (2, b)):  # each process finishes a cell in turn
        (tmp_path / f"c{i}").mkdir()
        (tmp_path / f"c{i}" / "summary.json").write_text(json.dumps({"status": "completed"}))
        writer.write([f"c{i}"])
        seen.append(json.loads((tmp_path / "grid.json").read_text())["counts"].get("completed", 0))
        (a if writer is b else b).write(["c2"])  # the other process reports on a cell of its own
        seen.append(json.loads((tmp_path / "grid.json").read_text())["counts"].get("completed", 0))
    assert seen == sorted(seen) and seen[-1] == 3, seen


def test_report_refuses_a_folder_whose_only_cell_cannot_be_read(tmp_path, capsys):
    run = write_run(tmp_path, V, 0)
    write_grid(tmp_path, [run])
    (run.path / "config.json").write_text('{"cell_id": "x", "vari')  # cut mid-write
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "no cells started" not in err and err.strip().count("\n") <= 1
    assert not (tmp_path / "report.md").exists()


def test_a_commands_python_warnings_are_one_line_each_without_source(monkeypatch, capsys):
    import warnings

    import ablate.commands.variants as command

    def warns(args):
        warnings.warn("a library's warning\nover two lines", UserWarning)
        return 0

    monkeypatch.setattr(command, "run", warns)
    assert main(["variants"]) == 0
    assert capsys.readouterr().err == "ablate variants: warning: a library's warning\n"
