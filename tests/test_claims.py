"""Claims: the declarations, the verdict engine on synthetic runs (every measure kind: clear
agreement, clear disagreement, too few seeds), each claim's grid, `ablate reproduce --list`,
a report and plot per claim, the index, and one real miniature end to end."""
import json
import math
import zlib

import numpy as np
import pytest

from ablate.analysis.claim_measures import MEASURES
from ablate.analysis.claims import (AGREES, CANNOT_TELL, DISAGREES, ClaimError, evaluate, mcnemar_pairs_for_power,
                                    parse_claim, select)
from ablate.analysis.stats import adjust_p_values
from ablate.cli import main
from ablate.commands.reproduce import QUICK_WORKERS, quick_seconds, shipped_claims
from ablate.grids import load_grid
from tests.synthetic_runs import write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"
CLAIMS = shipped_claims()
PNG = b"\x89PNG\r\n\x1a\n"


def add_metrics(run, per_step):
    """Add keys to a synthetic run's metrics.jsonl: {step: {key: value}}."""
    path = run.path / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row.update(per_step.get(row["step"], {}))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def patch_config(run, **fields):
    """Replace top-level fields of a synthetic run's config.json (a dict merges into the field)."""
    path = run.path / "config.json"
    config = json.loads(path.read_text())
    for key, value in fields.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(json.dumps(config))


def claim_of(measure, expect="higher", margin=None, than=None, a=None, b=None, **extra):
    entry = {"measure": measure, "a": a or {"norm": "post"}, "expect": expect, **extra}
    entry.update({"than": than} if than is not None else {"b": b or {"norm": "pre"}})
    if margin is not None:
        entry["margin"] = margin
    return parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g", "compare": [entry]})


# --------------------------------------------------------------- one writer per measure kind
# Each writes the cells of one variant and seed so that the measure's value is `v`.


def _loss_cell(root, variant, seed, v, **kw):
    write_run(root, variant, seed, losses=[4.0, 3.5, 3.0, 2.8], val_loss=v, **kw)


def _grad_reach_cell(root, variant, seed, v):
    write_run(root, variant, seed, grad_norms=[[10 ** v, 1.0]] * 5)  # layer 0 over the top layer: 10^v


def test_grad_reach_reads_the_embeddings_when_asked(tmp_path):
    for s in range(3):
        write_run(tmp_path, POST, s, grad_norms=[[1.0, 0.5 / 10 ** (1 + 0.1 * s)]] * 5)  # grad_norm/embed is 0.5
        write_run(tmp_path, PRE, s, grad_norms=[[1.0, 0.5]] * 5)
    result = evaluate(claim_of("grad_reach", params={"phase": "init", "from": "embed"}), tmp_path).results[0]
    assert result.mean_a == pytest.approx(1.1) and result.mean_b == pytest.approx(0.0) and result.outcome == AGREES


def _block_change_cell(root, variant, seed, v):
    run = write_run(root, variant, seed)
    add_metrics(run, {0: {"block_change/layer_0": v, "block_change/layer_1": v}})


def _attn_cell(root, variant, seed, v):
    run = write_run(root, variant, seed)
    add_metrics(run, {s: {"attn_logit_max/layer_0": 10 ** v / (4 - s), "attn_logit_max/layer_1": 1.0} for s in range(4)})


def _slope_cell(root, variant, seed, v):
    write_run(root, variant, seed, grad_norms=[[10 ** (v * i) for i in range(4)]] * 5, n_layer=4)


def _spread_cell(root, variant, seed, v):
    write_run(root, variant, seed, grad_norms=[[1.0, 1.0]] * 4 + [[1.0, 10 ** v]])


def _sweep_cells(root, variant, seed, v):
    for lr, final in ((1e-3, 1.0), (3e-3, 1.0), (1e-2, 1.0 + 3 * v)):  # sensitivity = v (init loss 4.0)
        write_run(root, variant, seed, losses=[4.0, 3.0, 2.5], val_loss=final, options={"lr": lr})


