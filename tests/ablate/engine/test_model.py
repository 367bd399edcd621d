"""The base model built from every variant: shapes, gradients, counts, wiring."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from ablate.engine.config import cell_id, resolve
from ablate.engine.inspect_model import param_breakdown
from ablate.engine.model import build_model
from ablate.engine.sizes import get_size
from ablate.variants import all_variants, make_variant
from ablate.variants.mlps import gated_hidden
from ablate.variants.placements import deepnorm_constants

TINY = get_size("tiny")
TINY6 = TINY.with_layers(6)  # the qk-norm test's model
# Every block without qk-norm, and qk-norm (each type) on one block per placement: qk-norm sits
# inside the attention, the same whatever the rest of the block is, so crossing it with every
# other axis would triple the cases without testing anything new.
ALL = [s for s in all_variants() if s.qk_norm == "none" or (s.act in ("gelu", None) and s.mlp in ("dense", "swiglu")
                                                          and s.residual and s.norm_type in ("layernorm", None))]


@pytest.mark.parametrize("spec", ALL, ids=[s.id for s in ALL])
def test_every_variant_trains_a_step_on_cpu(spec):
    torch.manual_seed(0)
    model = build_model(spec, TINY)
    idx = torch.randint(0, TINY.vocab_size, (2, 16))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 16, TINY.vocab_size)
    assert torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{spec.id}: no gradient for {name}"
        assert torch.isfinite(p.grad).all(), f"{spec.id}: non-finite gradient for {name}"


def test_andrea_120m_parameter_count_is_exact():
    model = build_model(make_variant(), get_size("andrea-120m"), device="meta")
    counts = param_breakdown(model)
    assert counts["total"] == 92_331_264
    assert counts["blocks"] == 85_054_464
    n_norms = sum(1 for m in model.modules() if type(m).__name__ == "LayerNorm")
    assert n_norms == 25


def test_a_meta_model_has_the_real_ones_parameters_and_skips_the_init(monkeypatch):
    """`ablate variants` counts parameters on the meta device, where the init has no values to
    fill (and each meta normal_ costs half a millisecond): the same names and shapes as a real
    model, for every preset's structure, without calling the init."""
    from ablate.engine.model import GPT
    from ablate.variants import PRESETS

    real = {name: build_model(PRESETS.get(name), TINY) for name in PRESETS}
    monkeypatch.setattr(GPT, "reset_parameters", lambda self: pytest.fail("the init ran on the meta device"))
    for name, model in real.items():
        meta = build_model(PRESETS.get(name), TINY, device="meta")
        assert {n: p.shape for n, p in meta.named_parameters()} == {n: p.shape for n, p in model.named_parameters()}, name
        assert all(p.is_meta for p in meta.parameters())


@pytest.mark.parametrize("gated", ["swiglu", "geglu", "reglu"])
@pytest.mark.parametrize("size", ["tiny", "small", "andrea-120m"])
def test_gated_mlps_are_parameter_matched(gated, size):
    s = get_size(size)
    dense = param_breakdown(build_model(make_variant(), s, device="meta"))["mlp_per_block"]
    glu = param_breakdown(build_model(make_variant(mlp=gated), s, device="meta"))["mlp_per_block"]
    assert abs(glu / dense - 1) < 0.01
    if size == "andrea-120m":
        assert gated_hidden(s.mlp_hidden) == 2048


def test_embeddings_are_tied():
    model = build_model(make_variant(), TINY)
    assert model.lm_head.weight is model.wte.weight
    assert model.lm_head.weight.data_ptr() == model.wte.weight.data_ptr()


def _block_input(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 16, TINY.d_model, generator=g)


