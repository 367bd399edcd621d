"""The time estimates come from this machine's measured speed (ablate/speed.py): the fit, the
cache and when it is measured again, and the commands that print them."""
import dataclasses
import json
from pathlib import Path

import pytest

import ablate.speed as speed
from ablate.cli import main
from ablate.config import resolve
from ablate.cores import cpu_count

MACHINE_SPEED = speed.machine_speed  # before conftest's fixture swaps it for the reference


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """The real machine_speed, with its cache in tmp_path, a fixed load average and a
    calibration that counts its calls and returns the given figures."""
    monkeypatch.setattr(speed, "machine_speed", MACHINE_SPEED)
    monkeypatch.delenv(speed.SPEED_ENV, raising=False)  # conftest.py's yardstick for child processes
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path))
    state = {"load": 0.5, "calls": 0}
    monkeypatch.setattr(speed, "competing_load", lambda: state["load"])

    def calibrate(threads=1):
        state["calls"] += 1
        return speed.Speed(0.01, 0.002, 1e9, 0.3, 1.0, threads, state["load"], speed.time.time(), speed.machine(),
                           format=speed.FORMAT, points_s=[0.01] * len(speed.POINTS))

    monkeypatch.setattr(speed, "calibrate", calibrate)
    return state


@pytest.mark.parametrize("share", [1.0, 0.5])
def test_the_fit_recovers_a_known_machine(monkeypatch, share):
    """Calibration runs whose step times follow the model exactly give its figures back;
    runs that got half a core each tell of other work wanting a core's worth per thread of ours."""
    import ablate.cores

    step_s, block_s, elem_s, rate = 0.004, 0.0015, 1e-8, 2e9
    monkeypatch.setattr(ablate.cores, "cpu_count", lambda: 1)  # no companions: the run and the other work

    def timed_run(model, blocks, threads, out, width=None):
        cfg = resolve({"model": model, "layers": blocks, "batch_size": speed.BATCH, "width": width})
        step = step_s + block_s * blocks + elem_s * speed.block_elements(cfg) + speed.step_flops(cfg) / rate
        return step, step * 0.3, 1.5, share, cfg

    monkeypatch.setattr(speed, "_timed_run", timed_run)
    s = speed.calibrate(1)
    assert s.step_s == pytest.approx(step_s, rel=1e-6) and s.block_s == pytest.approx(block_s, rel=1e-6)
    assert s.elem_s == pytest.approx(elem_s, rel=1e-6) and s.flops_per_s == pytest.approx(rate, rel=1e-6)
    assert s.eval_ratio == pytest.approx(0.3) and s.cell_s == pytest.approx(1.5)
    assert s.companions == 0 and s.other == pytest.approx(1 / share - 1)
    assert speed.contention(s, 1, 1) == pytest.approx(1 / share)  # one worker beside that work: its share again