def _basin_cells(root, variant, seed, v):
    # Within 0.1 nats of the best for `v` decades (v in {0, 0.5, 1}): lrs 1e-3, 3.16e-3, 1e-2.
    for i, lr in enumerate((1e-3, 10 ** -2.5, 1e-2)):
        final = 2.0 if i * 0.5 <= v else 3.0
        write_run(root, variant, seed, losses=[4.0, 3.0, 2.5], val_loss=final + 0.001 * seed * i, options={"lr": lr})


def _diverged_cells(root, variant, seed, v):
    for lr in (1e-3, 1e-2):
        losses = [4.0, 3.0, float("nan")] if v else [4.0, 3.0, 2.5]
        write_run(root, variant, seed, losses=losses, options={"lr": lr})


WRITERS = {
    "final_val_loss": (_loss_cell, {}), "grad_reach": (_grad_reach_cell, {"phase": "init"}),
    "block_change": (_block_change_cell, {}), "attn_logit_max": (_attn_cell, {}),
    "init_grad_slope": (_slope_cell, {"part": "mlp"}), "grad_spread": (_spread_cell, {"phase": "end"}),
    "lr_sensitivity": (_sweep_cells, {}), "diverged": (_diverged_cells, {}),
}


def test_every_registered_measure_has_a_synthetic_writer_here_or_its_own_test():
    own_tests = {"gain_per_param", "basin_width"}  # tested below on their own
    assert set(MEASURES) == set(WRITERS) | own_tests


@pytest.mark.parametrize("measure", sorted(WRITERS))
@pytest.mark.parametrize("case", ["agrees", "does not agree", "too few seeds"])
def test_the_engine_on_synthetic_runs_of_every_measure(tmp_path, measure, case):
    writer, params = WRITERS[measure]
    if measure == "diverged":
        seeds, post, pre = ((0, 1, 2, 3), [1] * 4, [0] * 4) if case == "agrees" else \
            ((0, 1, 2, 3), [0] * 4, [1] * 4) if case == "does not agree" else ((0, 1), [1, 0], [0, 0])
    else:
        noise = [0.011, -0.007, 0.004, -0.009]
        gap = {"agrees": 0.3, "does not agree": -0.3, "too few seeds": 0.004}[case]
        seeds = (0, 1, 2, 3) if case != "too few seeds" else (0, 1)
        post = [0.5 + gap + noise[s] for s in seeds]
        pre = [0.5 - noise[s] / 2 for s in seeds]
    for s, a, b in zip(seeds, post, pre):
        writer(tmp_path, POST, s, a)
        writer(tmp_path, PRE, s, b)
    verdict = evaluate(claim_of(measure, params=params), tmp_path)
    result = verdict.results[0]
    expected = {"agrees": AGREES, "does not agree": DISAGREES, "too few seeds": CANNOT_TELL}[case]
    assert result.outcome == expected, result.sentence()
    assert verdict.outcome == expected
    assert result.n_seeds == len(seeds)
    if case == "too few seeds":
        assert verdict.text().startswith(f"cannot tell with {len(seeds)} seeds")
        if measure != "diverged":  # a continuous measure's observed effect gives a seed count
            assert result.seeds_needed > len(seeds) and f"(about {result.seeds_needed} would tell)" in verdict.text()
    if measure not in ("diverged",):
        assert result.diff == pytest.approx(np.mean(post) - np.mean(pre), abs=1e-6)


def test_equivalence_within_a_margin_uses_tost(tmp_path):
    def run(root, gap, noise):
        for s in range(4):
            _loss_cell(root, POST, s, 2.5 + gap + noise * (-1) ** s)
            _loss_cell(root, PRE, s, 2.5)
        return evaluate(claim_of("final_val_loss", expect="equal", margin=0.03), root).results[0]

    same = run(tmp_path / "same", 0.002, 0.001)
    assert same.outcome == AGREES and same.test == "TOST" and same.interval.confidence == pytest.approx(0.9)
    assert -0.03 < same.interval.low and same.interval.high < 0.03
    apart = run(tmp_path / "apart", 0.2, 0.001)
    assert apart.outcome == DISAGREES and "beyond the margin" in apart.test
    noisy = run(tmp_path / "noisy", 0.0, 0.05)
    assert noisy.outcome == CANNOT_TELL and noisy.seeds_needed > 4


