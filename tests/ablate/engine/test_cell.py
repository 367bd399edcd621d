"""ablate.engine.cell.run_cell: one cell trained into its run folder exactly once; the folder is read
and checked once per run (the plan carries what it read); a failed cell is tried again; a run
folder written by an older version still resumes."""
import json

import pytest

import ablate.engine.train as T
from ablate.cli import main
from ablate.core.errors import ConfigError
from ablate.core.rundir import CONFIG, FAILED, METRICS, SUMMARY, status, write_json_atomic
from ablate.engine import cell as cell_module
from ablate.engine.cell import Cell, CellOutcome, CellResources, check_id_fits, run_cell
from ablate.kernels import cpu_attention, cpu_gelu
from tests.helpers.cli_lines import BASE, CELL
from tests.helpers.interrupting import interrupted_at

OPTIONS = {"layers": 2, "steps": 6, "checkpoint_every": 3, "probes": False, "eval_batches": 1,
           "final_eval_batches": 1, "batch_size": 2, "seq_len": 16, "device": "cpu"}


def steps_logged(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / METRICS).read_text().splitlines()]


def summary(run_dir) -> dict:
    return json.loads((run_dir / SUMMARY).read_text())


def interrupted(tmp_path, monkeypatch, at=2):
    cell = Cell.from_options(OPTIONS)
    with interrupted_at(monkeypatch, at), pytest.raises(T.Interrupted):
        run_cell(cell, tmp_path)
    return cell, tmp_path / cell.id


def count_config_reads(monkeypatch) -> list:
    reads = []
    real = T._read_config
    monkeypatch.setattr(T, "_read_config", lambda run_dir: reads.append(run_dir) or real(run_dir))
    return reads


def test_a_cell_is_trained_once_then_skipped(tmp_path):
    cell = Cell.from_options(OPTIONS)
    first = run_cell(cell, tmp_path)
    assert first.outcome == "trained" and first.summary["status"] == "completed" and first.summary["steps"] == 6
    again = run_cell(cell, tmp_path)
    assert again == CellOutcome(cell.id, "skipped", first.summary)
    assert status(tmp_path / cell.id) == "completed"


def test_the_run_folder_is_read_once_per_run_and_the_plan_carries_it(tmp_path, monkeypatch):
    cell, run_dir = interrupted(tmp_path, monkeypatch)
    recorded = json.loads((run_dir / CONFIG).read_text())
    plan = T.plan_run(cell, None, run_dir)
    assert plan.recorded == recorded and plan.run_dir == run_dir
    assert plan.threads == recorded["train"]["threads"] and plan.flush == recorded["train"]["flush_denormal"]
    reads = count_config_reads(monkeypatch)
    assert run_cell(cell, tmp_path).summary["status"] == "completed"
    assert reads == [run_dir]  # planned once; train used the plan
    assert steps_logged(run_dir) == [0, 1, 2, 3, 4, 5]


def test_a_folder_written_while_waiting_for_the_lock_is_read_again(tmp_path, monkeypatch):
    cell, run_dir = interrupted(tmp_path, monkeypatch)
    reads = count_config_reads(monkeypatch)
    real_acquire = cell_module.CellLock.acquire

    def acquire(self):  # another process rewrote config.json between the plan and the lock
        write_json_atomic(run_dir / CONFIG, json.loads((run_dir / CONFIG).read_text()))
        return real_acquire(self)

    monkeypatch.setattr(cell_module.CellLock, "acquire", acquire)
    assert run_cell(cell, tmp_path).summary["status"] == "completed"
    assert reads == [run_dir, run_dir]


