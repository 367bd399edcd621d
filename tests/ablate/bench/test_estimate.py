"""The time estimate (ablate/bench/estimate.py): the measured cell's factor and range, a cell's and a
grid's estimate, the cache and when it is measured again, and the one timing loop.

speed.json is the harness's cache, not the user's input: whatever is found at its name (a field of
the wrong type or range, another format, a list, a FIFO, a link to a device, a folder) means
"measure again", said in one line, and the estimate that follows is a number of minutes. A
nonsense $ABLATE_SPEED is refused; an estimate says where its figures come from."""
import dataclasses
import json
import math
import os
import re

import pytest

import ablate.bench.estimate as estimate
from ablate.bench.timing import interleaved, time_calls
from ablate.cli import main
from ablate.engine.config import resolve

MACHINE_SPEED = estimate.machine_speed  # before conftest's fixture swaps it for the reference
GRID = "claim-prenorm-wins"  # a shipped grid
THREADS = estimate.threads_per_worker(1)  # a dry run's at --workers 1
KEY = str(THREADS)  # the cache's entry for them


def known(threads=1, at=None, **changes) -> estimate.Speed:
    speed = estimate.Speed(factor=0.5, low=0.9, high=1.2, threads=threads, machine=estimate.machine(),
                           measured_at=estimate.time.time() if at is None else at)
    return dataclasses.replace(speed, **changes)


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The real machine_speed, its cache in tmp_path, a calibration that counts its calls."""
    monkeypatch.setattr(estimate, "machine_speed", MACHINE_SPEED)
    monkeypatch.delenv(estimate.SPEED_ENV, raising=False)
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(estimate, "calibrate", lambda threads=1: calls.append(threads) or known(threads))
    return calls


def test_the_measured_cell_sets_the_factor_and_its_rounds_the_range(monkeypatch):
    """Steps that take 1.5 x the yardstick's price, the rounds at 1.0, 0.9 and 1.3 x the median's:
    the factor and the range come back, and the estimate of the measured cell is its median step."""
    cfg = resolve({"model": "tiny", "layers": estimate.BLOCKS})
    step = 1.5 * estimate.reference().step_seconds(cfg)
    timed = [step] * estimate.WARMUP + [step * f for f in (1.0, 0.9, 1.3) for _ in range(estimate.STEPS)]

    def steps_in_turn(plan, copies, first, steps):
        assert steps == len(timed) and len(copies) == 1 and copies[0][2] is not None  # probes on
        return [timed], [[0.0] * steps]

    monkeypatch.setattr("ablate.bench.lockstep.steps_in_turn", steps_in_turn)
    s = estimate.calibrate(1)
    assert s.factor == pytest.approx(1.5) and s.low == pytest.approx(0.9) and s.high == pytest.approx(1.3)
    assert s.step_seconds(cfg) == pytest.approx(step) and s.machine == estimate.machine() and s.threads == 1


def test_a_cells_estimate_is_its_steps_and_evaluations():
    s = known()
    cfg = resolve({"layers": 5, "steps": 100, "eval_every": 50, "eval_batches": 4, "final_eval_batches": 8})
    assert s.cell_seconds(cfg) == pytest.approx((100 + (1 * 4 + 8) * estimate.EVAL_RATIO) * s.step_seconds(cfg))


def test_a_step_costs_its_blocks_and_its_flops_at_the_machines_factor():
    s = known()
    narrow, wide = (resolve({"layers": 4, "width": w}) for w in (16, 64))
    for cfg in (narrow, wide):
        price = estimate.BLOCK_S * 4 + estimate.step_flops(cfg) / estimate.FLOPS_PER_S
        assert s.step_seconds(cfg) == pytest.approx(0.5 * price)
    assert estimate.step_flops(wide) > 4 * estimate.step_flops(narrow)


def test_a_grid_estimate_shares_the_cells_among_the_workers():
    from ablate.grid.spec import load_grid

    s = known()
    grid = load_grid("claim-prenorm-wins")
    one = estimate.grid_seconds(grid, 1, speed=s)
    assert one > 0.5 * estimate.BLOCK_S * 12 * grid.total_steps
    two = estimate.grid_seconds(grid, 2, speed=s)
    assert one / 2 * (1 - 1e-12) <= two < one / 2 * 1.1  # never better than a perfect share


def test_the_range_is_the_fastest_and_slowest_round_and_the_yardstick_has_none():
    assert known().span(600) == " (9.0-12.0 min at its fastest and slowest round)"
    assert estimate.reference(1).span(600) == ""


def test_the_calibration_is_cached_while_it_describes_the_machine(measured, monkeypatch, tmp_path):
    first = estimate.machine_speed(1)
    assert measured == [1] and estimate.machine_speed(1) == first  # cached
    estimate.machine_speed(2)  # another thread count: its own entry
    assert measured == [1, 2] and estimate.machine_speed(1) == first
    entries = json.loads((tmp_path / estimate.CACHE_NAME).read_text())
    assert set(entries) == {"1", "2"} and entries["1"]["format"] == estimate.FORMAT
    entries["1"]["machine"] = "another CPU"
    (tmp_path / estimate.CACHE_NAME).write_text(json.dumps(entries))
    estimate.machine_speed(1)
    assert measured == [1, 2, 1]
    monkeypatch.setattr(estimate.time, "time", lambda: first.measured_at + estimate.MAX_AGE_S + 60)  # too old
    estimate.machine_speed(1)
    assert measured == [1, 2, 1, 1]


def test_ablate_speed_reference_estimates_from_the_yardstick_without_measuring(measured, monkeypatch):
    monkeypatch.setenv(estimate.SPEED_ENV, "reference")
    assert estimate.machine_speed(2) == estimate.reference(2) and measured == []


def test_grid_dry_run_prints_the_measured_estimate(measured, capsys, tmp_path):
    """(`ablate reproduce --list` prints the same figures: tests/ablate/claims/test_verdict.py runs it.)"""
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\n[base]\nsteps = 20\n[axes]\nseed = [0, 1, 2]\n')
    assert main(["grid", str(grid), "--dry-run", "--workers", "2", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("estimated time: about"))
    assert "with 2 local workers" in line and "measured just now" in line and "fastest and slowest round" in line
    assert len(measured) == 1


def test_the_cache_is_written_without_following_a_link(measured, tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("not the cache's")
    (tmp_path / estimate.CACHE_NAME).symlink_to(target)
    estimate.machine_speed(1)
    assert target.read_text() == "not the cache's" and not (tmp_path / estimate.CACHE_NAME).is_symlink()
    assert json.loads((tmp_path / estimate.CACHE_NAME).read_text())["1"]["threads"] == 1


def test_a_real_calibration_measures_positive_figures(monkeypatch):
    monkeypatch.setattr(estimate, "ROUNDS", 1)
    monkeypatch.setattr(estimate, "STEPS", 1)
    s = estimate.calibrate(1)
    assert s.factor > 0 and s.low == s.high == 1.0


def test_the_timing_loop_warms_up_then_times_each_repeat():
    calls = []
    samples = time_calls(lambda: calls.append(1), repeats=3, warmup=2, calls=4)
    assert len(samples) == 3 and len(calls) == 2 + 3 * 4 and all(s >= 0 for s in samples)


def test_the_timing_loop_reads_its_clock_around_the_calls_after_before():
    events = []

    def mark():
        events.append("mark")
        return len(events)

    samples = time_calls(lambda: events.append("call"), repeats=2, warmup=1, calls=2, clock=(mark, lambda a, b: b - a),
                         before=lambda: events.append("before"))
    assert events == ["call"] + ["before", "mark", "call", "call", "mark"] * 2
    assert samples == [(6 - 3) / 2, (11 - 8) / 2]  # each mark returns how many events came before it, itself included


def test_interleaved_timing_takes_turns_round_after_round():
    order = []
    samples = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=2, warmup=1)
    assert order == ["a", "a", "b", "b"] * 2 and [len(v) for v in samples.values()] == [2, 2]


# ----------------------------------------------------------------- the cache is not input


@pytest.fixture
def cache(measured, tmp_path):
    """`measured`, with one valid calibration cached: (the cache file, the calls, its entry)."""
    path = tmp_path / estimate.CACHE_NAME
    estimate.machine_speed(THREADS)
    entry = json.loads(path.read_text())[KEY]
    measured.clear()
    return path, measured, entry


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
                                  '{KEY: [{}]}', '{KEY: null}', "\xff\xfe", "[" * 3000 + "]" * 3000,
                                  '{KEY: ' + "[" * 3000 + "]" * 3000 + "}"])
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
    path.write_text(json.dumps({KEY: entry, "pad": "x" * estimate.CACHE_LIMIT}))
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
    monkeypatch.setenv(estimate.SPEED_ENV, value)
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