def test_one_sample_comparison_against_a_number(tmp_path):
    for s in range(3):
        _block_change_cell(tmp_path, PRE, s, 0.05 + 0.01 * s)
    claim = claim_of("block_change", expect="lower", than=0.5, a={"norm": "pre"})
    result = evaluate(claim, tmp_path).results[0]
    assert result.outcome == AGREES and result.test == "one-sample t-test"
    assert result.mean_b == 0.5 and result.diff == pytest.approx(0.06 - 0.5)


def test_comparisons_of_a_claim_are_holm_corrected_together(tmp_path):
    noise = [0.01, -0.03, 0.02, 0.005]
    for s in range(4):
        for lr, gap in ((1e-3, 0.05), (3e-3, 0.04)):
            _loss_cell(tmp_path, POST, s, 2.5 + gap + noise[s], options={"lr": lr})
            _loss_cell(tmp_path, PRE, s, 2.5, options={"lr": lr})
    entries = [{"measure": "final_val_loss", "at": {"lr": lr}, "a": {"norm": "post"}, "b": {"norm": "pre"},
                "expect": "higher"} for lr in (1e-3, 3e-3)]
    claim = parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "compare": entries})
    results = evaluate(claim, tmp_path).results
    raw = [r.p_value for r in results]
    assert [r.p_adjusted for r in results] == pytest.approx(adjust_p_values(raw, "holm"))
    assert all(r.p_adjusted >= r.p_value for r in results)


def test_gain_per_param_and_basin_width(tmp_path):
    for s in range(3):
        for ratio, loss, params in ((2.0, 2.6, 2e6), (4.0, 2.4, 3e6), (8.0, 2.35, 5e6)):
            noise = {2.0: 0.0, 4.0: 0.004 * s, 8.0: 0.003 * s * s}[ratio]
            run = write_run(tmp_path / "mlp", PRE, s, options={"mlp_ratio": ratio}, val_loss=loss + noise)
            patch_config(run, model={"params": params})
    claim = claim_of("gain_per_param", expect="lower", a={"mlp_ratio": [4.0, 8.0]}, b={"mlp_ratio": [2.0, 4.0]},
                     params={"axis": "mlp_ratio"})
    result = evaluate(claim, tmp_path / "mlp").results[0]
    # 2 -> 4 gains 0.2 - 0.004 s nats per 1M parameters, 4 -> 8 gains (0.05 + 0.004 s - 0.003 s^2) / 2.
    assert result.mean_b == pytest.approx(np.mean([0.2 - 0.004 * s for s in range(3)]))
    assert result.mean_a == pytest.approx(np.mean([(0.05 + 0.004 * s - 0.003 * s * s) / 2 for s in range(3)]))
    assert result.outcome == AGREES

    for s in range(3):
        _basin_cells(tmp_path / "basin", POST, s, 0.0)
        _basin_cells(tmp_path / "basin", PRE, s, 1.0)
    result = evaluate(claim_of("basin_width", expect="lower"), tmp_path / "basin").results[0]
    assert result.mean_a == pytest.approx(0.0) and result.mean_b == pytest.approx(1.0)


def test_a_metric_the_runs_lack_means_cannot_tell_with_the_reason(tmp_path):
    for s in range(3):
        write_run(tmp_path, POST, s)
        write_run(tmp_path, PRE, s)
    verdict = evaluate(claim_of("block_change", expect="lower"), tmp_path)
    assert verdict.outcome == CANNOT_TELL and "do not log block_change" in verdict.results[0].sentence()


def test_divergence_reports_the_first_non_finite_step(tmp_path):
    for s in range(4):
        _diverged_cells(tmp_path, POST, s, 1)
        _diverged_cells(tmp_path, PRE, s, 0)
    result = evaluate(claim_of("diverged"), tmp_path).results[0]
    assert result.test == "exact McNemar test" and result.n_pairs == 8
    assert result.p_value == pytest.approx(2 * 0.5 ** 8)
    assert "first non-finite value at step 2" in result.note


