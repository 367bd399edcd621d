"""`ablate reproduce prenorm-wins`: the grid it runs, the verdict logic, and the command."""
import json

import numpy as np
import pytest

from ablate.cli import main
from ablate.grids import load_grid
from ablate.analysis.analyse import analyse
from ablate.analysis.prenorm import PLATEAU_MARGIN, Side, decide, gap_sentences, setting_verdicts
from ablate.analysis.prenorm_report import verdict_section
from ablate.analysis.stats import adjust_p_values, bootstrap_ci
from tests.synthetic_runs import write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"


def test_the_grid_expands_to_the_stated_cells():
    grid = load_grid("prenorm-wins", "cpu")
    assert len(grid.cells) == 2 * 2 * 2 * 3
    seen = set()
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        assert cfg.spec.id in (PRE, POST)
        assert cfg.size.n_layer == 12 and cfg.size.d_model == 64 and cfg.context == 64
        assert (cfg.batch_size, cfg.steps, cfg.grad_clip) == (16, 300, 0.0)
        seen.add((cfg.spec.norm, cfg.warmup, cfg.lr, cfg.seed))
    assert seen == {(n, w, lr, s) for n in ("pre", "post") for w in (0, 100) for lr in (3e-3, 3e-4) for s in (0, 1, 2)}
    full = load_grid("prenorm-wins", "gpu")
    assert {full.configs[c.id].size.n_layer for c in full.cells} == {6, 12, 24}
    assert len({full.configs[c.id].seed for c in full.cells}) >= 3


def side(losses, diverged=(), plateaued=()):
    return Side(dict(enumerate(losses)) if isinstance(losses, list) else losses, tuple(diverged), tuple(plateaued),
                bootstrap_ci(list(losses.values()) if isinstance(losses, dict) else losses))


@pytest.mark.parametrize(
    "pre, post, expected",
    [
        (side([2.50, 2.55, 2.52]), side([3.20, 3.22, 3.19]), "pre-norm wins"),  # clear pre win
        (side([2.50, 2.55, 2.52]), side([2.30, 2.36, 2.31]), "post-norm wins"),  # clear post win
        (side([2.50, 2.60, 2.40]), side([2.55, 2.45, 2.52]), "no significant difference"),  # overlap
        (side([2.50]), side([3.20]), "not enough seeds to tell"),  # one seed
        (side({0: 2.5, 1: 2.6}), side({0: 3.0}, diverged=[1]), "not enough seeds to tell"),  # one pair left
        (side([2.5, 2.6, 2.4]), side({}, diverged=[0, 1, 2]), "pre-norm wins"),  # post diverged everywhere
    ],
)
def test_verdict_logic_on_synthetic_results(pre, post, expected):
    outcome, reason, _ = decide(pre, post)
    assert outcome == expected, reason


def _grid(tmp_path, settings, seeds=(0, 1, 2)):
    """settings: {(lr, warmup): (pre_final, post_final)}; each seed adds a little noise,
    different for the two placements so that the paired differences vary."""
    noise = {PRE: [0.01, -0.02, 0.012], POST: [-0.015, 0.02, 0.004]}
    for (lr, warmup), (pre_final, post_final) in settings.items():
        for variant, final in ((PRE, pre_final), (POST, post_final)):
            for seed in seeds:
                end = final + noise[variant][seed]
                write_run(tmp_path, variant, seed, losses=list(np.linspace(5.5, end, 12)) + [end] * 10,
                          options={"lr": lr, "warmup": warmup}, n_layer=3, grid="prenorm-wins")
    return analyse(tmp_path)


