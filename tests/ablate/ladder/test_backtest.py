"""The backtest (ablate/ladder/backtest.py): its scores on hand-computed cases, forecasts on synthetic
ladders whose truth is known (no training), ties, too few rungs, and the frozen plan: refused when
the plan changed, and end to end on a miniature ladder."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

from ablate.analysis.stats import ONE_SIDED_ALPHA
from ablate.ladder import backtest as B
from ablate.ladder.rungs import plan_identity

SIZES = (1e4, 1e5, 1e6)  # three fitted rungs, a decade apart
HELD_OUT = 1e7


# ----------------------------------------------------------------------- hand-computed


def test_the_interval_score_by_hand():
    assert B.interval_score(2.0, 1.0, 3.0, 0.05) == pytest.approx(2.0)  # inside: the width alone
    assert B.interval_score(0.5, 1.0, 3.0, 0.05) == pytest.approx(2.0 + 40 * 0.5)  # 2/alpha x the miss
    assert B.interval_score(4.0, 1.0, 3.0, 0.1) == pytest.approx(2.0 + 20 * 1.0)


def test_the_brier_score_by_hand():
    assert B.brier(0.8, True) == pytest.approx(0.04)
    assert B.brier(0.8, False) == pytest.approx(0.64)
    assert B.brier(0.025, False) == pytest.approx(0.000625)


def test_the_crps_of_a_t_by_hand_and_by_its_integral():
    # A normal's CRPS at its mean is sigma (2 phi(0) - 1 / sqrt(pi)) = 0.2336949 sigma; a t of very
    # many df is that normal.
    assert B.crps_t(1.0, 1.0, 2.0, 1e7) == pytest.approx(2.0 * (2 / math.sqrt(2 * math.pi) - 1 / math.sqrt(math.pi)),
                                                          rel=1e-5)
    # The definition, integral of (F(x) - 1{x >= y})^2, for a t of 4 df away from its centre.
    y, loc, scale, df = 0.7, -0.2, 0.5, 4

    def sq(x):
        return (stats.t.cdf((x - loc) / scale, df) - (x >= y)) ** 2

    below = integrate.quad(sq, -np.inf, y, limit=200)[0]
    above = integrate.quad(sq, y, np.inf, limit=200)[0]
    assert B.crps_t(y, loc, scale, df) == pytest.approx(below + above, rel=1e-6)


def test_clopper_pearson_of_eleven_of_fourteen():
    scored = [{"winner": 1, "trend": {"winner": 1 if i < 11 else -1}} for i in range(14)]
    d = B.decision_accuracy(scored, "trend")
    assert (d["right"], d["of"], d["ties"]) == (11, 14, 0)
    assert (round(d["low"], 2), round(d["high"], 2)) == (0.49, 0.95)


# ------------------------------------------------------------------- synthetic ladders


def _rows(effects_by_seed, sizes=SIZES):
    """Rung rows as ablate/ladder/backtest.rung_row makes them, from each rung's per-seed effects."""
    rows = []
    for i, (size, d) in enumerate(zip(sizes, effects_by_seed)):
        d = np.asarray(d, dtype=float)
        rows.append({"rung": f"w{i}", "size": size, "n": d.size, "cells_per_seed": 3, "effect": float(d.mean()),
                     "ss": float(np.sum((d - d.mean()) ** 2)), "se": float(d.std(ddof=1) / math.sqrt(d.size))})
    return rows


def _clause(rows, n_new=None, null=0.0, sign=-1, unit="nats"):
    return {"label": "c", "unit": unit, "null": null, "expected_sign": sign,
            "forecasts": B.forecasts(rows, HELD_OUT, n_new=n_new)}


def _measured(d):
    d = np.asarray(d, dtype=float)
    return {"rung": "w3", "size": HELD_OUT, "n": d.size, "cells_per_seed": 3, "effect": float(d.mean()),
            "ss": None, "se": float(d.std(ddof=1) / math.sqrt(d.size))}


def test_a_true_linear_trend_scores_better_than_persistence():
    rng = np.random.default_rng(0)
    truth = lambda size: -0.05 * (math.log10(size) - 3)  # grows by 0.05 nats a decade: the top rung lags
    wins, crps = 0, {f: [] for f in B.FORECASTS}
    for _ in range(200):
        rows = _rows([truth(s) + 0.02 * rng.standard_normal(5) for s in SIZES])
        scored = B.score_clause(_clause(rows), _measured(truth(HELD_OUT) + 0.02 * rng.standard_normal(5)),
                                ONE_SIDED_ALPHA)
        wins += scored["trend"]["crps"] < scored["persistence"]["crps"]
        for f in B.FORECASTS:
            crps[f].append(scored[f]["crps"])
    assert np.mean(crps["trend"]) < np.mean(crps["persistence"]) < np.mean(crps["no change"])
    assert wins > 150


