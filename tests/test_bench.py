"""The benchmark's plain-PyTorch baseline must be the same model as the harness's."""
import torch

from ablate.bench.plain_gpt import PlainGPT
from ablate.model import build_model
from ablate.sizes import get_size
from ablate.variants import make_variant


def test_plain_baseline_matches_the_harness_model_shape_for_shape():
    size = get_size("tiny")
    plain = PlainGPT(size.vocab_size, size.context, size.d_model, size.n_layer, size.n_head)
    harness = build_model(make_variant(), size)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in harness.parameters())
    # With the harness's weights copied in, both compute the same loss.
    ours = dict(harness.named_parameters())
    mapping = {"wte.weight": "wte.weight", "wpe.weight": "wpe.weight", "ln_f.weight": "norm_f.weight", "ln_f.bias": "norm_f.bias"}
    for i in range(size.n_layer):
        for a, b in [("ln1", "wiring.norm_attn"), ("ln2", "wiring.norm_mlp"), ("qkv", "attn.c_attn"),
                     ("proj", "attn.c_proj"), ("fc", "mlp.c_fc"), ("out", "mlp.c_proj")]:
            for kind in ("weight", "bias"):
                mapping[f"blocks.{i}.{a}.{kind}"] = f"blocks.{i}.{b}.{kind}"
    with torch.no_grad():
        for name, p in plain.named_parameters():
            p.copy_(ours[mapping[name]])
    idx = torch.randint(0, size.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(plain(idx, idx), harness(idx, idx)[1], atol=1e-5)


def test_bench_prints_the_step_table(capsys):
    from ablate.cli import main

    assert main(["bench", "--only", "steps", "--models", "tiny", "--steps", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| tiny |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 7 and cells[3].endswith("x") and cells[6].endswith("%")


def test_bench_refuses_bad_arguments(capsys):
    from ablate.cli import main

    assert main(["bench", "--steps", "1"]) == 2
    assert main(["bench", "--models", "huge"]) == 2
    err = capsys.readouterr().err
    assert "need steps >= 2" in err and "unknown model 'huge'" in err