def test_a_calibration_run_reports_cpu_time(monkeypatch, tmp_path):
    """A run that got a third of its core (the wall clock runs three times as fast as its CPU
    time) reports its steps in CPU time, a third of their wall time."""
    import ablate.train

    clock = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(speed.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(speed.time, "process_time", lambda: clock["cpu"])

    def train(cell, run_dir):
        from ablate.rundir import METRICS

        run_dir.mkdir(parents=True)
        rows = [{"time_s": 3.0 * (i + 1)} for i in range(speed.STEPS)]  # 3 s a step on the wall clock
        (run_dir / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
        clock["wall"] += 3.0 * speed.STEPS
        clock["cpu"] += 1.0 * speed.STEPS

    monkeypatch.setattr(ablate.train, "train", train)
    step, _, _, share, cfg = speed._timed_run("tiny", 1, 1, tmp_path)
    assert share == pytest.approx(1 / 3) and step == pytest.approx(1.0)


def test_a_cells_estimate_is_its_steps_evaluations_and_fixed_cost():
    s = speed.Speed(0.01, 0.002, float("inf"), 0.5, 2.0, 1, 0.0, 0.0, "m")
    cfg = resolve({"layers": 5, "steps": 100, "eval_every": 50, "eval_batches": 4, "final_eval_batches": 8})
    step = 0.01 + 0.002 * 5
    assert s.cell_seconds(cfg) == pytest.approx(2.0 + 100 * step + (1 * 4 + 8) * 0.5 * step)


def test_a_narrow_blocks_small_ops_cost_less_than_a_wide_ones():
    """ELEM prices what grows with the activations a block passes over: a width-16 cell's
    blocks cost their fixed part and a quarter of a width-64 cell's growing part."""
    s = speed.Speed(0.0, 0.002, float("inf"), 0.0, 0.0, 1, 0.0, 0.0, "m", elem_s=1e-8)
    narrow, wide = (resolve({"layers": 4, "steps": 10, "width": w}) for w in (16, 64))
    tokens = narrow.batch_size * narrow.context
    assert s.cell_seconds(narrow) == pytest.approx(10 * 4 * (0.002 + 1e-8 * tokens * 16))
    assert s.cell_seconds(wide) == pytest.approx(10 * 4 * (0.002 + 1e-8 * tokens * 64))


QK = "pre.layernorm.gelu.dense.res.qk-layernorm"


def test_a_variants_own_block_cost_prices_its_cells():
    """qk-norm's block costs more than the default's small ops: its cells are priced by its own."""
    s = speed.Speed(0.01, 0.002, float("inf"), 0.0, 0.0, 1, 0.0, 0.0, "m", variant_block_s={QK: 0.005})
    default, qk = resolve({"layers": 4, "steps": 10}), resolve({"layers": 4, "steps": 10, "variant": QK})
    assert qk.spec.id == QK
    assert s.cell_seconds(default) == pytest.approx(10 * (0.01 + 0.002 * 4))
    assert s.cell_seconds(qk) == pytest.approx(10 * (0.01 + 0.005 * 4))


def test_each_variant_an_estimate_needs_is_measured_once_and_cached(measured, monkeypatch, tmp_path):
    """A variant's BLOCK: the default's plus the difference of their blocks' times."""
    timed = []
    blocks = speed.VARIANT_POINT[1]
    # qk-norm's norms add parameters, so FLOPs: a block's share of them is not in its BLOCK
    flops = [speed.step_flops(resolve(speed._point_options(v))) for v in (QK, None)]
    more_flops = flops[0] - flops[1]

    def block_seconds(variants, threads):
        timed.append(variants)
        return {None: 0.010, QK: 0.014 + more_flops / blocks / speed.machine_speed(threads, quiet=True).flops_per_s}

    monkeypatch.setattr(speed, "_block_seconds", block_seconds)
    block = speed.machine_speed(1, quiet=True).block_s
    s = speed.machine_speed(1, quiet=True, variants=[QK, "pre.layernorm.gelu.dense.res"])  # the default: not its own
    assert timed == [[None, QK]] and s.variant_block_s == {QK: pytest.approx(block + 0.004)}
    again = speed.machine_speed(1, quiet=True, variants=[QK])  # from the cache file
    assert timed == [[None, QK]] and again.variant_block_s[QK] == pytest.approx(block + 0.004)
    assert measured["calls"] == 1
    stored = json.loads((tmp_path / speed.CACHE_NAME).read_text())["1"][-1]
    assert stored["variant_block_s"][QK] == pytest.approx(block + 0.004)
    assert stored["variant_extra_s"][QK] == pytest.approx(0.004)


def test_the_calibration_is_cached_while_it_describes_the_machine(measured, monkeypatch, tmp_path):
    first = speed.machine_speed(1, quiet=True)
    assert measured["calls"] == 1 and json.loads((tmp_path / speed.CACHE_NAME).read_text())["1"][-1]["threads"] == 1
    assert speed.machine_speed(1, quiet=True) == first and measured["calls"] == 1  # cached
    speed.machine_speed(2, quiet=True)  # another thread count: its own entry
    assert measured["calls"] == 2
    measured["load"] += speed.LOAD_TOLERANCE + 0.5  # the machine got busier: measured again
    speed.machine_speed(1, quiet=True)
    assert measured["calls"] == 3
    entries = json.loads((tmp_path / speed.CACHE_NAME).read_text())
    assert len(entries["1"]) == 2  # the history: both calibrations at 1 thread
    entries["1"] = [{**entries["1"][-1], "format": 2}]  # an entry of format 2: measured again
    (tmp_path / speed.CACHE_NAME).write_text(json.dumps(entries))
    speed.machine_speed(1, quiet=True)
    assert measured["calls"] == 4 and speed.machine_speed(1, quiet=True).format == speed.FORMAT
    monkeypatch.setattr(speed.time, "time", lambda: first.measured_at + 2 * speed.MAX_AGE_S)  # too old
    speed.machine_speed(1, quiet=True)
    assert measured["calls"] == 5
    (tmp_path / speed.CACHE_NAME).write_text("not json")  # a damaged cache: measured again
    speed.machine_speed(1, quiet=True)
    assert measured["calls"] == 6


def test_a_grid_estimate_shares_the_cells_among_the_workers():
    from ablate.grids import load_grid

    s = speed.Speed(0.01, 0.0, float("inf"), 0.0, 0.0, 1, 0.0, 0.0, "m")
    grid = load_grid("claim-prenorm-wins")
    one = speed.grid_seconds(grid, 1, threads=1, speed=s)
    assert one == pytest.approx(0.01 * grid.total_steps)
    two = speed.grid_seconds(grid, 2, threads=1, speed=s)
    # Never better than a perfect share (up to rounding), and the last cells share imperfectly.
    assert one / 2 * (1 - 1e-12) <= two < one / 2 * 1.1


def test_contention_is_one_on_a_quiet_machine_and_grows_with_other_work(monkeypatch):
    import ablate.cores

    monkeypatch.setattr(ablate.cores, "cpu_count", lambda: 2)
    quiet = speed.Speed(0.01, 0.0, 1e9, 0.0, 0.0, 1, 0.0, 0.0, "m")  # nothing else wanted the cores
    assert speed.contention(quiet, 2, 1) == 1.0 and speed.contention(quiet, 1, 1) == 1.0
    busy = speed.Speed(0.01, 0.0, 1e9, 0.0, 0.0, 1, 1.0, 0.0, "m", other=1.0)  # a core's worth of other work
    assert speed.contention(busy, 2, 1) == pytest.approx(3 / 2)  # three threads on two cores
    assert speed.contention(busy, 1, 1) == 1.0  # two on two


def test_the_other_work_is_read_from_the_share_of_a_core_the_runs_got(monkeypatch):
    import ablate.cores

    monkeypatch.setattr(ablate.cores, "cpu_count", lambda: 2)
    assert speed._other_demand(1.0, 1, 1) == 0.0  # both cores to the calibration and its companion
    assert speed._other_demand(2 / 3, 1, 1) == pytest.approx(1.0)  # three wanted two cores
    assert speed._other_demand(0.5, 2, 0) == pytest.approx(2.0)  # one run of 2 threads at half: two more


def test_the_competing_load_counts_the_runnable_processes_besides_this_one(monkeypatch):
    readings = iter(["0.50 0.40 0.30 1/90 7\n", "0.50 0.40 0.30 3/90 7\n"] * 10)
    real_open = open

    def fake_open(path, *args, **kwargs):
        if path == "/proc/loadavg":
            import io
            return io.StringIO(next(readings))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(speed, "LOAD_SAMPLE_GAP_S", 0.0)
    assert speed.competing_load() == pytest.approx(1.0)  # readings 1 and 3, this process among them


def test_a_real_calibration_measures_positive_figures(monkeypatch, tmp_path):
    monkeypatch.setattr(speed, "POINTS", (("tiny", 1, None), ("tiny", 3, None), ("small", 1, None), ("tiny", 3, 16)))
    monkeypatch.setattr(speed, "STEPS", 7)
    monkeypatch.setattr(speed, "WARMUP", 2)
    monkeypatch.setattr(speed, "CALIBRATION_ROUNDS", 1)
    s = speed.calibrate(1)
    assert s.step_s >= 0 and s.block_s >= 0 and s.flops_per_s > 0 and s.cell_s >= 0 and s.eval_ratio > 0
    assert s.machine == speed.machine() and s.threads == 1
    assert s.companions == cpu_count() - 1  # the other cores were busy, as a grid's other workers keep them
    monkeypatch.setattr(speed, "VARIANT_ROUNDS", 3)
    assert speed.calibrate_variants(s, [QK]) and s.variant_block_s[QK] >= 0
    assert not speed.calibrate_variants(s, [QK, "pre.layernorm.gelu.dense.res"])  # nothing more to measure


def test_grid_dry_run_prints_the_measured_estimate(measured, capsys, tmp_path):
    """(`ablate reproduce --list` prints the same figures: tests/test_claims.py runs it.)"""
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\n[base]\nsteps = 20\n[axes]\nseed = [0, 1, 2]\n')
    assert main(["grid", str(grid), "--dry-run", "--workers", "2", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "estimated time: about" in out and "with 2 local workers" in out
    assert "calibrated on this machine just now" in out and measured["calls"] == 1


def test_ablate_speed_reference_estimates_from_the_yardstick_without_measuring(measured, monkeypatch):
    monkeypatch.setenv(speed.SPEED_ENV, "reference")
    assert speed.machine_speed(2, quiet=True) == speed.reference(2) and measured["calls"] == 0


def test_companions_keep_the_other_cores_training_while_it_measures_and_stop_after(monkeypatch):
    import ablate.cores

    monkeypatch.setattr(ablate.cores, "cpu_count", lambda: 4)
    with speed._busy_like_a_grid(2) as companions:  # 4 cores, 2 threads a worker: one other worker
        assert len(companions) == 1 and companions[0].poll() is None  # said "ready": training
        folder = Path(companions[0].args[-1])
        assert folder.is_dir()
    assert companions[0].poll() is not None and not folder.exists()  # killed, and its runs removed
    with speed._busy_like_a_grid(4) as companions:  # one worker has every core: nobody beside it
        assert companions == []


def test_contention_counts_the_grids_own_threads(monkeypatch):
    import ablate.cores

    monkeypatch.setattr(ablate.cores, "cpu_count", lambda: 2)
    beside = speed.Speed(0.01, 0.0, 1e9, 0.0, 0.0, 1, 0.0, 0.0, "m", companions=1)  # measured with both cores busy
    assert speed.contention(beside, 2, 1) == 1.0 and speed.contention(beside, 1, 2) == 1.0
    assert speed.contention(beside, 4, 1) == pytest.approx(2.0)


def test_noise_that_would_make_a_part_negative_leaves_the_others_fitted():
    """A machine with no per-step cost, one point's time 5% low: an exact least squares gives a
    negative per-step cost; the fit sets it to 0 and keeps the block cost and FLOP rate close,
    where the fit before gave up on both for one rate for everything."""
    import numpy as np

    configs = [resolve({"model": m, "layers": n, "batch_size": speed.BATCH}) for m, n, _ in speed.POINTS[:4]]
    a = np.array([[1.0, c.size.n_layer, speed.step_flops(c)] for c in configs])
    block_s, rate = 2e-3, 5e10
    b = a @ np.array([0.0, block_s, 1 / rate])
    b[0] *= 0.95
    assert np.linalg.lstsq(a, b, rcond=None)[0][0] < 0
    step, block, per_flop = speed._fit(a, b)
    assert step == 0.0 and block == pytest.approx(block_s, rel=0.1) and 1 / per_flop == pytest.approx(rate, rel=0.1)


def _calibration(scale: float, at: float, other: float = 0.0, extras=None) -> speed.Speed:
    """A calibration of a machine at `scale` x a known one's step times, measured at time `at`."""
    import numpy as np

    points = speed._point_matrix() @ np.array([0.004, 0.0015, 1e-8, 1 / 2e9]) * scale
    return speed.Speed(0.0, 0.0, 1.0, 0.2 * scale, 1.0 * scale, 1, other, at, speed.machine(), format=speed.FORMAT,
                       points_s=[float(v) for v in points], variant_extra_s=dict(extras or {}), other=other)


def test_an_estimate_prices_steps_by_the_median_of_the_recent_calibrations():
    """Three calibrations caught the machine at 1.5x, 1x and 0.8x its steps' time: the estimate
    prices steps at the median, the load at the newest, and says where the other two lay."""
    history = [_calibration(1.5, 1.0, extras={QK: 0.003}), _calibration(1.0, 2.0, extras={QK: 0.001}),
               _calibration(0.8, 3.0, other=1.0)]
    s = speed.pool(history)
    assert s.step_s == pytest.approx(0.004, rel=1e-6) and s.block_s == pytest.approx(0.0015, rel=1e-6)
    assert s.elem_s == pytest.approx(1e-8, rel=1e-6) and s.flops_per_s == pytest.approx(2e9, rel=1e-6)
    assert s.eval_ratio == pytest.approx(0.2) and s.cell_s == pytest.approx(1.0)
    assert s.other == 1.0 and s.measured_at == 3.0  # the load now: the newest's
    assert s.calibrations == 3 and s.spread == pytest.approx([0.8, 1.5])
    assert s.variant_extra_s == {QK: pytest.approx(0.002)}  # the median of the two that measured it
    assert s.variant_block_s == {QK: pytest.approx(0.0035)}
    assert s.span(600) == " (8.0-15.0 min at the fastest and slowest of its 3 calibrations)"
    one = speed.pool(history[-1:])
    assert one is history[-1] and one.span(600) == ""  # one calibration: nothing to say about its spread


def test_the_history_keeps_the_last_day_of_this_machine(measured, monkeypatch, tmp_path):
    """A calibration too old to describe the load now is measured again and joins the history;
    calibrations over HISTORY_S old, of another machine, or beyond HISTORY_MAX are left out."""
    now = speed.time.time()
    clock = {"now": now}
    monkeypatch.setattr(speed.time, "time", lambda: clock["now"])
    old = [_calibration(2.0, now - speed.HISTORY_S - 1),  # over a day old
           dataclasses.replace(_calibration(2.0, now - 60), machine="another"),
           _calibration(1.0, now - 2 * speed.MAX_AGE_S), _calibration(1.2, now - speed.MAX_AGE_S - 1)]
    speed._store(old)
    monkeypatch.setattr(speed, "calibrate", lambda threads=1: _calibration(0.9, clock["now"]))
    s = speed.machine_speed(1, quiet=True)  # the newest is over MAX_AGE_S old: one more
    assert s.calibrations == 3 and s.spread == pytest.approx([0.9, 1.2])
    assert s.step_s == pytest.approx(0.004, rel=1e-6)  # the median: the 1.0x calibration
    stored = json.loads((tmp_path / speed.CACHE_NAME).read_text())["1"]
    assert [e["points_s"][0] / stored[-1]["points_s"][0] for e in stored] == pytest.approx([1 / 0.9, 1.2 / 0.9, 1])
    for i in range(speed.HISTORY_MAX + 2):  # each an hour apart: measured again every time
        clock["now"] += 3600
        speed.machine_speed(1, quiet=True)
    assert len(json.loads((tmp_path / speed.CACHE_NAME).read_text())["1"]) == speed.HISTORY_MAX
    assert speed.machine_speed(1, quiet=True).calibrations == speed.HISTORY_MAX  # the newest of the last day's


def test_the_cache_is_written_without_following_a_link(measured, tmp_path):
    """A link planted at speed.json's name is replaced by the cache; its target is left alone."""
    target = tmp_path / "elsewhere.txt"
    target.write_text("not the cache's")
    (tmp_path / speed.CACHE_NAME).symlink_to(target)
    speed.machine_speed(1, quiet=True)
    assert target.read_text() == "not the cache's" and not (tmp_path / speed.CACHE_NAME).is_symlink()
    assert json.loads((tmp_path / speed.CACHE_NAME).read_text())["1"][-1]["threads"] == 1
