"""The fused CPU tanh-GELU (ablate/kernels/cpu_gelu.py): parity with the float64 reference,
bits that do not depend on the thread count, the fallback where it cannot be built, and runs
that keep the form they started with."""
import hashlib
import json

import pytest
import torch
import torch.nn.functional as F

from ablate.cli import main
from ablate.kernels import cpu_gelu
from ablate.kernels.cpu_backend import CpuBackend
from ablate.kernels.cpu_build import cpu_has

FUSED = [f for f in cpu_gelu.available() if f != cpu_gelu.PASSES]
ARGS = ["train", "--quiet", "--steps", "6", "--batch-size", "2", "--seq-len", "16", "--eval-batches", "1",
        "--final-eval-batches", "1", "--threads", "1", "--device", "cpu"]


@pytest.fixture
def threads():
    outer = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(outer)


@pytest.mark.skipif(not FUSED, reason=f"no fused form here: {cpu_gelu.library()[1]}")
@pytest.mark.parametrize("form", FUSED)
@pytest.mark.parametrize("shape", [(7,), (3, 4099), (16, 64, 256)])  # a partial block, several, tiny's MLP
def test_the_fused_gelu_matches_the_float64_reference(form, shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 4
    dy = torch.randn(shape)
    x64 = x.double().requires_grad_()
    ref = F.gelu(x64, approximate="tanh")
    (dref,) = torch.autograd.grad(ref, x64, dy.double())
    xf = x.clone().requires_grad_()
    with cpu_gelu.using(form):
        y = CpuBackend().activation("gelu", xf)  # through the kernel interface
    y.backward(dy)
    torch.testing.assert_close(y.double(), ref.detach(), atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(xf.grad.double(), dref, atol=2e-5, rtol=1e-5)


@pytest.mark.skipif(not FUSED, reason="no fused form here")
def test_special_values_and_strided_inputs_are_the_functions():
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 100.0, -100.0, -20.0, 20.0, 1e-30, 0.0])
    with cpu_gelu.using(FUSED[0]):
        y = cpu_gelu.gelu(x)
        torch.testing.assert_close(y, F.gelu(x, approximate="tanh"), equal_nan=True)
        wide = torch.randn(8, 10)
        torch.testing.assert_close(cpu_gelu.gelu(wide.t()), F.gelu(wide.t(), approximate="tanh"), atol=2e-6, rtol=2e-6)


@pytest.mark.skipif(not FUSED, reason="no fused form here")
def test_its_bits_do_not_depend_on_the_thread_count(threads):
    x = torch.randn(3 * 4096 + 17)
    dy = torch.randn_like(x)
    out = []
    for n in (1, 2):
        threads(n)
        xf = x.clone().requires_grad_()
        with cpu_gelu.using(FUSED[0]):
            y = cpu_gelu.gelu(xf)
        y.backward(dy)
        out.append((y.detach(), xf.grad))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


@pytest.mark.skipif("poly-bias" not in cpu_gelu.available(), reason="no poly-bias form here")
def test_polys_threads_compute_in_the_callers_flush_to_zero_mode(threads):
    """Subnormal inputs read as 0 on the calling thread (a run's flush_denormal) must on the
    kernel's other threads too, or an element's bits would depend on the thread computing it."""
    x = torch.randn(4 * 4096)
    x[4096:] *= 1e-39  # the blocks a second thread takes: subnormal
    dy = torch.ones_like(x)
    threads(2)
    with cpu_gelu.using("poly-bias"):
        cpu_gelu.gelu(x)  # the kernel's threads start (a new thread inherits its maker's mode)
        assert torch.set_flush_denormal(True), "this CPU cannot flush subnormals"
        try:
            out = []
            for n in (1, 2):
                threads(n)
                y, dx = torch.empty_like(x), torch.empty_like(x)
                cpu_gelu._call("fwd", x, y)
                cpu_gelu._call("bwd", x, dy, dx)
                out.append((y, dx))
        finally:
            torch.set_flush_denormal(False)
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
    assert (out[0][0][4096:] == 0).all()  # read as 0 on every thread


