"""`ablate kernels tune` (ablate/bench/step_tune.py): whole steps timed per backend, rounds
interleaved, recorded where `--kernels auto` reads them. The GPU timing itself runs on the
device (scripts/gpu_check.sh); here the measurement is faked or run on a tiny CPU model."""
import json

import pytest

from ablate.bench import step_tune
from ablate.engine.cell import Cell
from ablate.engine.train import plan_run
from ablate.kernels import step_cache

KEY = {"name": "a GPU", "capability": "9.0", "driver": "1", "torch": "2", "cuda": "12", "triton": "3"}
TINY = {"model": "tiny", "layers": 1, "batch_size": 2, "seq_len": 16, "kernels": "reference", "device": "cpu",
        "threads": 1}


@pytest.fixture
def plan(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    return plan_run(Cell.from_options(TINY))


def test_tune_records_the_steps_it_measured_under_the_device_key_and_shape(plan, capsys):
    calls = []

    def measure(plan_, backends, steps, repeats, progress=None):
        calls.append((sorted(backends), steps, repeats))
        return {"reference": [2.0, 2.1], "cuda": [1.0, 1.1]}

    result = step_tune.tune(plan, (), steps=7, repeats=2, measure=measure, key=KEY)
    assert calls == [(["reference"], 7, 2)] and result["choice"] == "cuda"
    (entry,) = json.loads(step_cache.path().read_text())["entries"]
    assert entry["device"] == KEY and entry["steps"] == 7
    assert entry["shape"] == step_cache.step_shape(plan.cfg, plan.size, plan.amp)
    assert step_cache.lookup(KEY, entry["shape"])["choice"] == "cuda"


def test_a_backend_that_cannot_load_is_not_timed_and_says_why(plan):
    said = []
    backends = step_tune.candidates(("cuda",), "cpu", said.append)
    assert list(backends) == ["reference"] and len(said) == 1 and said[0].startswith("cuda: not timed (")


def test_whole_steps_are_timed_per_backend_in_interleaved_rounds(plan, monkeypatch):
    from ablate.kernels.reference import ReferenceBackend

    order = []
    real = step_tune.Stepper.run
    monkeypatch.setattr(step_tune.Stepper, "run", lambda self, n: order.append((self.name, n)) or real(self, n))
    monkeypatch.setattr(step_tune.Stepper, "name", None, raising=False)
    backends = {"reference": ReferenceBackend(), "other": ReferenceBackend()}
    real_init = step_tune.Stepper.__init__

    def init(self, plan_, ops):
        real_init(self, plan_, ops)
        self.name = "reference" if ops is backends["reference"] else "other"

    monkeypatch.setattr(step_tune.Stepper, "__init__", init)
    seconds = step_tune.time_steps(plan, backends, steps=1, repeats=2)
    assert {k: len(v) for k, v in seconds.items()} == {"reference": 2, "other": 2}
    assert all(s > 0 for v in seconds.values() for s in v)
    assert [n for _, n in order[:2]] == [step_tune.WARMUP] * 2
    timed = [name for name, n in order[2:]]
    assert timed == ["reference", "other", "other", "reference"]  # the order rotates each round


@pytest.mark.parametrize("argv, words", [
    (["--device", "cpu"], "times steps on a CUDA device, not on cpu"),
    (["--timed-steps", "0"], "--timed-steps 0 is out of range; valid: 1 to 1000"),
    (["--repeats", "101"], "--repeats 101 is out of range; valid: 1 to 100"),
    (["--backends", "cpu"], "unknown kernel backend 'cpu'; valid: triton, cuda"),
])
def test_tune_refuses_in_one_line(argv, words, capsys, tmp_path, monkeypatch):
    from ablate.cli import main

    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    assert main(["kernels", "tune", "--model", "tiny", "--layers", "1", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]
    assert not step_cache.path().exists()
