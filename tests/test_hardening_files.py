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
from pathlib import Path

import pytest

from ablate.cli import main
from tests.helpers.cli_lines import one_line
from tests.helpers.synthetic_runs import write_grid, write_run

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
    import ablate.engine.train

    root = tmp_path_factory.mktemp("stopped")
    os.environ["ABLATE_CACHE"], old = str(root / "cache"), os.environ.get("ABLATE_CACHE")
    real, received = ablate.engine.train.lr_at, []

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
        mp.setattr(ablate.engine.train, "lr_at", lr_at)
        mp.setattr(ablate.engine.train, "_graceful_signals", signals)
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


# ------------------------------------------------------------- export's own folders as links

V = "pre.layernorm.gelu.dense.res"


def _victim(tmp_path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "kept.txt").write_text("mine")
    return victim


def test_a_link_planted_at_dir_tensorboard_is_replaced_not_written_through(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    runs = tmp_path / "runs"
    write_run(runs, V, 0)
    victim = _victim(tmp_path)
    (runs / "tensorboard").symlink_to(victim)
    assert main(["export", str(runs), "--to", "tensorboard"]) == 0
    assert sorted(p.name for p in victim.iterdir()) == ["kept.txt"]
    assert not (runs / "tensorboard").is_symlink()
    assert list((runs / "tensorboard").rglob("events.out.tfevents.*"))


def test_a_link_planted_at_dir_wandb_is_replaced_not_written_through(tmp_path):
    pytest.importorskip("wandb")
    runs = tmp_path / "runs"
    write_run(runs, V, 0)
    victim = _victim(tmp_path)
    (runs / "wandb").symlink_to(victim)
    home = tmp_path / "home"
    env = {**os.environ, "HOME": str(home), "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config")}
    done = subprocess.run([sys.executable, "-m", "ablate", "export", str(runs), "--to", "wandb"], capture_output=True,
                          text=True, env=env, timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in victim.iterdir()) == ["kept.txt"]
    assert not (runs / "wandb").is_symlink() and list((runs / "wandb").glob("offline-run-*"))


def test_report_and_export_replace_a_planted_link_by_one_rule(tmp_path):
    """report's plots/ and export's folders go through one helper (ablate/core/safe_files.py)."""
    from ablate.core.safe_files import output_folder

    victim = _victim(tmp_path)
    (tmp_path / "plots").symlink_to(victim)
    assert output_folder(tmp_path / "plots") == tmp_path / "plots"
    assert (tmp_path / "plots").is_dir() and not (tmp_path / "plots").is_symlink()
    assert sorted(p.name for p in victim.iterdir()) == ["kept.txt"]


# ------------------------------------------------- finished cells whose metrics cannot be read


def _spoil_metrics(run, kind):
    metrics = run.path / "metrics.jsonl"
    metrics.unlink()
    if kind == "a FIFO":
        os.mkfifo(metrics)
    elif kind == "a link to /dev/zero":
        metrics.symlink_to("/dev/zero")


