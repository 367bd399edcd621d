"""`ablate ladder`'s inputs refused up front (widths that overflow, pass the ladder's ceilings
or do not fit the heads; damaged ladder folders; --backtest that cannot be scored), and its edge
rungs: a grid without an `lr` key, another backend without --workers, a rung whose cells all
failed or diverged, an earlier sweep's cells in a rung folder, links planted at grids/ and plots/."""
import json
import textwrap

import pytest

from ablate import ladder_rungs as ladder
from ablate.analysis import ladder_report as L
from ablate.cli import main

from tests.helpers.synthetic_runs import write_grid, write_run

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
    assert main(["ladder", *map(str, argv), "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


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
    from ablate.grid.spec import load_grid

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
    from ablate.analysis.claim_report import write_claim_report

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
    from ablate.commands.ladder import LadderPlan

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
