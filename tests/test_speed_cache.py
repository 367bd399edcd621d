"""speed.json is the harness's cache, not the user's input: whatever is found at its name (a
field of the wrong type or range, another format, a list, a FIFO, a link to a device, a folder)
means "measure again", said in one line, and the estimate that follows is a number of minutes.
A nonsense $ABLATE_SPEED is refused; an estimate says where its figures come from."""
import json
import math
import os
import re

import pytest

import ablate.bench.estimate as speed
from ablate.cli import main

MACHINE_SPEED = speed.machine_speed  # before conftest's fixture swaps it for the reference
GRID = "claim-prenorm-wins"  # a shipped grid
THREADS = speed.threads_per_worker(1)  # a dry run's at --workers 1
KEY = str(THREADS)  # the cache's entry for them


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """The real machine_speed with its cache in tmp_path and a stand-in calibration that counts
    its calls; returns (the cache file, the calls, one valid cached calibration)."""
    monkeypatch.setattr(speed, "machine_speed", MACHINE_SPEED)
    monkeypatch.delenv(speed.SPEED_ENV, raising=False)
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    calls = []

    def calibrate(threads=1):
        calls.append(threads)
        return speed.Speed(factor=0.5, low=0.9, high=1.2, threads=threads, machine=speed.machine(),
                           measured_at=speed.time.time())

    monkeypatch.setattr(speed, "calibrate", calibrate)
    path = tmp_path / speed.CACHE_NAME
    speed.machine_speed(THREADS)
    entry = json.loads(path.read_text())[KEY]
    calls.clear()
    return path, calls, entry


