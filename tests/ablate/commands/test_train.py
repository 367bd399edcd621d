"""A run directory's life under `ablate train`: refused before anything is written, reused only
for the run it holds, resumed with the thread count it started with, stopped with a way back,
and its files readable by others."""
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ablate.engine.train
from ablate.cli import main
from ablate.core.rundir import write_json_atomic
from ablate.engine.cell import Cell, CellResources, run_cell

CELL = "post.layernorm.gelu.dense.res__batch_size=2__seq_len=16__steps=3__seed=0"
# On the CPU wherever the tests run, so that --device cuda and --dtype bfloat16 are other runs.
BASE = ["train", "--variant", "post-ln", "--steps", "3", "--batch-size", "2", "--seq-len", "16",
        "--eval-batches", "1", "--device", "cpu", "--quiet"]


def train_args(out, *extra):
    return [*BASE, "--out", str(out), *extra]


def snapshot(folder: Path) -> dict:
    """Every file under `folder` with its contents and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_timing(metrics):
    return [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")} for r in metrics]


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 60)  # 2700 bytes: both splits fit
    return path


@pytest.fixture
def interrupt_at(monkeypatch):
    """interrupt_at(step): the next run gets a SIGINT while training `step`, as from Ctrl-C
    (the loop checkpoints after that step and stops). Records the torch threads of each step."""
    received: list[int] = []
    threads_seen: list[int] = []
    when = {"step": None}

    @contextlib.contextmanager
    def signals():
        received.clear()
        yield received

    real_lr_at = ablate.engine.train.lr_at

    def lr_at(step, *args, **kwargs):
        threads_seen.append(torch.get_num_threads())
        if step == when["step"]:
            received.append(signal.SIGINT)
        return real_lr_at(step, *args, **kwargs)

    monkeypatch.setattr(ablate.engine.train, "_graceful_signals", signals)
    monkeypatch.setattr(ablate.engine.train, "lr_at", lr_at)

    def arm(step):
        when["step"] = step
        threads_seen.clear()
        return threads_seen

    return arm


# ------------------------------------------------------------------ 1. a finished run of other settings


@pytest.mark.parametrize("extra, fragment", [
    (["--dtype", "bfloat16"], "dtype='float32'), but this command asks for dtype='bfloat16'"),
    (["--device", "cuda"], "device='cpu'"),
    (["--probes", "false"], "probes=True), but this command asks for probes=False"),
    (["--eval-every", "2"], "eval_every=50), but this command asks for eval_every=2"),
    (["--log-every", "2"], "log_every=1), but this command asks for log_every=2"),
    (["--threads", "3"], "but this command asks for threads=3"),
])
def test_a_finished_run_is_not_handed_back_for_other_settings(tmp_path, capsys, extra, fragment):
    assert main(train_args(tmp_path, "--threads", "1")) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(train_args(tmp_path, *extra)) == 2
    err = one_line_error(capsys)
    assert fragment in err and "another --out" in err and "remove that folder" in err
    assert snapshot(tmp_path) == before


def test_a_finished_run_is_not_handed_back_for_other_data(tmp_path, capsys, text_file):
    out = tmp_path / "out"
    assert main(train_args(out)) == 0
    before = snapshot(out)
    capsys.readouterr()
    assert main(train_args(out, "--data", str(text_file))) == 2
    err = one_line_error(capsys)
    assert "data=None (sha256:" in err and f"asks for data={str(text_file)!r} (sha256:" in err
    assert snapshot(out) == before


@pytest.mark.parametrize("extra", [[], ["--variant", "norm=post"], ["--set", "variant=gpt2", "--set", "norm=post"],
                                   ["--kernels", "cpu"], ["--checkpoint-every", "7"]])
@pytest.mark.slow
def test_the_same_run_spelled_another_way_is_still_a_no_op(tmp_path, capsys, extra):
    assert main(train_args(tmp_path)) == 0
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(train_args(tmp_path, *extra)) == 0
    assert "already finished (completed); nothing to do" in capsys.readouterr().out
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------ 2. an unfinished run


def test_resuming_with_another_option_names_it_and_both_values(tmp_path, capsys):
    assert main(train_args(tmp_path)) == 0
    (tmp_path / CELL / "summary.json").unlink()  # as if it had stopped early
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(train_args(tmp_path, "--set", "eval_batches=3")) == 2
    err = one_line_error(capsys)
    assert "(eval_batches=1), but this command asks for eval_batches=3" in err
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_an_interrupted_run_resumes_under_an_equivalent_variant_spelling(tmp_path, capsys, interrupt_at):
    args = ["--steps", "6", "--checkpoint-every", "100"]
    assert main([*BASE, "--out", str(tmp_path / "ref"), *args]) == 0
    interrupt_at(2)
    assert main([*BASE, "--out", str(tmp_path / "cut"), *args]) == 130
    interrupt_at(None)
    cell = CELL.replace("steps=3", "steps=6")
    assert (tmp_path / "cut" / cell / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main([*BASE, "--out", str(tmp_path / "cut"), *args, "--variant", "norm=post"]) == 0, capsys.readouterr().err
    assert without_timing(rows(tmp_path / "cut" / cell)) == without_timing(rows(tmp_path / "ref" / cell))


# ------------------------------------------------------------------ 3. refused before anything is written


def test_data_too_short_for_a_split_is_refused_before_anything_is_written(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    short_val = tmp_path / "short.txt"
    short_val.write_text("x" * 300)  # 285 training tokens, but 15 held out for validation: fewer than 17
    out = tmp_path / "out"
    for path, split in ((empty, "train"), (short_val, "val")):
        assert main(train_args(out, "--data", str(path))) == 2
        assert not out.exists()
        err = one_line_error(capsys)
        assert f"its {split} split has" in err and "seq_len 16 + 1" in err
    assert main(train_args(out)) == 0  # the correct command is not blocked by anything left behind


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("extra", [["--kernels", "cuda"], ["--device", "cuda"]])
def test_an_unavailable_backend_or_device_leaves_no_folder_or_lock(tmp_path, capsys, extra):
    out = tmp_path / "out"
    assert main(train_args(out, *extra)) == 2
    assert "available" in one_line_error(capsys)
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_triton_without_its_interpreter_leaves_no_folder_or_lock(tmp_path):
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "ablate", *train_args(out, "--kernels", "triton")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_run_on_interpreted_triton_kernels_says_why_it_is_slow_and_what_checks_them(tmp_path, capsys):
    pytest.importorskip("triton")
    from ablate.kernels import triton_kernels

    assert triton_kernels.INTERPRETED  # conftest.py sets TRITON_INTERPRET=1 where there is no GPU
    assert main(["train", "--kernels", "triton", "--layers", "1", "--batch-size", "1", "--seq-len", "8", "--steps", "1",
                 "--eval-batches", "1", "--final-eval-batches", "1", "--quiet", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "Triton's CPU interpreter" in err and "one Python program per token row (8 here" in err
    assert "`ablate kernels check --backends triton`" in err


# ------------------------------------------------------------------ 4. final_loss follows the contract


@pytest.mark.slow
def test_final_loss_is_the_mean_of_the_last_ten_logged_steps_across_a_resume(tmp_path, interrupt_at):
    from ablate.analysis.metrics import final_loss

    args = ["--steps", "60", "--log-every", "5", "--checkpoint-every", "100"]
    assert main([*BASE, "--out", str(tmp_path / "ref"), *args]) == 0
    cell = CELL.replace("steps=3", "steps=60")
    logged = rows(tmp_path / "ref" / cell)
    assert [r["step"] for r in logged] == list(range(0, 60, 5)) + [59]
    summary = json.loads((tmp_path / "ref" / cell / "summary.json").read_text())
    assert summary["final_loss"] == pytest.approx(np.mean([r["loss"] for r in logged[-10:]]), rel=1e-12)
    assert summary["final_loss"] == pytest.approx(final_loss(np.array([r["loss"] for r in logged])), rel=1e-12)
    # Stopped inside the last ten logged steps, then resumed: the same final_loss.
    interrupt_at(52)
    assert main([*BASE, "--out", str(tmp_path / "cut"), *args]) == 130
    interrupt_at(None)
    assert main([*BASE, "--out", str(tmp_path / "cut"), *args]) == 0
    assert json.loads((tmp_path / "cut" / cell / "summary.json").read_text())["final_loss"] == summary["final_loss"]


# ------------------------------------------------------------------ 5. threads on resume


@pytest.fixture
def two_threads():
    """The process runs 2 torch threads: not the thread count of the runs under test."""
    outer = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(outer)


def test_a_resumed_run_keeps_its_thread_count_and_refuses_another(tmp_path, capsys, interrupt_at, two_threads):
    args = ["--steps", "6", "--checkpoint-every", "100"]
    assert main([*BASE, "--out", str(tmp_path / "ref"), *args, "--threads", "1"]) == 0
    interrupt_at(2)
    assert main([*BASE, "--out", str(tmp_path / "cut"), *args, "--threads", "1"]) == 130
    cell = CELL.replace("steps=3", "steps=6")
    config = tmp_path / "cut" / cell / "config.json"
    before = snapshot(tmp_path / "cut")
    capsys.readouterr()
    assert main([*BASE, "--out", str(tmp_path / "cut"), *args, "--threads", "2"]) == 2
    err = one_line_error(capsys)
    assert "threads=1" in err and "threads=2" in err
    assert snapshot(tmp_path / "cut") == before
    threads_seen = interrupt_at(None)
    assert main([*BASE, "--out", str(tmp_path / "cut"), *args]) == 0  # no --threads: the run's own
    assert set(threads_seen) == {1}
    assert json.loads(config.read_text())["train"]["threads"] == 1
    assert without_timing(rows(tmp_path / "cut" / cell)) == without_timing(rows(tmp_path / "ref" / cell))
    assert torch.get_num_threads() == 2  # and the process gets its own count back


def test_a_schedulers_thread_count_yields_to_the_recorded_one(tmp_path, interrupt_at, two_threads):
    cell = Cell.from_options({"steps": 6, "batch_size": 2, "seq_len": 16, "eval_batches": 1, "threads": 1})
    interrupt_at(2)
    with pytest.raises(ablate.engine.train.Interrupted):
        run_cell(cell, tmp_path)
    threads_seen = interrupt_at(None)
    # A grid resumed with another worker count hands the cell another thread count (an
    # CellResources beside it); the run goes on with the one it started with.
    unpinned = Cell.from_options({"steps": 6, "batch_size": 2, "seq_len": 16, "eval_batches": 1})
    assert unpinned.id == cell.id
    assert run_cell(unpinned, tmp_path, execution=CellResources(2)).summary["status"] == "completed"
    assert set(threads_seen) == {1}
    assert json.loads((tmp_path / cell.id / "config.json").read_text())["train"]["threads"] == 1
    assert not unpinned.is_given("threads") and cell.is_given("threads")


# ------------------------------------------------------------------ 6. bad paths are one line


def test_unusable_out_and_config_paths_are_one_line_errors(tmp_path, capsys):
    a_file = tmp_path / "afile"
    a_file.write_text("not a folder")
    not_utf8 = tmp_path / "latin1.toml"
    not_utf8.write_bytes('steps = 3\n# caf\xe9\n'.encode("latin-1"))
    cases = [
        (train_args(a_file), "is a file, not a folder"),
        (train_args(a_file / "sub"), "is a file, not a folder"),
        (["train", "--config", str(tmp_path), "--out", str(tmp_path / "o")],
         "a folder, not a regular file); valid: a UTF-8 TOML file"),
        (["train", "--config", str(not_utf8), "--out", str(tmp_path / "o")], "cannot be read (not UTF-8 text (byte 0xe9"),
    ]
    for args, fragment in cases:
        assert main(args) == 2
        assert fragment in one_line_error(capsys)
    assert a_file.read_text() == "not a folder" and not (tmp_path / "o").exists()


# ------------------------------------------------------------------ 7. file modes


@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_results_get_the_normal_file_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "x.json", {"a": 1})
        assert main(train_args(tmp_path / "out")) == 0
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == want
    for name in ("config.json", "summary.json", "metrics.jsonl"):
        assert stat.S_IMODE((tmp_path / "out" / CELL / name).stat().st_mode) == want, name


# ------------------------------------------------------------------ 8. Ctrl-C


def test_ctrl_c_says_how_to_resume(tmp_path):
    args = ["--steps", "400", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1", "--threads", "1",
            "--quiet", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ablate", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "pre.layernorm.gelu.dense.res__batch_size=2__seq_len=16__steps=400__seed=0" / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "interrupted by SIGINT after step" in err and "rerun the same command to resume" in err
    assert (metrics.parent / "checkpoint.pt").exists()


def test_token_cache_files_are_readable_by_others_and_shards_are_scanned_once(tmp_path, monkeypatch):
    """The data cache is shared like results: its files get 0666 less the umask, not 0600. A
    shard folder's fingerprint and largest token id are cached, not re-read at every run start."""
    import numpy as np

    from ablate.engine import data as data_mod

    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    old = os.umask(0o022)
    try:
        text = tmp_path / "corpus.txt"
        text.write_text("hello world, " * 2000)
        data_mod.load_data(str(text), "bytes", 256)
        shard = tmp_path / "shards" / "data.bin"
        data_mod.write_shard(shard, np.arange(5000, dtype=np.uint16) % 300)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "cache").rglob("*") if p.is_file()}
    assert modes and set(modes.values()) == {0o644}, modes
    assert shard.stat().st_mode & 0o777 == 0o644

    first = data_mod.load_data(str(shard.parent), "bytes", 256)
    assert first.max_token == 299
    scans = []
    monkeypatch.setattr(data_mod, "_scan", lambda arrays: scans.append(1) or ("x", 0))
    again = data_mod.load_data(str(shard.parent), "bytes", 256)
    assert scans == [] and again.fingerprint == first.fingerprint and again.max_token == 299
