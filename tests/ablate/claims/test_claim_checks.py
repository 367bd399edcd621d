"""A claim file is checked completely when it loads (ablate/claims/claim_checks.py, called by
ablate/claims/claim_file.py load_claim; its selectors against its grid by ablate/claims/selectors.py): each hostile value below is refused in one line naming the
file and the key, before any cell trains, and `ablate reproduce` on such a file exits 2."""
import pytest

from ablate.claims.claim_file import ClaimError, load_claim
from ablate.cli import main

HEAD = """name = "hostile"
statement = "GELU beats ReLU."
source = "a test"
grid = "{grid}"
plot = "lr_curve"
plot_params = {plot_params}
"""

CLAUSE = """
[[clause]]
label = "clause {i}"
sentence = "GELU reaches a lower loss."

[[clause.compare]]
measure = "{measure}"
a = {a}
{b}
expect = "{expect}"
effect = {effect}
{extra}
"""


def claim_text(grid="claim-gelu-vs-relu", plot_params='{ split = "act" }', clauses=1, measure="final_val_loss",
               a='{ act = "gelu" }', b='b = { act = "relu" }', expect="lower", effect="0.02", extra=""):
    return HEAD.format(grid=grid, plot_params=plot_params) + "".join(
        CLAUSE.format(i=i, measure=measure, a=a, b=b, expect=expect, effect=effect, extra=extra)
        for i in range(clauses))


def refused(tmp_path, **kw) -> str:
    """The one-line refusal of a claim file as the shipped claims load: the file's own checks
    (load_claim), then its selectors against its grid (ablate/claims/selectors.py)."""
    from ablate.claims.selectors import check_claim_against_its_grid

    path = tmp_path / "hostile.toml"
    path.write_text(claim_text(**kw))
    with pytest.raises(ClaimError) as e:
        check_claim_against_its_grid(load_claim(path), str(path))
    message = str(e.value)
    assert message.startswith(str(path)) and "\n" not in message
    return message


def test_the_plain_claim_loads(tmp_path):
    path = tmp_path / "hostile.toml"
    path.write_text(claim_text())
    assert load_claim(path).name == "hostile"


@pytest.mark.parametrize("than", ["nan", "2.0", "-0.5", "0.0", "1.0"])
def test_a_rate_than_outside_0_1_is_refused(tmp_path, than):
    message = refused(tmp_path, measure="diverged", b="", extra=f"than = {than}", expect="lower")
    assert "than" in message and ("between 0 and 1" in message or "finite" in message)