def test_pre_norm_block_is_near_identity_at_init():
    torch.manual_seed(0)
    size = get_size("small")
    block = build_model(make_variant(), size).blocks[0]
    x = torch.randn(2, 16, size.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        change = (block(x) - x).norm() / x.norm()
    assert change < 0.1


def test_post_norm_normalises_the_block_output_and_pre_norm_does_not():
    torch.manual_seed(0)
    x = 3.0 * _block_input() + 1.0  # a stream far from zero mean, unit variance
    with torch.no_grad():
        post = build_model(make_variant(norm="post"), TINY).blocks[0](x)
        pre = build_model(make_variant(norm="pre"), TINY).blocks[0](x)
    # Post-norm's last op is a LayerNorm with unit gain and zero bias: every row has
    # mean 0 and variance 1. Pre-norm adds to the raw stream, which keeps its scale.
    assert torch.allclose(post.mean(-1), torch.zeros(2, 16), atol=1e-5)
    assert torch.allclose(post.var(-1, unbiased=False), torch.ones(2, 16), atol=1e-3)
    assert pre.var(-1, unbiased=False).mean() > 5


def test_pre_norm_block_computes_x_plus_branches_of_normalised_input():
    torch.manual_seed(0)
    block = build_model(make_variant(), TINY).blocks[0]
    x = _block_input()
    with torch.no_grad():
        w = block.wiring
        h = x + block.attn(w.norm_attn(x))
        expected = h + block.mlp(w.norm_mlp(h))
        assert torch.allclose(block(x), expected, atol=1e-6)


def test_no_residual_pre_norm_drops_the_skip():
    torch.manual_seed(0)
    block = build_model(make_variant(residual=False), TINY).blocks[0]
    x = _block_input()
    with torch.no_grad():
        w = block.wiring
        expected = block.mlp(w.norm_mlp(block.attn(w.norm_attn(x))))
        assert torch.allclose(block(x), expected, atol=1e-6)


def test_deepnorm_scales_residual_and_branch_init():
    torch.manual_seed(0)
    model = build_model(make_variant(norm="deepnorm"), TINY)
    alpha, beta = deepnorm_constants(TINY.n_layer)
    assert math.isclose(alpha, (2 * TINY.n_layer) ** 0.25)
    block = model.blocks[0]
    w = block.mlp.c_fc.weight
    xavier_std = math.sqrt(2.0 / (w.shape[0] + w.shape[1]))
    assert abs(w.std().item() / (beta * xavier_std) - 1) < 0.05
    x = _block_input()
    with torch.no_grad():
        h = block.wiring.norm_attn(alpha * x + block.attn(x))
        expected = block.wiring.norm_mlp(alpha * h + block.mlp(h))
        assert torch.allclose(block(x), expected, atol=1e-5)


def test_final_norm_only_where_the_placement_needs_it():
    assert build_model(make_variant(norm="pre"), TINY).norm_f is not None
    assert build_model(make_variant(norm="sandwich"), TINY).norm_f is not None
    assert build_model(make_variant(norm="post"), TINY).norm_f is None
    assert build_model(make_variant(norm="none"), TINY).norm_f is None


def test_gelu_is_the_tanh_approximation():
    from ablate.variants.activations import gelu

    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    formula = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    assert torch.allclose(gelu(x), formula, atol=1e-12)


def _gelu_and_grad(f, x: torch.Tensor):
    x = x.detach().clone().requires_grad_()
    y = f(x)
    y.backward(torch.ones_like(y))
    return y.detach(), x.grad


def test_the_cpu_gelu_is_torchs_tanh_gelu_in_float64():
    """The CPU form (x * sigmoid(2u), its derivative written out) is the same function as
    torch's tanh GELU: values and gradients agree to float64 rounding, and gradcheck passes."""
    from ablate.variants.activations import gelu

    x = torch.cat([torch.linspace(-40, 40, 20001, dtype=torch.float64), torch.tensor([0.0, 1e-300, -1e-300])])
    y, g = _gelu_and_grad(gelu, x)
    y_ref, g_ref = _gelu_and_grad(lambda t: F.gelu(t, approximate="tanh"), x)
    assert (y - y_ref).abs().max() < 1e-13 and (g - g_ref).abs().max() < 1e-13
    assert torch.autograd.gradcheck(gelu, (torch.randn(64, dtype=torch.float64, requires_grad=True) * 4,))


def test_the_cpu_gelu_in_float32_is_as_close_to_the_float64_truth_as_torchs():
    from ablate.variants.activations import gelu

    x = torch.linspace(-12, 12, 200001)  # every float32 input, scored against float64 at that input
    y_true, g_true = _gelu_and_grad(lambda t: F.gelu(t, approximate="tanh"), x.double())
    for f, (fwd_tol, bwd_tol) in ((gelu, (1e-6, 3e-6)), (lambda t: F.gelu(t, approximate="tanh"), (1e-6, 2e-6))):
        y, g = _gelu_and_grad(f, x)
        assert y.dtype == g.dtype == torch.float32
        assert (y.double() - y_true).abs().max() < fwd_tol and (g.double() - g_true).abs().max() < bwd_tol
    # Where the tanh form cancels (0.5(1 + tanh u) for u << 0) the sigmoid form does not:
    y, _ = _gelu_and_grad(gelu, torch.tensor([-5.0]))
    y_torch, _ = _gelu_and_grad(lambda t: F.gelu(t, approximate="tanh"), torch.tensor([-5.0]))
    exact = F.gelu(torch.tensor([-5.0], dtype=torch.float64), approximate="tanh")
    assert abs(y.double() - exact) < 0.01 * abs(exact) < abs(y_torch.double() - exact)


def test_the_gelu_keeps_torchs_kernel_off_the_cpu_float_path_and_its_edge_values():
    """bfloat16 (and any device but the CPU, and torch.compile) take torch's own kernel, bit for
    bit; on the float path infinities and NaNs land where torch's land."""
    from ablate.variants.activations import gelu

    x = torch.randn(1000).bfloat16()
    assert torch.equal(gelu(x), F.gelu(x, approximate="tanh"))
    edges = torch.tensor([-float("inf"), -1e20, -1e10, -30.0, 0.0, 30.0, 1e10, 1e20, float("inf"), float("nan")])
    (y, g), (y_ref, g_ref) = _gelu_and_grad(gelu, edges), _gelu_and_grad(lambda t: F.gelu(t, approximate="tanh"), edges)
    assert torch.equal(y.isnan(), y_ref.isnan()) and torch.equal(g.isnan(), g_ref.isnan())
    assert torch.allclose(y, y_ref, equal_nan=True) and torch.allclose(g, g_ref, equal_nan=True)


@pytest.mark.parametrize("qk", ["layernorm", "rmsnorm"])
def test_qk_norm_normalises_queries_and_keys_per_head(qk):
    torch.manual_seed(0)
    model = build_model(make_variant(qk_norm=qk), TINY6)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
        attn.k_norm.weight.fill_(1.0)
    x = torch.randn(2, 8, TINY6.d_model) * 5
    q, k, v = attn.qkv(x)
    raw_q, raw_k, _ = attn.c_attn(x).split(TINY6.d_model, dim=2)
    d_head = TINY6.d_model // TINY6.n_head
    for t, raw in ((q, raw_q), (k, raw_k)):
        heads = raw.view(2, 8, TINY6.n_head, d_head).transpose(1, 2)
        if qk == "layernorm":
            expected = F.layer_norm(heads, (d_head,))
            assert torch.allclose(t.mean(-1), torch.zeros(()), atol=1e-5)
        else:
            expected = heads * torch.rsqrt(heads.square().mean(-1, keepdim=True) + 1e-5)
        assert torch.allclose(t, expected, atol=1e-5)
        assert torch.allclose(t.square().mean(-1), torch.ones(()), atol=1e-3)  # unit RMS per head
    # ... and the attention is computed from the normalised ones.
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 8, TINY6.d_model)
    assert torch.allclose(attn(x), attn.c_proj(y), atol=1e-6)
    plain = build_model(make_variant(), TINY6)
    assert plain.blocks[0].attn.q_norm is None
    assert make_variant(qk_norm=qk).id == f"pre.layernorm.gelu.dense.res.qk-{qk}"
    assert make_variant().id == "pre.layernorm.gelu.dense.res"  # the default leaves ids unchanged


