"""ablate/claims/claim_report.py: the words of a verdict, and verdict.json."""
import pytest

from ablate.claims.claim_report import level_text


def test_an_interval_level_reads_in_four_digits_and_never_as_100_percent():
    assert [level_text(c) for c in (0.95, 0.99, 0.9969547, 0.99375, 0.5)] == \
        ["95%", "99%", "99.7%", "99.38%", "50%"]
    # a first look's level under an O'Brien-Fleming boundary: more digits, never "100%"
    assert level_text(0.99998713) == "99.999%" and level_text(0.9999999) == "99.99999%"


def _claim(*compares):
    from ablate.claims.claim_file import parse_claim

    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g",
                        "clause": [{"sentence": "s", "label": "both", "compare": list(compares)}]})


def _entry(label, effect):
    return {"label": label, "measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"},
            "expect": "higher", "effect": effect}


def test_a_clause_waiting_for_its_other_comparison_names_it():
    from ablate.claims.claim_report import clause_line
    from ablate.claims.verdict import CANNOT_TELL, ClauseResult, Result, run_test

    claim = _claim(_entry("gradient ratio", 1.0), _entry("init slope", 0.02))
    shown = [9.1, 8.0, 10.2, 7.5, 11.0, 9.6]  # far beyond 1, every seed: shown at 6 seeds
    open_ = [0.03, -0.01, 0.05, 0.02, -0.02, 0.04]  # neither shown nor excluded
    results = []
    for c, d in zip(claim.clauses[0].compare, (shown, open_)):
        r = Result(c, "log10", keys=tuple((s,) for s in range(6)), a=tuple(d), b=(0.0,) * 6,
                   seed_values=tuple(d), seed_ids=tuple(range(6)), spread=(1.0, 10), seeds_needed=16)
        results.append(Result(**{**r.__dict__, "test": run_test(r, 0.025)}))
    line = clause_line(0, ClauseResult(claim.clauses[0], tuple(results), None, 0.3, outcome=CANNOT_TELL, level=0.025))
    assert "shown the claimed way; the clause waits for its other comparison: init slope" in line
    assert line.count("about 16 seeds would resolve") == 1  # only for the comparison still open


def test_a_fixed_design_over_a_decided_folder_says_what_it_does_to_the_error_rate():
    from ablate.claims.claim_report import after_decide_note

    claim = _claim(_entry("x", 1.0))
    note = after_decide_note(claim, 24)
    assert "not at one-sided 0.025" in note and "up to 0.042 of the time" in note
    assert "adds nothing to its error rate" in after_decide_note(claim, 12)


def test_a_fixed_design_and_a_decide_write_one_verdict_json_layout(tmp_path):
    import json

    from ablate.claims.claim_report import SCHEMA, as_dict
    from ablate.claims.sequential import decide_claim
    from ablate.claims.verdict import evaluate
    from tests.helpers.synthetic_runs import write_run

    claim = _claim(_entry("loss higher", 0.05))
    for seed in range(12):  # post's loss above pre's in every seed: both designs decide "agrees"
        write_run(tmp_path, "post.layernorm.gelu.dense.res", seed, losses=[4.0, 3.0], val_loss=2.7 + 0.01 * seed,
                  unigram_entropy=3.4)
        write_run(tmp_path, "pre.layernorm.gelu.dense.res", seed, losses=[4.0, 3.0], val_loss=2.5,
                  unigram_entropy=3.4)
    verdict, decision = evaluate(claim, tmp_path), decide_claim(claim, tmp_path)
    fixed, decide = as_dict(verdict), decision.to_json()
    for saved in (fixed, decide):
        json.dumps(saved, allow_nan=False)  # plain JSON: an unbounded end is null
        assert saved["schema"] == SCHEMA and saved["headline"] == "agrees (1 of 1)" and saved["status"] == "agrees"
    assert (fixed["design"], decide["design"]) == ("fixed", "sequential")
    assert list(fixed) == list(decide)
    (a,), (b,) = fixed["clauses"], decide["clauses"]
    assert list(a) == list(b) and a["status"] == b["status"] == verdict.clauses[0].outcome == "agrees"
    assert list(a["comparisons"][0]) == list(b["comparisons"][0])
    assert list(a["comparisons"][0]["test"]) == list(b["comparisons"][0]["test"])
    assert fixed["looks"] == a["looks"] == [] and decide["looks"] == [3, 6, 12] and b["looks"][0]["seeds"] == 3
    per_seed = a["comparisons"][0]["per_seed"]
    assert len(per_seed) == 12 and per_seed[0] == pytest.approx(0.2) and a["comparisons"][0]["seeds"] == list(range(12))
    assert a["comparisons"][0]["test"]["name"].startswith("exact sign")


def test_the_note_over_a_decided_folder_reads_that_decide_s_own_plan():
    """A --decide over looks 1,2,4 was said to end at 12 seeds, so 6 fixed seeds 'added nothing'."""
    from ablate.claims.claim_report import after_decide_note

    claim = _claim(_entry("x", 1.0))
    note = after_decide_note(claim, 6, (1, 2, 4))
    assert "first 4 seeds" in note and "not at one-sided 0.025" in note
    assert "last look (12)" in after_decide_note(claim, 6)  # no plan recorded: the default one
