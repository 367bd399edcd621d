"""analysis/claim_report.py: the words of a verdict."""
from ablate.analysis.claim_report import level_text


def test_an_interval_level_reads_in_four_digits_and_never_as_100_percent():
    assert [level_text(c) for c in (0.95, 0.99, 0.9969547, 0.99375, 0.5)] == \
        ["95%", "99%", "99.7%", "99.38%", "50%"]
    # a first look's level under an O'Brien-Fleming boundary: more digits, never "100%"
    assert level_text(0.99998713) == "99.999%" and level_text(0.9999999) == "99.99999%"


def _claim(*compares):
    from ablate.analysis.claims import parse_claim

    return parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g",
                        "clause": [{"sentence": "s", "label": "both", "compare": list(compares)}]})


def _entry(label, effect):
    return {"label": label, "measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"},
            "expect": "higher", "effect": effect}


def test_a_clause_waiting_for_its_other_comparison_names_it():
    from ablate.analysis.claim_report import clause_line
    from ablate.analysis.verdict import CANNOT_TELL, ClauseResult, Result, run_test

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
    from ablate.analysis.claim_report import after_decide_note

    claim = _claim(_entry("x", 1.0))
    note = after_decide_note(claim, 24)
    assert "not at one-sided 0.025" in note and "up to 0.042 of the time" in note
    assert "adds nothing to its error rate" in after_decide_note(claim, 12)
