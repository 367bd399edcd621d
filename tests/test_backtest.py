"""The backtest (analysis/backtest.py): its scores on hand-computed cases, forecasts on synthetic
ladders whose truth is known (no training), ties, too few rungs, and the frozen plan: refused when
the plan changed, and end to end on a miniature ladder."""
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, stats

from ablate.analysis import backtest as B
from ablate.analysis.stats import ONE_SIDED_ALPHA
from ablate.errors import ConfigError

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
    """Rung rows as analysis/backtest.rung_row makes them, from each rung's per-seed effects."""
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


def test_a_held_out_rung_planned_under_another_plan_is_refused(tmp_path):
    (tmp_path / B.PLAN_JSON).write_text(json.dumps({**_identity(), "clauses": []}))
    B.check_plan(tmp_path, _identity(commit="def"), True)  # another commit, the same sources: the same plan
    for key, value in (("grid_sha256", "d" * 64), ("analysis_sha256", "e" * 64), ("fitted_widths", [32, 64, 96])):
        with pytest.raises(ConfigError, match=f"another plan \\({key}"):
            B.check_plan(tmp_path, _identity(**{key: value}), True)
    (tmp_path / B.PLAN_JSON).unlink()
    with pytest.raises(ConfigError, match="without a frozen plan"):
        B.check_plan(tmp_path, _identity(), True)  # cells of the held-out rung, no plan
    B.check_plan(tmp_path, _identity(), False)  # a new ladder: nothing to refuse


def test_the_plan_names_the_files_and_code_it_was_made_under(tmp_path):
    from ablate.commands.reproduce import find_claim
    from ablate.grids import find_grid

    claim = find_claim("swiglu")
    identity = B.plan_identity(claim, find_grid(claim.grid), "cpu", {}, [64, 16, 32], 128)
    assert identity["claim_sha256"] == B.sha256_file(claim.path) and len(identity["grid_sha256"]) == 64
    assert identity["fitted_widths"] == [16, 32, 64] and identity["held_out"] == "w128"
    assert len(identity["analysis_sha256"]) == 64 and identity["alpha"] == ONE_SIDED_ALPHA


# --------------------------------------------------------------------- end to end


MINI = """
name = "mini"
[base]
model = "tiny"
layers = 1
steps = 4
eval_every = 2
warmup = 0
batch_size = 2
probes = false
[axes]
act = ["gelu", "relu"]
lr = [1e-2]
seed = [0, 1]
"""


def _ladder(path, out, *extra):
    return subprocess.run([sys.executable, "-m", "ablate", "ladder", str(path), "--widths", "16,32,48", "--backtest",
                           "--workers", "0", "--quiet", "--out", str(out), *extra], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_a_miniature_backtest_freezes_its_plan_before_the_held_out_rung_trains(tmp_path):
    path = tmp_path / "mini.toml"
    path.write_text(textwrap.dedent(MINI))
    out = tmp_path / "ladders"
    done = _ladder(path, out)
    assert done.returncode == 0, done.stdout + done.stderr
    ladder = out / "mini"
    plan = json.loads((ladder / B.PLAN_JSON).read_text())
    assert plan["held_out"] == "w96" and plan["fitted_widths"] == [16, 32, 48]
    frozen = (ladder / B.PLAN_JSON).stat().st_mtime_ns
    held_out_cells = [p.stat().st_mtime_ns for p in (ladder / "w96").glob("*/summary.json")]
    assert len(held_out_cells) == 4 and frozen < min(held_out_cells)
    assert all(p.stat().st_mtime_ns < frozen for p in (ladder / "w48").glob("*/summary.json"))
    assert set(plan["clauses"][0]["forecasts"]) >= {"trend", "persistence", "no change"}
    text = (ladder / B.BACKTEST_MD).read_text()
    assert "| mini | act gelu below relu | nats | w96 |" in text and "Decision accuracy of the trend" in text

    plan["grid_sha256"] = "0" * 64  # as if the grid file had changed since the plan was frozen
    (ladder / B.PLAN_JSON).write_text(json.dumps(plan))
    refused = _ladder(path, out)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "another plan (grid_sha256" in refused.stderr and "Traceback" not in refused.stderr
    assert (ladder / B.BACKTEST_MD).read_text() == text  # nothing written over