def test_persistence_wins_when_the_truth_does_not_move():
    """The score can fail: on a flat truth the line's extrapolation is noisier than persistence."""
    rng = np.random.default_rng(1)
    crps = {f: [] for f in B.FORECASTS}
    for _ in range(200):
        rows = _rows([-0.1 + 0.02 * rng.standard_normal(5) for _ in SIZES])
        scored = B.score_clause(_clause(rows), _measured(-0.1 + 0.02 * rng.standard_normal(5)), ONE_SIDED_ALPHA)
        for f in B.FORECASTS:
            crps[f].append(scored[f]["crps"])
    assert np.mean(crps["persistence"]) < np.mean(crps["trend"])


def test_on_a_flat_null_truth_the_predicted_chance_of_rejection_stays_near_alpha():
    # Well-measured fitted rungs (200 seeds), a held-out rung of 5: the forecast's location is
    # nearly known, so the chance that the held-out t rejects is close to the test's own level.
    rng = np.random.default_rng(2)
    probabilities = []
    for _ in range(200):
        rows = _rows([0.03 * rng.standard_normal(200) for _ in SIZES])
        f = B.Forecast(**B.forecasts(rows, HELD_OUT, n_new=5)["trend"])
        probabilities.append(B.rejection_probability(f, 0.0, -1, ONE_SIDED_ALPHA))
    assert abs(np.mean(probabilities) - ONE_SIDED_ALPHA) < 0.01
    assert max(probabilities) < 0.1
    # "No change" knows the location exactly: its chance is the t test's level itself.
    f = B.Forecast(**B.forecasts(rows, HELD_OUT, n_new=5)["no change"])
    assert B.rejection_probability(f, 0.0, -1, ONE_SIDED_ALPHA) == pytest.approx(ONE_SIDED_ALPHA, abs=1e-9)


def test_a_measured_zero_is_a_tie_not_a_wrong_sign():
    rows = _rows([[-0.3, -0.31, -0.29], [-0.2, -0.21, -0.19], [-0.1, -0.11, -0.09]])
    scored = B.score_clause(_clause(rows), {**_measured([0.0, 0.0, 0.0]), "se": 0.0}, ONE_SIDED_ALPHA)
    assert scored["winner"] == 0 and scored["trend"]["winner"] == -1
    d = B.decision_accuracy([scored], "trend")
    assert (d["right"], d["of"], d["ties"]) == (0, 0, 1)
    wrong = B.score_clause(_clause(rows), _measured([0.1, 0.12, 0.08]), ONE_SIDED_ALPHA)
    both = B.decision_accuracy([scored, wrong], "trend")  # a measured +0.1 against a forecast below 0: wrong
    assert (both["right"], both["of"], both["ties"]) == (0, 1, 1)


def test_two_rungs_are_too_few_to_predict_and_the_table_says_so():
    rows = _rows([[-0.2, -0.21, -0.19], [-0.1, -0.11, -0.09]], sizes=SIZES[:2])
    clause = _clause(rows)
    assert clause["forecasts"] == {"note": B.TOO_FEW_RUNGS}
    scored = B.score_clause(clause, _measured([-0.05, -0.06, -0.04]), ONE_SIDED_ALPHA)
    ladder = {"claim": "c1", "held_out": "w3", "fitted": ["w0", "w1"], "alpha": ONE_SIDED_ALPHA, "clauses": [scored],
              "plan": {"claim_sha256": None, "grid_sha256": "0" * 64, "analysis_sha256": "1" * 64, "commit": None,
                       "version": "0.1.0"}}
    text = B.backtest_markdown([ladder])
    assert B.TOO_FEW_RUNGS in text and "[" not in text.split("| c1 |")[1].split("\n")[0].split("|")[2]


def test_errors_are_summarised_per_unit_never_across_units():
    rng = np.random.default_rng(3)
    scored = []
    for unit, scale in (("nats", 0.02), ("decades", 2.0)):
        rows = _rows([scale * rng.standard_normal(4) for _ in SIZES])
        scored.append(B.score_clause(_clause(rows, unit=unit), _measured(scale * rng.standard_normal(4)),
                                     ONE_SIDED_ALPHA))
    lines = B.unit_summary(scored)
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["decades", "nats"]
    assert all(line.split("|")[2].strip() == "1" for line in lines[2:])


# ------------------------------------------------------------------------ the plan


def _identity(**changes):
    base = {"claim": "c1", "claim_sha256": "a" * 64, "grid_file": "g.toml", "grid_sha256": "b" * 64,
            "commit": "abc", "version": "0.1.0", "analysis_sha256": "c" * 64, "rate_transfer": B.RATE_TRANSFER,
            "scale": "cpu", "overrides": {}, "fitted_widths": [16, 32, 64], "held_out": "w128",
            "held_out_width": 128, "alpha": ONE_SIDED_ALPHA}
    return {**base, **changes}


