"""analysis/claim_report.py: the words of a verdict."""
from ablate.analysis.claim_report import level_text


def test_an_interval_level_reads_in_four_digits_and_never_as_100_percent():
    assert [level_text(c) for c in (0.95, 0.99, 0.9969547, 0.99375, 0.5)] == \
        ["95%", "99%", "99.7%", "99.38%", "50%"]
    # a first look's level under an O'Brien-Fleming boundary: more digits, never "100%"
    assert level_text(0.99998713) == "99.999%" and level_text(0.9999999) == "99.99999%"
