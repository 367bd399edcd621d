"""`ablate ladder`: the rungs and their rate transfer (ablate/ladder_rungs.py), the per-clause effects
across sizes (analysis/ladder_report.py), bad input, and a miniature 3-rung ladder
end to end with a kill -9 half-way."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

from ablate import ladder_rungs as ladder
from ablate.analysis import ladder_report as L
from ablate.analysis.claims import claim_at_rung
from ablate.analysis.verdict import AGREES
from ablate.cli import main
from ablate.errors import ConfigError
from ablate.grid.spec import find_grid, shipped_grids


# ------------------------------------------------------------------------ rates and rungs


def test_rates_transfer_as_one_over_width_from_the_grids_own_width():
    rungs = ladder.rungs_for([128, 32, 64], ref_width=64)
    assert [r.name for r in rungs] == ["w32", "w64", "w128"]  # smallest first, whatever the order given
    assert [r.rate_factor for r in rungs] == [2.0, 1.0, 0.5]
    w32 = ladder.with_rates(rungs[0], [1e-3, 3e-3, 1e-2])
    assert w32.rates == {1e-3: 0.002, 3e-3: 0.006, 1e-2: 0.02}
    shifted = ladder.with_rates(rungs[0], [1e-3, 1e-2], shift=10 ** 0.5)
    assert shifted.rates == {1e-3: ladder.sig3(2e-3 * 10 ** 0.5), 1e-2: ladder.sig3(2e-2 * 10 ** 0.5)}


def test_the_sweep_moves_one_step_toward_an_edge_only_when_a_best_rate_sits_there():
    step = ladder.sweep_step([1e-3, 3e-3, 1e-2])
    assert step == pytest.approx(10 ** 0.5, rel=0.06)
    assert ladder.shift_toward_edges([(1e-2, 1e-3, 1e-2), (3e-3, 1e-3, 1e-2)], step) == step  # one arm at the top
    assert ladder.shift_toward_edges([(1e-3, 1e-3, 1e-2)], step) == 1 / step  # at the bottom
    assert ladder.shift_toward_edges([(1e-3, 1e-3, 1e-2), (1e-2, 1e-3, 1e-2)], step) == 1.0  # both ends: stay
    assert ladder.shift_toward_edges([(3e-3, 1e-3, 1e-2)], step) == 1.0 and ladder.shift_toward_edges([], step) == 1.0


def test_a_claims_selected_rates_follow_its_rung():
    from ablate.commands.reproduce import find_claim

    claim = find_claim("qk-norm")
    mapped = claim_at_rung(claim, {3e-2: 0.06, 1e-1: 0.2, 1e-3: 0.002, 1e-2: 0.02})
    assert mapped.clauses[0].compare[0].at["lr"] == [0.06, 0.2]
    assert claim.clauses[0].compare[0].at["lr"] == [3e-2, 1e-1]  # the claim itself is unchanged


@pytest.mark.parametrize("name", sorted(shipped_grids()))
def test_every_shipped_grid_is_written_back_as_the_same_toml(name):
    data = ladder.read_grid_data(find_grid(name))
    identity = {lr: lr for lr in ladder.grid_rates(data)}
    assert tomllib.loads(ladder.toml_text(ladder.scaled(data, identity), "header")) == data


def test_a_rung_grid_scales_every_rate_and_names_itself(tmp_path):
    data = ladder.read_grid_data(find_grid("claim-prenorm-wins"))
    rung = ladder.with_rates(ladder.rungs_for([32, 64, 128], 64)[0], ladder.grid_rates(data))
    text = ladder.rung_grid_text(data, rung, find_grid("claim-prenorm-wins"))
    written = tomllib.loads(text)
    assert written["name"] == "claim-prenorm-wins-w32"
    assert written["axes"]["lr"] == [0.002, 0.02, 0.06] and written["base"]["lr"] == 0.002


def test_a_rung_leaves_out_the_equal_parameter_cells_and_the_reports_that_read_them():
    from ablate.analysis.claims import ClaimError
    from ablate.commands.reproduce import find_claim

    data = ladder.read_grid_data(find_grid("claim-mlp-ratio"))
    rung = ladder.with_rates(ladder.rungs_for([16, 32, 64], 64)[1], ladder.grid_rates(data))
    written = tomllib.loads(ladder.rung_grid_text(data, rung, find_grid("claim-mlp-ratio")))
    assert [e for e in written["include"] if "width" in e] == [] and written["include"]  # ratio 1's extra rate stays
    assert written["scales"]["gpu"]["include"] == []
    claim = find_claim("mlp-ratio")
    at_rung = claim_at_rung(claim, rung.rates, ref_width=64, width=32)
    assert all(c.at["width"] == 32 for cl in at_rung.clauses for c in cl.compare)
    assert len(claim.report) == 3 and at_rung.report == ()  # the equal-parameter reports name only other widths
    assert claim_at_rung(claim, rung.rates).report == claim.report  # no rung width: as the claim says
    with pytest.raises(ClaimError, match="names no width 128"):
        claim_at_rung(claim, rung.rates, ref_width=128, width=32)


def test_a_clause_a_rung_cannot_run_is_refused_before_anything_runs(tmp_path):
    from dataclasses import replace

    from ablate.commands.ladder import LadderPlan
    from ablate.commands.reproduce import find_claim

    claim = find_claim("mlp-ratio")
    first = claim.clauses[0]
    elsewhere = replace(first, compare=tuple(replace(c, at={"width": 128}) for c in first.compare))
    claim = replace(claim, clauses=(elsewhere, *claim.clauses[1:]))
    with pytest.raises(ConfigError, match="names no width 64"):
        LadderPlan(claim, find_grid("claim-mlp-ratio"), "cpu", {}, [16, 32, 64], False, "refuse", tmp_path / "l")
    assert not (tmp_path / "l").exists()


def test_every_full_rung_sets_its_width_in_every_cell():
    rungs = ladder.rungs_for([], ref_width=384, full=True)
    assert [r.options["width"] for r in rungs] == [192, 384, 768]
    assert rungs[-1].options["model"] == "andrea-120m"


# ---------------------------------------------------------------------------- bad input


def _refused(capsys, tmp_path, *argv):
    out = tmp_path / "ladders"
    assert main(["ladder", *argv, "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0]
    assert not out.exists()
    return err[0]


def test_fewer_than_three_rungs_is_one_line(capsys, tmp_path):
    assert "at least 3" in _refused(capsys, tmp_path, "swiglu", "--widths", "32,64")


def test_a_width_the_heads_cannot_take_is_one_line(capsys, tmp_path):
    assert "width 40" in _refused(capsys, tmp_path, "swiglu", "--widths", "32,40,64")


def test_an_unknown_claim_and_a_grid_without_two_arms_are_one_line(capsys, tmp_path):
    assert "unknown claim 'nope'" in _refused(capsys, tmp_path, "nope")
    grid = tmp_path / "three.toml"
    grid.write_text('[axes]\nact = ["gelu", "relu", "silu"]\nseed = [0, 1]\n')
    assert "two arms" in _refused(capsys, tmp_path, str(grid))


def test_widths_that_are_not_numbers_are_one_line(capsys, tmp_path):
    assert "--widths" in _refused(capsys, tmp_path, "swiglu", "--widths", "32,x,64")


# ------------------------------------------------------------------- effects across sizes


def _clause(label, effects, null=0.0, sign=-1, verdict=AGREES, se=0.01):
    rows = [{"rung": f"w{i}", "size": 10 ** (4 + i), "effect": e, "low": e - 2 * se, "high": e + 2 * se,
             "se": se, "n": 5, "verdict": verdict, "best_lr": "", "multiplier": None}
            for i, e in enumerate(effects)]
    clause = {"label": label, "measure": "final_val_loss", "null": null, "expected_sign": sign, "rows": rows}
    clause.update(L.trend_and_sentence(rows, null, sign, {"next": 1e8}, 0.05))
    return clause


def test_sentences_say_whether_the_effect_holds_and_how_it_moves():
    assert _clause("a", [-0.1, -0.2, -0.3])["sentence"] == "holds at every size, growing"
    assert _clause("a", [-0.3, -0.2, -0.1])["sentence"] == "holds at every size, shrinking"
    assert _clause("a", [-0.1, 0.05, 0.1])["sentence"].startswith("changes sign between 10k and 100k")
    assert _clause("a", [0.01, 0.04, 0.02], se=0.05)["sentence"] == "goes the other way at every size, flat"


def test_a_count_is_counted_at_every_rung_not_fitted():
    rows = [{"rung": "w1", "size": 1e4, "effect": 152.0, "se": 0.0, "n": 3},
            {"rung": "w2", "size": 1e5, "effect": 600.0, "se": 0.0, "n": 3}]
    out = L.counted_sentence(rows, 0.0, -1)
    assert out["trend"] is None and out["sentence"].startswith("goes the other way at every size")


# --------------------------------------------------------------------- end to end


MINI = """
name = "mini"
[base]
model = "tiny"
layers = 1
steps = 6
eval_every = 2
warmup = 0
batch_size = 4
probes = false
[axes]
act = ["gelu", "relu"]
lr = [1e-3, 1e-2]
seed = [0, 1]
"""


def _ladder(path, out):
    # --workers 0: the cells train in the ladder's own process (no worker to start per rung), so
    # the kill -9 below lands on the process that trains, schedules and reports alike.
    return subprocess.Popen([sys.executable, "-m", "ablate", "ladder", str(path), "--widths", "16,32,48",
                             "--workers", "0", "--quiet", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow
def test_a_three_rung_ladder_survives_kill_9_and_reports_every_clause(tmp_path):
    path = tmp_path / "mini.toml"
    path.write_text(textwrap.dedent(MINI))
    out = tmp_path / "ladders"
    proc = _ladder(path, out)
    second = out / "mini" / "w32"
    deadline = time.time() + 600
    while time.time() < deadline and not any(second.glob("*/metrics.jsonl")) and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[0]
    os.killpg(proc.pid, signal.SIGKILL)  # mid-way through the second rung
    proc.wait()
    first = {p.parent.name: p.stat().st_mtime_ns for p in (out / "mini" / "w16").glob("*/summary.json")}
    assert len(first) == 8 and not (out / "mini" / L.REPORT_MD).exists()
    (w16,) = json.loads((out / "mini" / L.LADDER_JSON).read_text())["rungs"]  # written after each rung
    assert w16["name"] == "w16" and w16["seconds"] > 0

    rerun = _ladder(path, out)
    text = rerun.communicate(timeout=900)[0]
    assert rerun.returncode == 0, text
    assert first == {p.parent.name: p.stat().st_mtime_ns for p in (out / "mini" / "w16").glob("*/summary.json")}
    for rung in ("w16", "w32", "w48"):
        assert len(list((out / "mini" / rung).glob("*/summary.json"))) == 8
    result = json.loads((out / "mini" / L.RESULT_JSON).read_text())
    assert [r["name"] for r in result["rungs"]] == ["w16", "w32", "w48"]
    rungs = json.loads((out / "mini" / L.LADDER_JSON).read_text())["rungs"]
    assert rungs[0]["seconds"] == w16["seconds"]  # trained before the kill: its time as recorded then
    assert result["seconds"] == pytest.approx(sum(r["seconds"] for r in rungs), abs=0.2)
    clause = result["clauses"][0]
    assert len(clause["rows"]) == 3 and all(r["n"] == 4 for r in clause["rows"])  # 2 seeds x 2 rates, paired
    assert clause["trend"] is not None and "andrea-120m" in clause["predictions"]
    assert "mini" in text and "act gelu below relu" in text
    assert (out / "mini" / "plots" / "ladder_effects.png").stat().st_size > 1000
    assert (out / "mini" / "plots" / "ladder_lr.png").stat().st_size > 1000


def test_the_width_option_keeps_the_head_dimension():
    from ablate.config import is_default, resolve

    cfg = resolve({"width": 32})
    assert (cfg.size.d_model, cfg.size.n_head, cfg.size.head_dim) == (32, 2, 16)
    assert is_default(resolve({"width": 64}), "width") and not is_default(cfg, "width")
    with pytest.raises(ConfigError, match="width 24 must be a positive multiple of the head dimension 16"):
        resolve({"width": 24})


def test_a_size_the_data_cannot_feed_is_one_line(capsys, tmp_path):
    data = tmp_path / "short.txt"
    data.write_text("a short text, far shorter than two context windows of 64 tokens.\n")
    grid = tmp_path / "two.toml"
    grid.write_text(f'[base]\ndata = "{data}"\n[axes]\nact = ["gelu", "relu"]\nseed = [0, 1]\n')
    assert "shorter than one context window" in _refused(capsys, tmp_path, str(grid))


def test_a_width_axis_makes_distinct_cells_named_by_their_width(tmp_path):
    from ablate.grid.spec import load_grid

    grid = tmp_path / "widths.toml"
    grid.write_text('[base]\nsteps = 2\n[axes]\nwidth = [32, 64, 128]\nseed = [0]\n')
    ids = [c.id for c in load_grid(grid).cells]
    assert ids == ["pre.layernorm.gelu.dense.res__width=32__seed=0",
                   "pre.layernorm.gelu.dense.res__width=64__seed=0",  # named: it varies in the grid
                   "pre.layernorm.gelu.dense.res__width=128__seed=0"]