def _sealed(plan: dict) -> dict:
    return {**plan, B.PLAN_DIGEST: B.plan_digest(plan)}


def test_a_held_out_rung_planned_under_another_plan_is_refused(tmp_path):
    (tmp_path / B.PLAN_JSON).write_text(json.dumps(_sealed({**_identity(), "clauses": []})))
    B.check_plan(tmp_path, _identity(commit="def"), True)  # another commit, the same sources: the same plan
    for key, value in (("grid_sha256", "d" * 64), ("analysis_sha256", "e" * 64), ("fitted_widths", [32, 64, 96])):
        with pytest.raises(B.BacktestError, match=f"another plan \\({key}"):
            B.check_plan(tmp_path, _identity(**{key: value}), True)
    (tmp_path / B.PLAN_JSON).unlink()
    with pytest.raises(B.BacktestError, match="without a frozen plan"):
        B.check_plan(tmp_path, _identity(), True)  # cells of the held-out rung, no plan
    B.check_plan(tmp_path, _identity(), False)  # a new ladder: nothing to refuse


def test_the_plan_names_the_files_and_code_it_was_made_under(tmp_path):
    from ablate.claims.run import find_claim
    from ablate.grid.spec import find_grid

    claim = find_claim("swiglu")
    identity = plan_identity(claim, find_grid(claim.grid), "cpu", {}, [64, 16, 32], 128)
    assert identity["claim_sha256"] == B.sha256_file(claim.path) and len(identity["grid_sha256"]) == 64
    assert identity["fitted_widths"] == [16, 32, 64] and identity["held_out"] == "w128"
    assert len(identity["analysis_sha256"]) == 64 and identity["alpha"] == ONE_SIDED_ALPHA


