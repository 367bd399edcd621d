"""config.json records the CPU a run computed on (`machine`) and each other one it continued on
(`resumed_on`); a run continuing on another CPU says so in one line."""
from __future__ import annotations

import json

import pytest
import torch

import ablate.engine.train as T
from ablate.core.provenance import machine, machine_changed, machine_record
from ablate.core.rundir import CONFIG, METRICS
from ablate.engine.cell import Cell, run_cell
from tests.helpers.interrupting import interrupted_at

OPTIONS = {"layers": 2, "steps": 6, "checkpoint_every": 3, "probes": False, "eval_batches": 1,
           "final_eval_batches": 1, "batch_size": 2, "seq_len": 16, "device": "cpu"}
ELSEWHERE = {"cpu": "Another CPU", "torch_cpu_capability": "AVX512"}


def interrupted(tmp_path, monkeypatch):
    cell = Cell.from_options(OPTIONS)
    with interrupted_at(monkeypatch, 2), pytest.raises(T.Interrupted):
        run_cell(cell, tmp_path)
    return cell, tmp_path / cell.id


def edit_config(run_dir, **changes):
    config = json.loads((run_dir / CONFIG).read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key)
        else:
            config[key] = value
    (run_dir / CONFIG).write_text(json.dumps(config))


def losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / METRICS).read_text().splitlines()]


def test_machine_names_the_cpu_and_the_code_torch_picks_for_it():
    here = machine()
    assert here["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(here["cpu"], str) and here["cpu"]


def test_the_record_keeps_where_a_run_started_and_adds_each_other_machine_once():
    here = machine()
    assert machine_record(None) == {"machine": here, "resumed_on": []}
    assert machine_record({"machine": here, "resumed_on": []}) == {"machine": here, "resumed_on": []}
    assert machine_record({"machine": ELSEWHERE, "resumed_on": []}) == {"machine": ELSEWHERE, "resumed_on": [here]}
    assert machine_record({"machine": ELSEWHERE, "resumed_on": [here]}) == {"machine": ELSEWHERE, "resumed_on": [here]}
    assert machine_record({}) == {"machine": None, "resumed_on": [here]}  # recorded before `machine` was
    assert machine_changed({"machine": ELSEWHERE}) is not None
    assert machine_changed({"machine": ELSEWHERE, "resumed_on": [here]}) is None
    assert machine_changed({}) is None and machine_changed(None) is None


@pytest.mark.parametrize("bad", ["a string", 3, {"cpu": None}, ["a list"]])
def test_a_record_that_is_not_a_machines_reads_as_unknown(bad):
    here = machine()
    assert machine_changed({"machine": bad, "resumed_on": bad}) is None
    assert machine_record({"machine": bad, "resumed_on": bad}) == {"machine": None, "resumed_on": [here]}
    assert machine_record({"machine": ELSEWHERE, "resumed_on": [bad]}) == {"machine": ELSEWHERE, "resumed_on": [here]}


def test_a_new_run_records_this_machine(tmp_path):
    cell = Cell.from_options(OPTIONS)
    run_cell(cell, tmp_path)
    config = json.loads((tmp_path / cell.id / CONFIG).read_text())
    assert config["machine"] == machine() and config["resumed_on"] == []


def test_a_run_continued_on_another_cpu_says_so_in_one_line_and_records_it(tmp_path, monkeypatch, capsys):
    cell = Cell.from_options(OPTIONS)
    straight = run_cell(cell, tmp_path / "straight")
    _, run_dir = interrupted(tmp_path / "resumed", monkeypatch)
    edit_config(run_dir, machine=ELSEWHERE)
    capsys.readouterr()
    resumed = run_cell(cell, tmp_path / "resumed")
    err = [line for line in capsys.readouterr().err.splitlines() if "continues on" in line]
    assert len(err) == 1 and "Another CPU (AVX512)" in err[0] and str(run_dir) in err[0]
    config = json.loads((run_dir / CONFIG).read_text())
    assert config["machine"] == ELSEWHERE and config["resumed_on"] == [machine()]
    assert resumed.summary["status"] == straight.summary["status"] == "completed"
    assert losses(run_dir) == losses(tmp_path / "straight" / cell.id)  # here both halves ran on one CPU


@pytest.mark.parametrize("recorded", ["here", "before the record"])
def test_a_run_continued_where_it_ran_or_recorded_before_says_nothing(tmp_path, monkeypatch, capsys, recorded):
    cell, run_dir = interrupted(tmp_path, monkeypatch)
    if recorded == "before the record":
        edit_config(run_dir, machine=None, resumed_on=None)
    capsys.readouterr()
    run_cell(cell, tmp_path)
    assert "continues on" not in capsys.readouterr().err
    config = json.loads((run_dir / CONFIG).read_text())
    if recorded == "here":
        assert config["machine"] == machine() and config["resumed_on"] == []
    else:  # where it started is not known; where it continued is
        assert config["machine"] is None and config["resumed_on"] == [machine()]
