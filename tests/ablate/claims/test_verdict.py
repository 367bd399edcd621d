"""Claims: the declarations (clauses), the verdict engine on synthetic runs whose right answer is
known (every measure kind: clear agreement, clear disagreement, too few seeds), the decision
rules (intersection-union within a clause, Holm across clauses, intervals from the same test
as their p-values, failed runs counted, each arm at its best rate, non-inferiority), each
claim's grid, `ablate reproduce --list`, a report and plot per claim, the index, and one real
miniature end to end."""
import json
import math
import zlib

import numpy as np
import pytest
from scipy import stats as scipy_stats

from ablate.analysis.stats import adjust_p_values, mcnemar_pairs_for_power
from ablate.claims.claim_file import ClaimError, check_against_grid, parse_claim
from ablate.claims.claim_measures import MEASURES
from ablate.claims.claim_report import figure, sentence
from ablate.claims.plan import QUICK_WORKERS, quick_seconds
from ablate.claims.run import shipped_claims
from ablate.claims.selection import select
from ablate.claims.selectors import grid_cells
from ablate.claims.verdict import AGREES, CANNOT_TELL, DISAGREES, at_best_lr, evaluate
from ablate.cli import main
from ablate.grid.spec import load_grid
from tests.helpers.repo import REPO
from tests.helpers.synthetic_runs import write_run

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


def entry(measure, expect="higher", margin=None, than=None, a=None, b=None, effect=0.01, **extra):
    e = {"measure": measure, "a": a or {"norm": "post"}, "expect": expect, "effect": effect, **extra}
    e.update({"than": than} if than is not None else {"b": b or {"norm": "pre"}})
    if margin is not None:
        e["margin"] = margin
    return e


def claim_with(*clauses, report=()):
    """A claim of the given clauses, each a list of comparison entries."""
    return parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g",
                        "clause": [{"sentence": f"s{i}", "label": f"c{i}", "compare": list(c)}
                                   for i, c in enumerate(clauses)], "report": list(report)})


def claim_of(measure, **kw):
    return claim_with([entry(measure, **kw)])


# --------------------------------------------------------------- one writer per measure kind
# Each writes the cells of one variant and seed so that the measure's value is `v`.


def _loss_cell(root, variant, seed, v, **kw):
    write_run(root, variant, seed, losses=[4.0, 3.5, 3.0, 2.8], val_loss=v, **kw)


def _grad_reach_cell(root, variant, seed, v):
    write_run(root, variant, seed, grad_norms=[[10 ** v, 1.0]] * 5)  # layer 0 over the top layer: 10^v


def _block_change_cell(root, variant, seed, v):
    run = write_run(root, variant, seed)
    add_metrics(run, {0: {"block_change/layer_0": v, "block_change/layer_1": v}})


def _attn_cell(root, variant, seed, v):
    run = write_run(root, variant, seed)
    add_metrics(run, {s: {"attn_logit_max/layer_0": 10 ** v / (4 - s), "attn_logit_max/layer_1": 1.0}
                      for s in range(4)})


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


# The binary writers put each arm's edge of stability inside a fine sweep (ablate/claims/design_checks.py:
# futility needs it): v = 1 fails at 2 of 3 rates, v = 0 at 1.
def _diverged_cells(root, variant, seed, v):
    for lr in (1e-3, 2e-3, 3e-3):
        losses = [4.0, 3.0, float("nan")] if lr > (1e-3 if v else 2e-3) else [4.0, 3.0, 2.5]
        write_run(root, variant, seed, losses=losses, options={"lr": lr})


def _failed_cells(root, variant, seed, v):
    # v = 1: one plateaued run (on the unigram entropy) and one diverged; v = 0: one diverged.
    write_run(root, variant, seed, losses=[4.0, 3.0, 2.5], options={"lr": 1e-3}, unigram_entropy=3.4)
    write_run(root, variant, seed, losses=[4.0, 3.0, 3.2], val_loss=3.3 if v else 2.5, options={"lr": 2e-3},
              unigram_entropy=3.4)
    write_run(root, variant, seed, losses=[4.0, 3.0, float("nan")], options={"lr": 3e-3}, unigram_entropy=3.4)