def test_mcnemar_power_grows_with_the_number_of_pairs():
    n = mcnemar_pairs_for_power(0.5, 0.0, 0.05)
    assert n is not None and 6 <= n <= 20  # 6 one-sided discordant pairs give p = 0.031
    assert mcnemar_pairs_for_power(0.3, 0.3, 0.05) is None  # no effect: no count tells


@pytest.mark.parametrize("bad, message", [
    ({"measure": "nope"}, "is not registered"),
    ({"than": 1.0}, "exactly one of 'b'"),
    ({"expect": "equal"}, "positive 'margin'"),
    ({"expect": "sideways"}, "valid: higher, lower, equal"),
    ({"colour": "red"}, "unknown key 'colour'"),
])
def test_a_bad_declaration_is_refused_naming_the_key(bad, message):
    entry = {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher", **bad}
    with pytest.raises(ClaimError, match=message):
        parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "compare": [entry]}, "t.toml")


# ------------------------------------------------------------------------ the shipped claims


def grid_frame(grid):
    """The grid's cells with the columns a claim selects on, as the analysis will see them."""
    import pandas as pd

    rows = []
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        spec = cfg.spec
        rows.append({"cell_id": cell.id, "seed": cfg.seed, "norm": spec.norm, "act": spec.act, "mlp": spec.mlp,
                     "residual": spec.residual, "qk_norm": spec.qk_norm, "lr": cfg.lr, "warmup": cfg.warmup,
                     "init": cfg.init_name, "mlp_ratio": cfg.mlp_ratio, "n_layer": cfg.size.n_layer,
                     "steps": cfg.steps})
    return pd.DataFrame(rows)


def test_the_shipped_claims_are_the_issue_s_eight():
    assert set(CLAIMS) == {"residual-gradient", "identity-init", "norm-stability", "prenorm-wins", "mlp-ratio",
                           "swiglu", "gelu-vs-relu", "qk-norm"}


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_each_claim_s_grid_expands_to_the_cells_its_declaration_names(name):
    claim = CLAIMS[name]
    grid = load_grid(claim.grid)
    frame = grid_frame(grid)
    used = set()
    for c in (*claim.compare, *claim.report):
        a = frame[select(frame, c.selector("a"))]
        assert a["seed"].nunique() >= 2, (c.label, "a")
        used |= set(a["cell_id"])
        if c.b is not None:
            b = frame[select(frame, c.selector("b"))]
            assert b["seed"].nunique() >= 2 and set(b["seed"]) == set(a["seed"]), (c.label, "b")
            if MEASURES[c.measure].per_cell:  # the sides pair cell for cell
                assert len(a) == len(b), c.label
            if c.measure != "gain_per_param":
                assert not set(a["cell_id"]) & set(b["cell_id"]), c.label
            used |= set(b["cell_id"])
    assert used == set(frame["cell_id"]), "every cell of the grid enters some comparison"
    assert "gpu" in grid.scales and len(load_grid(claim.grid, "gpu").cells) >= len(grid.cells) * 0.5
    assert quick_seconds(grid, QUICK_WORKERS) < 15 * 60


def test_all_quick_fits_in_90_minutes():
    assert sum(quick_seconds(load_grid(c.grid)) for c in CLAIMS.values()) < 90 * 60


