"""ablate/claim/looks.py: `--looks`, a planned continuation of a folder's --decide."""
import json

import pytest

from ablate.claim.looks import parse_looks, plan_of
from ablate.errors import ConfigError


def test_looks_parse_as_rising_whole_numbers():
    assert parse_looks(None) is None and parse_looks("3,6,12,24") == (3, 6, 12, 24)
    for bad in ("3,6,6", "12,6", "0,3", "a,b", "", "3,,6", "3,20000"):
        with pytest.raises(ConfigError, match="is not a plan of looks; valid: seeds at each look"):
            parse_looks(bad)


def _verdict(out, looks, read, continues=None):
    out.mkdir(parents=True, exist_ok=True)
    clauses = [{"looks": [{"seeds": n} for n in looks[:read]]}, {"looks": [{"seeds": looks[0]}]}]
    (out / "verdict.json").write_text(json.dumps({"looks": list(looks), "clauses": clauses, "continues": continues}))


def test_a_continuation_keeps_the_looks_an_earlier_decide_read(tmp_path):
    assert plan_of(tmp_path / "none", (3, 6, 12, 24)) is None  # nothing decided here yet: a fresh plan
    _verdict(tmp_path, (3, 6, 12), 2)  # a --decide stopped after its second look (the budget, say)
    assert plan_of(tmp_path, (3, 6, 12)) is None  # the same plan: nothing to keep apart
    assert plan_of(tmp_path, (3, 6, 12, 24)) == ((3, 6, 12), 2)  # the most looks any clause read
    with pytest.raises(ConfigError, match="does not continue the plan 3,6,12 .* valid: looks starting 3,6"):
        plan_of(tmp_path, (3, 8, 24))
    # once the continuation has written its verdict, a rerun of it keeps what it kept
    _verdict(tmp_path, (3, 6, 12, 24), 3, continues=[[3, 6, 12], 2])
    assert plan_of(tmp_path, (3, 6, 12, 24)) == ((3, 6, 12), 2)


def test_a_damaged_verdict_is_refused_in_one_line(tmp_path):
    (tmp_path / "verdict.json").write_text('{"looks": "x"}')
    with pytest.raises(ConfigError, match="not a --decide verdict"):
        plan_of(tmp_path, (3, 6, 12, 24))