def _act_cell(root, variant, seed, v):
    write_run(root, variant, seed, act_norms=[[1.0, 2.0]] + [[1.0, 2.0 * 10 ** v]] * 4)


WRITERS = {
    "final_val_loss": (_loss_cell, {}), "grad_reach": (_grad_reach_cell, {"phase": "init"}),
    "grad_imbalance": (_grad_reach_cell, {"phase": "early"}),
    "block_change": (_block_change_cell, {}), "attn_logit_max": (_attn_cell, {}),
    "init_grad_slope": (_slope_cell, {"part": "mlp"}), "grad_spread": (_spread_cell, {"phase": "end"}),
    "lr_sensitivity": (_sweep_cells, {}), "diverged": (_diverged_cells, {}), "failed": (_failed_cells, {}),
    "act_rms_growth": (_act_cell, {}),
}
BINARY = ("diverged", "failed")


def test_every_registered_measure_has_a_synthetic_writer_here_or_its_own_test():
    own_tests = {"gain_per_param", "basin_width", "params",  # tested below on their own
                 "dead", "largest_stable_lr", "warmup_lr_gain"}  # tests/ablate/claims/test_claim_measures.py
    assert set(MEASURES) == set(WRITERS) | own_tests


def _binary_case(case):
    # The sign test over seeds needs 6 seeds, every one the claimed way, to reach 0.025 (1/2^6).
    if case == "agrees":
        return tuple(range(6)), [1] * 6, [0] * 6
    if case == "does not agree":
        return tuple(range(6)), [0] * 6, [1] * 6
    return (0, 1), [1, 0], [0, 0]


@pytest.mark.parametrize("measure", sorted(WRITERS))
@pytest.mark.parametrize("case", ["agrees", "does not agree", "too few seeds"])
def test_the_engine_on_synthetic_runs_of_every_measure(tmp_path, measure, case):
    writer, params = WRITERS[measure]
    if measure in BINARY:
        seeds, post, pre = _binary_case(case)
    else:
        # 6 seeds: the sign test's smallest p (1/2^6) reaches 0.025
        noise = [0.011, -0.007, 0.004, -0.009, 0.006, -0.003]
        gap = {"agrees": 0.3, "does not agree": -0.3, "too few seeds": 0.004}[case]
        seeds = tuple(range(6)) if case != "too few seeds" else (0, 1)
        post = [0.5 + gap + noise[s] for s in seeds]
        pre = [0.5 - noise[s] / 2 for s in seeds]
    for s, a, b in zip(seeds, post, pre):
        writer(tmp_path, POST, s, a)
        writer(tmp_path, PRE, s, b)
    verdict = evaluate(claim_of(measure, params=params, effect=0.05), tmp_path)
    result, clause = verdict.results[0], verdict.clauses[0]
    expected = {"agrees": AGREES, "does not agree": DISAGREES, "too few seeds": CANNOT_TELL}[case]
    assert clause.outcome == expected, sentence(result)
    assert verdict.status == expected and len(result.seeds) == len(seeds) == result.n_seeds
    if case == "too few seeds" and measure not in BINARY:  # the declared effect, not the observed one
        assert result.seeds_needed > len(seeds) and "would resolve the smallest effect of interest (0.05" in \
            verdict_line(verdict)
    if measure not in BINARY:
        assert result.diff == pytest.approx(np.mean(post) - np.mean(pre), abs=1e-6)


def verdict_line(verdict):
    from ablate.claims.claim_report import clause_line

    return clause_line(0, verdict.clauses[0])


def test_grad_reach_reads_the_embeddings_when_asked(tmp_path):
    for s in range(6):
        write_run(tmp_path, POST, s, grad_norms=[[1.0, 0.5 / 10 ** (1 + 0.1 * s)]] * 5)  # grad_norm/embed is 0.5
        write_run(tmp_path, PRE, s, grad_norms=[[1.0, 0.5]] * 5)
    verdict = evaluate(claim_of("grad_reach", params={"phase": "init", "from": "embed"}), tmp_path)
    result = verdict.results[0]
    assert result.mean_a == pytest.approx(1.25) and result.mean_b == pytest.approx(0.0) and verdict.status == AGREES