def test_setting_verdicts_and_gap_closing_from_run_directories(tmp_path):
    analysis = _grid(tmp_path, {(3e-3, 0): (2.5, 3.2), (3e-3, 100): (2.4, 2.41), (3e-4, 0): (2.9, 2.9)})
    listed = setting_verdicts(analysis.metrics)
    verdicts = {(v.setting["lr"], v.setting["warmup"]): v for v in listed}
    # The settings' paired p-values are one family, corrected together (Benjamini-Hochberg).
    raw = [v.p_value for v in listed]
    assert all(p is not None for p in raw)
    assert [v.p_adjusted for v in listed] == pytest.approx(adjust_p_values(raw, "bh"))
    assert all(v.p_adjusted >= v.p_value for v in listed)
    assert "BH-adjusted p=" in verdicts[(3e-3, 0)].reason
    assert verdicts[(3e-3, 0)].outcome == "pre-norm wins"
    assert verdicts[(3e-3, 0)].diff_mean == pytest.approx(0.7 + (-0.015 + 0.02 + 0.004 - 0.01 + 0.02 - 0.012) / 3)
    assert verdicts[(3e-3, 100)].outcome == "no significant difference"  # 0.01 apart, noise 0.02
    assert "paired seeds would detect a difference of this size with 80% power" in verdicts[(3e-3, 100)].reason
    assert verdicts[(3e-4, 0)].outcome != "pre-norm wins"
    gaps = gap_sentences(list(verdicts.values()))
    assert any(g.startswith("With the lower learning rate") and "it closes" in g for g in gaps)


def test_plateau_counts_use_the_unigram_entropy(tmp_path):
    analysis = _grid(tmp_path, {(3e-3, 0): (2.5, 3.2)})
    metrics = analysis.metrics.assign(unigram_entropy=3.25)
    v = setting_verdicts(metrics)[0]
    assert len(v.post.plateaued) == 3 and len(v.pre.plateaued) == 0
    assert 3.2 >= 3.25 - PLATEAU_MARGIN > 2.5


def test_verdict_section_says_what_the_numbers_show(tmp_path):
    analysis = _grid(tmp_path, {(3e-3, 0): (2.5, 3.2), (3e-3, 100): (2.4, 2.3)}, seeds=(0, 1, 2))
    text = verdict_section(analysis)
    assert "At lr 0.003, warmup 0: **pre-norm wins**" in text
    assert "At lr 0.003, warmup 100: **post-norm wins**" in text
    assert "closes and reverses" in text and "Liu et al." in text
    one = _grid(tmp_path / "one", {(3e-3, 0): (2.5, 3.2)}, seeds=(0,))
    assert "**not enough seeds to tell**" in verdict_section(one) and "Cannot tell" in verdict_section(one)


@pytest.mark.slow
def test_miniature_grid_and_prenorm_verdict_run_end_to_end(tmp_path):
    # `ablate reproduce prenorm-wins` now runs the claims engine (tests/test_claims.py); this
    # drives the prenorm modules end to end the way it used to, until they are retired.
    from ablate.analysis.prenorm_report import write_prenorm_plots
    from ablate.analysis.report import write_report

    out = tmp_path / "pw"
    status = main(["grid", "prenorm-wins", "--out", str(out), "--workers", "1", "--quiet",
                   "--set", "steps=4", "--set", "layers=2", "--set", "batch_size=4", "--set", "eval_every=2",
                   "--set", "eval_batches=1"])
    assert status == 0
    analysis = analyse(out)
    verdicts = setting_verdicts(analysis.metrics)
    write_prenorm_plots(analysis, out / "plots", verdicts)
    write_report(out, preamble_sections=[verdict_section(analysis, verdicts=verdicts)], analysis=analysis)
    report = (out / "report.md").read_text()
    assert report.index("## Verdict: does pre-norm win?") < report.index("## Results")
    assert "At lr 0.003, warmup 0:" in report
    for name in ("prenorm_final_loss", "prenorm_init_and_heatmaps", "loss_curves", "grad_norm_heatmaps"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    grid = json.loads((out / "grid.json").read_text())
    assert len(grid["cells"]) == 24


def test_unknown_experiment_exits_2(tmp_path, capsys):
    assert main(["reproduce", "postnorm-wins", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "valid: " in err and "prenorm-wins" in err.split("valid: ")[1] and not (tmp_path / "x").exists()
