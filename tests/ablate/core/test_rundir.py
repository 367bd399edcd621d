"""ablate.core.rundir: the run folder's facts (file names, status words, summary.json's schema), a
run's status read from its folder, "is this the same run?", and its writes and locks: a link in
a run folder is never written through, a failed write leaves nothing, and a status check never
makes a free cell look busy."""
import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.core import rundir
from ablate.core.rundir import (COMPLETED, CellLock, DIVERGED, DONE, FAILED, FINISHED, PENDING, RESULT_KEYS, RUNNING,
                                STATUSES, SUMMARY_KEYS, differing, failed_summary, file_version, finished_status,
                                identity, identity_keys, read_summary, remove_stale_temporaries, replace_atomic,
                                run_summary, status, summary_status, write_json_atomic)
from tests.helpers.cli_lines import BASE, CELL, one_line
from tests.helpers.repo import REPO


def write_summary(run_dir: Path, content) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    text = content if isinstance(content, str) else json.dumps(content)
    (run_dir / rundir.SUMMARY).write_text(text)


# ------------------------------------------------------------------------------ words and schema

def test_the_status_words_and_how_they_group():
    assert DONE == (COMPLETED, DIVERGED) == ("completed", "diverged")
    assert FINISHED == ("completed", "diverged", "failed") and FAILED not in DONE
    assert STATUSES == ("completed", "diverged", "failed", "running", "pending")
    assert rundir.INTERRUPTED not in STATUSES  # `ablate status`'s finer word for a pending cell


def test_a_finished_summary_has_every_key_and_names_lost_steps_only_when_there_are_some():
    summary = run_summary(COMPLETED, 2.5, float("nan"), None, steps=10, wall_time_s=1.5)
    assert tuple(summary) == SUMMARY_KEYS
    assert summary["final_val_loss"] is None  # JSON has no NaN
    assert run_summary(DIVERGED, None, None, 4, 5, 0.1, missing_steps=[2])[rundir.MISSING_STEPS] == [2]
    with pytest.raises(AssertionError):
        run_summary(FAILED, None, None, None, 0, 0.0)  # a failed summary has its own maker


def test_a_failed_summary_has_no_result_but_its_error_and_attempts():
    summary = failed_summary("RuntimeError: boom", 2)
    assert tuple(summary)[:len(SUMMARY_KEYS)] == SUMMARY_KEYS
    assert summary["status"] == FAILED and all(summary[k] is None for k in RESULT_KEYS)
    assert (summary["error"], summary[rundir.ATTEMPTS]) == ("RuntimeError: boom", 2)


@pytest.mark.parametrize("summary, expected", [
    (None, None), ({"status": "completed"}, COMPLETED), ({"status": "diverged"}, DIVERGED),
    ({"status": "failed"}, FAILED), ({}, FAILED), ({"status": "running"}, FAILED), ({"status": 3}, FAILED),
])
def test_a_summary_that_names_no_finished_status_says_failed(summary, expected):
    assert summary_status(summary) == expected


# ------------------------------------------------------------------------------ a folder's status

def test_the_status_of_an_empty_a_finished_and_a_failed_folder(tmp_path):
    assert status(tmp_path / "never-made") == PENDING and finished_status(tmp_path / "never-made") is None
    for word in FINISHED:
        write_summary(tmp_path / word, {"status": word})
        assert status(tmp_path / word) == finished_status(tmp_path / word) == word


@pytest.mark.parametrize("content", ["{\"status\": \"compl", "[1, 2]", "\x00garbage", '{"status": "bogus"}'])
def test_a_damaged_summary_is_failed_not_a_result(tmp_path, content):
    write_summary(tmp_path, content)
    assert read_summary(tmp_path) == ({} if content != '{"status": "bogus"}' else {"status": "bogus"})
    assert status(tmp_path) == FAILED


def test_a_summary_that_is_a_fifo_is_failed_without_blocking(tmp_path):
    os.mkfifo(tmp_path / rundir.SUMMARY)
    assert read_summary(tmp_path) == {} and status(tmp_path) == FAILED


def test_a_partial_folder_is_running_while_another_process_holds_its_lock_else_pending(tmp_path):
    (tmp_path / rundir.METRICS).write_text('{"step": 0, "loss": 4.0}\n')
    assert status(tmp_path) == PENDING  # interrupted: resumes on a rerun
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from ablate.core.rundir import CellLock; "
                               f"assert CellLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert status(tmp_path) == RUNNING
        write_summary(tmp_path, {"status": "completed"})
        assert status(tmp_path) == COMPLETED  # the summary decides, whoever holds the lock
    finally:
        holder.kill()
        holder.wait()


def test_our_own_lock_does_not_make_the_folder_running(tmp_path):
    lock = CellLock(tmp_path)
    assert lock.acquire()
    try:
        assert status(tmp_path) == RUNNING  # another open file description: as another process
    finally:
        lock.release()
    assert status(tmp_path) == PENDING