# ------------------------------------------------------------------- the decision rules


def test_a_clause_of_one_clear_and_one_absent_comparison_cannot_tell(tmp_path):
    # post is clearly higher on the loss; the block change does not differ. Intersection-union: the
    # clause cannot tell, and an unrelated measure never makes it "does not agree".
    noise = [0.01, -0.02, 0.015, -0.005, 0.0, 0.012, -0.01, 0.004]  # 8 seeds: 2 x 1/2^8 <= 0.025
    for s in range(8):
        _loss_cell(tmp_path, POST, s, 2.8 + noise[s])
        _loss_cell(tmp_path, PRE, s, 2.5)
    verdict = evaluate(claim_with([entry("final_val_loss"), entry("final_val_loss", expect="lower")]), tmp_path)
    clause = verdict.clauses[0]
    assert [r.test.side for r in clause.results] == ["right", "wrong"]
    assert clause.outcome == DISAGREES  # the second comparison, clearly the other way, refutes the clause
    both = evaluate(claim_with([entry("final_val_loss"), entry("attn_logit_max", effect=0.1)]), tmp_path)
    assert both.results[1].test is None and both.clauses[0].outcome == CANNOT_TELL
    assert both.status == CANNOT_TELL


def test_intersection_union_takes_the_largest_p_within_a_clause_and_holm_across_clauses(tmp_path):
    noise = [0.01, -0.03, 0.02, 0.005]
    for s in range(4):
        for lr, gap in ((1e-3, 0.05), (3e-3, 0.04)):
            _loss_cell(tmp_path, POST, s, 2.5 + gap + noise[s], options={"lr": lr})
            _loss_cell(tmp_path, PRE, s, 2.5, options={"lr": lr})
    one = [entry("final_val_loss", at={"lr": lr}) for lr in (1e-3, 3e-3)]
    together = evaluate(claim_with(one), tmp_path)
    raw = [r.test.p_value for r in together.results]
    assert together.clauses[0].p_value == pytest.approx(max(raw))  # no correction inside a clause
    assert together.clauses[0].p_adjusted == pytest.approx(max(raw))  # a family of one clause
    apart = evaluate(claim_with([one[0]], [one[1]]), tmp_path)
    assert [c.p_adjusted for c in apart.clauses] == pytest.approx(adjust_p_values(raw, "holm"))
    assert all(c.p_adjusted >= c.p_value for c in apart.clauses)


def test_the_headline_counts_the_clauses_that_agree(tmp_path):
    for s in range(7):  # 7 seeds: 1/2^7 within Holm's levels of up to three clauses
        _loss_cell(tmp_path, POST, s, 2.8 + 0.01 * (-1) ** s)
        _loss_cell(tmp_path, PRE, s, 2.5)
    higher, lower = entry("final_val_loss"), entry("final_val_loss", expect="lower")
    absent = entry("attn_logit_max")
    assert evaluate(claim_with([higher], [higher]), tmp_path).outcome == "agrees (2 of 2)"
    assert evaluate(claim_with([higher], [absent]), tmp_path).outcome == \
        "agrees in part (1 agree, 0 do not, 1 cannot tell)"
    assert evaluate(claim_with([higher], [lower], [absent]), tmp_path).outcome == \
        "agrees in part (1 agree, 1 do not, 1 cannot tell)"  # every outcome counted, the other way included
    assert evaluate(claim_with([lower], [absent]), tmp_path).outcome == "does not agree (1 of 2, 1 cannot tell)"
    assert evaluate(claim_with([absent]), tmp_path).outcome == "cannot tell (1 of 1)"


def test_intervals_come_from_the_test_of_their_p_value(tmp_path):
    gaps = {0: 0.30, 1: 0.05, 2: 0.90, 3: -0.02, 4: 0.4, 5: 0.2, 6: 0.6, 7: 0.1}  # 7 of 8 the claimed way
    for s, g in gaps.items():
        _loss_cell(tmp_path, POST, s, 2.5 + g)
        _loss_cell(tmp_path, PRE, s, 2.5)
    t = evaluate(claim_of("final_val_loss"), tmp_path).results[0].test
    d = np.array(list(gaps.values()))
    # the sign test of the median seed: its p and the order statistics that invert it
    assert t.name == "exact sign test over seeds" and t.estimate == pytest.approx(np.median(d))
    assert t.p_value == pytest.approx(scipy_stats.binomtest(7, 8, 0.5, alternative="greater").pvalue)
    assert (t.interval.low > 0) == (t.p_value <= 0.025)  # never an interval beside a p that contradicts it
    assert t.interval.low == pytest.approx(np.sort(d)[0]) and t.interval.high == pytest.approx(np.sort(d)[-1])


