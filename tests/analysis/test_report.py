"""`ablate report` and analysis.report: report.md, summary.csv and plots for a grid or a run."""
import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from ablate.analysis.analyse import Settings, analyse
from ablate.analysis.report import LOSS_DIGITS, OTHER_DIGITS, RESULT_COLUMNS, render, write_report
from ablate.analysis.stats import adjust_p_values, format_p, holm
from ablate.cli import main
from tests.helpers.planted_links import plant_links, victims_untouched
from tests.helpers.synthetic_runs import write_grid, write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
RMS, SANDWICH, SWIGLU = "pre.rmsnorm.gelu.dense.res", "sandwich.layernorm.gelu.dense.res", "pre.layernorm.swiglu.res"
PLOTS = ["loss_curves", "final_loss", "grad_norm_heatmaps", "grad_norm_profiles", "residual_rms"]


def flat(final, n=12):
    """Losses whose mean over the last 10 steps is exactly `final`."""
    return [final + 1.0, final + 0.5] + [final] * (n - 2)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A grid still running: known final training losses per variant and seed (see each line);
    each final validation loss is the last training loss + 0.1 (synthetic_runs' default)."""
    root = tmp_path_factory.mktemp("grid")
    runs = []
    for variant, finals in [(PRE, [3.00, 3.10, 3.05]),  # the baseline (default block)
                            (POST, [3.20, 3.35, 3.15]),  # higher, paired p ~ 0.05, adjusted 0.08: not significant
                            (RMS, [2.50, 2.60, 2.54])]:  # lower, p < 0.001
        runs += [write_run(root, variant, seed, flat(final)) for seed, final in enumerate(finals)]
    runs += [write_run(root, SANDWICH, 0, flat(2.9)), write_run(root, SANDWICH, 1, flat(2.95)),
             write_run(root, SANDWICH, 2, [3.0, 2.8, 7.0, float("inf")])]  # diverges at step 2
    runs.append(write_run(root, SWIGLU, 0, flat(2.8)))  # one seed only
    runs.append(write_run(root, PRE, 3, [4.0, 3.5, 3.2], status="running", truncate_last_line=True))
    write_grid(root, runs, pending=[f"{SWIGLU}__seed=1"])
    return root


@pytest.fixture(scope="module")
def reported(grid):
    """`ablate report GRID` once; the tests below read what it wrote."""
    with pytest.warns(UserWarning, match="metrics.jsonl"):
        analysis = analyse(grid)
    code = main(["report", str(grid)])
    return code, analysis


def parse_table(markdown: str, header: list[str]) -> list[list[str]]:
    lines = markdown.splitlines()
    start = lines.index("| " + " | ".join(header) + " |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_report_on_a_running_grid_exits_0_and_writes_everything(grid, reported):
    assert reported[0] == 0
    text = (grid / "report.md").read_text()
    assert text.startswith("# Ablation report: synthetic")
    for section in ("## What was run", "## Results", "## Comparisons", "## Plots", "## Cells", "## Method"):
        assert section in text
    assert "- cells: 15 (12 completed, 1 diverged, 1 running, 1 pending (not started))" in text
    assert "data fingerprint: `" + "f" * 64 + "`" in text and "harness commit: `" + "0" * 40 + "`" in text
    assert f"baseline: variant `{PRE}`" in text
    for name in PLOTS:
        png = grid / "plots" / f"{name}.png"
        assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 5_000
        assert (grid / "plots" / f"{name}.svg").is_file()
        assert f"](plots/{name}.png)" in text
    # the truncated running cell (load.py words the warning; it names the line and the file)
    assert re.search(r"skipped .*last line of metrics\.jsonl", text.split("## Warnings")[1])


def test_the_report_table_matches_summary_csv(grid, reported):
    summary = pd.read_csv(grid / "summary.csv")
    rows = parse_table((grid / "report.md").read_text(), RESULT_COLUMNS)
    assert [r[0].strip("`") for r in rows] == list(summary["group"])
    assert list(summary["group"])[0] == PRE  # the baseline first
    for row, (_, csv) in zip(rows, summary.iterrows()):
        numbers = [float(x) for x in re.findall(r"[-+]?\d+\.\d+", row[2])]
        expected = [csv["final_val_loss_mean"], csv["final_val_loss_ci_low"], csv["final_val_loss_ci_high"]]
        assert numbers == [round(x, LOSS_DIGITS) for x in expected if not math.isnan(x)]
        assert row[3] == f"{csv['final_loss']:.{LOSS_DIGITS}f}"  # the training-loss mean stays a column
        if csv["group"] != csv["baseline"]:
            delta = [float(x) for x in re.findall(r"[-+]?\d+\.\d+", row[4])]
            expected = [csv["delta_vs_baseline"], csv["delta_ci_low"], csv["delta_ci_high"]]
            assert delta == [round(x, LOSS_DIGITS) for x in expected if not math.isnan(x)]
            if isinstance(csv["test"], str):
                assert row[5] == {"paired t-test": "paired", "Welch t-test": "Welch"}[csv["test"]]
                assert row[6] == format_p(csv["p_value"]) and row[7] == format_p(csv["p_adjusted"])
        assert row[8].startswith(csv["divergence"])
        assert row[9] == f"{csv['spikes']:.{OTHER_DIGITS}f}"
        assert row[10] == f"{csv['grad_ratio_end']:.{OTHER_DIGITS}f}"


def test_summary_csv_holds_the_hand_computed_numbers(grid, reported):
    s = pd.read_csv(grid / "summary.csv").set_index("group")
    assert s.loc[PRE, "final_val_loss_mean"] == pytest.approx(3.15) and s.loc[PRE, "final_loss"] == pytest.approx(3.05)
    assert s.loc[POST, "delta_vs_baseline"] == pytest.approx(np.mean([0.20, 0.25, 0.10]))
    assert s.loc[RMS, "delta_vs_baseline"] == pytest.approx(np.mean([-0.50, -0.50, -0.51]))
    assert s.loc[PRE, "n_running"] == 1 and s.loc[PRE, "n_completed"] == 3  # running: no statistic
    assert (s.loc[SANDWICH, "n_diverged"], s.loc[SANDWICH, "divergence"]) == (1, "1/3")
    assert s.loc[SANDWICH, "final_val_loss_mean"] == pytest.approx(3.025)
    # Seeds pair: the paired t-test on the per-seed differences, then BH over the report's 3 tests.
    tested = [POST, RMS, SANDWICH]
    assert list(s.loc[tested, "test"]) == ["paired t-test"] * 3
    post = scipy_stats.ttest_rel([3.30, 3.45, 3.25], [3.10, 3.20, 3.15]).pvalue
    assert s.loc[POST, "p_value"] == pytest.approx(post)
    assert list(s.loc[tested, "p_adjusted"]) == pytest.approx(adjust_p_values(list(s.loc[tested, "p_value"]), "bh"))
    assert s.loc[POST, "p_adjusted"] > 0.05 and s.loc[POST, "seeds_for_power"] == 4
    assert math.isnan(s.loc[SWIGLU, "final_val_loss_ci_low"]) and s.loc[SWIGLU, "interval"] == "no interval: only one seed"


def test_one_seed_says_no_interval_and_comparisons_say_what_the_numbers_show(grid, reported):
    text = (grid / "report.md").read_text()
    swiglu = next(r for r in parse_table(text, RESULT_COLUMNS) if r[0] == f"`{SWIGLU}`")
    assert swiglu[2] == "2.9000 (no interval: only one seed)"
    assert swiglu[4] == "-0.2000 (no interval: one seed)" and swiglu[6] == "—"
    comparisons = text.split("## Comparisons")[1].split("## Plots")[0]
    assert "BH-adjusted p < 0.05 (Benjamini-Hochberg over this report's 3 tests)" in comparisons
    assert (f"No significant difference between `{POST}` and `{PRE}`: difference +0.1833 nats" in comparisons
            and "paired t-test p=0.05, BH-adjusted p=0.08, 3 paired seeds); about 4 paired seeds would detect"
            in comparisons)
    assert f"`{RMS}` has a lower final validation loss than `{PRE}` by 0.5033 nats" in comparisons
    assert "only one seed, no interval" in comparisons
    assert f"`{SANDWICH}` diverged in 1/3 seeds (baseline `{PRE}`: 0/3)." in comparisons
    cells = text.split("## Cells")[1]
    assert "| diverged |" in cells and "diverged at step 2" in cells and "running (no summary.json yet)" in cells


def test_report_on_a_single_run_and_a_preamble_section(tmp_path, capsys):
    # A crash cut the last metrics line: reported as a one-line warning, not a traceback.
    run = write_run(tmp_path, seed=5, losses=flat(2.5, n=13), axes={}, truncate_last_line=True)
    assert main(["report", str(run.path)]) == 0
    out, err = capsys.readouterr()
    assert str(run.path / "report.md") in out
    assert err.startswith(f"ablate report: warning: {run.cell_id}: skipped ") and err.count("\n") == 1
    assert "last line of metrics.jsonl" in err
    text = (run.path / "report.md").read_text()
    assert text.startswith(f"# Run report: {run.cell_id}")
    assert "2.6000 (no interval: only one seed)" in text and (run.path / "summary.csv").is_file()

    verdict = lambda a: f"## Verdict\n\n{len(a.groups)} group, baseline {a.baseline.name}."  # noqa: E731
    with pytest.warns(UserWarning):
        path = write_report(run.path, preamble_sections=[verdict, ("Note", "by hand")], dpi=40)
    sections = re.findall(r"^## (.+)$", path.read_text(), flags=re.M)
    assert sections[:3] == ["Verdict", "Note", "What was run"]
    assert f"1 group, baseline {PRE}." in path.read_text()


def test_holm_on_request_corrects_the_same_family_and_says_so(grid):
    with pytest.warns(UserWarning):
        a = analyse(grid, settings=Settings(correction="holm"))
    tested = [c for c in a.comparisons if c.p_value is not None]
    assert [c.group for c in tested] == [POST, RMS, SANDWICH]
    assert [c.p_adjusted for c in tested] == pytest.approx(list(holm([c.p_value for c in tested])))
    text = render(a, [], [])
    assert "Holm-adjusted p < 0.05 (Holm over this report's 3 tests)" in text
    assert "Holm (family-wise error rate)" in text.split("## Method")[1]


def test_baseline_can_be_chosen_by_group(grid):
    with pytest.warns(UserWarning):
        a = analyse(grid, baseline=POST)
    assert a.baseline.kind == "group" and a.groups[0] == POST
    assert a.comparison(PRE).mean_diff == pytest.approx(-np.mean([0.20, 0.25, 0.10]))
    assert a.comparison(POST) is None  # the baseline is not compared with itself


def test_a_variant_baseline_compares_like_with_like_at_each_option_setting(tmp_path):
    # pre is better by 0.1 at lr=0.001 and worse by 0.2 at lr=0.01: pooling would hide both.
    for seed in (0, 1):
        for lr, pre, post in [(1e-3, 3.0, 3.1), (1e-2, 3.0, 2.8)]:
            write_run(tmp_path, PRE, seed, flat(pre + 0.01 * seed), options={"lr": lr})
            write_run(tmp_path, POST, seed, flat(post + 0.01 * seed), options={"lr": lr})
    a = analyse(tmp_path)  # default: the default block's variant, matched by lr
    assert a.baseline.kind == "variant" and a.baseline.name == PRE
    assert a.groups == [f"{PRE}__lr=0.001", f"{POST}__lr=0.001", f"{PRE}__lr=0.01", f"{POST}__lr=0.01"]
    assert a.comparison(f"{POST}__lr=0.001").baseline == f"{PRE}__lr=0.001"
    assert a.comparison(f"{POST}__lr=0.001").mean_diff == pytest.approx(0.1)
    assert a.comparison(f"{POST}__lr=0.01").mean_diff == pytest.approx(-0.2)
    assert list(a.summary["baseline"]) == [f"{PRE}__lr=0.001"] * 2 + [f"{PRE}__lr=0.01"] * 2


@pytest.mark.parametrize("args, message", [
    (["{missing}"], "does not exist; valid: a grid folder or a run directory"),
    (["{empty}"], "is not a run or grid folder"),
    (["{grid}", "--baseline", "nope"], "unknown baseline 'nope'; valid: a group ("),
    (["{grid}", "--last-k", "0"], "--last-k 0 must be at least 1"),
    (["{grid}", "--correction", "bonferroni"], "--correction 'bonferroni'; valid: bh, holm"),
    (["{grid}", "--basin-tolerance", "-1"], "--basin-tolerance -1.0 must be 0 or more"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    write_run(tmp_path / "grid", seed=0)
    before = sorted(p for p in tmp_path.rglob("*"))
    paths = {"missing": tmp_path / "missing", "empty": tmp_path / "empty", "grid": tmp_path / "grid"}
    argv = ["report"] + [a.format(**paths) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ablate report: error: ") and message in err and err.count("\n") == 1
    assert sorted(p for p in tmp_path.rglob("*")) == before


V = "pre.layernorm.gelu.dense.res"


def test_report_outputs_planted_as_links_leave_their_targets_untouched(tmp_path):
    runs, victims = tmp_path / "runs", tmp_path / "victims"
    victims.mkdir()
    write_grid(runs, [write_run(runs, V, s) for s in (0, 1)])
    assert main(["report", str(runs)]) == 0
    outputs = [runs / "report.md", runs / "summary.csv", runs / "cells.csv", *sorted((runs / "plots").iterdir())]
    assert any(p.suffix == ".png" for p in outputs)
    links = plant_links(victims, outputs)
    assert main(["report", str(runs)]) == 0
    assert victims_untouched(links)
    assert all(not p.is_symlink() and p.is_file() for p in links)


def test_the_step_of_a_line_dropped_on_resume_is_kept_in_the_record_and_named_in_the_report(tmp_path, capsys):
    import ablate.engine.train as T
    from ablate.engine.cell import Cell, run_cell

    cell = Cell.from_options({"layers": 2, "steps": 6, "checkpoint_every": 2, "eval_batches": 1,
                              "final_eval_batches": 1})
    run_dir = tmp_path / "g" / cell.id
    calls = []

    def killed_after_step_3():
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt  # after the checkpoint at step 2: the rerun resumes there

    with pytest.raises(KeyboardInterrupt):
        T.train(cell, run_dir, after_step=killed_after_step_3)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    lines[1] = '{"step": 1, "lo'  # damaged mid-file: the resume cannot keep it
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run_cell(cell, tmp_path / "g")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["missing_steps"] == [1]
    assert "step 1" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "g")]) == 0
    report = (tmp_path / "g" / "report.md").read_text()
    assert "no metrics row for step 1" in report


def test_report_refuses_a_folder_whose_only_cell_cannot_be_read(tmp_path, capsys):
    run = write_run(tmp_path, V, 0)
    write_grid(tmp_path, [run])
    (run.path / "config.json").write_text('{"cell_id": "x", "vari')  # cut mid-write
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "config.json" in err and "no cells started" not in err and err.strip().count("\n") <= 1
    assert not (tmp_path / "report.md").exists()
