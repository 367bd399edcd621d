"""The CPU attention kernel (ablate/kernels/cpu_attention.py): parity with float64, the layouts
the model hands it, bits that depend neither on the thread count nor on the vector width, and
runs that keep the form they started with."""
import hashlib
import json

import pytest
import torch
import torch.nn.functional as F

from ablate.cli import main
from ablate.engine.sizes import get_size
from ablate.kernels import cpu_attention
from ablate.kernels.cpu_backend import CpuBackend
from ablate.kernels.cpu_build import cpu_has
from tests.helpers.interrupting import interrupted_at

BLOCKED = "blocked" in cpu_attention.available()
needs_kernel = pytest.mark.skipif(not BLOCKED, reason=f"no attention kernel here: {cpu_attention.library()[1]}")
ARGS = ["train", "--quiet", "--steps", "6", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
        "--final-eval-batches", "1", "--threads", "1", "--device", "cpu"]


def heads(B, H, T, D, scale=1.0, seed=0):
    """q, k, v as the model makes them: (B, H, T, D) views of one (B, T, 3 H D) tensor."""
    torch.manual_seed(seed)
    qkv = torch.randn(B, T, 3 * H * D) * scale
    return [t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=2)]


def through_the_kernel(q, k, v, dout):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with cpu_attention.using("blocked"):
        assert cpu_attention.handles(*leaves)
        out = CpuBackend().attention(*leaves)  # the kernel interface the model calls
    out.backward(dout)
    return out.detach(), [t.grad for t in leaves]


def in_float64(q, k, v, dout):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(dout.double())
    return out.detach(), [t.grad for t in leaves]


def assert_matches_float64(q, k, v, dout):
    """The kernel's output and gradients as close to float64's as torch's float32 comes."""
    out, grads = through_the_kernel(q, k, v, dout)
    ref, ref_grads = in_float64(q, k, v, dout)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, atol=5e-5, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("shape", [(2, 4, 64, 16), (2, 3, 37, 20), (1, 2, 130, 64), (3, 2, 1, 16), (1, 1, 5, 3)])
def test_it_matches_float64_forward_and_backward(shape):
    """tiny's heads; a context and a head dimension off the 16-wide tiles; rows past 128; one
    position; a head dimension under one tile."""
    q, k, v = heads(*shape)
    assert_matches_float64(q, k, v, torch.randn(q.shape))


@needs_kernel
def test_on_c_attns_output_the_gradient_is_written_in_place_with_the_same_bits():
    """The model's q, k, v are views of c_attn's output: the kernel then takes that tensor and
    writes its gradient whole, the values the three-gradient path and autograd's join give."""
    from ablate.engine.model import build_model
    from ablate.variants import make_variant

    B, H, T, D = 2, 4, 24, 16
    torch.manual_seed(0)
    qkv = torch.randn(B, T, 3 * H * D, requires_grad=True)
    heads3 = [t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=2)]
    assert cpu_attention.packed_source(*heads3)._base is qkv
    dout = torch.randn(B, H, T, D)
    with cpu_attention.using("blocked"):
        out = cpu_attention.attention(*heads3)
        (packed,) = torch.autograd.grad(out, qkv, dout)
        apart, grads = through_the_kernel(*heads3, dout)
    assert torch.equal(out, apart) and torch.equal(packed, torch.cat([g.transpose(1, 2).flatten(2) for g in grads], 2))
    size = get_size("tiny")
    for axes, packs in (({}, True), ({"qk_norm": "rmsnorm"}, False)):  # qk-norm's q and k are tensors of their own
        attn = build_model(make_variant(**axes), size).blocks[0].attn
        assert (cpu_attention.packed_source(*attn.qkv(torch.randn(2, 8, size.d_model))) is not None) == packs


@needs_kernel
def test_contiguous_heads_and_a_strided_gradient_are_read_as_they_lie():
    """qk-norm hands it contiguous (B, H, T, D) queries and keys; the gradient may arrive with
    any strides whose last is 1."""
    q, k, v = (t.contiguous() for t in heads(2, 2, 24, 16))
    dout = torch.randn(2, 24, 2, 32)[..., ::2].transpose(1, 2)  # last stride 2: copied first
    assert_matches_float64(q, k, v, dout)