def test_a_pair_with_one_arm_diverged_is_counted_at_the_failed_score_not_dropped(tmp_path):
    for s in range(3):
        write_run(tmp_path, PRE, s, losses=[4.0, 3.0, 2.5], val_loss=2.5 + 0.01 * s, unigram_entropy=3.4)
        losses = [4.0, 3.0, float("nan")] if s == 0 else [4.0, 3.0, 2.8]
        write_run(tmp_path, POST, s, losses=losses, val_loss=None if s == 0 else 2.8 + 0.02 * s, unigram_entropy=3.4)
    verdict = evaluate(claim_of("final_val_loss"), tmp_path)
    r = verdict.results[0]
    assert r.n_pairs == 3 and r.a[0] == pytest.approx(3.4)  # the diverged arm scored at the unigram entropy
    assert r.outcomes["a"] == {"trained": 2, "diverged": 1}
    assert "1 diverged" in sentence(r)


def test_failure_counts_over_12_seeds_one_tied_give_the_exact_sign_test_p(tmp_path):
    for s in range(12):
        write_run(tmp_path, POST, s, losses=[4.0, 3.3], val_loss=3.35, unigram_entropy=3.4)  # plateaued
        pre_fails = s == 11
        write_run(tmp_path, PRE, s, losses=[4.0, 3.0], val_loss=3.35 if pre_fails else 2.5, unigram_entropy=3.4)
    t = evaluate(claim_of("failed", effect=0.25), tmp_path).results[0].test
    assert t.name == "exact sign test over seeds" and t.detail == "11 of 12 seeds the claimed way, 1 tied"
    assert t.p_value == pytest.approx(0.5 ** 11) and t.p_value == pytest.approx(0.000488, rel=1e-3)  # one-sided
    assert t.interval.low == 1.0 and t.interval.high == 1.0  # every untied seed at +1: the median's bounds


def test_a_failure_rate_against_a_bound_is_a_sign_test_of_each_seed_s_share(tmp_path):
    for s in range(8):  # two cells a seed; seed 0 fails both, the others none: shares 1, 0, 0, ...
        for lr in (1e-3, 1e-2):
            write_run(tmp_path, PRE, s, losses=[4.0, 3.0], val_loss=3.35 if s == 0 else 2.5, unigram_entropy=3.4,
                      options={"lr": lr})
    claim = claim_of("failed", expect="lower", than=0.25, a={"norm": "pre"}, effect=0.25)
    r = evaluate(claim, tmp_path).results[0]
    t = r.test
    assert r.n_seeds == 8 and r.n_pairs == 16 and list(r.seed_values) == [0.75] + [-0.25] * 7  # share - 0.25
    assert t.name == "exact sign test over seeds" and t.estimate == pytest.approx(-0.25)
    assert t.p_value == pytest.approx(scipy_stats.binomtest(7, 8, 0.5, alternative="greater").pvalue)
    assert t.side == "right" and 0.025 < t.p_value < 0.05


def _sweep(root, variant, seed, curve, **kw):
    for lr, loss in curve.items():
        write_run(root, variant, seed, losses=[4.0, 3.0, 2.6], val_loss=loss + 0.003 * seed, options={"lr": lr},
                  unigram_entropy=3.4, **kw)


