"""The initialisations of variants/inits.py."""
import math

import pytest
import torch

from ablate.engine.config import resolve
from ablate.engine.model import build_model
from ablate.engine.sizes import get_size
from ablate.variants import make_variant


TINY = get_size("tiny").with_layers(6)


def _std(t):
    return float(t.detach().double().std())


@pytest.mark.parametrize("init", ["gpt2", "normal", "xavier", "small", "deepnet"])
def test_each_init_matches_its_definition(init):
    torch.manual_seed(0)
    spec = make_variant(norm="deepnorm") if init == "deepnet" else make_variant(mlp="swiglu")
    size = get_size("small")  # d 128: enough entries for tight std estimates
    model = build_model(spec, size, init=init)
    d, n = size.d_model, size.n_layer
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        elif p.dim() == 1:
            assert torch.all(p == 1), name
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    q, k, v = attn.c_attn.weight.chunk(3, dim=0)
    tol = 0.08  # relative: several thousand entries per matrix
    if init == "gpt2":
        expected = {"wte": 0.02, "q": 0.02, "c_proj": 0.02 / math.sqrt(2 * n), "fc": 0.02}
    elif init == "normal":
        expected = {"wte": 0.02, "q": 0.02, "c_proj": 0.02, "fc": 0.02}
    elif init == "xavier":
        h = mlp.c_proj.weight.shape[1]
        expected = {"wte": math.sqrt(2 / (size.vocab_size + d)), "q": math.sqrt(2 / (2 * d)),
                    "c_proj": math.sqrt(2 / (2 * d)), "fc": math.sqrt(2 / (h + d))}  # each gated half its own
    elif init == "small":
        s = math.sqrt(2 / (5 * d))
        expected = {"wte": s, "q": s, "c_proj": s, "fc": s}
    else:
        beta = (8 * n) ** -0.25
        expected = {"wte": 0.02, "q": math.sqrt(2 / (2 * d)), "c_proj": beta * math.sqrt(2 / (2 * d))}
        assert _std(v) == pytest.approx(beta * math.sqrt(2 / (2 * d)), rel=tol)
    assert _std(model.wte.weight) == pytest.approx(expected["wte"], rel=tol)
    assert _std(q) == pytest.approx(expected["q"], rel=tol)
    assert _std(k) == pytest.approx(expected["q"], rel=tol)
    assert _std(attn.c_proj.weight) == pytest.approx(expected["c_proj"], rel=tol)
    if "fc" in expected:
        assert _std(mlp.c_fc.weight.chunk(2, dim=0)[0]) == pytest.approx(expected["fc"], rel=tol)


def test_default_init_is_the_placements_and_gpt2_is_bitwise_the_old_one():
    assert resolve({}).init_name == "gpt2"
    assert resolve({"norm": "deepnorm"}).init_name == "deepnet"
    model = build_model(make_variant(), TINY)
    torch.manual_seed(1)
    model.reset_parameters()
    torch.manual_seed(1)
    expected = {}
    for name, p in model.named_parameters():  # the pre-registry reset_parameters, written out
        t = torch.empty_like(p)
        if name.endswith("bias"):
            t.zero_()
        elif p.dim() == 1:
            t.fill_(1)
        elif name.endswith("c_proj.weight"):
            t.normal_(0, 0.02 / math.sqrt(2 * TINY.n_layer))
        else:
            t.normal_(0, 0.02)
        expected[name] = t
    for name, p in model.named_parameters():
        assert torch.equal(p, expected[name]), name
