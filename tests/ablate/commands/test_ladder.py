"""`ablate ladder`: the rungs and their rate transfer (ablate/ladder/rungs.py), the per-clause effects
across sizes (ablate/ladder/report.py), bad input refused up front (widths that overflow, pass
the ladder's ceilings or do not fit the heads; damaged ladder folders; --backtest that cannot be
scored), its edge rungs (a grid without an `lr` key, another backend without --workers, a rung
whose cells all failed or diverged, an earlier sweep's cells in a rung folder, links planted at
grids/ and plots/), and a miniature 3-rung ladder end to end with a kill -9 half-way."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

from ablate.claims.claim_file import claim_at_rung
from ablate.claims.verdict import AGREES
from ablate.cli import main
from ablate.core.errors import ConfigError
from ablate.engine.config import is_default, resolve
from ablate.grid.spec import find_grid, load_grid, shipped_grids
from ablate.ladder import report as L, rungs as ladder
from tests.helpers.synthetic_runs import write_grid, write_run


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
    from ablate.claims.run import find_claim

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
    assert written["axes"]["lr"] == [0.002, 0.004, 0.01, 0.02] and written["base"]["lr"] == 0.002


def test_a_rung_leaves_out_the_equal_parameter_cells_and_the_reports_that_read_them():
    from ablate.claims.claim_file import ClaimError
    from ablate.claims.run import find_claim

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

    from ablate.ladder.run import LadderPlan
    from ablate.claims.run import find_claim

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


TWO_ARMS = """
name = "mini"
[base]
model = "tiny"
layers = 1
steps = 6
batch_size = 4
probes = false
[axes]
act = ["gelu", "relu"]
lr = [1e-3, 1e-2]
seed = [0, 1]
"""


@pytest.fixture
def grid_file(tmp_path):
    path = tmp_path / "mini.toml"
    path.write_text(textwrap.dedent(TWO_ARMS))
    return path


def refused(capsys, out, *argv) -> str:
    """The one line `ablate ladder ARGV --dry-run` refuses with (exit 2)."""
    assert main(["ladder", *map(str, argv), "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def refused_writing_nothing(capsys, tmp_path, *argv) -> str:
    out = tmp_path / "ladders"
    line = refused(capsys, out, *argv)
    assert not out.exists()
    return line


def test_fewer_than_three_rungs_is_one_line(capsys, tmp_path):
    assert "at least 3" in refused_writing_nothing(capsys, tmp_path, "swiglu", "--widths", "32,64")


def test_a_width_the_heads_cannot_take_is_one_line(capsys, tmp_path):
    assert "width 40" in refused_writing_nothing(capsys, tmp_path, "swiglu", "--widths", "32,40,64")


def test_an_unknown_claim_and_a_grid_without_two_arms_are_one_line(capsys, tmp_path):
    assert "unknown claim 'nope'" in refused_writing_nothing(capsys, tmp_path, "nope")
    grid = tmp_path / "three.toml"
    grid.write_text('[axes]\nact = ["gelu", "relu", "silu"]\nseed = [0, 1]\n')
    assert "two arms" in refused_writing_nothing(capsys, tmp_path, str(grid))


def test_widths_that_are_not_numbers_are_one_line(capsys, tmp_path):
    assert "--widths" in refused_writing_nothing(capsys, tmp_path, "swiglu", "--widths", "32,x,64")


def test_a_count_past_its_ceiling_is_one_line_before_anything_is_built(capsys, tmp_path):
    # E1: --seeds of 401 digits built its list of seeds (4.4 GB) before any check
    line = refused_writing_nothing(capsys, tmp_path, "swiglu", "--seeds", "9" * 401)
    assert "(401 characters) is not a number of seeds; valid: a whole number in 2..10000" in line
    widths = ",".join(str(16 * k) for k in range(1, 18))
    assert "--widths: 17 widths; valid: 3 to 16 rungs" in refused_writing_nothing(capsys, tmp_path, "swiglu",
                                                                                   "--widths", widths)
    with pytest.raises(SystemExit) as parsed:  # refused by the parser: no grid is read
        main(["ladder", "swiglu", "--workers", "1025", "--out", str(tmp_path / "ladders"), "--dry-run"])
    err = capsys.readouterr().err
    assert parsed.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "argument --workers: '1025' is not a count of 0..1024; valid: a whole number in 0..1024" in err


@pytest.mark.parametrize("widths", ["16,32,2147483648", "100000,200000,300000", "16,32,20000", "16,32,12800"])
def test_widths_past_the_parameter_ceiling_are_one_line_before_anything_is_built(capsys, tmp_path, grid_file, widths):
    out = tmp_path / "ladders"
    line = refused(capsys, out, grid_file, "--widths", widths)
    assert line.startswith(f"ablate ladder: error: --widths {widths}:") and f"{ladder.MAX_RUNG_PARAMS:,}" in line
    assert not out.exists()


def test_widths_the_heads_cannot_take_are_refused_as_widths(capsys, tmp_path, grid_file):
    line = refused(capsys, tmp_path / "ladders", grid_file, "--widths", "1,2,3")
    assert "--widths 1,2,3: width 1 is not a multiple of the head dimension 16" in line and "--set" not in line


def test_a_plan_past_the_time_ceiling_is_one_line(capsys, tmp_path, grid_file):
    text = TWO_ARMS.replace("steps = 6", "steps = 1000000")
    grid_file.write_text(textwrap.dedent(text))
    out = tmp_path / "ladders"
    line = refused(capsys, out, grid_file, "--widths", "256,512,1024")
    assert f"ceiling of {ladder.MAX_PLANNED_HOURS} hours" in line
    assert not out.exists()


def test_the_ceilings_refuse_only_past_them():
    ladder.check_planned_hours("x", ladder.MAX_PLANNED_HOURS, "hours")
    with pytest.raises(Exception, match="ceiling"):
        ladder.check_planned_hours("x", ladder.MAX_PLANNED_HOURS + 1, "hours")


def test_a_grid_without_an_lr_key_is_estimated(capsys, tmp_path, grid_file):
    grid_file.write_text(textwrap.dedent(TWO_ARMS.replace("lr = [1e-3, 1e-2]\n", "")))
    assert main(["ladder", str(grid_file), "--widths", "16,32,48", "--out", str(tmp_path / "l"), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("  4 cells  about") == 3  # 2 arms x 2 seeds at the default rate


@pytest.mark.parametrize("backend", ["slurm", "ray"])
def test_another_backend_without_workers_is_not_refused_for_workers(capsys, tmp_path, grid_file, backend):
    assert main(["ladder", str(grid_file), "--widths", "16,32,48", "--backend", backend,
                 "--out", str(tmp_path / "l"), "--dry-run"]) == 0
    assert "--workers" not in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["rung file", "rung link", "grids file", "grid file folder", "ladder.json folder",
                                    "plots file"])
def test_a_damaged_ladder_folder_is_one_line(capsys, tmp_path, grid_file, damage):
    root = tmp_path / "ladders"
    folder = root / "mini"
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    {"rung file": lambda: (folder / "w16").write_text("x"),
     "rung link": lambda: (folder / "w16").symlink_to(elsewhere),
     "grids file": lambda: (folder / "grids").write_text("x"),
     "grid file folder": lambda: (folder / "grids" / "w16.toml").mkdir(parents=True),
     "ladder.json folder": lambda: (folder / "ladder.json").mkdir(),
     "plots file": lambda: (folder / "plots").write_text("x")}[damage]()
    line = refused(capsys, root, grid_file, "--widths", "16,32,48")
    assert "ladder folder" in line or "is a file" in line
    assert list(elsewhere.iterdir()) == []


def test_backtest_with_no_wait_is_refused(capsys, tmp_path, grid_file):
    line = refused(capsys, tmp_path / "l", grid_file, "--widths", "16,32,48", "--backtest", "--backend", "slurm",
                   "--no-wait")
    assert "--backtest" in line and "--no-wait" in line


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


# ---------------------------------------------------------------------- edge rungs


PRE, RELU = "pre.layernorm.gelu.dense.res", "pre.layernorm.relu.dense.res"


def _rung(folder, status=None, lrs=(1e-3, 1e-2), extra_lrs=()):
    """A rung folder of the mini grid: 2 arms x lrs x 2 seeds (`status` for every cell), and
    cells of `extra_lrs` that its grid.json does not list (an earlier sweep's)."""
    runs = []
    for variant, loss in ((PRE, 2.0), (RELU, 2.1)):
        for lr in (*lrs, *extra_lrs):
            for seed in (0, 1):
                losses = [4.0, 3.0, float("nan")] if status == "diverged" else [4.0, 3.0, loss]
                run = write_run(folder, variant, seed, losses=losses, options={"lr": lr}, n_layer=1,
                                status=status if status != "diverged" else None,
                                val_loss=None if status else loss + (5.0 if lr in extra_lrs else 0.0))
                if status == "failed":  # as a cell that raised before its first step: no metrics at all
                    (run.path / "metrics.jsonl").unlink()
                if lr in lrs:
                    runs.append(run)
    write_grid(folder, runs)


def _ladder_json(out, claim, rates):
    rungs = [{"name": f"w{w}", "options": {"width": w}, "width": w, "rate_factor": 64 / w,
              "rates": {"0.001": rates[0], "0.01": rates[1]}, "size": 40 * w * w, "folder": f"w{w}",
              "grid_file": f"grids/w{w}.toml", "seconds": 1.0} for w in (16, 32, 48)]
    (out / L.LADDER_JSON).write_text(json.dumps({"claim": claim.name, "source": "mini.toml", "scale": "cpu",
                                                 "ref_width": 64, "rungs": rungs, "seconds": 3.0,
                                                 "targets": {"w96": 400000, "andrea-120m": 85_000_000}}))


def _claim(grid_file):
    return ladder.two_arm_claim(load_grid(grid_file), str(grid_file))


@pytest.mark.parametrize("status, failed_rungs", [("failed", 1), ("diverged", 1), ("failed", 3), ("diverged", 3)])
def test_a_rung_whose_cells_all_failed_or_diverged_still_gets_its_report(tmp_path, grid_file, status, failed_rungs):
    out = tmp_path / "ladder"
    for i, rung in enumerate(("w16", "w32", "w48")):
        _rung(out / rung, status=status if i < failed_rungs else None)
    claim = _claim(grid_file)
    _ladder_json(out, claim, (1e-3, 1e-2))
    summary = L.write_ladder_report(claim, out)
    assert (out / L.REPORT_MD).is_file() and summary["sentence_count"] == 1
    assert (out / "plots" / "ladder_lr.png").stat().st_size > 1000


def test_a_claim_plot_of_a_rung_whose_cells_all_diverged_is_drawn(tmp_path, grid_file):
    from ablate.claims.claim_report import write_claim_report

    _rung(tmp_path / "w16", status="diverged")
    _, verdict = write_claim_report(_claim(grid_file), tmp_path / "w16")
    assert (tmp_path / "w16" / "plots" / "claim_mini.png").is_file() and verdict.text()


def test_a_rung_counts_only_its_own_grids_cells(tmp_path, grid_file):
    out = tmp_path / "ladder"
    for rung in ("w16", "w32", "w48"):
        _rung(out / rung, extra_lrs=(3e-2,))  # an earlier sweep's cells, 5 nats worse, still in the folder
    claim = _claim(grid_file)
    _ladder_json(out, claim, (1e-3, 1e-2))
    summary = L.write_ladder_report(claim, out)
    rows = summary["clauses"][0]["rows"]
    assert all(r["n"] == 4 for r in rows)  # 2 seeds x 2 rates, not 3 rates
    assert all(r["effect"] == pytest.approx(-0.1) for r in rows)


@pytest.mark.parametrize("name", ["grids", "plots"])
def test_a_link_planted_at_grids_or_plots_is_replaced_not_written_through(tmp_path, grid_file, name):
    from ablate.ladder.run import LadderPlan

    out = tmp_path / "ladder"
    out.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    (out / name).symlink_to(target)
    claim = _claim(grid_file)
    if name == "grids":
        plan = LadderPlan(claim, grid_file, "cpu", {}, [16, 32, 48], False, "refuse", out)
        plan.load(plan.rungs[0], write=True)
    else:
        for rung in ("w16", "w32", "w48"):
            _rung(out / rung)
        _ladder_json(out, claim, (1e-3, 1e-2))
        L.write_ladder_report(claim, out)
    assert list(target.iterdir()) == [] and not (out / name).is_symlink() and any((out / name).iterdir())


def test_a_grid_file_with_imports_is_planned_with_trust_imports(capsys, tmp_path, grid_file):
    (tmp_path / "plug.py").write_text("import torch\nfrom ablate.variants import ACTIVATIONS\n\n"
                                      "@ACTIVATIONS.register('relu_ladder_test')\ndef relu(x):\n    return torch.relu(x)\n")
    text = TWO_ARMS.replace('name = "mini"', 'name = "mini"\nimports = ["plug.py"]').replace('"relu"]', '"relu_ladder_test"]')
    grid_file.write_text(textwrap.dedent(text))
    assert main(["ladder", str(grid_file), "--trust-imports", "--widths", "16,32,48", "--out", str(tmp_path / "l"),
                 "--dry-run"]) == 0, capsys.readouterr().err


# --------------------------------------------------------------------- end to end


# Evaluated, no warmup; on a small text file and the reference kernels, so that with the test's own
# empty cache (the `cache` fixture) nothing is shared with other tests: no C kernels to build and
# no standard library to tokenize (a minute on a cold cache), and no walk of the standard library
# per cell. What is tested, the ladder's stop and resume and its report, is the same on any data.
MINI = TWO_ARMS.replace("steps = 6\n", 'steps = 6\neval_every = 2\nwarmup = 0\nkernels = "reference"\ndata = "{data}"\n')


def _ladder(path, out):
    # --workers 0: the cells train in the ladder's own process (no worker to start per rung), so
    # the kill -9 below lands on the process that trains, schedules and reports alike.
    return subprocess.Popen([sys.executable, "-m", "ablate", "ladder", str(path), "--widths", "16,32,48",
                             "--workers", "0", "--quiet", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow
def test_a_three_rung_ladder_survives_kill_9_and_reports_every_clause(tmp_path, cache, text_file, capsys):
    path = tmp_path / "mini.toml"
    path.write_text(textwrap.dedent(MINI).format(data=text_file))
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

    # The rerun in this process (the killed one left nothing behind but its files), which spares
    # the start of a second one: imports alone take seconds, more on a loaded machine.
    assert main(["ladder", str(path), "--widths", "16,32,48", "--workers", "0", "--quiet", "--out", str(out)]) == 0
    text = capsys.readouterr().out
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
    assert "shorter than one context window" in refused_writing_nothing(capsys, tmp_path, str(grid))


def test_a_width_axis_makes_distinct_cells_named_by_their_width(tmp_path):
    grid = tmp_path / "widths.toml"
    grid.write_text('[base]\nsteps = 2\n[axes]\nwidth = [32, 64, 128]\nseed = [0]\n')
    ids = [c.id for c in load_grid(grid).cells]
    assert ids == ["pre.layernorm.gelu.dense.res__width=32__seed=0",
                   "pre.layernorm.gelu.dense.res__width=64__seed=0",  # named: it varies in the grid
                   "pre.layernorm.gelu.dense.res__width=128__seed=0"]


def test_seeds_put_every_rung_at_n_seeds_and_enter_the_frozen_plan(tmp_path):
    from ablate.ladder.run import LadderPlan
    from ablate.claims.run import find_claim
    from ablate.ladder.rungs import plan_identity

    claim = find_claim("swiglu")
    own = LadderPlan(claim, find_grid(claim.grid), "cpu", {}, [16, 32, 64], False, "refuse", tmp_path / "a")
    six = LadderPlan(claim, find_grid(claim.grid), "cpu", {}, [16, 32, 64], False, "refuse", tmp_path / "b", 6)

    def seeds(grid):
        return sorted({grid.configs[c.id].seed for c in grid.cells})

    assert own.seeds is None and all(seeds(g) == [0, 1, 2] for g in own.grids)
    assert six.seeds == list(range(6)) and all(seeds(g) == list(range(6)) for g in six.grids)
    assert all(len(b.cells) == 2 * len(a.cells) for a, b in zip(own.grids, six.grids))
    # a seed's cell keeps its id, so the grid's own seeds resume into the same folders
    assert all({c.id for c in a.cells} <= {c.id for c in b.cells} for a, b in zip(own.grids, six.grids))
    frozen = [plan_identity(claim, find_grid(claim.grid), "cpu", {}, [16, 32, 64], 128, seeds=s) for s in
              (own.seeds, six.seeds)]
    assert frozen[0]["seeds"] == "the grid's own" and frozen[1]["seeds"] == list(range(6))


def test_a_bad_seed_count_or_a_seed_override_is_one_line(capsys, tmp_path):
    assert "valid: a whole number in 2..10000" in refused_writing_nothing(capsys, tmp_path, "swiglu", "--seeds", "1")
    assert "contradict" in refused_writing_nothing(capsys, tmp_path, "swiglu", "--seeds", "6", "--set", "seed=3")


def test_the_frozen_plan_records_the_held_out_rungs_seeds(tmp_path, monkeypatch):
    import ablate.ladder.run as ladder_run
    from ablate.claims.run import find_claim
    from ablate.ladder.run import LadderPlan, _freezer

    claim = find_claim("swiglu")
    plan = LadderPlan(claim, find_grid(claim.grid), "cpu", {}, [16, 32, 64, 128], False, "refuse", tmp_path / "l", 4)
    held = []
    # patched where the ladder calls them
    monkeypatch.setattr(ladder_run, "freeze_plan", lambda claim, out, identity, h, ladder: held.append(h))
    monkeypatch.setattr(ladder_run, "load_ladder", lambda out: None)
    monkeypatch.setattr(ladder_run, "sha256_file", lambda path: "sha")
    _freezer(plan, {"held_out": "w128"})(plan.rungs[-1], plan.grids[-1], plan.sizes[-1])
    assert held[0]["seeds"] == 4 and held[0]["size"] == plan.sizes[-1]