def test_z_loss_adds_exactly_its_coefficient_times_mean_squared_log_partition():
    from ablate.engine.train import z_loss_term

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    expected = torch.logsumexp(logits, -1).pow(2).mean()
    assert torch.allclose(z_loss_term(logits), expected)
    assert torch.allclose(z_loss_term(torch.zeros(1, 3, 10)), torch.tensor(math.log(10) ** 2))


@pytest.mark.slow
def test_z_loss_changes_training_but_not_what_the_logged_loss_means(tmp_path):
    from ablate.engine.cell import Cell
    from ablate.engine.train import train

    def losses(z):
        cell = Cell.from_options({"layers": 2, "steps": 6, "z_loss": z, "probes": False}, id_keys=["z_loss"])
        train(cell, tmp_path / cell.id)
        return [json.loads(line)["loss"] for line in (tmp_path / cell.id / "metrics.jsonl").read_text().splitlines()]

    off, on = losses(0.0), losses(0.5)
    assert off[0] == on[0]  # step 0: the same weights, the same cross-entropy (the z term is not logged)
    assert off[1:] != on[1:]  # the gradient differs from the first update on


def test_mlp_ratio_sets_the_dense_width_and_its_default_leaves_ids_unchanged():
    assert resolve({"mlp_ratio": 2}).size.mlp_hidden == 128
    assert resolve({}).size.mlp_hidden == 256
    swiglu = resolve({"mlp": "swiglu", "mlp_ratio": 2})
    model = build_model(swiglu.spec, swiglu.size)
    assert model.blocks[0].mlp.c_proj.weight.shape[1] == round(2 * 128 / 3)  # gated: 2/3, parameter-matched
    assert cell_id(resolve({"mlp_ratio": 4}), ["mlp_ratio"]) == "pre.layernorm.gelu.dense.res__seed=0"
    assert cell_id(resolve({"mlp_ratio": 2}), ["mlp_ratio"]) == "pre.layernorm.gelu.dense.res__mlp_ratio=2__seed=0"