POLY_COPIES = [c for c in cpu_gelu.FORMS["poly-bias"] if cpu_has(*c.needs)]


@pytest.mark.skipif(len(POLY_COPIES) < 2 or cpu_gelu.library()[0] is None, reason="needs AVX-512 and AVX2 copies")
def test_polys_copies_for_each_instruction_set_give_the_same_bits():
    """`poly-bias` is one form whichever vector width computes it: a run resumes on another CPU."""
    torch.manual_seed(1)
    x = torch.cat([torch.randn(50_000) * 4, torch.randn(5_000) * 30, torch.tensor([9.5, -9.5, 9.4999, 1e-38, -3e-39])])
    dy = torch.randn_like(x)
    outs = []
    for copy in POLY_COPIES:
        y, dx = torch.empty_like(x), torch.empty_like(x)
        cpu_gelu._call("fwd", x, y, copy=copy)
        cpu_gelu._call("bwd", x, dy, dx, copy=copy)
        outs.append((y, dx))
    assert all(torch.equal(a, b) for a, b in zip(outs[0], outs[1]))


@pytest.mark.skipif("poly-bias" not in cpu_gelu.available(), reason="no poly-bias form here")
def test_polys_gradient_is_the_functions_far_out():
    """Past |x| = 9.5 the derivative is 1 or 0: no NaN from x^3 overflowing at 1e20."""
    x = torch.tensor([1e20, -1e20, 50.0, -50.0, 9.6, -9.6]).requires_grad_()
    with cpu_gelu.using("poly-bias"):
        cpu_gelu.gelu(x).sum().backward()
    assert x.grad.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def rows(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in ("time_s", "tokens_per_s")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def without_a_compiler(monkeypatch):
    monkeypatch.setattr(cpu_gelu.KERNEL, "_lib", [(None, "no C compiler (a test)")])


def test_without_a_compiler_a_run_trains_with_the_passes_and_says_so(tmp_path, monkeypatch):
    without_a_compiler(monkeypatch)
    assert cpu_gelu.available() == [cpu_gelu.PASSES]
    assert main([*ARGS, "--out", str(tmp_path)]) == 0
    (config,) = tmp_path.glob("*/config.json")
    assert json.loads(config.read_text())["gelu_cpu"] == cpu_gelu.PASSES


def test_a_run_from_before_the_kernel_resumes_on_the_passes_bit_for_bit(tmp_path, monkeypatch, capsys):
    import ablate.engine.train

    with monkeypatch.context() as m:  # the reference: a whole run on the passes, as before the kernel
        without_a_compiler(m)
        assert main([*ARGS, "--out", str(tmp_path / "ref")]) == 0
        m.setattr(ablate.engine.train, "lr_at", _stop_after(2, ablate.engine.train.lr_at, m))
        assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 130
    (config,) = (tmp_path / "cut").glob("*/config.json")
    old = json.loads(config.read_text())
    del old["gelu_cpu"]  # written before the option existed
    config.write_text(json.dumps(old))
    assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 0  # the kernel is available again: not used
    assert json.loads(config.read_text())["gelu_cpu"] == cpu_gelu.PASSES
    assert rows(config.parent) == rows(next((tmp_path / "ref").iterdir()))
    if FUSED:  # and a run started fused is refused, in one line, where no kernel builds
        old["gelu_cpu"] = FUSED[0]
        config.write_text(json.dumps(old))
        (config.parent / "summary.json").unlink()
        without_a_compiler(monkeypatch)
        capsys.readouterr()
        assert main([*ARGS, "--out", str(tmp_path / "cut")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and FUSED[0] in err and "valid here: passes" in err


def _stop_after(step, real, m):
    """lr_at that asks the loop to stop (as Ctrl-C does) while training `step`."""
    import contextlib
    import signal

    import ablate.engine.train

    received = []

    @contextlib.contextmanager
    def signals():
        yield received

    m.setattr(ablate.engine.train, "_graceful_signals", signals)

    def lr_at(s, *args, **kwargs):
        if s == step:
            received.append(signal.SIGINT)
        return real(s, *args, **kwargs)

    return lr_at


def _digest(*tensors: torch.Tensor) -> str:
    return hashlib.sha256(b"".join(t.contiguous().numpy().tobytes() for t in tensors)).hexdigest()[:16]


# sha256 of `poly`'s output and gradient on the inputs below, computed by its first build (the
# scalar C loops GCC vectorized, 2026-12-02), flush-to-zero off and on. A form is its bits: a
# faster rewrite of the kernel must give these (the vec.h rewrite was also checked on every float32).
POLY_BITS = {False: "42ec095ce8d74dc7", True: "dd5653f839904102"}


@pytest.mark.skipif(not POLY_COPIES or cpu_gelu.library()[0] is None, reason="no poly copy here")
@pytest.mark.parametrize("flush", [False, True])
@pytest.mark.parametrize("copy", POLY_COPIES, ids=lambda c: c.isa)
def test_polys_bits_are_those_it_first_computed(copy, flush, threads):
    bits = torch.arange(0, 1 << 32, 65521, dtype=torch.int64)  # every exponent, NaNs, infinities, subnormals
    x = torch.where(bits >= 1 << 31, bits - (1 << 32), bits).to(torch.int32).view(torch.float32)
    dy = x.flip(0).clone()
    y, dx = torch.empty_like(x), torch.empty_like(x)
    threads(2)
    torch.set_flush_denormal(flush)
    try:
        cpu_gelu._call("fwd", x, y, copy=copy)
        cpu_gelu._call("bwd", x, dy, dx, copy=copy)
    finally:
        torch.set_flush_denormal(False)
    assert _digest(y, dx) == POLY_BITS[flush]


# ---- poly-bias: the dense MLP's c_fc bias added in the GELU's pass -----------------------------

BIAS = [f for f in cpu_gelu.available() if f in cpu_gelu.BIAS_FORMS]
needs_bias_form = pytest.mark.skipif(not BIAS, reason=f"no bias form here: {cpu_gelu.library()[1]}")


def _linear_case(shape, cols, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(shape)
    return x, torch.randn(cols, shape[-1]) * shape[-1] ** -0.5 * 2, torch.randn(cols), torch.randn(*shape[:-1], cols)


@needs_bias_form
@pytest.mark.parametrize("shape,cols", [((16, 64, 64), 256),  # tiny's MLP
                                        ((3, 5, 7), 37),  # rows in a partial block, a partial vector
                                        ((2000, 9), 21),  # more rows than 64 blocks of 16
                                        ((1, 8), 3)])
def test_linear_gelu_matches_the_float64_reference(shape, cols):
    """Values and all three gradients, through the kernel interface."""
    x, w, b, dy = _linear_case(shape, cols)
    ref64 = [t.double().requires_grad_() for t in (x, w, b)]
    ref = F.gelu(F.linear(*ref64), approximate="tanh")
    ref.backward(dy.double())
    ours = [t.clone().requires_grad_() for t in (x, w, b)]
    with cpu_gelu.using(BIAS[0]):
        assert cpu_gelu.handles_linear(*ours)
        y = CpuBackend().linear_activation("gelu", *ours)
    y.backward(dy)
    torch.testing.assert_close(y.double(), ref.detach(), atol=2e-6, rtol=2e-6)
    for got, want in zip(ours, ref64):
        torch.testing.assert_close(got.grad.double(), want.grad, atol=1e-4, rtol=1e-5)


@needs_bias_form
def test_linear_gelus_bits_do_not_depend_on_the_thread_count(threads):
    x, w, b, dy = _linear_case((300, 16), 40, seed=2)  # 19 blocks of rows, a partial vector
    out = []
    for n in (1, 2):
        threads(n)
        ours = [t.clone().requires_grad_() for t in (x, w, b)]
        with cpu_gelu.using(BIAS[0]):
            y = cpu_gelu.linear_gelu(*ours)
        y.backward(dy)
        out.append([y.detach(), *(t.grad for t in ours)])
    assert all(torch.equal(a, c) for a, c in zip(*out))


def _mlp_case(shape, hidden, seed=0, bias2=True):
    x, w, b, _ = _linear_case(shape, hidden, seed)
    torch.manual_seed(seed + 1)
    w2 = torch.randn(shape[-1], hidden) * hidden ** -0.5
    return x, w, b, w2, (torch.randn(shape[-1]) if bias2 else None), torch.randn(shape)


def _mlp_run(fn, tensors, grad, frozen=()):
    """fn's output and the gradients of its tensor inputs (None where frozen or absent)."""
    ours = [None if t is None else t.clone().requires_grad_(i not in frozen) for i, t in enumerate(tensors)]
    with cpu_gelu.using(BIAS[0]):
        out = fn(*ours)
    out.backward(grad)
    return [out.detach(), *(None if t is None else t.grad for t in ours)]


def _two_layers(x, w, b, w2, b2):
    return F.linear(cpu_gelu.linear_gelu(x, w, b), w2, b2)


@needs_bias_form
@pytest.mark.parametrize("shape,hidden,bias2,frozen", [((16, 64, 64), 256, True, ()),  # tiny's MLP
                                                       ((3, 5, 7), 37, True, ()),
                                                       ((2000, 9), 21, False, ()),  # no second bias
                                                       ((4, 6, 8), 32, True, (2, 3)),  # c_fc's bias, c_proj frozen
                                                       ((4, 6, 8), 32, True, (0,))])  # the input needs no gradient
def test_dense_mlp_has_the_bits_of_its_two_layers_in_turn(threads, shape, hidden, bias2, frozen):
    """The backend's dense MLP on the bias form writes the activation's gradient in place; the
    output and every gradient are those of linear_gelu then F.linear under autograd, bit for
    bit, at 1 and 2 threads: runs made before it continue on their own bits."""
    x, w, b, w2, b2, grad = _mlp_case(shape, hidden, bias2=bias2)
    for n in (1, 2):
        threads(n)
        assert cpu_gelu.handles_mlp(x, w, b, w2, b2)
        fused = _mlp_run(lambda *t: CpuBackend().dense_mlp("gelu", *t), (x, w, b, w2, b2), grad, frozen)
        apart = _mlp_run(_two_layers, (x, w, b, w2, b2), grad, frozen)
        for got, want in zip(fused, apart):
            assert (got is None and want is None) or torch.equal(got, want)


@needs_bias_form
def test_dense_mlp_leaves_the_gradient_it_is_handed_as_it_was():
    """A residual sum hands one gradient tensor to both its terms: the MLP may overwrite only
    the buffer it makes, never the one it is given (the stream's gradient would change)."""
    x, w, b, w2, b2, grad = _mlp_case((4, 6, 8), 32)
    stream = torch.zeros_like(x, requires_grad=True)
    with cpu_gelu.using(BIAS[0]):
        out = stream + CpuBackend().dense_mlp("gelu", x.requires_grad_(), w, b, w2, b2)
    assert type(out.grad_fn.next_functions[1][0]).__name__ == "_GeluBiasLinearBackward"
    kept = grad.clone()
    out.backward(grad)
    assert torch.equal(grad, kept) and torch.equal(stream.grad, kept)


def test_dense_mlp_takes_both_layers_in_turn_where_the_kernel_does_not_apply():
    x, w, b, w2, b2, _ = _mlp_case((4, 6, 8), 32)
    backend = CpuBackend()
    for form in [f for f in cpu_gelu.available() if f not in cpu_gelu.BIAS_FORMS]:
        with cpu_gelu.using(form):
            assert not cpu_gelu.handles_mlp(x, w, b, w2, b2)
            assert torch.equal(backend.dense_mlp("gelu", x, w, b, w2, b2),
                               F.linear(backend.activation("gelu", F.linear(x, w, b)), w2, b2))
    if BIAS:
        with cpu_gelu.using(BIAS[0]):
            assert not cpu_gelu.handles_mlp(x, w, b, w2.double(), b2)
            assert not cpu_gelu.handles_mlp(x, w, b, w2[:, :-1], b2)  # a second layer that does not fit
            assert not cpu_gelu.handles_mlp(x, w, b, w2, b2[:-1])
            assert not cpu_gelu.handles_mlp(x, w, None, w2, b2)
    assert torch.equal(backend.dense_mlp("relu", x, w, b, w2, b2), F.linear(torch.relu(F.linear(x, w, b)), w2, b2))


def test_other_forms_and_other_inputs_take_the_linear_then_the_activation():
    """Where the bias form is not in use (a run on `poly`, the passes), or the input is not
    float32 on the CPU, or under autocast, linear_activation is F.linear then activation: the bits
    of every run made before the bias form."""
    x, w, b, _ = _linear_case((4, 6, 8), 32)
    backend = CpuBackend()
    for form in [f for f in cpu_gelu.available() if f not in cpu_gelu.BIAS_FORMS]:
        with cpu_gelu.using(form):
            assert not cpu_gelu.handles_linear(x, w, b)
            assert torch.equal(backend.linear_activation("gelu", x, w, b), backend.activation("gelu", F.linear(x, w, b)))
    with cpu_gelu.using(cpu_gelu.BIAS_FORMS[0]):
        assert not cpu_gelu.handles_linear(x.double(), w.double(), b.double())
        assert not cpu_gelu.handles_linear(x, w, None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not cpu_gelu.handles_linear(x, w, b)
    assert torch.equal(backend.linear_activation("relu", x, w, b), torch.relu(F.linear(x, w, b)))


BIAS_COPIES = [c for c in cpu_gelu.FORMS["poly-bias"] if cpu_has(*c.needs)]


def _bias_bits(copy, rows=100, cols=37):
    """poly-bias's forward, gradient and bias gradient on fixed inputs (exact in float32)."""
    i = torch.arange(rows * cols)
    h = ((i % 977 - 488) / 40.0).float().view(rows, cols)
    b = ((torch.arange(cols) % 13 - 6) / 8.0).float()
    dy = (((i * 7) % 101 - 50) / 16.0).float().view(rows, cols)
    y, dz, db = torch.empty_like(h), torch.empty_like(h), torch.empty(cols)
    cpu_gelu._bias_fwd(h, b, y, copy=copy)
    cpu_gelu._bias_bwd(h, b, dy, dz, db, copy=copy)
    return y, dz, db


# sha256 of poly-bias's outputs on _bias_bits's inputs, as its first build computed them
# (2026-12-03): a form is its bits, so a faster rewrite of the kernel must still give these.
POLY_BIAS_BITS = "8f3c69c0cb7d647f"


@pytest.mark.skipif(not BIAS_COPIES or cpu_gelu.library()[0] is None, reason="no poly-bias copy here")
@pytest.mark.parametrize("copy", BIAS_COPIES, ids=lambda c: c.isa)
def test_poly_bias_bits_are_those_it_first_computed_on_every_copy(copy):
    assert _digest(*_bias_bits(copy)) == POLY_BIAS_BITS


@pytest.mark.skipif(cpu_gelu.library()[0] is None, reason="no C kernel builds here")
def test_a_kernel_whose_sources_define_no_copy_of_a_symbol_is_not_built():
    """Sources may each define some symbols, but a symbol no
    copy defines is a mistake, refused at build rather than met at a training step."""
    from ablate.kernels.cpu_build import CpuKernel

    kernel = CpuKernel("gelu_tanh", cpu_gelu.FORMS, cpu_gelu.PASSES, {**cpu_gelu.SIGNATURES, "gelu_nowhere": ()},
                       headers=cpu_gelu.KERNEL.headers)
    lib, why = kernel.library()
    assert lib is None and "gelu_nowhere" in why
    assert kernel.available() == [cpu_gelu.PASSES]
    assert len(kernel.copies) == len({c.isa for c in kernel.copies})  # one copy per instruction set