@pytest.mark.parametrize("kind", ["missing", "a FIFO", "a link to /dev/zero"])
def test_report_names_a_finished_cell_whose_metrics_cannot_be_read(kind, tmp_path, capsys):
    runs = [write_run(tmp_path, V, seed) for seed in range(2)]
    write_grid(tmp_path, runs)
    _spoil_metrics(runs[1], kind)
    assert main(["report", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if runs[1].cell_id in line and "metrics.jsonl" in line]
    assert len(lines) == 1, err
    assert f"{runs[1].cell_id}: finished, but its metrics.jsonl" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("kind", ["missing", "a FIFO", "a link to /dev/zero"])
def test_export_names_a_finished_cell_whose_metrics_cannot_be_read(kind, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    runs = [write_run(tmp_path / "runs", V, seed) for seed in range(2)]
    _spoil_metrics(runs[1], kind)
    assert main(["export", str(tmp_path / "runs"), "--to", "tensorboard", "--out", str(tmp_path / "tb")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if runs[1].cell_id in line]
    assert len(lines) == 1 and "metrics.jsonl" in lines[0], err


def test_a_300_character_group_is_exported_under_a_shortened_name_and_said(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from ablate.analysis.export import MAX_COMPONENT_BYTES, path_component

    runs = tmp_path / "runs"
    long_group = "g" * 300
    long_run = write_run(runs, V, 0, group=long_group)
    write_run(runs, V, 1)
    assert main(["export", str(runs), "--to", "tensorboard", "--out", str(tmp_path / "tb")]) == 0
    err = capsys.readouterr().err
    assert sum(long_run.cell_id in line and "300 characters" in line for line in err.splitlines()) == 1, err
    short = path_component(long_group)
    assert len(short.encode()) == MAX_COMPONENT_BYTES and short == path_component(long_group)  # deterministic
    assert short != path_component("g" * 301)  # and still one name per group
    assert list((tmp_path / "tb" / short / "seed=0").glob("events.out.tfevents.*"))
    assert len(list((tmp_path / "tb").rglob("events.out.tfevents.*.start*"))) == 2


# ------------------------------------------- state and input files read through one bounded reader
# (ablate/core/bounded_read.py): a damaged state file is set aside with one line, a damaged input file
# is refused in one line (exit 2); nothing blocks, reads without end, or ends in a traceback.

FAST = 60  # a FIFO blocked, /dev/zero read without end: a regression fails here instead of hanging
KEY = {"claim": "c", "scale": "quick", "overrides": {}}
NESTED = "[" * 3000 + "]" * 3000
DAMAGED_DECIDE = {
    "seconds 1e999": '{"version": 1, "key": KEY, "looks": [], "seconds": 1e999}',
    "seconds Infinity": '{"version": 1, "key": KEY, "looks": [], "seconds": Infinity}',
    "seconds '1e999'": '{"version": 1, "key": KEY, "looks": [], "seconds": "1e999"}',
    "seconds of 400 digits": '{"version": 1, "key": KEY, "looks": [], "seconds": ' + "9" * 400 + "}",
    "nested looks": '{"version": 1, "key": KEY, "looks": ' + NESTED + ', "seconds": 1}',
    "nested": NESTED,
}


@pytest.mark.parametrize("name", sorted(DAMAGED_DECIDE))
def test_a_damaged_decide_json_is_set_aside_and_the_budget_starts_afresh(name, tmp_path):
    """E2, E3: a non-finite or huge `seconds`, or JSON nested thousands deep, used to end every
    rerun in a traceback (or an infinite time spent that could not be written back)."""
    from ablate.claims.looks import LookLog

    path = tmp_path / "decide" / "decide.json"
    path.parent.mkdir()
    path.write_text(DAMAGED_DECIDE[name].replace("KEY", json.dumps(KEY)))
    log, why = LookLog.load(path, KEY)
    assert (log.looks, log.seconds) == ([], 0.0)
    assert why.startswith(f"{path}: ") and "set aside" in why and "\n" not in why
    log.write(path)  # and the fresh record is written over it
    assert LookLog.load(path, KEY)[1] == ""


PLAN = "backtest_plan.json"


@pytest.mark.parametrize("text", ["[1, 2]", '"a plan"', "7", "null", NESTED, '{"held_out": 1e999}'])
def test_a_backtest_plan_that_is_not_an_object_is_refused_in_one_line(text, tmp_path):
    """E6: a list, a string or a number used to end in AttributeError, a nested one in RecursionError."""
    from ablate.ladder.backtest import BacktestError, check_plan

    (tmp_path / PLAN).write_text(text)
    with pytest.raises(BacktestError) as e:
        check_plan(tmp_path, {"held_out": "r3"}, held_out_started=True)
    assert str(e.value).startswith(f"{tmp_path / PLAN}") and "\n" not in str(e.value)


def _not_a_regular_file(kind: str, tmp_path: Path) -> Path:
    if kind == "/dev/zero":
        return Path("/dev/zero")
    fifo_at(tmp_path / "input.toml")
    return tmp_path / "input.toml"


@pytest.mark.parametrize("kind", ["/dev/zero", "a FIFO"])
@pytest.mark.parametrize("command", [["grid", "{}", "--dry-run"], ["grid", "{}"], ["train", "--config", "{}"]])
def test_a_grid_or_config_file_that_is_not_a_regular_file_is_refused_at_once(command, kind, tmp_path):
    """E8, E12: `ablate grid /dev/zero --dry-run` read without end; `train --config /dev/zero`
    ended in MemoryError; a FIFO as either blocked for ever."""
    path = _not_a_regular_file(kind, tmp_path)
    done = child([arg.format(path) for arg in command], tmp_path, timeout=FAST)
    assert done.returncode == 2, done.stderr
    assert str(path) in one_line(done.stderr) and "not a regular file" in done.stderr


@pytest.mark.parametrize("option", ["--data", "--import"])
def test_data_or_a_plugin_that_is_a_device_is_refused_for_what_it_is(option, tmp_path):
    """Not 'holds no text files' nor 'does not exist': /dev/zero is there, and no regular file."""
    done = child(["train", option, "/dev/zero", "--steps", "1", "--device", "cpu"], tmp_path, timeout=FAST)
    assert done.returncode == 2, done.stderr
    assert "/dev/zero" in one_line(done.stderr) and "not a regular file" in done.stderr


@pytest.mark.parametrize("recorded", ["", 5, ["passes"]])
def test_a_config_json_whose_cpu_form_is_no_form_is_refused_not_resumed_as_the_fallback(recorded, tmp_path):
    """config.json `gelu_cpu: ""` used to resume as `passes` without a word."""
    import torch

    from ablate.core.errors import ConfigError
    from ablate.engine.train import _cpu_forms_for

    with pytest.raises(ConfigError) as e:
        _cpu_forms_for({"gelu_cpu": recorded, "attention_cpu": None}, tmp_path, torch.device("cpu"), "cpu")
    assert str(tmp_path) in str(e.value) and "gelu_cpu" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["config.json", "summary.json", "grid.json", "metrics.jsonl"])
def test_a_run_file_nested_thousands_deep_is_named_and_left_out_by_the_reader(name, tmp_path):
    """analysis read config.json, summary.json and grid.json with json.load and each metrics line
    with json.loads: a file (or a line) nested thousands deep ended `report` in RecursionError."""
    from ablate.analysis.load import load_runs

    runs = [write_run(tmp_path, V, seed) for seed in range(2)]
    write_grid(tmp_path, runs)
    spoiled = tmp_path / name if name == "grid.json" else runs[1].path / name
    with open(spoiled, "a" if name == "metrics.jsonl" else "w") as f:
        f.write(NESTED + "\n")
    with pytest.warns(UserWarning) as caught:
        loaded = load_runs(tmp_path)
    said = [str(w.message) for w in caught if name in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0], said
    assert len(loaded.cells) == (1 if name in ("config.json", "summary.json") else 2)


@pytest.mark.parametrize("kind", ["a FIFO", "a folder"])
def test_a_claim_file_that_is_not_a_regular_file_is_refused_for_what_it_is(kind, tmp_path):
    """Not 'does not exist': the name is there, and is no file to read."""
    path = tmp_path / "claim.toml"
    fifo_at(path) if kind == "a FIFO" else path.mkdir()
    done = child(["reproduce", str(path), "--dry-run"], tmp_path, timeout=FAST)
    assert done.returncode == 2, done.stderr
    assert str(path) in one_line(done.stderr) and f"{kind}, not a regular file" in done.stderr