def test_each_arm_at_its_own_best_rate_and_an_edge_flagged(tmp_path):
    gelu, relu = "pre.layernorm.gelu.dense.res", "pre.layernorm.relu.dense.res"
    for s in range(3):  # gelu is best at 3e-3, relu at the top of the sweep (1e-2): on the sweep's seeds
        _sweep(tmp_path, gelu, s, {1e-3: 2.6, 3e-3: 2.40, 1e-2: 2.55})
        _sweep(tmp_path, relu, s, {1e-3: 2.7, 3e-3: 2.55, 1e-2: 2.45 + 0.01 * s})
    claim = claim_of("final_val_loss", expect="lower", a={"act": "gelu"}, b={"act": "relu"}, best_lr=True)
    verdict = evaluate(claim, tmp_path)
    r = verdict.results[0]
    assert r.best["a"] == [("", 3e-3, False)] and r.best["b"] == [("", 1e-2, True)] and r.edge
    # The sweep's seeds chose the rates; they do not test them: no fresh seed, no test.
    assert r.test is None and "no fresh seeds" in r.note and verdict.status == CANNOT_TELL
    for s in (3, 4, 5):  # fresh seeds at the chosen rates only
        _sweep(tmp_path, gelu, s, {3e-3: 2.40})
        _sweep(tmp_path, relu, s, {1e-2: 2.45 + 0.01 * s})
    verdict = evaluate(claim, tmp_path)
    r = verdict.results[0]
    assert r.seeds == (3, 4, 5) and r.sweep_seeds == (0, 1, 2)
    assert r.mean_a == pytest.approx(2.412) and r.mean_b == pytest.approx(2.502)
    assert "best lr of a: lr 0.003" in sentence(r) and "at the edge of the sweep" in verdict_line(verdict)


def test_best_rate_selection_on_synthetic_curves_scores_failed_cells():
    import pandas as pd

    cells = pd.DataFrame({"lr": [1e-3, 1e-2, 3e-2] * 2, "seed": [0, 0, 0, 1, 1, 1],
                          "scored_loss": [2.6, 2.4, 3.4, 2.62, 2.45, 2.3], "mlp_ratio": 4.0})
    # 3e-2 is best in seed 1 but failed (entropy 3.4) in seed 0: the mean picks 1e-2.
    kept, picks = at_best_lr(cells, ["lr", "seed"])
    assert picks == [("", 1e-2, False)] and sorted(kept["seed"]) == [0, 1]


def test_non_inferiority_passes_for_the_better_arm_and_fails_for_a_worse_one(tmp_path):
    def run(root, gap):
        for s in range(6):
            _loss_cell(root, POST, s, 2.5 + gap + 0.003 * (-1) ** s)
            _loss_cell(root, PRE, s, 2.5)
        return evaluate(claim_with([entry("final_val_loss", expect="not_higher", margin=0.03)]), root)

    better = run(tmp_path / "better", -0.08)  # "SwiGLU is 0.08 nats better" passes "matches"
    assert better.status == AGREES and better.results[0].test.interval.confidence == pytest.approx(0.95)
    worse = run(tmp_path / "worse", 0.2)
    assert worse.status == DISAGREES and "worse by the margin" in worse.clauses[0].why
    near = run(tmp_path / "near", 0.03)
    assert near.status == CANNOT_TELL


def test_an_exact_count_decides_without_a_test(tmp_path):
    for s in range(2):
        for variant, params in ((PRE, 1_000_000), (POST, 999_000)):
            patch_config(write_run(tmp_path, variant, s), model={"params": params})
    tiny = evaluate(claim_of("params", expect="lower", effect=0.01), tmp_path)  # 0.1% fewer: not "lower"
    assert tiny.status == DISAGREES and "exact" in figure(tiny.results[0])
    assert evaluate(claim_of("params", expect="lower", effect=0.0005), tmp_path).status == AGREES


def test_a_step_0_measure_without_its_step_0_row_counts_the_seed_missing(tmp_path):
    for s in range(3):
        for variant, v in ((POST, 0.4), (PRE, 0.1)):
            run = write_run(tmp_path, variant, s)
            add_metrics(run, {st: {"block_change/layer_0": v, "block_change/layer_1": v} for st in range(5)})
            if variant == POST and s == 1:  # its first metrics line cut: step 0 is gone
                path = run.path / "metrics.jsonl"
                path.write_text("".join(path.read_text().splitlines(keepends=True)[1:]))
    r = evaluate(claim_of("block_change"), tmp_path).results[0]
    assert r.n_pairs == 2 and len(r.missing["a"]) == 1
    assert "no row for step 0" in sentence(r) and "counted missing" in sentence(r)


