"""`--kernels auto` on a CUDA device, with CUDA faked (CI has no GPU): `reference` unless whole
steps of the cell's shape were measured faster with another backend on this very device key,
and nothing of a backend not chosen is loaded, built or checked (ablate/kernels/select.py,
step_cache.py)."""
import json
import sys
import types

import pytest
import torch

from ablate.kernels import get_backend, parity, select, step_cache

KEY = {"name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "driver": "550.54.15", "torch": "2.13.0",
       "cuda": "12.8", "triton": "3.9.0"}
SHAPE = {"model": {"name": "tiny"}, "variant": "pre.layernorm.gelu.dense.res", "optimizer": "adamw",
         "batch_size": 8, "seq_len": 64, "dtype": "bfloat16", "compile": False}
CUDA_FASTER = {"reference": [10.0, 10.4, 10.9], "cuda": [8.0, 8.3, 8.1], "triton": [12.0, 12.5, 11.9]}


def _refuse(what):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} was called")
    return refuse


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """A CUDA device as far as select.py can tell, whose GPU backends may not be built or checked
    (their modules' load and the parity suite raise); returns the names loaded and checked."""
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(step_cache, "device_key", lambda device: dict(KEY))
    monkeypatch.setattr(select, "_CHOICE", {})
    monkeypatch.setattr(select, "AUTO_DETAILS", {})
    monkeypatch.setattr(step_cache, "_SAID", set())
    for name in ("cuda", "triton"):
        fake = types.ModuleType(f"ablate.kernels.{name}_backend")
        fake.load = _refuse(f"the {name} backend's build")
        monkeypatch.setitem(sys.modules, f"ablate.kernels.{name}_backend", fake)
    monkeypatch.setattr(parity, "run_suite", _refuse("the parity suite"))
    bench = types.ModuleType("ablate.bench.kernel_ops")
    bench.quick_time = _refuse("an isolated per-op timing")
    monkeypatch.setitem(sys.modules, "ablate.bench.kernel_ops", bench)
    used = {"loaded": [], "checked": []}

    def load_backends(names, device):
        used["loaded"] += list(names)
        return {n: types.SimpleNamespace(name=n) for n in names}

    def failed_parity(name, backend, device, details, quiet=False):
        used["checked"].append(name)
        return used.get("fails", False)

    monkeypatch.setattr(parity, "load_backends", load_backends)
    monkeypatch.setattr(select, "failed_parity", failed_parity)
    return used


def test_with_nothing_measured_auto_is_reference_and_builds_nothing(gpu, capsys):
    assert get_backend("auto", "cuda:0", shape=SHAPE).name == "reference"
    assert select.pick_auto("cuda:0") == "reference"  # no step shape: nothing measured for it either
    assert gpu == {"loaded": [], "checked": []} and capsys.readouterr().err == ""
    assert select.AUTO_DETAILS["cuda:0"]["choice"] == "reference"


def test_a_backend_measured_faster_on_whole_steps_here_is_chosen_and_only_it_is_checked(gpu):
    step_cache.record(KEY, SHAPE, CUDA_FASTER, steps=10)
    assert select.pick_auto("cuda:0", SHAPE) == "cuda"
    assert gpu == {"loaded": ["cuda"], "checked": ["cuda"]}  # triton: never loaded, never checked
    assert select.pick_auto("cuda:0", SHAPE) == "cuda" and gpu["checked"] == ["cuda"]  # once a process
    assert select.AUTO_DETAILS["cuda:0"]["seconds"] == CUDA_FASTER


def test_the_chosen_backend_failing_its_parity_check_falls_back_to_reference_in_one_line(gpu, capsys):
    step_cache.record(KEY, SHAPE, CUDA_FASTER, steps=10)
    gpu["fails"] = True
    assert select.pick_auto("cuda:0", SHAPE) == "reference"
    err = capsys.readouterr().err
    assert gpu["loaded"] == ["cuda"] and err == ""  # failed_parity (faked here) says it; nothing else does


@pytest.mark.parametrize("elsewhere", ["name", "driver", "torch", "cuda", "triton", "capability"])
def test_timings_from_another_device_driver_or_library_version_are_ignored(gpu, elsewhere):
    step_cache.record({**KEY, elsewhere: "other"}, SHAPE, CUDA_FASTER, steps=10)
    assert select.pick_auto("cuda:0", SHAPE) == "reference"
    assert gpu == {"loaded": [], "checked": []}