def test_a_backtest_on_the_gpu_ladder_and_too_few_fitted_rungs_are_one_line(capsys, tmp_path):
    from ablate.cli import main

    for argv, words in ((["--full"], "--backtest with --full"), (["--widths", "32,64"], "at least 3")):
        assert main(["ladder", "swiglu", "--backtest", *argv, "--out", str(tmp_path / "l"), "--dry-run"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "l").exists()


# --------------------------------------------------------------------- end to end


def _synthetic_ladder(out: Path):
    """A ladder folder as `ablate ladder --backtest` leaves it, from synthetic runs (no training):
    four rungs a decade apart, GELU below ReLU by 0.05 nats more each decade, 3 seeds."""
    from tests.helpers.synthetic_runs import write_grid, write_run

    from ablate.claims.claim_file import parse_claim

    claim = parse_claim({"name": "mini", "statement": "s", "source": "t", "source_figures": "none", "grid": "g.toml",
                         "clause": [{"label": "gelu below relu", "sentence": "s", "why": "w", "compare": [
                             {"label": "l", "measure": "final_val_loss", "a": {"act": "gelu"}, "b": {"act": "relu"},
                              "expect": "lower", "effect": 0.02}]}]}, where="test")
    rungs = []
    for i, (width, size) in enumerate(zip((16, 32, 64, 128), (*SIZES, HELD_OUT))):
        cells = [write_run(out / f"w{width}", f"pre.layernorm.{act}.dense.res", seed,
                           val_loss=3.0 + (-0.05 * i - 0.01 + 0.004 * seed if act == "gelu" else 0.0))
                 for seed in range(3) for act in ("gelu", "relu")]
        write_grid(out / f"w{width}", cells)
        (out / "grids").mkdir(exist_ok=True)
        (out / "grids" / f"w{width}.toml").write_text(f"# rung w{width}\n")
        rungs.append({"name": f"w{width}", "width": width, "rates": {}, "size": size, "folder": f"w{width}",
                      "grid_file": f"grids/w{width}.toml", "rate_factor": 1.0, "options": {}, "seconds": 60.0})
    ladder = {"claim": "mini", "scale": "cpu", "ref_width": 64, "targets": {}}
    identity = plan_identity(claim, out / "grids" / "w16.toml", "cpu", {}, [16, 32, 64], 128)
    return claim, identity, ladder, rungs


def test_a_plan_frozen_from_the_fitted_rungs_scores_the_held_out_one(tmp_path):
    claim, identity, ladder, rungs = _synthetic_ladder(tmp_path)
    (tmp_path / "ladder.json").write_text(json.dumps({**ladder, "rungs": rungs[:3]}))  # the held-out rung not yet run
    held = {"grid_sha256": B.sha256_file(tmp_path / "grids" / "w128.toml"), "size": HELD_OUT, "rates": {}, "seeds": 3}
    plan = B.freeze_plan(claim, tmp_path, identity, held, json.loads((tmp_path / "ladder.json").read_text()))
    forecast = plan["clauses"][0]["forecasts"]
    assert [r["rung"] for r in plan["clauses"][0]["fitted"]] == ["w16", "w32", "w64"]
    assert forecast["trend"]["location"] == pytest.approx(-0.156) and forecast["persistence"]["location"] == pytest.approx(-0.106)
    assert forecast["line"]["noise_df"] == 6  # 3 rungs x (3 seeds - 1)
    assert json.loads((tmp_path / B.PLAN_JSON).read_text()) == plan

    (tmp_path / "ladder.json").write_text(json.dumps({**ladder, "rungs": rungs}))
    scored = B.score_ladder(claim, tmp_path, identity)
    (c,) = scored["clauses"]
    assert c["measured"]["effect"] == pytest.approx(-0.156) and c["measured"]["n"] == 3 and c["rejected"]
    assert c["trend"]["crps"] < c["persistence"]["crps"] < c["no change"]["crps"] and c["trend"]["covered"]
    text = B.backtest_markdown([scored])
    assert "| mini | gelu below relu | nats | w128 | -0.156 [" in text and "trained in 1.0 min" in text

    (tmp_path / "grids" / "w128.toml").write_text("# another rung\n")  # a held-out rung not made under the plan
    with pytest.raises(B.BacktestError, match="not made under the frozen plan"):
        B.score_ladder(claim, tmp_path, identity)
    with pytest.raises(B.BacktestError, match="another plan \\(analysis_sha256"):
        B.score_ladder(claim, tmp_path, {**identity, "analysis_sha256": "f" * 64})


@pytest.mark.parametrize("edit", ["a forecast moved", "a fitted row changed", "no digest", "a clause dropped"])
def test_a_plan_edited_after_freezing_is_refused_in_one_line(tmp_path, edit):
    claim, identity, ladder, rungs = _synthetic_ladder(tmp_path)
    (tmp_path / "ladder.json").write_text(json.dumps({**ladder, "rungs": rungs[:3]}))
    held = {"grid_sha256": B.sha256_file(tmp_path / "grids" / "w128.toml"), "size": HELD_OUT, "rates": {}, "seeds": 3}
    plan = B.freeze_plan(claim, tmp_path, identity, held, json.loads((tmp_path / "ladder.json").read_text()))
    B.check_plan(tmp_path, identity, True)  # as frozen: accepted
    edited = json.loads(json.dumps(plan))
    if edit == "a forecast moved":
        edited["clauses"][0]["forecasts"]["trend"]["location"] = -0.15  # toward what w128 measures
    elif edit == "a fitted row changed":
        edited["clauses"][0]["fitted"][0]["effect"] = 0.0
    elif edit == "no digest":
        del edited[B.PLAN_DIGEST]
    else:
        edited["clauses"] = []
    (tmp_path / B.PLAN_JSON).write_text(json.dumps(edited, indent=2))
    (tmp_path / "ladder.json").write_text(json.dumps({**ladder, "rungs": rungs}))
    for attempt in (lambda: B.check_plan(tmp_path, identity, True), lambda: B.score_ladder(claim, tmp_path, identity),
                    lambda: B.freeze_plan(claim, tmp_path, identity, held, {**ladder, "rungs": rungs[:3]})):
        with pytest.raises(B.BacktestError, match="edited after freezing") as e:
            attempt()
        assert "\n" not in str(e.value) and B.PLAN_JSON in str(e.value)


MINI = """
name = "mini"
[base]
model = "tiny"
layers = 1
steps = 4
batch_size = 2
probes = false
[axes]
act = ["gelu", "relu"]
seed = [0, 1]
"""


def test_the_command_refuses_a_ladder_frozen_under_another_plan_before_anything_runs(capsys, tmp_path):
    from ablate.cli import main

    grid = tmp_path / "mini.toml"
    grid.write_text(MINI)
    ladder = tmp_path / "ladders" / "mini"
    ladder.mkdir(parents=True)
    stored = {**_identity(claim="mini", grid_file=str(grid), fitted_widths=[16, 32, 48], held_out="w96",
                          held_out_width=96), "clauses": []}
    (ladder / B.PLAN_JSON).write_text(json.dumps(stored))
    argv = ["ladder", str(grid), "--widths", "16,32,48", "--backtest", "--workers", "0", "--out", str(ladder.parent)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another plan (analysis_sha256" in err[0] and "grid_sha256" in err[0]
    assert sorted(p.name for p in ladder.iterdir()) == [B.PLAN_JSON]  # nothing trained, nothing written
    assert json.loads((ladder / B.PLAN_JSON).read_text()) == stored
