"""The packs bench (ablate/bench/packs.py) runs on a CPU and says what it measured."""
import pytest

from ablate.bench import packs


@pytest.mark.slow
def test_the_packs_bench_prints_tokens_per_second_per_member_and_in_all(capsys):
    lines = packs.run([16], [1, 2], 2, False, "cpu", layers=1)
    assert lines[0].startswith("width 16: one cell alone ") and lines[0].endswith(" tokens/s")
    assert lines[1].startswith("width 16, pack of 1: ") and "x cells alone" in lines[2]
    assert "pack of 2" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--members", "abc"], ["--members", "0"], ["--members", "9" * 30], ["--widths", "16,,2"],
                                 ["--steps", "1,2"], ["--layers", "0"], ["--device", "xyz"]])
def test_a_bad_argument_is_one_line_before_anything_trains(bad):
    """`abc` was a ValueError traceback; 0 or 30 digits trained the lone cell first, then failed or ran on."""
    import subprocess
    import sys

    args = ["--widths", "16", "--members", "2", "--steps", "2", "--layers", "1", "--device", "cpu", *bad]
    result = subprocess.run([sys.executable, "-m", "ablate.bench.packs", *args], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 or "usage:" in result.stderr
