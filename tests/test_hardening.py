"""Issue 12, hostile and unlucky users: a failed run is tried again, a tampered token cache is
rebuilt, environment errors are one line, links in a run folder are never written through,
a status check never makes a free cell look busy, and a grid rerun keeps its thread counts."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ablate.train
from ablate import grid_state
from ablate.backends import local
from ablate.cli import build_parser, main
from ablate.grid_runner import GridRunOptions, run_checked_grid
from ablate.grids import load_grid
from ablate.rundir import CellLock, remove_stale_temporaries, replace_atomic, write_json_atomic

BASE = ["train", "--steps", "3", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
        "--device", "cpu", "--threads", "1", "--quiet"]
CELL = "pre.layernorm.gelu.dense.res__batch_size=2__seq_len=16__steps=3__seed=0"


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def losses(run_dir: Path) -> list:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    return path


# ------------------------------------------------------------------ 2. a failed run is tried again


def test_a_failed_run_is_tried_again_on_rerun_and_its_rerun_never_exits_0(tmp_path, capsys, monkeypatch):
    real = ablate.train.train
    monkeypatch.setattr(ablate.train, "train", lambda *a, **k: (_ for _ in ()).throw(MemoryError("injected")))
    args = [*BASE, "--out", str(tmp_path)]
    run_dir = tmp_path / CELL
    assert main(args) == 1
    assert summary(run_dir)["status"] == "failed"
    capsys.readouterr()
    assert main(args) == 1  # was: "already finished (failed); nothing to do", exit 0
    err = capsys.readouterr().err
    assert "failed before (MemoryError: injected); trying again" in err and "failed: MemoryError" in err
    assert summary(run_dir)["attempts"] == 2
    monkeypatch.setattr(ablate.train, "train", real)
    assert main(args) == 0
    assert summary(run_dir)["status"] == "completed"
    # Nothing of the failed attempts is lost.
    assert sorted(p.name for p in run_dir.glob("error-attempt*")) == ["error-attempt0.txt", "error-attempt1.txt"]
    assert all("MemoryError: injected" in p.read_text() for p in run_dir.glob("error-attempt*"))
    assert [json.loads((run_dir / f"summary.failed-{k}.json").read_text())["attempts"] for k in (0, 1)] == [1, 2]
    capsys.readouterr()
    assert main(args) == 0 and "already finished (completed)" in capsys.readouterr().out  # completed: never again


# ------------------------------------------------------------------ 5. the token cache


def test_a_tampered_token_cache_is_detected_and_rebuilt(cache, text_file):
    from ablate import data

    clean = data.load_data(str(text_file), "bytes", 256)
    want_fp, want_tokens = clean.fingerprint, np.concatenate([clean.train[0], clean.val[0]]).copy()
    (bin_path,) = cache.rglob("tokens-*.bin")
    meta_path = bin_path.with_suffix(".json")

    def check():
        again = data.load_data(str(text_file), "bytes", 256)
        assert again.fingerprint == want_fp
        assert np.array_equal(np.concatenate([again.train[0], again.val[0]]), want_tokens)

    # Other tokens of the same size, written in place with the old mtime put back.
    st = bin_path.stat()
    with open(bin_path, "r+b") as f:
        f.seek(1024)
        f.write(b"\x07\x00" * 100)
    os.utime(bin_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert bin_path.stat().st_size == st.st_size
    check()
    # An edited fingerprint in the meta file.
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "fingerprint": "sha256:" + "0" * 64}))
    check()
    # A deleted token file with its meta kept.
    bin_path.unlink()
    check()
    # A copied cache (new inode, same tokens) is verified by hashing, not rebuilt.
    os.replace(bin_path, bin_path.with_name("x"))
    bin_path.with_name("x").rename(bin_path)
    check()


def test_a_poisoned_max_token_in_the_shard_meta_is_not_trusted(cache, tmp_path):
    from ablate import data

    shard = tmp_path / "shards" / "data.bin"
    data.write_shard(shard, np.arange(5000, dtype=np.uint16) % 300)
    assert data.load_data(str(shard.parent), "bytes", 256).max_token == 299
    (meta_path,) = cache.glob("shards-*.json")
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "max_token": 3}))
    assert data.load_data(str(shard.parent), "bytes", 256).max_token == 299


# ------------------------------------------------------------------ 6. environment errors


def test_an_unusable_cache_or_out_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, text_file):
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    for cache in (a_file, "/proc/ablate-cache"):
        monkeypatch.setenv("ABLATE_CACHE", str(cache))
        assert main([*BASE, "--data", str(text_file), "--out", str(tmp_path / "out")]) == 2
        err = one_line(capsys.readouterr().err)
        assert f"ABLATE_CACHE={cache}" in err and "valid: a folder you can write to" in err
    assert a_file.read_text() == "keep" and not (tmp_path / "out").exists()
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    assert main([*BASE, "--data", str(text_file), "--out", "/proc/x"]) == 2
    assert "/proc/x" in one_line(capsys.readouterr().err)


def test_disk_full_is_one_line_and_the_rerun_resumes_cleanly(tmp_path, capsys, monkeypatch):
    import torch

    args = [*BASE, "--steps", "6", "--checkpoint-every", "2"]
    assert main([*args, "--out", str(tmp_path / "ref")]) == 0
    cell = CELL.replace("steps=3", "steps=6")
    real_save = torch.save

    def full_disk(obj, f, *a, **k):
        (f.write if hasattr(f, "write") else open(f, "wb").write)(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device", str(getattr(f, "name", f)))

    monkeypatch.setattr(torch, "save", full_disk)
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "cut")]) == 2
    assert "No space left on device" in one_line(capsys.readouterr().err)
    run_dir = tmp_path / "cut" / cell
    assert not (run_dir / "summary.json").exists() and not (run_dir / "checkpoint.pt").exists()
    monkeypatch.setattr(torch, "save", real_save)
    assert main([*args, "--out", str(tmp_path / "cut")]) == 0
    assert losses(run_dir) == losses(tmp_path / "ref" / cell)
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_cell_id_too_long_for_a_file_name_is_refused_at_dry_run(tmp_path, capsys):
    path = tmp_path / "long.toml"
    path.write_text(textwrap.dedent("""
        [axes]
        lr = [0.00123456, 0.00234567]
        warmup = [11111111, 22222222]
        min_lr_ratio = [0.111111, 0.222222]
        weight_decay = [0.0111111, 0.0222222]
        beta1 = [0.811111, 0.822222]
        beta2 = [0.911111, 0.922222]
        grad_clip = [1.11111, 2.22222]
        diverge_factor = [3.11111, 4.22222]
        eval_every = [1111111, 2222222]
        batch_size = [11, 12]
        steps = [1111111, 2222222]
        z_loss = [0.0001111, 0.0002222]
        log_every = [1111111, 2222222]
    """))
    out = tmp_path / "out"
    assert main(["grid", str(path), "--dry-run", "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "longer than a file name may be (255)" in err and "fewer axes" in err and "weight_decay" in err
    assert not out.exists()


# ------------------------------------------------------------------ 7. links in a run folder


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


# ------------------------------------------------------------------ 8. the lock race


def test_a_status_check_never_makes_a_free_cell_look_busy(tmp_path):
    run_dir = tmp_path / "cell"
    run_dir.mkdir()
    (run_dir / ".lock").touch()
    probe = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from ablate.rundir import CellLock
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


# ------------------------------------------------------------------ 9. smaller items


def _wait_for_torch(proc) -> None:
    """Until the process is importing torch: inside ablate's start-up, past the interpreter's."""
    maps = Path(f"/proc/{proc.pid}/maps")
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        try:
            if "torch" in maps.read_text():
                return
        except OSError:
            pass
        time.sleep(0.005)


def test_sigint_during_start_up_prints_no_traceback(tmp_path):
    """SIGINT at three moments of start-up (the three processes start together, each with its
    own run folder, and each gets its signal its own delay after it began importing torch)."""
    delays = (0.0, 0.3, 0.8)
    procs = [subprocess.Popen([sys.executable, "-m", "ablate", *BASE, "--out", str(tmp_path / str(i))],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(len(delays))]

    def interrupt(proc, delay):
        _wait_for_torch(proc)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)

    threads = [threading.Thread(target=interrupt, args=pair) for pair in zip(procs, delays)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for proc, delay in zip(procs, delays):
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, (delay, err)
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, proc.returncode, err)


def test_empty_grid_files_are_refused_and_a_file_name_names_a_nameless_grid(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing yet\n")
    assert main(["grid", str(empty), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert "defines no cells" in one_line(capsys.readouterr().err)
    spaced = tmp_path / "my grid.toml"
    spaced.write_text("[axes]\nseed = [0, 1]\n")
    assert load_grid(spaced).name == "my-grid"
    odd = tmp_path / "%%%.toml"
    odd.write_text("[axes]\nseed = [0, 1]\n")
    assert main(["grid", str(odd), "--dry-run"]) == 2
    assert "the file name '%%%.toml' gives no grid name" in one_line(capsys.readouterr().err)


def test_busy_cells_are_reported_as_they_end_and_never_skipped(tmp_path, capsys, monkeypatch):
    path = tmp_path / "g.toml"
    path.write_text("[base]\nsteps = 1\n[axes]\nseed = [0, 1, 2]\n")
    grid, out = load_grid(path), tmp_path / "out"
    calls = []

    def cell_fn(cell, out_root, retries=0, quiet=True, execution=None):
        from ablate.cell import CellOutcome

        calls.append(cell.id)
        run_dir = Path(out_root) / cell.id
        run_dir.mkdir(parents=True, exist_ok=True)
        done = {"status": "completed", "final_loss": 1.0, "final_val_loss": 1.0, "diverged_at_step": None,
                "steps": 1, "wall_time_s": 0.0, "error": None}
        seed = cell.options["seed"]
        if calls.count(cell.id) == 1 and seed in (0, 1):
            if seed == 0:  # its holder finished it while we looked elsewhere
                write_json_atomic(run_dir / "summary.json", done)
            return CellOutcome(cell.id, "busy", None)
        write_json_atomic(run_dir / "summary.json", done)
        return CellOutcome(cell.id, "trained", done)

    args = GridRunOptions.from_args(build_parser().parse_args(["grid", str(path), "--workers", "0", "--quiet"]))
    assert run_checked_grid(grid, out, args, cell_fn=cell_fn) == 0
    text = capsys.readouterr().out
    final = text.strip().splitlines()[-1]
    assert final.startswith("grid g: 3 cells: 3 completed") and "another process" not in final, final
    assert "1 cell another process held and left unfinished: training it here" in text
    assert calls.count(grid.cells[1].id) == 2 and calls.count(grid.cells[0].id) == 1
    assert json.loads((out / "grid.json").read_text())["counts"] == {"completed": 3}


def test_grid_json_updates_rederive_only_the_cells_that_changed(tmp_path, monkeypatch):
    path = tmp_path / "g.toml"
    path.write_text("[axes]\nseed = %s\n" % list(range(300)))
    grid, out = load_grid(path), tmp_path / "out"
    grid_json = grid_state.GridJson(out, grid.record())
    grid_json.write()
    derived = []
    real = grid_state.cell_status
    monkeypatch.setattr(grid_state, "cell_status", lambda root, cid: derived.append(cid) or real(root, cid))
    done = grid.cells[7].id
    (out / done).mkdir()
    write_json_atomic(out / done / "summary.json", {"status": "completed"})
    grid_json.write({done})
    assert derived == [done]
    state = json.loads((out / "grid.json").read_text())
    assert state["counts"] == {"pending": 299, "completed": 1}
    assert [c["id"] for c in state["cells"]] == [c.id for c in grid.cells]
    assert state["cells"][7] == {"id": done, "group": grid.cells[7].group, "status": "completed",
                                 "options": grid.cells[7].options}
    assert state == {**grid_state.write_grid_json(out, grid.record()), "updated": state["updated"]}


# ------------------------------------------------------------------ 10. thread counts on a rerun


@pytest.mark.slow
def test_a_rerun_with_fewer_cells_left_keeps_the_recorded_thread_count(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(local, "cpu_count", lambda: 2)  # as on a 2-core machine, wherever this runs
    path = tmp_path / "g.toml"
    path.write_text(textwrap.dedent("""
        [base]
        layers = 2
        batch_size = 4
        seq_len = 32
        eval_batches = 1
        steps = 6
        [axes]
        seed = [0, 1, 2]
    """))
    grid = load_grid(path)
    args = GridRunOptions.from_args(build_parser().parse_args(["grid", str(path), "--workers", "2", "--quiet"]))
    out = tmp_path / "out"
    assert run_checked_grid(grid, out, args) == 0
    assert "3 to run on 2 workers, 1 thread each" in capsys.readouterr().out
    last = out / grid.cells[-1].id
    reference = losses(last)
    assert json.loads((last / "config.json").read_text())["train"]["threads"] == 1
    assert all(c["threads"] == 1 for c in json.loads((out / "grid.json").read_text())["cells"])
    # As if the first run had stopped before this cell started: one cell left, two workers.
    for item in last.iterdir():
        item.unlink()
    assert run_checked_grid(grid, out, args) == 0
    assert "1 to run on 1 worker, 1 thread each" in capsys.readouterr().out  # was: 2 threads
    assert json.loads((last / "config.json").read_text())["train"]["threads"] == 1
    assert losses(last) == reference