@pytest.mark.parametrize("key", ["margin", "effect"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_a_margin_or_effect_that_is_not_finite_is_refused(tmp_path, key, value):
    if key == "margin":
        message = refused(tmp_path, expect="not_higher", extra=f"margin = {value}")
    else:
        message = refused(tmp_path, effect=value)
    assert key in message


def test_nan_anywhere_in_the_numbers_is_refused(tmp_path):
    message = refused(tmp_path, a='{ act = "gelu", lr = nan }')
    assert "lr = nan" in message and "finite" in message


def test_plot_params_that_are_not_a_table_are_refused(tmp_path):
    message = refused(tmp_path, plot_params='"x"')
    assert "plot_params = 'x' must be a table" in message


def test_more_clauses_than_letters_are_refused(tmp_path):
    message = refused(tmp_path, clauses=27)
    assert "27 [[clause]]" in message and "at most 26" in message
    path = tmp_path / "hostile.toml"
    path.write_text(claim_text(clauses=26))
    assert len(load_claim(path).clauses) == 26


def test_an_unknown_measure_is_refused(tmp_path):
    assert "measure 'nope' is not registered" in refused(tmp_path, measure="nope")


@pytest.mark.parametrize("measure, params, key", [("final_val_loss", "{ foo = 1 }", "foo"),
                                                 ("grad_imbalance", '{ phase = "early", untill = 20 }', "untill")])
def test_a_params_key_its_measure_does_not_read_is_refused(tmp_path, measure, params, key):
    """`untill` for `until` was ignored without a word: the measure read its default."""
    message = refused(tmp_path, measure=measure, extra=f"params = {params}")
    assert f"params key {key!r} is not read by measure {measure!r}" in message and "valid:" in message


def test_selectors_that_match_no_cell_are_refused(tmp_path):
    assert "axis 'colour'" in refused(tmp_path, a='{ colour = "red" }')
    assert "act = 'swish' matches no cell" in refused(tmp_path, a='{ act = ["gelu", "swish"] }')
    assert "lr = 0.5 matches no cell" in refused(tmp_path, extra="at = { lr = 0.5 }")


def test_a_missing_grid_is_refused(tmp_path):
    message = refused(tmp_path, grid="no-such-grid")
    assert "grid = 'no-such-grid'" in message and "claim-gelu-vs-relu" in message
    assert "does not exist" in refused(tmp_path, grid=str(tmp_path / "gone.toml"))


def test_reproduce_refuses_a_hostile_claim_file_with_exit_2(tmp_path, monkeypatch, capsys):
    import ablate.claims.run as reproduce

    folder = tmp_path / "claims"
    folder.mkdir()
    (folder / "hostile.toml").write_text(claim_text(measure="diverged", b="", extra="than = 2.0"))
    monkeypatch.setattr(reproduce, "claims_dir", lambda: folder)
    import ablate.grid.runner

    def train(*args, **kwargs):
        raise AssertionError("a cell would train on a hostile claim")

    monkeypatch.setattr(ablate.grid.runner, "run_grid", train)
    out = tmp_path / "out"
    assert main(["reproduce", "hostile", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "than = 2.0" in err[0] and "Traceback" not in err[0]
    assert not out.exists()


def test_every_shipped_claim_passes_its_checks():
    from ablate.claims.run import shipped_claims

    assert len(shipped_claims()) >= 8


def test_a_cell_without_a_readable_row_counts_missing_not_unlogged(tmp_path):
    """identity-init's clause (b): one cell's step-0 row (its only row) unreadable is that seed
    missing, not "the runs do not log block_change"."""
    from ablate.claims.verdict import evaluate
    from tests.helpers.synthetic_runs import write_run
    from tests.ablate.claims.test_verdict import POST, PRE, add_metrics, claim_of, sentence

    for s in range(3):
        for variant, v in ((POST, 0.4), (PRE, 0.1)):
            run = write_run(tmp_path, variant, s)
            add_metrics(run, {0: {"block_change/layer_0": v, "block_change/layer_1": v}})
            if variant == POST and s == 1:
                (run.path / "metrics.jsonl").write_text('{"step": 0, "loss": \n')  # cut mid-row
    r = evaluate(claim_of("block_change"), tmp_path).results[0]
    assert "do not log" not in sentence(r)
    assert r.n_pairs == 2 and len(r.missing["a"]) == 1


# ------------------------------------------------------- the design rule of a stability clause


def _cells(rates, warmups=(0, 100), steps=300, schedule="cosine", grad_clip=1.0):
    import pandas as pd

    return pd.DataFrame([{"seed": s, "norm": "post", "lr": lr, "warmup": w, "planned_steps": steps,
                          "schedule": schedule, "grad_clip": grad_clip}
                         for s in range(3) for lr in rates for w in warmups])


def _stability_claim():
    from ablate.claims.claim_file import parse_claim

    return parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g", "clause": [
        {"sentence": "Post-norm trains poorly without warmup.", "label": "warmup rescues post-norm", "compare": [
            {"measure": "failed", "at": {"norm": "post"}, "a": {"warmup": 0}, "b": {"warmup": 100},
             "expect": "higher", "effect": 0.25}]}]})


def test_a_stability_clause_on_rates_too_far_apart_is_noted_at_load():
    from ablate.claims.claim_checks import design_notes

    notes = design_notes(_stability_claim(), _cells((1e-3, 1e-2, 3e-2)))
    assert len(notes) == 1 and "clause (a) 'warmup rescues post-norm', side a and b" in notes[0]
    assert "rates 0.001 and 0.01 are 1.00 decades apart" in notes[0] and "at most 0.52" in notes[0]
    assert design_notes(_stability_claim(), _cells((1e-3, 3e-3, 1e-2))) == []  # a 1-3-10 ladder is half a decade
    assert design_notes(_stability_claim(), _cells((1e-3, 2e-3, 5e-3, 1e-2))) == []


def test_a_short_warmup_and_an_off_recipe_base_are_noted():
    from ablate.claims.claim_checks import design_notes

    notes = design_notes(_stability_claim(), _cells((1e-3, 3e-3, 1e-2), steps=1000, schedule="constant",
                                                    grad_clip=0.0))
    assert any("warmup 100 of 1000 steps is under 20% of the run: too short to matter" in n for n in notes)
    assert any("schedule 'constant'" in n for n in notes) and any("grad_clip 0 where" in n for n in notes)


def test_a_warmup_as_long_as_the_run_is_noted():
    """Warmup 100 of a 50-step run (the rate never reaches its rung) was noted by nothing."""
    from ablate.claims.claim_checks import design_notes

    notes = design_notes(_stability_claim(), _cells((1e-3, 3e-3, 1e-2), steps=50))
    assert any("warmup 100 of 50 steps is as long as the run or longer" in n for n in notes)
    assert not any("as long as the run" in n for n in design_notes(_stability_claim(), _cells((1e-3, 3e-3, 1e-2))))


def test_a_non_stability_clause_is_not_held_to_the_rule():
    from ablate.claims.claim_checks import design_notes
    from ablate.claims.claim_file import parse_claim

    claim = parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g", "clause": [
        {"sentence": "s", "label": "loss", "compare": [{"measure": "final_val_loss", "a": {"warmup": 0},
                                                         "b": {"warmup": 100}, "expect": "higher", "effect": 0.1}]}]})
    assert design_notes(claim, _cells((1e-3, 1e-1))) == []


def test_the_shipped_flagship_passes_the_rule_and_its_old_grid_does_not(tmp_path):
    """prenorm-wins against its grid, as `ablate reproduce` checks it: no design note; the grid it
    had before issue 52 (1e-3, 1e-2, 3e-2, constant rate, no clipping) draws them."""
    import subprocess

    from ablate.claims.claim_checks import axis_reasons
    from ablate.claims.run import shipped_claims
    from ablate.claims.plan import check_claim_grid
    from ablate.grid.spec import load_grid
    from tests.helpers.repo import REPO

    claim = shipped_claims()["prenorm-wins"]
    grid_file = REPO / "variants" / "grids" / "claim-prenorm-wins.toml"
    rule = ("decades apart", "too short to matter", "where the base recipe")
    assert not [n for n in check_claim_grid(claim, load_grid(str(grid_file))) if any(w in n for w in rule)]
    assert axis_reasons(grid_file.read_text()) == []  # every axis value says why it is there
    old = subprocess.run(["git", "show", "984aaa9:variants/grids/claim-prenorm-wins.toml"], cwd=REPO,
                         capture_output=True, text=True)
    if old.returncode == 0:  # a checkout with that commit
        assert axis_reasons(old.stdout) == ["norm", "warmup", "lr", "seed", "axes"]
