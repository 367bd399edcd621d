"""The opt-in early stop of dead runs (stop_dead): the watch on synthetic rows, and real runs."""
import json

import pandas as pd
import pytest

from ablate.analysis.outcomes import DEAD, PLATEAUED, failure_kind, outcome_of
from ablate.core.collapse import DEAD_GRAD_DECADES, row_dead
from ablate.core.errors import ConfigError
from ablate.engine.dead_stop import DeadWatch, dead_watch

ENTROPY = 3.2


def row(loss=3.3, first=1e-12, top=1.0, cos=None, layers=3):
    grads = [first] + [top] * (layers - 1)
    r = {"loss": loss, **{f"grad_norm/layer_{i}": g for i, g in enumerate(grads)}}
    if cos is not None:
        r[f"cos_sim/layer_{layers - 1}"] = cos
    return r


def test_a_row_is_dead_on_the_plateau_with_the_first_blocks_gradient_decades_under_the_tops():
    assert row_dead(row(), ENTROPY, None)
    assert not row_dead(row(loss=2.5), ENTROPY, None)  # off the plateau: training
    assert not row_dead(row(first=10 ** -(DEAD_GRAD_DECADES - 0.5)), ENTROPY, None)  # gradients alive
    assert not row_dead(row(cos=0.5), ENTROPY, None)  # the probes refute it
    assert row_dead(row(cos=0.999), ENTROPY, None) and row_dead(row(first=0.0), ENTROPY, None)
    assert not row_dead({"loss": 3.3}, ENTROPY, None)  # no per-layer gradients: nothing to read


def test_the_watch_stops_after_n_dead_steps_and_a_live_row_restarts_the_count():
    watch = DeadWatch(after=4, unigram_entropy=ENTROPY, probed=False)
    assert [watch.stops(s, row()) for s in range(4)] == [False] * 4
    assert not watch.stops(4, row(loss=2.0))  # alive: the stretch ends
    assert [watch.stops(s, row()) for s in range(5, 10)] == [False] * 4 + [True]
    assert not DeadWatch(after=1, unigram_entropy=ENTROPY, probed=False).stops(0, {"loss": 3.3})  # not logged


def test_a_probed_run_stops_only_once_a_probe_step_in_the_stretch_confirmed_the_collapse():
    watch = DeadWatch(after=2, unigram_entropy=ENTROPY, probed=True)
    assert [watch.stops(s, row()) for s in range(5)] == [False] * 5  # no probe step yet
    assert watch.stops(5, row(cos=0.999))
    refuted = DeadWatch(after=4, unigram_entropy=ENTROPY, probed=True)
    assert not any(refuted.stops(s, row(cos=0.999 if s == 0 else 0.5 if s == 3 else None)) for s in range(5))
    assert refuted.since == 4 and not refuted.confirmed  # the refuting probe began the count again


def test_the_watch_state_round_trips_through_a_checkpoint():
    watch = DeadWatch(after=3, unigram_entropy=ENTROPY, probed=True)
    watch.stops(7, row(cos=0.999))
    again = DeadWatch(after=3, unigram_entropy=ENTROPY, probed=True)
    again.restore(watch.state())
    assert (again.since, again.confirmed) == (7, True) and again.stops(10, row())


def test_stop_dead_needs_the_gradients_it_reads_and_the_plateaus_loss():
    from ablate.engine.cell import Cell

    with pytest.raises(ConfigError, match="stop_dead 5 reads the per-layer gradient norms"):
        Cell.from_options({"stop_dead": 5, "probes": False})
    cfg = Cell.from_options({"stop_dead": 5}).config
    with pytest.raises(ConfigError, match="unigram entropy"):
        dead_watch(cfg, None)
    assert dead_watch(Cell.from_options({}).config, None) is None  # off by default


def _cell(**extra):
    from ablate.engine.cell import Cell

    # Post-norm, 12 blocks, lr 1e-2 without warmup: dead within about ten steps (issue 52).
    return Cell.from_options({"norm": "post", "layers": 12, "lr": 1e-2, "steps": 30, "eval_every": 20,
                              "eval_batches": 1, "final_eval_batches": 2, "probe_every": 5, **extra})


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_dead_run_stops_early_and_its_outcome_is_dead_with_the_same_steps_before_the_stop(tmp_path):
    from ablate.engine.train import train

    summary = train(_cell(stop_dead=8), tmp_path / "stop")
    assert summary["status"] == "completed" and summary["steps"] < 30
    assert summary["stopped_dead_at_step"] == summary["steps"] - 1
    rows = _metrics(tmp_path / "stop")
    steps = pd.DataFrame(rows)
    entropy = json.loads((tmp_path / "stop" / "config.json").read_text())["data"]["unigram_entropy"]
    outcome = outcome_of(summary["status"], summary["final_val_loss"], entropy)
    assert outcome == PLATEAUED and failure_kind(outcome, steps) == DEAD
    train(_cell(), tmp_path / "full")  # the same run without stop_dead
    same = _metrics(tmp_path / "full")[:len(rows) - 1]  # the stop's last row carries the final evaluation
    drop = ("time_s", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows[:-1]] == \
        [{k: v for k, v in r.items() if k not in drop} for r in same]


def test_a_dead_run_killed_in_its_dead_stretch_resumes_to_the_same_stop(tmp_path):
    import ablate.engine.train as T

    cell = _cell(stop_dead=8, checkpoint_every=4)
    whole = T.train(cell, tmp_path / "whole")
    calls = []

    def killed_after_step_13():
        calls.append(1)
        if len(calls) == 14:
            raise KeyboardInterrupt  # after the checkpoint at step 12, inside the dead stretch

    with pytest.raises(KeyboardInterrupt):
        T.train(cell, tmp_path / "again", after_step=killed_after_step_13)
    resumed = T.train(cell, tmp_path / "again")
    keys = ("status", "steps", "stopped_dead_at_step", "final_loss", "final_val_loss")
    assert {k: resumed[k] for k in keys} == {k: whole[k] for k in keys}


def test_cells_that_stop_dead_runs_are_never_packed():
    from ablate.engine.pack import group_packs

    cells = [_cell(seed=s, stop_dead=8) for s in range(2)] + [_cell(seed=s) for s in range(2)]
    assert [len(p) for p in group_packs(cells, 4)] == [1, 1, 2]


def test_stop_dead_on_token_shards_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    import numpy as np

    from ablate.cli import main
    from ablate.engine.data import write_shard

    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    write_shard(tmp_path / "data.bin", np.random.default_rng(0).integers(0, 300, size=5000).astype(np.uint16))
    out = tmp_path / "runs"
    assert main(["train", "--data", str(tmp_path / "data.bin"), "--stop-dead", "5", "--steps", "2",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "stop_dead 5 needs the data's unigram entropy" in err and err.strip().count("\n") == 0
    assert not out.exists()
