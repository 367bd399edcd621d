"""The packs bench (ablate/bench/packs.py) runs on a CPU and says what it measured."""
import pytest

from ablate.bench import packs


@pytest.mark.slow
def test_the_packs_bench_prints_tokens_per_second_per_member_and_in_all(capsys):
    lines = packs.run([16], [1, 2], 2, False, "cpu", layers=1)
    assert lines[0].startswith("width 16: one cell alone ") and lines[0].endswith(" tokens/s")
    assert lines[1].startswith("width 16, pack of 1: ") and "x cells alone" in lines[2]
    assert "pack of 2" in capsys.readouterr().out
