""""About N seeds would resolve it" (analysis/verdict.py seeds_needed, decide.sd_upper_bound): from
the spread pooled across comparable cells, and again at that spread's upper confidence bound, so a
spread read off few degrees of freedom does not promise too few seeds; and the seed floor a claim
is flagged with at load names both the full level and Holm's first step."""
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from ablate.analysis import decide
from ablate.analysis.claim_report import clause_line
from ablate.analysis.claims import check_against_grid, parse_claim
from ablate.analysis.verdict import CANNOT_TELL, evaluate
from tests.synthetic_runs import write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"


def clause(label, measure="final_val_loss", effect=0.05):
    return {"sentence": "s", "label": label, "compare": [
        {"measure": measure, "a": {"norm": "post"}, "b": {"norm": "pre"}, "expect": "higher", "effect": effect}]}


def claim(*clauses):
    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": list(clauses)})


def test_the_spread_upper_bound_by_hand():
    # chi2 with 4 degrees of freedom: its 0.2 quantile is 1.6488; sd * sqrt(4 / 1.6488)
    assert decide.sd_upper_bound(1.0, 4) == pytest.approx(math.sqrt(4 / 1.6487623), rel=1e-5)
    bounds = [decide.sd_upper_bound(0.1, df) for df in (2, 8, 64, 4096)]
    assert all(b > 0.1 for b in bounds) and bounds == sorted(bounds, reverse=True)  # tighter with df
    assert bounds[-1] == pytest.approx(0.1, rel=0.02)
    assert decide.sd_upper_bound(0.1, 8, level=0.5) == pytest.approx(
        0.1 * math.sqrt(8 / scipy_stats.chi2.median(8)))


def test_too_few_seeds_give_both_counts_and_the_upper_one_is_larger(tmp_path):
    noise = [0.03, -0.02, 0.01]  # a - b = 0.01 + noise: an effect of 0.05 is neither shown nor excluded
    for s, e in enumerate(noise):
        write_run(tmp_path, POST, s, losses=[4.0, 3.0, 2.6], val_loss=2.51 + e, unigram_entropy=3.4)
        write_run(tmp_path, PRE, s, losses=[4.0, 3.0, 2.6], val_loss=2.5, unigram_entropy=3.4)
    verdict = evaluate(claim(clause("l")), tmp_path)
    r = verdict.results[0]
    assert verdict.clauses[0].outcome == CANNOT_TELL
    sd, df = r.spread
    assert df == 2 and r.seeds_needed_upper > r.seeds_needed > 3
    level = verdict.claim.alpha  # one clause: Holm's first step is the full level
    assert r.seeds_needed_upper == max(2, decide.t_seeds_for(0.05, decide.sd_upper_bound(sd, df), level))
    line = clause_line(0, verdict.clauses[0])
    assert f"about {r.seeds_needed} seeds would resolve" in line
    assert f"{r.seeds_needed_upper} at its 80% upper confidence bound" in line


def test_a_failure_clause_gives_no_upper_count():
    cells = pd.DataFrame([{"norm": n, "seed": s} for n in ("pre", "post") for s in range(3)])
    two = claim(clause("a", measure="failed", effect=0.25), clause("b", measure="failed", effect=0.25))
    notes = check_against_grid(two, cells)
    assert notes[0] == ("clause (a) 'a': cannot decide with 3 seeds; needs at least 6 "
                        "(7 at Holm's first step, one-sided 0.025 / 2 clauses)")
    assert np.log2(1 / (0.025 / 2)) > 6  # 1/2^7 <= 0.0125 < 1/2^6
