"""ablate.cli: environment errors, a SIGINT during start-up and Python warnings are one line each,
with the exit status the CLI promises."""
from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ablate.cli import main
from tests.helpers.cli_lines import BASE, CELL, one_line


def losses(run_dir: Path) -> list:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


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


def test_a_commands_python_warnings_are_one_line_each_without_source(monkeypatch, capsys):
    import warnings

    import ablate.commands.variants as command

    def warns(args):
        warnings.warn("a library's warning\nover two lines", UserWarning)
        return 0

    monkeypatch.setattr(command, "run", warns)
    assert main(["variants"]) == 0
    assert capsys.readouterr().err == "ablate variants: warning: a library's warning\n"


def _refused(argv: list[str], capsys) -> str:
    """The one line a command refuses `argv` with, exit 2: by the parser (SystemExit) or by run."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = e.code
    assert status == 2
    return one_line(capsys.readouterr().err)


def test_every_count_has_a_ceiling_refused_in_one_line_before_anything_is_built(tmp_path, capsys):
    out = tmp_path / "out"
    big = "9" * 401
    cases = [
        (["train", "--steps", "10000001"], "steps 10000001 must be at most 10000000; valid: 1..10000000"),
        (["train", "--width", "1000000000"], "width 1000000000 must be at most 65536; valid: 1..65536"),
        (["train", "--layers", big], "must be at most 1024; valid: 1..1024"),
        (["train", "--threads", "5000"], "threads 5000 must be at most 1024"),
        (["train", "--set", "checkpoint_every=10000001"], "checkpoint_every 10000001 must be at most 10000000"),
        (["grid", "mission", "--set", f"steps={big}"], "must be at most 10000000"),
        (["grid", "mission", "--workers", big], "argument --workers: '99999999999999999...99999999999999999' "
                                                "(401 characters) is not a count of 0..1024"),
        (["grid", "mission", "--retries", "101"], "argument --retries: '101' is not a count of 0..100"),
        (["grid", "mission", "--cpus-per-cell", "inf", "--backend", "ray"], "argument --cpus-per-cell: 'inf' is not a "
                                                                           "number of 0..1024"),
        (["grid", "mission", "--time", "43201", "--backend", "slurm"], "argument --time: '43201' is not a count of "
                                                                      "1..43200"),
        (["reproduce", "identity-init", "--workers", "1025"], "argument --workers: '1025' is not a count of 0..1024"),
        (["reproduce", "identity-init", "--seeds", "1000000000", "--dry-run"], "--seeds '1000000000' is not a number "
                                                                               "of seeds; valid: a whole number in "
                                                                               "2..10000"),
    ]
    for argv, message in cases:
        assert message in _refused([*argv, "--out", str(out)], capsys), argv
    assert not out.exists()
