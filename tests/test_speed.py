"""The time estimate (ablate/bench/estimate.py): the fit of two measured cells, a cell's and a
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
    speed = estimate.Speed(block_s=0.002, flops_per_s=1e9, cell_s=1.0, low=0.9, high=1.2, threads=threads,
                           machine=estimate.machine(), measured_at=estimate.time.time() if at is None else at)
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


def test_two_cells_give_back_a_known_machines_block_cost_and_flop_rate(monkeypatch):
    """Rounds whose step times follow the formula exactly give its figures back; the fastest
    and slowest rounds of the claims' cell give the estimate's range."""
    block_s, rate = 0.0015, 2e9
    configs = {w: resolve({"model": "tiny", "layers": estimate.BLOCKS, "width": w}) for w in estimate.WIDTHS}
    monkeypatch.setattr(estimate, "_stepper", lambda width, threads: (width, configs[width], 0.5 + width / 100))

    def rounds(fns, n, repeats, warmup):
        assert n == estimate.ROUNDS and repeats == estimate.STEPS
        step = {w: block_s * estimate.BLOCKS + estimate.step_flops(configs[w]) / rate for w in fns}
        return {w: [step[w] * f for f in (1.0, 0.9, 1.3)] for w in fns}

    monkeypatch.setattr("ablate.bench.timing.interleaved", rounds)
    s = estimate.calibrate(1)
    assert s.block_s == pytest.approx(block_s, rel=1e-6) and s.flops_per_s == pytest.approx(rate, rel=1e-6)
    assert s.low == pytest.approx(0.9) and s.high == pytest.approx(1.3) and s.cell_s == pytest.approx(0.66)
    assert s.machine == estimate.machine() and s.threads == 1


def test_a_cells_estimate_is_its_steps_evaluations_and_build():
    s = known(flops_per_s=float("inf"))
    cfg = resolve({"layers": 5, "steps": 100, "eval_every": 50, "eval_batches": 4, "final_eval_batches": 8})
    step = 0.002 * 5
    assert s.cell_seconds(cfg) == pytest.approx(1.0 + (100 + (1 * 4 + 8) * estimate.EVAL_RATIO) * step)


def test_a_step_costs_its_blocks_and_its_flops():
    s = known()
    narrow, wide = (resolve({"layers": 4, "width": w}) for w in (16, 64))
    for cfg in (narrow, wide):
        assert s.step_seconds(cfg) == pytest.approx(0.002 * 4 + estimate.step_flops(cfg) / 1e9)
    assert estimate.step_flops(wide) > 4 * estimate.step_flops(narrow)


def test_a_grid_estimate_shares_the_cells_among_the_workers():
    from ablate.grid.spec import load_grid

    s = known(block_s=0.01, flops_per_s=float("inf"), cell_s=0.0)
    grid = load_grid("claim-prenorm-wins")
    one = estimate.grid_seconds(grid, 1, threads=1, speed=s)
    assert one > 0.01 * 12 * grid.total_steps
    two = estimate.grid_seconds(grid, 2, threads=1, speed=s)
    assert one / 2 * (1 - 1e-12) <= two < one / 2 * 1.1  # never better than a perfect share


def test_the_range_is_the_fastest_and_slowest_round_and_the_yardstick_has_none():
    assert known().span(600) == " (9.0-12.0 min at its fastest and slowest round)"
    assert estimate.reference(1).span(600) == ""


def test_the_calibration_is_cached_while_it_describes_the_machine(measured, monkeypatch, tmp_path):
    first = estimate.machine_speed(1, quiet=True)
    assert measured == [1] and estimate.machine_speed(1, quiet=True) == first  # cached
    estimate.machine_speed(2, quiet=True)  # another thread count: its own entry
    assert measured == [1, 2] and estimate.machine_speed(1, quiet=True) == first
    entries = json.loads((tmp_path / estimate.CACHE_NAME).read_text())
    assert set(entries) == {"1", "2"} and entries["1"]["format"] == estimate.FORMAT
    entries["1"]["machine"] = "another CPU"
    (tmp_path / estimate.CACHE_NAME).write_text(json.dumps(entries))
    estimate.machine_speed(1, quiet=True)
    assert measured == [1, 2, 1]
    monkeypatch.setattr(estimate.time, "time", lambda: first.measured_at + estimate.MAX_AGE_S + 60)  # too old
    estimate.machine_speed(1, quiet=True)
    assert measured == [1, 2, 1, 1]


def test_ablate_speed_reference_estimates_from_the_yardstick_without_measuring(measured, monkeypatch):
    monkeypatch.setenv(estimate.SPEED_ENV, "reference")
    assert estimate.machine_speed(2, quiet=True) == estimate.reference(2) and measured == []


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
    estimate.machine_speed(1, quiet=True)
    assert target.read_text() == "not the cache's" and not (tmp_path / estimate.CACHE_NAME).is_symlink()
    assert json.loads((tmp_path / estimate.CACHE_NAME).read_text())["1"]["threads"] == 1


def test_a_real_calibration_measures_positive_figures(monkeypatch):
    monkeypatch.setattr(estimate, "ROUNDS", 1)
    monkeypatch.setattr(estimate, "STEPS", 1)
    s = estimate.calibrate(1)
    assert s.block_s >= 0 and s.flops_per_s > 0 and s.cell_s > 0 and s.low == s.high == 1.0


def test_the_timing_loop_warms_up_then_times_each_repeat():
    calls = []
    samples = time_calls(lambda: calls.append(1), repeats=3, warmup=2, calls=4)
    assert len(samples) == 3 and len(calls) == 2 + 3 * 4 and all(s >= 0 for s in samples)


def test_interleaved_timing_takes_turns_round_after_round():
    order = []
    samples = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, rounds=2, warmup=1)
    assert order == ["a", "a", "b", "b"] * 2 and [len(v) for v in samples.values()] == [2, 2]
