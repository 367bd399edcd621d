"""`ablate reproduce CLAIM --decide` with the real sequential decision (ablate/claims/sequential.py)
on a miniature claim of one-step cells: the residual's effect on a block's relative change at
initialisation is large, yet the sign test leaves it undecided at 3 and 6 seeds (its smallest p
there is above those looks' nominal levels); the look of 12 seeds decides it, and the loop stops. Rerun, it trains nothing and writes the
same verdict.json, byte for byte: the decision is rebuilt from the run folders alone."""
import json
import textwrap

import pytest

from ablate.cli import main

GRID = """
name = "mini-identity"
[base]
variant = "gpt2"
model = "tiny"
layers = 2
batch_size = 2
steps = 1
eval_every = 1
eval_batches = 1
final_eval_batches = 1
threads = 1
[axes]
residual = [true, false]
seed = [0, 1, 2]
"""
CLAIM = """
name = "mini-identity"
statement = "The residual passes a block's input through almost unchanged at initialisation."
source = "a test"
grid = "{grid}"
[[clause]]
label = "the residual keeps the change small"
sentence = "The residual passes the input through almost unchanged."
[[clause.compare]]
measure = "block_change"
a = {{ residual = true }}
b = {{ residual = false }}
expect = "lower"
effect = 0.1
"""


@pytest.mark.slow
def test_decide_adds_one_look_decides_and_a_rerun_writes_the_same_verdict(tmp_path, capsys):
    (tmp_path / "grid.toml").write_text(textwrap.dedent(GRID))
    claim = tmp_path / "claim.toml"
    claim.write_text(textwrap.dedent(CLAIM.format(grid=tmp_path / "grid.toml")))
    cells = tmp_path / "cells"
    argv = ["reproduce", str(claim), "--decide", "--workers", "0", "--out", str(cells), "--quiet"]
    assert main(argv) == 0
    verdict_path = cells / "decide" / "verdict.json"
    verdict = json.loads(verdict_path.read_text())
    clause = verdict["clauses"][0]
    assert verdict["headline"] == "agrees (1 of 1)" and verdict["done"] and verdict["unit"] == "seed"
    # The sign test's smallest p at 6 seeds (1/64) is above the second look's nominal level, so
    # two looks are added and the last decides.
    assert [look["seeds"] for look in clause["looks"]] == [3, 6, 12]
    assert [look["outcome"] for look in clause["looks"]] == ["cannot tell", "cannot tell", "agrees"]
    assert clause["looks"][2]["statistic"] >= clause["looks"][2]["boundary"]
    seeds = sorted(int(p.name.rsplit("=", 1)[1]) for p in cells.iterdir() if (p / "config.json").is_file())
    assert seeds == sorted(2 * list(range(12)))  # no seed beyond the look that decided
    first = verdict_path.read_bytes()
    trained = _summaries(cells)
    capsys.readouterr()
    assert main(argv) == 0
    assert verdict_path.read_bytes() == first
    assert _summaries(cells) == trained  # nothing trained again
    assert (cells / "decide" / "plots" / "decide_mini-identity.png").is_file()


def _summaries(cells):
    return {p.name: (p / "summary.json").stat().st_mtime_ns for p in cells.iterdir() if (p / "summary.json").is_file()}