def dry_run(tmp_path, capsys) -> tuple[str, str]:
    """`ablate grid GRID --dry-run` at one worker: its stdout and stderr; it must exit 0."""
    assert main(["grid", GRID, "--dry-run", "--workers", "1", "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    return out, err


def assert_measured_again(out: str, err: str, calls: list) -> None:
    """One line on stderr saying the cache was unusable and is measured again, one calibration,
    and an estimate of a finite, non-negative number of minutes."""
    assert err.count("\n") == 1 and "measure again" in err and "Traceback" not in err, err
    assert calls == [THREADS]
    minutes = re.search(r"estimated time: about (\S+) min", out).group(1)
    assert math.isfinite(float(minutes)) and float(minutes) >= 0


WRONG_FIELDS = [
    ("measured_at", None), ("measured_at", "yesterday"), ("measured_at", -5.0), ("measured_at", 1e12),
    ("measured_at", 0), ("factor", 0), ("factor", -66.6), ("factor", "fast"), ("factor", "0.5"), ("factor", [0.5]),
    ("factor", None), ("factor", True), ("factor", {"s": 1}), ("low", 0), ("low", 1.5),
    ("low", "x"), ("high", 0.5), ("high", None), ("threads", "1"), ("threads", 1.5), ("threads", 0),
    ("threads", False), ("machine", 5), ("machine", None), ("format", 5), ("format", "6"), ("format", None),
]


@pytest.mark.parametrize("field, value", WRONG_FIELDS, ids=[f"{f}={v!r}" for f, v in WRONG_FIELDS])
def test_a_field_of_the_wrong_type_or_range_is_measured_again(cache, tmp_path, capsys, field, value):
    path, calls, entry = cache
    path.write_text(json.dumps({KEY: {**entry, field: value}}))
    assert_measured_again(*dry_run(tmp_path, capsys), calls)


NON_FINITE = ["NaN", "Infinity", "-Infinity"]


@pytest.mark.parametrize("field", ["measured_at", "factor", "low", "high"])
@pytest.mark.parametrize("value", NON_FINITE)
def test_a_non_finite_field_is_measured_again_never_an_estimate_of_nan_min(cache, tmp_path, capsys, field, value):
    """JSON has no NaN, but Python's reader takes NaN and Infinity: "about nan min" no more."""
    path, calls, entry = cache
    path.write_text(json.dumps({KEY: {**entry, field: 0.5}}).replace("0.5", value))
    out, err = dry_run(tmp_path, capsys)
    assert_measured_again(out, err, calls)
    assert "nan" not in out and "inf" not in out


def test_a_missing_or_unknown_field_is_measured_again(cache, tmp_path, capsys):
    path, calls, entry = cache
    path.write_text(json.dumps({KEY: {k: v for k, v in entry.items() if k != "factor"}}))
    assert_measured_again(*dry_run(tmp_path, capsys), calls)
    calls.clear()
    path.write_text(json.dumps({KEY: {**entry, "bogus": 1}}))
    assert_measured_again(*dry_run(tmp_path, capsys), calls)


@pytest.mark.parametrize("text", ["not json", "[]", '"speed"', "null", '{KEY: {}}', '{KEY: "x"}', '{KEY: []}',
                                  '{KEY: [{}]}', '{KEY: null}', "\xff\xfe"])
def test_a_cache_that_is_not_an_object_of_lists_is_measured_again(cache, tmp_path, capsys, text):
    path, calls, _ = cache
    path.write_bytes(text.replace("KEY", json.dumps(KEY)).encode("latin-1"))
    assert_measured_again(*dry_run(tmp_path, capsys), calls)


def test_a_link_to_dev_zero_is_not_read_and_is_replaced(cache, tmp_path, capsys):
    path, calls, _ = cache
    path.unlink()
    path.symlink_to("/dev/zero")
    assert_measured_again(*dry_run(tmp_path, capsys), calls)
    assert not path.is_symlink() and json.loads(path.read_text())[KEY]["threads"] == THREADS


def test_a_fifo_is_not_waited_on(cache, tmp_path, capsys):
    """A FIFO at the cache's name would block a reader until someone writes it: never opened so."""
    path, calls, _ = cache
    path.unlink()
    os.mkfifo(path)
    assert_measured_again(*dry_run(tmp_path, capsys), calls)


def test_a_folder_or_an_oversized_file_is_measured_again(cache, tmp_path, capsys):
    path, calls, entry = cache
    path.write_text(json.dumps({KEY: entry, "pad": "x" * speed.CACHE_LIMIT}))
    assert_measured_again(*dry_run(tmp_path, capsys), calls)
    calls.clear()
    path.unlink()
    path.mkdir()
    assert_measured_again(*dry_run(tmp_path, capsys), calls)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_cache_is_measured_again(cache, tmp_path, capsys):
    path, calls, _ = cache
    path.chmod(0)
    assert_measured_again(*dry_run(tmp_path, capsys), calls)


def test_a_valid_cache_is_used_without_a_word(cache, tmp_path, capsys):
    _, calls, _ = cache
    out, err = dry_run(tmp_path, capsys)
    assert err == "" and calls == [] and "estimated time: about" in out


@pytest.mark.parametrize("value", ["refernce", "measure", "0", "REFERENCE"])
def test_a_nonsense_ablate_speed_is_refused_naming_the_valid_values(cache, tmp_path, capsys, monkeypatch, value):
    _, calls, _ = cache
    monkeypatch.setenv(speed.SPEED_ENV, value)
    assert main(["grid", GRID, "--dry-run", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and value in err and "reference" in err and "unset" in err
    assert calls == []  # refused, not taken for "measure"


def test_the_yardstick_is_named_as_such_with_no_calibration_age(tmp_path, capsys):
    """The suite's yardstick (conftest.py): no "calibrated ... 29939920 min ago"."""
    out, _ = dry_run(tmp_path, capsys)
    line = next(line for line in out.splitlines() if line.startswith("estimated time"))
    assert "reference yardstick" in line and "not measured on this machine" in line
    assert "ago" not in line and "calibrat" not in line


def test_a_measured_estimate_says_how_old_its_calibration_is(cache, tmp_path, capsys):
    out, _ = dry_run(tmp_path, capsys)
    line = next(line for line in out.splitlines() if line.startswith("estimated time"))
    assert "just now" in line and "yardstick" not in line
