"""The time estimate (ablate/bench/estimate.py): the measured cell's factor and range, a cell's and a
grid's estimate, the cache and when it is measured again, and the one timing loop."""
import dataclasses
import json

import pytest

import ablate.bench.estimate as estimate
from ablate.bench.timing import interleaved, time_calls
from ablate.cli import main
from ablate.config import resolve

MACHINE_SPEED = estimate.machine_speed  # before conftest's fixture swaps it for the reference


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
    """(`ablate reproduce --list` prints the same figures: tests/test_claims.py runs it.)"""
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