def test_file_version_changes_when_a_file_is_replaced(tmp_path):
    path = tmp_path / "config.json"
    assert file_version(path) is None
    rundir.write_json_atomic(path, {"a": 1})
    first = file_version(path)
    rundir.write_json_atomic(path, {"a": 1})
    assert first is not None and file_version(path) != first


# ------------------------------------------------------------------------------ the same run?

COMPARED = {"lr": 0.001, "steps": 100, "layers": None, "variant": None, "data": None, "kernels": "auto"}


def config(**train):
    return {"train": {"lr": 0.001, "steps": 100, **train}, "variant": {"id": "pre.layernorm.gelu.dense.res"},
            "model": {"n_layer": 2, "init": "gpt2"}, "data": {"fingerprint": "sha256:abc"}, "kernels": "torch",
            "device": "cpu", "dtype": "float32"}


def test_identity_reads_resolved_options_where_config_json_records_them():
    ident = identity(config(), COMPARED)
    assert ident == {"lr": 0.001, "steps": 100, "variant": "pre.layernorm.gelu.dense.res", "layers": 2, "init": "gpt2",
                     "data": "sha256:abc", "kernels": "torch", "device": "cpu", "dtype": "float32"}


def test_the_same_run_differs_in_nothing_and_another_run_in_what_it_changed():
    assert differing(config(), config(), COMPARED) == []
    assert differing(config(), config(lr=0.003), COMPARED) == ["lr"]
    other = {**config(), "variant": {"id": "post.layernorm.gelu.dense.res"}}
    assert differing(config(), other, COMPARED) == ["variant"]


def test_an_older_config_has_the_default_of_an_option_it_lacks_and_is_not_compared_where_it_recorded_nothing():
    old = config()
    del old["train"]["lr"], old["dtype"], old["model"]
    assert identity(old, COMPARED)["lr"] == 0.001 and "dtype" not in identity(old, COMPARED)
    assert differing(old, config(), COMPARED) == []
    assert differing(old, config(lr=0.003), COMPARED) == ["lr"]


def test_identity_keys_come_from_config_json_or_the_old_tuple():
    assert identity_keys({"identity_keys": ["lr", 3, "steps"]}) == ("lr", "steps")
    assert identity_keys({}) == rundir.SETTING_KEYS


# ------------------------------------------------------------------------------ writes and locks

def test_a_symlinked_lock_or_temporary_never_clobbers_its_target(tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run_dir = tmp_path / "out" / CELL
    run_dir.mkdir(parents=True)
    (run_dir / ".lock").symlink_to(victim)
    assert main([*BASE, "--out", str(tmp_path / "out")]) == 2
    assert "is a symbolic link" in one_line(capsys.readouterr().err)
    assert victim.read_text() == "precious"
    # A lock file hard-linked to another file is locked but not truncated.
    (run_dir / ".lock").unlink()
    os.link(victim, run_dir / ".lock")
    lock = CellLock(run_dir)
    assert lock.acquire()
    lock.release()
    assert victim.read_text() == "precious"
    # Temporaries: a planted checkpoint.tmp / metrics.tmp / .x.tmp link is removed, not written
    # through; replace_atomic replaces a link at its path, never the target.
    for name in ("checkpoint.tmp", "metrics.tmp", ".summary.json.0123abcd.tmp"):
        (run_dir / name).symlink_to(victim)
    remove_stale_temporaries(run_dir)
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    (run_dir / "summary.json").symlink_to(victim)
    replace_atomic(run_dir / "summary.json", lambda f: f.write(b"{}"))
    assert victim.read_text() == "precious" and not (run_dir / "summary.json").is_symlink()


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path):
    def fail(f):
        f.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError):
        replace_atomic(tmp_path / "error-attempt0.txt", fail)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "summary.json", {"x": float("inf")})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_status_check_never_makes_a_free_cell_look_busy(tmp_path):
    run_dir = tmp_path / "cell"
    run_dir.mkdir()
    (run_dir / ".lock").touch()
    probe = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from ablate.core.rundir import CellLock
        lock = CellLock({str(run_dir)!r})
        print("ready", flush=True)
        while True:
            lock.is_held_elsewhere()
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout.readline().strip() == "ready"
        lock = CellLock(run_dir)
        busy = 0
        for _ in range(5000):
            if lock.acquire():
                lock.release()
            else:
                busy += 1
        assert busy == 0, f"{busy} of 5000 acquisitions saw a free cell as busy"
    finally:
        probe.kill()
        probe.wait()
    # And the check still sees a real holder, in this process or another.
    holder = CellLock(run_dir)
    assert holder.acquire()
    assert CellLock(run_dir).is_held_elsewhere() and not CellLock(run_dir).acquire()
    holder.release()
    assert not CellLock(run_dir).is_held_elsewhere()