def test_gain_per_param_and_basin_width(tmp_path):
    for s in range(6):
        for ratio, loss, params in ((2.0, 2.6, 2e6), (4.0, 2.4, 3e6), (8.0, 2.35, 5e6)):
            noise = {2.0: 0.0, 4.0: 0.004 * s, 8.0: 0.003 * s * s}[ratio]
            run = write_run(tmp_path / "mlp", PRE, s, options={"mlp_ratio": ratio}, val_loss=loss + noise)
            patch_config(run, model={"params": params})
    claim = claim_of("gain_per_param", expect="lower", a={"mlp_ratio": [4.0, 8.0]}, b={"mlp_ratio": [2.0, 4.0]},
                     params={"axis": "mlp_ratio"})
    verdict = evaluate(claim, tmp_path / "mlp")
    result = verdict.results[0]
    # 2 -> 4 gains 0.2 - 0.004 s nats per 1M parameters, 4 -> 8 gains (0.05 + 0.004 s - 0.003 s^2) / 2.
    assert result.mean_b == pytest.approx(np.mean([0.2 - 0.004 * s for s in range(6)]))
    assert result.mean_a == pytest.approx(np.mean([(0.05 + 0.004 * s - 0.003 * s * s) / 2 for s in range(6)]))
    assert verdict.status == AGREES

    for s in range(3):
        _basin_cells(tmp_path / "basin", POST, s, 0.0)
        _basin_cells(tmp_path / "basin", PRE, s, 1.0)
    result = evaluate(claim_of("basin_width", expect="lower"), tmp_path / "basin").results[0]
    assert result.mean_a == pytest.approx(0.0) and result.mean_b == pytest.approx(1.0)


def test_a_measure_that_cannot_vary_on_its_grid_is_refused_at_load_time(tmp_path, capsys):
    import pandas as pd

    cells = pd.DataFrame({"norm": ["pre", "post"] * 3, "lr": [1e-3, 1e-3, 1e-2, 1e-2, 3e-2, 3e-2], "seed": 0})
    with pytest.raises(ClaimError, match="'basin_width' cannot vary on this grid: side a has 3 value"):
        check_against_grid(claim_of("basin_width", expect="lower"), cells)
    with pytest.raises(ClaimError, match="side b selects no cell"):
        check_against_grid(claim_of("final_val_loss", b={"norm": "sandwich"}), cells)
    check_against_grid(claim_of("lr_sensitivity"), cells)  # 3 rates feed it


def test_a_metric_the_runs_lack_means_cannot_tell_with_the_reason(tmp_path):
    for s in range(3):
        write_run(tmp_path, POST, s)
        write_run(tmp_path, PRE, s)
    verdict = evaluate(claim_of("block_change", expect="lower"), tmp_path)
    assert verdict.status == CANNOT_TELL and "do not log block_change" in sentence(verdict.results[0])


def test_divergence_reports_the_first_non_finite_step(tmp_path):
    for s in range(4):
        _diverged_cells(tmp_path, POST, s, 1)
        _diverged_cells(tmp_path, PRE, s, 0)
    result = evaluate(claim_of("diverged"), tmp_path).results[0]
    # 12 paired cells are 4 seeds: the unit is the seed, so p = 1/2^4, not 1/2^12
    assert result.test.name == "exact sign test over seeds" and result.n_pairs == 12 and result.n_seeds == 4
    assert result.test.p_value == pytest.approx(0.5 ** 4)
    assert "first non-finite value at step 2" in result.note


def test_mcnemar_power_grows_with_the_number_of_pairs():
    n = mcnemar_pairs_for_power(0.5, 0.0, 0.05)
    assert n is not None and 6 <= n <= 20  # 6 one-sided discordant pairs give p = 0.031
    assert mcnemar_pairs_for_power(0.3, 0.3, 0.05) is None  # no effect: no count tells


