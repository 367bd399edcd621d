"""Subnormal floats flushed to zero (option flush_denormal, ablate/engine/fpmode.py): applied in every
torch thread of every process that trains, recorded in config.json, bitwise repeatable, and a
run from before the option resumes as it started, with subnormals kept."""
import contextlib
import json
import signal

import pytest
import torch

import ablate.engine.train
from ablate.cli import main
from ablate.engine import fpmode
from ablate.engine.cell import Cell, run_cell

# A post-norm stack at a high rate: its first blocks' gradients reach the subnormal range by step
# 6, so flushing them changes its numbers there (their logged gradient norms first; a healthy
# cell would never notice the setting). One thread keeps it fast on a shared machine; the thread
# pool has a test of its own.
UNSTABLE = {"variant": "post-ln", "layers": 12, "lr": 3e-2, "steps": 8, "batch_size": 2, "seq_len": 16,
            "eval_batches": 1, "final_eval_batches": 1, "threads": 1, "checkpoint_every": 100}
ARGS = ["train", "--quiet", *[a for k, v in UNSTABLE.items() for a in (f"--{k.replace('_', '-')}", str(v))]]


@pytest.fixture
def flushing_seen(monkeypatch):
    """Records, at every step of the runs that follow, whether every torch thread flushes, and
    can interrupt one run at a step as Ctrl-C would (it checkpoints after that step and stops)."""
    seen: list = []
    stop = {"at": None}
    received: list[int] = []

    @contextlib.contextmanager
    def signals():
        received.clear()
        yield received

    real = ablate.engine.train.lr_at

    def lr_at(step, *args, **kwargs):
        seen.append(fpmode.flushing())
        if step == stop["at"]:
            received.append(signal.SIGINT)
        return real(step, *args, **kwargs)

    monkeypatch.setattr(ablate.engine.train, "lr_at", lr_at)
    monkeypatch.setattr(ablate.engine.train, "_graceful_signals", signals)
    outer = torch.get_num_threads()
    yield seen, stop
    torch.set_num_threads(outer)
    fpmode.set_flush_denormal(False)


def rows(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in ("time_s", "tokens_per_s")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_setting_reaches_every_torch_thread_and_back():
    outer = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert fpmode.set_flush_denormal(True) and fpmode.flushing() is True
        assert fpmode.set_flush_denormal(False) and fpmode.flushing() is False
    finally:
        torch.set_num_threads(outer)


@pytest.mark.parametrize("flush", [True, False])
def test_a_training_process_applies_and_records_the_setting(tmp_path, flushing_seen, flush):
    seen, _ = flushing_seen
    assert fpmode.set_flush_denormal(not flush)  # the process had the other one: the run sets its own
    # Two threads: the setting must reach torch's pool thread, not only this one.
    cell = Cell.from_options({**UNSTABLE, "steps": 2, "threads": 2, "flush_denormal": flush})
    assert run_cell(cell, tmp_path).summary["status"] in ("completed", "diverged")
    assert seen and set(seen) == {flush}
    config = json.loads((tmp_path / cell.id / "config.json").read_text())
    assert config["train"]["flush_denormal"] is flush and config["subnormals_flushed"] is flush
    assert fpmode.flushing() is (not flush)  # and the process gets its own setting back
    assert "flush_denormal" not in cell.id  # an execution setting: never in an id


def test_flushed_runs_are_bitwise_repeatable_and_the_setting_matters_here(tmp_path, flushing_seen):
    for out, flush in (("a", "true"), ("b", "true"), ("off", "false")):
        assert main([*ARGS, "--out", str(tmp_path / out), "--flush-denormal", flush]) == 0
    (cell,) = [p.name for p in (tmp_path / "a").iterdir()]
    assert rows(tmp_path / "a" / cell) == rows(tmp_path / "b" / cell)
    assert rows(tmp_path / "a" / cell) != rows(tmp_path / "off" / cell)  # so the tests above test something


def test_a_run_from_before_the_option_resumes_with_subnormals_kept_bit_for_bit(tmp_path, capsys, flushing_seen):
    seen, stop = flushing_seen
    assert main([*ARGS, "--out", str(tmp_path / "ref"), "--flush-denormal", "false"]) == 0
    stop["at"] = 2
    assert main([*ARGS, "--out", str(tmp_path / "cut"), "--flush-denormal", "false"]) == 130
    (cell,) = [p.name for p in (tmp_path / "cut").iterdir()]
    path = tmp_path / "cut" / cell / "config.json"
    config = json.loads(path.read_text())  # as written before the option existed
    del config["train"]["flush_denormal"], config["subnormals_flushed"]
    path.write_text(json.dumps(config))
    stop["at"] = None
    capsys.readouterr()
    assert main([*ARGS, "--out", str(tmp_path / "cut"), "--flush-denormal", "true"]) == 2  # asked for: refused
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "flush_denormal=false" in err and "flush_denormal=true" in err
    seen.clear()
    assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 0  # the default (true) yields to the run's own
    assert set(seen) == {False}
    assert rows(tmp_path / "cut" / cell) == rows(tmp_path / "ref" / cell)
    assert json.loads(path.read_text())["train"]["flush_denormal"] is False


def test_a_grid_worker_process_applies_it(tmp_path, flushing_seen):
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\n[base]\nsteps = 2\nbatch_size = 2\nseq_len = 16\neval_batches = 1\n'
                    'final_eval_batches = 1\n[axes]\nseed = [0]\n')
    assert fpmode.set_flush_denormal(False)  # this process does not flush: the worker process must
    assert main(["grid", str(grid), "--out", str(tmp_path / "o"), "--workers", "1", "--quiet"]) == 0
    (config,) = (tmp_path / "o").glob("*/config.json")
    config = json.loads(config.read_text())
    assert config["train"]["flush_denormal"] is True and config["subnormals_flushed"] is True


def test_the_lockstep_bench_trains_a_claim_cell_both_ways():
    from ablate.bench.subnormals import CELLS, describe, find_cell, lockstep_pair

    pair = lockstep_pair(find_cell(*CELLS[0]), steps=2)
    assert len(pair.flushed_s) == len(pair.kept_s) == 2 and pair.losses[0] == pair.losses[1]  # no subnormals yet
    assert "kept / flushed" in describe([pair]) and fpmode.flushing() is False