@needs_kernel
def test_large_logits_stay_finite_and_a_nan_propagates():
    """Scores in the hundreds (a diverging run's): the softmax subtracts its row maximum, and
    weights below float32's normal range are 0. A NaN input gives NaN, as torch's does."""
    q, k, v = heads(1, 2, 48, 16, scale=12.0)
    dout = torch.randn(q.shape)
    out, grads = through_the_kernel(q, k, v, dout)
    ref, ref_grads = in_float64(q, k, v, dout)
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)
    q = q.clone()
    q[0, 1, 7, 3] = float("nan")
    with cpu_attention.using("blocked"):
        out = cpu_attention.attention(q, k, v)
    assert out[0, 1, 7].isnan().all() and not out[0, 0].isnan().any() and not out[0, 1, :7].isnan().any()


@needs_kernel
def test_its_bits_do_not_depend_on_the_thread_count():
    q, k, v = heads(3, 3, 40, 16)
    dout = torch.randn(q.shape)
    outer = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            results.append(through_the_kernel(q, k, v, dout))
    finally:
        torch.set_num_threads(outer)
    for out, grads in results[1:]:
        assert torch.equal(out, results[0][0]) and all(torch.equal(a, b) for a, b in zip(grads, results[0][1]))


@needs_kernel
def test_every_thread_computes_in_the_callers_flush_to_zero_mode():
    """Values near 1e-38 make subnormal products: flushed on the calling thread (a run's
    flush_denormal), they must be flushed on the kernel's other threads too, or the bits would
    depend on which thread computed a head."""
    q, k, v = heads(2, 4, 32, 16)
    v = v * 1e-37
    dout = torch.randn(q.shape) * 1e-30
    outer = torch.get_num_threads()
    torch.set_num_threads(2)
    through_the_kernel(q, k, v, dout)  # the kernel's threads start (a new thread inherits its maker's mode)
    assert torch.set_flush_denormal(True), "this CPU cannot flush subnormals"
    try:
        results = []
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(through_the_kernel(q, k, v, dout))
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(outer)
    (out1, grads1), (out2, grads2) = results
    assert torch.equal(out1, out2) and all(torch.equal(a, b) for a, b in zip(grads1, grads2))


COPIES = [c for c in cpu_attention.FORMS["blocked"] if cpu_has(*c.needs)]


@pytest.mark.skipif(len(COPIES) < 2 or not BLOCKED, reason="needs the AVX-512 and AVX2 copies")
@pytest.mark.parametrize("shape", [(2, 4, 64, 16), (1, 3, 71, 40)])
def test_the_avx512_and_avx2_copies_give_the_same_bits(shape):
    """`blocked` is one form whichever vector width computes it: a run resumes on another CPU."""
    q, k, v = heads(*shape, scale=3.0)
    dout = torch.randn(q.shape).transpose(1, 2).contiguous().transpose(1, 2)
    outs = []
    for copy in COPIES:
        out, stats = cpu_attention.forward(q, k, v, copy)
        outs.append((out, stats, *cpu_attention.backward(q, k, v, out, stats, dout, copy)))
    assert all(torch.equal(a, b) for a, b in zip(*outs))


# sha256 of `blocked`'s output, row statistics and three gradients on the exact inputs below (multiples of
# 1/256), computed by the build of 2026-12-02: a form is its bits, whatever a later rewrite of the kernel.
BLOCKED_BITS = {(2, 4, 64, 16): "979a0e6b3fc68621", (1, 3, 37, 20): "153c5d5d5728f30d"}


@pytest.mark.skipif(not COPIES or not BLOCKED, reason="no blocked copy here")
@pytest.mark.parametrize("shape", list(BLOCKED_BITS))
@pytest.mark.parametrize("copy", COPIES, ids=lambda c: c.isa)
def test_blockeds_bits_are_those_it_first_computed(copy, shape):
    def exact(n):  # the same floats on any machine
        return ((torch.arange(n, dtype=torch.int64) * 7919) % 2003 - 1001).to(torch.float32) / 256

    B, H, T, D = shape
    q, k, v = cpu_attention.heads_of(exact(B * T * 3 * H * D).view(B, T, 3 * H * D), H)
    dout = exact(B * T * H * D).flip(0).view(B, T, H, D).transpose(1, 2)
    out, stats = cpu_attention.forward(q, k, v, copy)
    tensors = (out, stats, *cpu_attention.backward(q, k, v, out, stats, dout, copy))
    digest = hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in tensors)).hexdigest()[:16]
    assert digest == BLOCKED_BITS[shape]


