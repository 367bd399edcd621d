"""`ablate bench --only cpu-gelu,cpu-attention,cpu-mlp` (ablate/bench/cpu_kernels.py): every
implementation in its table, figures from the one timing loop, bad shapes refused in one line.
No timed assertions: the figures are printed, not judged."""
import pytest
import torch

from ablate.bench import cpu_kernels
from ablate.cli import main
from ablate.kernels import cpu_attention, cpu_gelu
from ablate.kernels.cpu_build import cpu_has

FORMS = [f for f in cpu_gelu.available() if f != cpu_gelu.PASSES]
COPIES = [c.isa for c in cpu_attention.FORMS["blocked"] if cpu_has(*c.needs)] \
    if "blocked" in cpu_attention.available() else []


def test_the_gelu_part_times_every_form_and_torchs_gelus_in_turn(monkeypatch):
    seen = []
    real = cpu_kernels.interleaved
    monkeypatch.setattr(cpu_kernels, "interleaved", lambda fns, *a, **k: seen.append(list(fns)) or real(fns, *a, **k))
    text = cpu_kernels.gelu((4, 8), rounds=2, calls=2)
    names = set(FORMS) | {"torch erf", "torch tanh"} | ({"poly + bias"} if set(FORMS) & set(cpu_gelu.BIAS_FORMS) else set())
    assert {name for name, _ in seen[0]} == names  # one interleaved loop over them all
    assert "4 x 8 float32" in text and all(f"\n| {name} | fwd | " in text for name in names)
    assert torch.get_num_threads() >= 1


def test_the_attention_part_times_every_copy_and_torchs_attention():
    text = cpu_kernels.attention((2, 3, 17, 8), rounds=2, calls=2)
    assert "batch 2, 3 heads, T 17, head dimension 8" in text
    assert all(f"\n| {name} | bwd | " in text for name in [*COPIES, "torch sdpa"])


def test_bench_only_takes_comma_separated_parts(capsys, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "gelu", lambda shape: f"gelu {shape}")
    monkeypatch.setattr(cpu_kernels, "attention", lambda shape: f"attention {shape}")
    assert main(["bench", "--only", "cpu-gelu,cpu-attention"]) == 0
    out = capsys.readouterr().out
    assert f"gelu {cpu_kernels.GELU_SHAPE}" in out and f"attention {cpu_kernels.ATTENTION_SHAPE}" in out
    assert main(["bench", "--only", "cpu-gelu", "--shape", "3,5"]) == 0
    assert "gelu (3, 5)" in capsys.readouterr().out


@pytest.mark.skipif(not set(FORMS) & set(cpu_gelu.BIAS_FORMS), reason="no bias form here")
def test_the_mlp_part_compares_in_place_with_two_layers_on_the_same_bits(capsys):
    assert main(["bench", "--only", "cpu-mlp", "--models", "tiny", "--layers", "1", "--steps", "8",
                 "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "tiny x 1 blocks" in out and "over 2 rounds" in out and "DIFFER" not in out


@pytest.mark.parametrize("argv", [["--only", "cpu-gelu", "--shape", "4,abc"], ["--only", "cpu-gelu", "--shape", "0,4"],
                                  ["--only", "cpu-attention", "--shape", "16,4,64"], ["--only", "cpu-gelu,nope"],
                                  ["--only", ","]])
def test_bad_parts_and_shapes_are_refused_in_one_line(capsys, argv):
    assert main(["bench", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "valid:" in captured.err
