"""ablate/claims/looks.py: `--looks`, a planned continuation of a folder's --decide."""
import json

import pytest

from ablate.claims.looks import plan_of
from ablate.claims.options import parse_looks
from ablate.core.errors import ConfigError


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


def test_a_continuation_reads_a_verdict_of_either_layout(tmp_path):
    """verdict.json version 2 (analysis.claim_report.SCHEMA) keeps the keys a continuation reads;
    a version-1 file (no "schema", the _verdict above) is read the same way."""
    from ablate.claims.claim_file import parse_claim
    from ablate.claims.sequential import decide_claim
    from tests.helpers.synthetic_runs import write_run

    claim = parse_claim({"name": "t", "statement": "s", "source": "x", "grid": "g", "clause": [
        {"sentence": "s", "label": "l", "compare": [{"measure": "final_val_loss", "a": {"norm": "post"},
                                                     "b": {"norm": "pre"}, "expect": "higher", "effect": 0.05}]}]})
    for seed in range(6):  # two looks read, the plan's last still ahead
        write_run(tmp_path / "cells", "post.layernorm.gelu.dense.res", seed, losses=[4.0, 3.0], val_loss=2.7,
                  unigram_entropy=3.4)
        write_run(tmp_path / "cells", "pre.layernorm.gelu.dense.res", seed, losses=[4.0, 3.0], val_loss=2.5,
                  unigram_entropy=3.4)
    saved = decide_claim(claim, tmp_path / "cells").to_json()
    assert saved["schema"] == 2 and [lk["seeds"] for lk in saved["clauses"][0]["looks"]] == [3, 6]
    (tmp_path / "verdict.json").write_text(json.dumps(saved))
    assert plan_of(tmp_path, (3, 6, 12, 24)) == ((3, 6, 12), 2)
    _verdict(tmp_path / "old", (3, 6, 12), 2)
    assert plan_of(tmp_path / "old", (3, 6, 12, 24)) == ((3, 6, 12), 2)


def test_a_continuation_of_a_plan_whose_last_look_was_read_is_refused(tmp_path):
    """Its alpha is spent: the added looks' boundaries are infinite, so it would train seeds that
    cannot decide. Refused in one line before anything trains."""
    _verdict(tmp_path, (3, 6, 12), 3)
    with pytest.raises(ConfigError, match="already read the last look .12 seeds. .* could not decide; valid: "):
        plan_of(tmp_path, (3, 6, 12, 24))


def test_a_huge_look_is_shown_elided():
    """A 400-digit look was echoed whole in the refusal."""
    from ablate.claims.options import parse_looks
    from ablate.core.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        parse_looks("3,6," + "9" * 400)
    assert len(str(e.value)) < 300 and "characters" in str(e.value)


def test_the_plan_of_a_decided_folder_is_its_verdict_s_looks(tmp_path):
    """The note of a fixed design over a decided folder reads this plan (claim_report.after_decide_note)."""
    from ablate.claims.looks import plan_looks

    (tmp_path / "verdict.json").write_text(json.dumps({"looks": [1, 2, 4]}))
    assert plan_looks(tmp_path) == (1, 2, 4)
    (tmp_path / "verdict.json").write_text("[" * 5000)
    assert plan_looks(tmp_path) is True  # damaged: the default plan


def test_a_look_line_prints_a_z_of_minus_zero_as_0():
    from ablate.claims.looks import _g

    assert (_g(-0.0), _g(float("-inf")), _g(None), _g(2.254)) == ("0", "-inf", "-", "2.25")
