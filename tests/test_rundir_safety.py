"""ablate.rundir's writes and locks: a link in a run folder is never written through, a failed
write leaves nothing, and a status check never makes a free cell look busy."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest

from ablate.cli import main
from ablate.rundir import CellLock
from ablate.rundir import remove_stale_temporaries, replace_atomic
from ablate.rundir import write_json_atomic

from tests.helpers.cli_lines import BASE, CELL, one_line


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