def test_timings_of_another_step_shape_are_ignored(gpu):
    step_cache.record(KEY, {**SHAPE, "batch_size": 16}, CUDA_FASTER, steps=10)
    assert select.pick_auto("cuda:0", SHAPE) == "reference" and gpu["loaded"] == []


@pytest.mark.parametrize("content", [b"\x00garbage", b"[" * 5000 + b"]" * 5000, b"[1, 2]", b'{"entries": 3}',
                                     b'{"entries": [{"device": {}, "shape": {}, "seconds": {"cuda": [-1]}}]}',
                                     b'{"entries": [{"device": {}, "shape": {}, "seconds": {"cuda": [1e999]}}]}'])
def test_a_damaged_timing_file_is_ignored_with_one_line_and_measured_again(gpu, capsys, content):
    where = step_cache.path()
    where.parent.mkdir(parents=True)
    where.write_bytes(content)
    assert select.pick_auto("cuda:0", SHAPE) == "reference"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(where) in err and "ablate kernels tune" in err and "Traceback" not in err
    assert gpu["loaded"] == []
    step_cache.record(KEY, SHAPE, CUDA_FASTER, steps=10)  # what a tune does: the file is written anew
    assert step_cache.lookup(KEY, SHAPE)["choice"] == "cuda"


def test_a_fifo_as_the_timing_file_is_not_waited_on(gpu, capsys):
    import os

    where = step_cache.path()
    where.parent.mkdir(parents=True)
    os.mkfifo(where)
    assert select.pick_auto("cuda:0", SHAPE) == "reference"
    assert "FIFO" in capsys.readouterr().err


@pytest.mark.parametrize("seconds, choice", [
    ({"reference": [10.0, 10.1, 10.2], "cuda": [9.0, 9.1, 9.2]}, "cuda"),
    ({"reference": [10.0, 10.1, 10.2], "cuda": [9.0, 10.05, 10.3]}, "reference"),  # median not below ref's fastest
    ({"reference": [10.0], "cuda": [9.0], "triton": [8.0]}, "triton"),
    ({"cuda": [1.0]}, "reference"),  # reference never timed: nothing to beat
    ({"reference": [10.0], "cuda": [10.0]}, "reference"),  # a tie is no win
])
def test_faster_means_the_median_beats_references_fastest_round(seconds, choice):
    assert step_cache.fastest(seconds) == choice


def test_the_cache_file_keeps_one_entry_per_device_and_shape(gpu):
    step_cache.record(KEY, SHAPE, CUDA_FASTER, steps=10)
    step_cache.record(KEY, SHAPE, {"reference": [1.0], "cuda": [2.0]}, steps=10)
    step_cache.record({**KEY, "driver": "560.1"}, SHAPE, CUDA_FASTER, steps=10)
    entries = json.loads(step_cache.path().read_text())["entries"]
    assert len(entries) == 2 and step_cache.lookup(KEY, SHAPE)["choice"] == "reference"


def test_plan_run_hands_auto_the_cells_step_shape(monkeypatch):
    import ablate.engine.train
    from ablate.engine.cell import Cell

    seen = {}
    real = ablate.engine.train.get_backend
    monkeypatch.setattr(ablate.engine.train, "get_backend", lambda name, device, shape=None: seen.update(shape=shape)
                        or real(name, device, shape))
    cell = Cell.from_options({"model": "tiny", "layers": 1, "batch_size": 3, "seq_len": 16, "kernels": "reference",
                              "device": "cpu"})
    plan = ablate.engine.train.plan_run(cell)
    assert seen["shape"] == step_cache.step_shape(plan.cfg, plan.size, None)
    assert seen["shape"]["batch_size"] == 3 and seen["shape"]["seq_len"] == 16 and seen["shape"]["dtype"] == "float32"


def test_the_driver_version_is_read_from_the_nvidia_driver_file(monkeypatch, tmp_path):
    from pathlib import Path

    text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: text if str(self) == "/proc/driver/nvidia/version"
                        else real(self, *a, **k))
    assert step_cache.driver_version() == "550.54.15"