def test_reproduce_list_matches_the_shipped_claims(capsys):
    assert main(["reproduce", "--list"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("  ") and "grid" not in line[:30]]
    listed = {row[0]: row for row in rows}
    assert set(listed) == set(CLAIMS)
    for name, claim in CLAIMS.items():
        assert listed[name][1] == claim.grid and int(listed[name][2]) == len(load_grid(claim.grid).cells)


def test_an_unknown_claim_exits_2_and_writes_nothing(tmp_path, capsys):
    assert main(["reproduce", "postnorm-wins", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown claim 'postnorm-wins'" in err and "prenorm-wins" in err and not (tmp_path / "x").exists()


def synthetic_claim_runs(root, claim):
    """A synthetic run directory for every cell of the claim's grid (one seed pair), with values
    that depend on the cell's settings: what a miniature of the claim writes, without training."""
    grid = load_grid(claim.grid, overrides={"steps": 6})
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        if cfg.seed > 1:
            continue
        spec = cfg.spec
        axes = {k: v for k, v in cell.axes.items() if k != "seed"}
        noise = zlib.crc32(cell.id.encode()) % 1000 / 1e4  # differs per cell, the same every run
        shift = 0.1 * (spec.norm == "post") + 0.05 * (spec.qk_norm == "none") + noise + 0.3 * cfg.lr
        losses = [5.5, 4.0, 3.5, 3.2, 3.0, 2.9 + shift] if spec.norm != "none" or cfg.lr < 1e-2 else [5.5, float("nan")]
        variant = {"id": spec.id, "norm": spec.norm, "norm_type": spec.norm_type, "act": spec.act, "mlp": spec.mlp,
                   "residual": spec.residual, "qk_norm": spec.qk_norm}
        base = ".".join(p for p in spec.id.split(".") if not p.startswith("qk-"))
        params = 100_000 + int(20_000 * cfg.mlp_ratio)
        grads = [[(i + 1) * (1 + 10 * noise) ** (i + 1) for i in range(3)]] * len(losses)
        run = write_run(root, base, cfg.seed, losses=losses, options=axes, n_layer=3, probe_every=2,
                        unigram_entropy=3.25, planned_steps=6, grad_norms=grads)
        patch_config(run, variant=variant, model={"params": params})
        add_metrics(run, {0: {f"block_change/layer_{i}": (0.1 if spec.residual else 1.2) + noise for i in range(3)}})


def test_reproduce_all_writes_each_verdict_and_plot_and_an_index_linking_every_claim(tmp_path, monkeypatch, capsys):
    # The grids are not trained here (the real miniature below trains one): each claim's cells are
    # written as synthetic runs where the grid would run, and the verdicts come without the full report.
    import ablate.analysis.claim_report as claim_report
    import ablate.grid_runner as grid_runner

    def fake_run_grid(grid, out, options=None, **_):
        synthetic_claim_runs(out, next(c for c in CLAIMS.values() if c.grid == grid.name))
        return 0

    full_report = claim_report.write_claim_report
    monkeypatch.setattr(grid_runner, "run_grid", fake_run_grid)
    monkeypatch.setattr(claim_report, "write_claim_report", lambda claim, out: full_report(claim, out, full=False))
    assert main(["reproduce", "all", "--quick", "--out", str(tmp_path), "--quiet"]) == 0
    text = (tmp_path / "index.md").read_text()
    printed = capsys.readouterr().out
    for name, claim in CLAIMS.items():
        out = tmp_path / name
        saved = json.loads((out / "verdict.json").read_text())
        verdict = saved["verdict"]
        assert verdict in (AGREES, DISAGREES) or verdict.startswith("cannot tell with")
        assert len(saved["results"]) == len(claim.compare) and len(saved["reported"]) == len(claim.report)
        report = (out / "report.md").read_text()
        assert f"## Verdict: {name}" in report and f"**Verdict: {verdict}.**" in report
        assert f"![{name}](plots/claim_{name}.png)" in report
        png = out / "plots" / f"claim_{name}.png"
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000, name
        assert f"[{name}]({name}/report.md)" in text
        assert f"| {name} | {claim.source} | {verdict} |" in text
        assert f"{name}: {verdict}" in printed


@pytest.mark.slow
def test_a_real_miniature_reproduces_end_to_end(tmp_path, capsys):
    out = tmp_path / "rg"
    status = main(["reproduce", "residual-gradient", "--quick", "--out", str(out), "--workers", "0", "--quiet",
                   "--set", "steps=3", "--set", "layers=3", "--set", "batch_size=2", "--set", "eval_every=3",
                   "--set", "eval_batches=1", "--set", "final_eval_batches=1", "--set", "seed=0"])
    assert status == 0
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["verdict"] == "cannot tell with 1 seed (no estimate of how many would tell)"
    first = verdict["results"][0]
    assert first["n_pairs"] == 1 and math.isfinite(first["mean_a"]) and math.isfinite(first["mean_b"])
    assert (out / "plots" / "claim_residual-gradient.png").read_bytes()[:8] == PNG
    assert "## Verdict: residual-gradient" in (out / "report.md").read_text()
    assert "residual-gradient: cannot tell with 1 seed" in capsys.readouterr().out