@pytest.mark.parametrize("bad, message", [
    ({"measure": "nope"}, "is not registered"),
    ({"than": 1.0}, "exactly one of 'b'"),
    ({"expect": "not_higher"}, "positive 'margin'"),
    ({"expect": "sideways"}, "valid: higher, lower, not_higher, not_lower"),
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"effect": None}, "smallest effect of interest"),
    ({"best_lr": True, "at": {"lr": 1e-3}}, "best_lr must be"),
])
def test_a_bad_declaration_is_refused_naming_the_key(bad, message):
    e = {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher", "effect": 0.1,
         **bad}
    e = {k: v for k, v in e.items() if v is not None}
    with pytest.raises(ClaimError, match=message):
        parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g",
                     "clause": [{"sentence": "s", "label": "l", "compare": [e]}]}, "t.toml")


def test_a_claim_without_clauses_is_refused():
    with pytest.raises(ClaimError, match="at least one \\[\\[clause\\]\\]"):
        parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g"}, "t.toml")


# ------------------------------------------------------------------------ the shipped claims


def test_the_shipped_claims_are_the_issue_s_eight():
    assert set(CLAIMS) == {"residual-gradient", "identity-init", "norm-stability", "prenorm-wins", "mlp-ratio",
                           "swiglu", "gelu-vs-relu", "qk-norm"}


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_each_claim_s_grid_expands_to_the_cells_its_declaration_names(name):
    claim = CLAIMS[name]
    grid = load_grid(claim.grid)
    frame = grid_cells(grid)
    used = set()
    for c in (*claim.compare, *claim.report):
        a = frame[select(frame, c.selector("a"))]
        assert a["seed"].nunique() >= 2, (c.label, "a")
        used |= set(a["cell_id"])
        if c.b is not None:
            b = frame[select(frame, c.selector("b"))]
            assert b["seed"].nunique() >= 2 and set(b["seed"]) == set(a["seed"]), (c.label, "b")
            if MEASURES[c.measure].per_cell and not c.best_lr:  # the sides pair cell for cell
                assert len(a) == len(b), c.label
            if c.best_lr:  # each side's best rate is one of its own rates, and each rate has every seed
                for side in (a, b):
                    assert all(set(g["seed"]) == set(a["seed"]) for _, g in side.groupby("lr")), c.label
            if not MEASURES[c.measure].consumes:
                assert not set(a["cell_id"]) & set(b["cell_id"]), c.label
            used |= set(b["cell_id"])
    assert used == set(frame["cell_id"]), "every cell of the grid enters some comparison"
    assert "gpu" in grid.scales and len(load_grid(claim.grid, "gpu").cells) >= len(grid.cells) * 0.5
    assert quick_seconds(grid, QUICK_WORKERS) < 15 * 60


def test_all_quick_fits_in_90_minutes():
    assert sum(quick_seconds(load_grid(c.grid)) for c in CLAIMS.values()) < 90 * 60