def test_the_sdpa_form_is_torchs_attention_bit_for_bit():
    q, k, v = heads(2, 4, 64, 16)
    with cpu_attention.using(cpu_attention.SDPA):
        assert not cpu_attention.handles(q, k, v)
        out = CpuBackend().attention(q, k, v)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def rows(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in ("time_s", "tokens_per_s")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@needs_kernel
def test_a_new_run_records_the_kernel_and_one_from_before_resumes_on_torchs_bit_for_bit(tmp_path, monkeypatch):
    assert main([*ARGS, "--out", str(tmp_path / "new")]) == 0
    (new,) = (tmp_path / "new").glob("*/config.json")
    assert json.loads(new.read_text())["attention_cpu"] == "blocked"
    with monkeypatch.context() as m:  # the reference: a whole run as before the kernel
        m.setattr(cpu_attention.KERNEL, "best", lambda: cpu_attention.SDPA)
        assert main([*ARGS, "--out", str(tmp_path / "ref")]) == 0
        with interrupted_at(m, 2):
            assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 130
    (config,) = (tmp_path / "cut").glob("*/config.json")
    old = json.loads(config.read_text())
    del old["attention_cpu"]  # written before the kernel existed
    config.write_text(json.dumps(old))
    assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 0  # the kernel is here: not used
    assert json.loads(config.read_text())["attention_cpu"] == cpu_attention.SDPA
    assert rows(config.parent) == rows(next((tmp_path / "ref").iterdir()))
    assert rows(config.parent) != rows(new.parent)  # the two forms differ in their last bits


@needs_kernel
def test_a_run_on_the_kernel_is_refused_in_one_line_where_it_does_not_build(tmp_path, monkeypatch, capsys):
    with interrupted_at(monkeypatch, 2):
        assert main([*ARGS, "--out", str(tmp_path)]) == 130
    monkeypatch.setattr(cpu_attention.KERNEL, "_lib", [(None, "no C compiler (a test)")])
    capsys.readouterr()
    assert main([*ARGS, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'blocked'" in err and "attention" in err and "valid here: sdpa" in err


@pytest.mark.skipif(len(COPIES) < 2 or not BLOCKED, reason="needs the AVX-512 and AVX2 copies")
def test_a_pinned_copy_computes_every_call_the_backward_through_autograd_too(monkeypatch):
    """The bench times each copy's forward and backward: pinned, autograd's backward runs it."""
    called = []
    real = cpu_attention.KERNEL.function
    monkeypatch.setattr(cpu_attention.KERNEL, "function", lambda symbol, copy=None: called.append(
        (symbol, (copy or cpu_attention.KERNEL._copy).isa)) or real(symbol, copy))
    q, k, v = heads(1, 2, 16, 16)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with cpu_attention.using("blocked"), cpu_attention.KERNEL.pinned(COPIES[-1]):
        cpu_attention.attention(*leaves).sum().backward()
    assert called == [("attention_fwd", COPIES[-1].isa), ("attention_bwd", COPIES[-1].isa)]
    with cpu_attention.KERNEL.pinned(COPIES[-1]):
        assert real("attention_bwd") is getattr(cpu_attention.library()[0], f"attention_bwd_{COPIES[-1].isa}")
    assert real("attention_bwd") is getattr(cpu_attention.library()[0], f"attention_bwd_{COPIES[0].isa}")


def test_a_run_on_another_device_records_no_cpu_form_and_needs_no_compiler(tmp_path, monkeypatch):
    """A GPU run computes neither CPU kernel: resumed on a machine where they do not build, it
    is not refused, and nothing is compiled for it."""
    from ablate.engine.train import CPU_KERNELS, _cpu_forms_for

    for kernel, _ in CPU_KERNELS.values():
        monkeypatch.setattr(kernel, "_lib", [(None, "no C compiler (a test)")])
    recorded = {key: "blocked" if key == "attention_cpu" else "poly-bias" for key in CPU_KERNELS}
    assert _cpu_forms_for(recorded, tmp_path, torch.device("cuda"), "cuda") == dict.fromkeys(CPU_KERNELS)
    with pytest.raises(Exception, match="valid here"):  # on the CPU the same record is refused
        _cpu_forms_for(recorded, tmp_path, torch.device("cpu"), "cpu")