def test_a_plan_made_for_another_folder_is_refused(tmp_path):
    cell = Cell.from_options(OPTIONS)
    plan = T.plan_run(cell, CellResources(1), tmp_path / "a")
    with pytest.raises(ValueError):
        T.train(cell, tmp_path / "b", plan=plan)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_folder_holding_another_run_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    cell, run_dir = interrupted(tmp_path, monkeypatch)
    before = sorted(p.name for p in run_dir.iterdir())
    other = Cell.from_options({**OPTIONS, "lr": 0.01})
    with pytest.raises(ConfigError) as e:
        T.plan_run(other, None, run_dir)  # its own id names another folder: plan it into this one
    assert "different training config" in str(e.value) and "lr=" in str(e.value)
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_a_failed_cell_is_recorded_then_tried_again_and_its_record_kept(tmp_path, monkeypatch):
    cell = Cell.from_options(OPTIONS)
    real = T.train
    monkeypatch.setattr(T, "train", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("injected")))
    failed = run_cell(cell, tmp_path, retries=1)
    run_dir = tmp_path / cell.id
    assert failed.summary["status"] == FAILED and failed.summary["attempts"] == 2
    assert failed.summary["error"] == "RuntimeError: injected" and status(run_dir) == FAILED
    assert sorted(p.name for p in run_dir.glob("error-attempt*")) == ["error-attempt0.txt", "error-attempt1.txt"]
    monkeypatch.setattr(T, "train", real)
    again = run_cell(cell, tmp_path)
    assert again.outcome == "trained" and again.summary["status"] == "completed"
    assert json.loads((run_dir / "summary.failed-0.json").read_text())["attempts"] == 2


def test_a_failed_run_is_tried_again_on_rerun_and_its_rerun_never_exits_0(tmp_path, capsys, monkeypatch):
    real = T.train
    monkeypatch.setattr(T, "train", lambda *a, **k: (_ for _ in ()).throw(MemoryError("injected")))
    args = [*BASE, "--out", str(tmp_path)]
    run_dir = tmp_path / CELL
    assert main(args) == 1
    assert summary(run_dir)["status"] == "failed"
    capsys.readouterr()
    assert main(args) == 1  # was: "already finished (failed); nothing to do", exit 0
    err = capsys.readouterr().err
    assert "failed before (MemoryError: injected); trying again" in err and "failed: MemoryError" in err
    assert summary(run_dir)["attempts"] == 2
    monkeypatch.setattr(T, "train", real)
    assert main(args) == 0
    assert summary(run_dir)["status"] == "completed"
    # Nothing of the failed attempts is lost.
    assert sorted(p.name for p in run_dir.glob("error-attempt*")) == ["error-attempt0.txt", "error-attempt1.txt"]
    assert all("MemoryError: injected" in p.read_text() for p in run_dir.glob("error-attempt*"))
    assert [json.loads((run_dir / f"summary.failed-{k}.json").read_text())["attempts"] for k in (0, 1)] == [1, 2]
    capsys.readouterr()
    assert main(args) == 0 and "already finished (completed)" in capsys.readouterr().out  # completed: never again


def test_an_older_run_folder_still_resumes(tmp_path, monkeypatch):
    """A config.json written before identity_keys, plugins, the GELU and attention forms,
    subnormal flushing and z_loss were recorded: resumed with what it trained with, and finished."""
    cell, run_dir = interrupted(tmp_path, monkeypatch)
    config = json.loads((run_dir / CONFIG).read_text())
    for key in ("identity_keys", "plugins", "gelu_cpu", "attention_cpu", "subnormals_flushed"):
        config.pop(key)
    for key in ("flush_denormal", "z_loss"):
        config["train"].pop(key)
    (run_dir / CONFIG).write_text(json.dumps(config))
    outcome = run_cell(cell, tmp_path)
    assert outcome.outcome == "trained" and outcome.summary["status"] == "completed" and outcome.summary["steps"] == 6
    assert steps_logged(run_dir) == [0, 1, 2, 3, 4, 5]
    resumed = json.loads((run_dir / CONFIG).read_text())
    assert resumed["train"]["flush_denormal"] is False  # as it trained before the option existed
    assert resumed["gelu_cpu"] == cpu_gelu.PASSES  # a config without one trained with the torch passes
    assert resumed["attention_cpu"] == cpu_attention.SDPA  # ... and with torch's attention
    assert json.loads((run_dir / SUMMARY).read_text())["status"] == "completed"


def test_an_id_too_long_for_a_folder_name_is_refused():
    with pytest.raises(ConfigError) as e:
        check_id_fits("x" * 300, "the options")
    assert "300 bytes" in str(e.value) and "\n" not in str(e.value)