def test_reproduce_list_matches_the_shipped_claims(capsys):
    assert main(["reproduce", "--list"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("  ") and "grid" not in line[:30]]
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


@pytest.mark.slow
def test_reproduce_all_writes_each_verdict_and_plot_and_an_index_linking_every_claim(tmp_path, monkeypatch, capsys):
    # The grids are not trained here (the real miniature below trains one): each claim's cells are
    # written as synthetic runs where the grid would run, and the verdicts come without the full report.
    import ablate.claims.claim_report as claim_report
    import ablate.claims.run as run
    import ablate.grid.runner as grid_runner

    def fake_run_grid(grid, out, options=None, **_):
        synthetic_claim_runs(out, next(c for c in CLAIMS.values() if c.grid == grid.name))
        return 0

    full_report = claim_report.write_claim_report
    monkeypatch.setattr(grid_runner, "run_grid", fake_run_grid)
    # The synthetic runs stand in for the grid's cells under names of their own: none is "unfinished".
    monkeypatch.setattr(run, "unfinished", lambda cells, ids: [])
    monkeypatch.setattr(run, "write_claim_report", lambda claim, out, **kw: full_report(claim, out, full=False, **kw))
    assert main(["reproduce", "all", "--quick", "--out", str(tmp_path), "--quiet"]) == 0
    text = (tmp_path / "index.md").read_text()
    printed = capsys.readouterr().out
    for name, claim in CLAIMS.items():
        out = tmp_path / name
        saved = json.loads((out / "verdict.json").read_text())
        verdict = saved["headline"]
        assert saved["status"] in (AGREES, DISAGREES, CANNOT_TELL, "agrees in part") and verdict.startswith(
            saved["status"] + " (") and saved["unit"] == "seed"  # the headline counts its clauses
        assert len(saved["clauses"]) == len(claim.clauses) and len(saved["reported"]) == len(claim.report)
        assert [len(c["comparisons"]) for c in saved["clauses"]] == [len(c.compare) for c in claim.clauses]
        report = (out / "report.md").read_text()
        assert f"## Verdict: {name}" in report and f"**Verdict: {verdict}.**" in report
        assert f"![{name}: what the claim says, at a glance](plots/claim_{name}.png)" in report
        png = out / "plots" / f"claim_{name}.png"
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000, name
        assert f"[Report]({name}/report.md)" in text and f"## {name}: {verdict}" in text
        for clause in saved["clauses"]:  # one line per clause in the report, the index and the output
            assert clause["line"] in report and clause["line"] in text and clause["line"] in printed
        assert f"{name}: {verdict}" in printed


@pytest.mark.slow
def test_a_real_miniature_reproduces_end_to_end(tmp_path, capsys):
    out = tmp_path / "rg"
    status = main(["reproduce", "residual-gradient", "--quick", "--out", str(out), "--workers", "0", "--quiet",
                   "--set", "steps=3", "--set", "layers=3", "--set", "batch_size=2", "--set", "eval_every=3",
                   "--set", "eval_batches=1", "--set", "final_eval_batches=1", "--set", "seed=0"])
    assert status == 0
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["status"] == CANNOT_TELL and verdict["headline"] == "cannot tell (1 of 1)"  # one seed: no test
    first = verdict["clauses"][0]["comparisons"][0]
    assert first["n_pairs"] == 1 and math.isfinite(first["mean_a"]) and math.isfinite(first["mean_b"])
    assert (out / "plots" / "claim_residual-gradient.png").read_bytes()[:8] == PNG
    assert "## Verdict: residual-gradient" in (out / "report.md").read_text()
    assert "residual-gradient: cannot tell" in capsys.readouterr().out


def test_reproduce_refuses_a_claim_its_grid_cannot_feed_before_writing(tmp_path, monkeypatch, capsys):
    import ablate.claims.run as reproduce

    claim = parse_claim({"name": "basin", "statement": "s", "source": "x", "grid": "claim-prenorm-wins",
                         "clause": [{"sentence": "s", "label": "l", "compare": [entry("basin_width", expect="lower",
                                                                                      at={"init": "gpt2"})]}]})
    monkeypatch.setattr(reproduce, "find_claim", lambda name: claim)
    assert main(["reproduce", "basin", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "'basin_width' cannot vary on this grid" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()


def test_verdict_and_index_replace_a_planted_link_instead_of_writing_through_it(tmp_path):
    from ablate.claims.claim_report import VERDICT_JSON, write_claim_report, write_index

    claim = claim_with([entry("final_val_loss")])
    for s in range(3):
        _loss_cell(tmp_path / "g", POST, s, 2.8 + 0.01 * s)
        _loss_cell(tmp_path / "g", PRE, s, 2.5)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    for name in (VERDICT_JSON, "report.md"):
        (tmp_path / "g" / name).symlink_to(victim)
    (tmp_path / "index.md").symlink_to(victim)
    _, verdict = write_claim_report(claim, tmp_path / "g", full=False)
    write_index([(claim, tmp_path / "g", verdict)], tmp_path / "index.md")
    assert victim.read_text() == "keep"
    assert not (tmp_path / "g" / VERDICT_JSON).is_symlink() and not (tmp_path / "index.md").is_symlink()


def test_the_claim_file_shown_in_the_docs_parses():
    import re
    import tomllib
    from pathlib import Path

    text = (REPO / "docs" / "claims.md").read_text()
    block = re.search(r"```toml\n(.*?)```", text, re.S).group(1)
    claim = parse_claim(tomllib.loads(block))
    assert claim.clauses[0].compare[0].expect == "not_higher" and claim.clauses[0].compare[0].effect == 0.03
