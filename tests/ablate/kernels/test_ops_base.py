"""ops_base: the eager binding, the custom ops, scratch and weight caches, on launchers written
in torch (fast, any machine); the real kernels are checked in test_parity.py and
test_triton_kernels.py."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ablate.kernels import ops_base
from ablate.kernels.ops_base import ACTS, KernelBackend, define_ops, float32_param, reduce_scratch
from ablate.kernels.reference import ReferenceBackend
from ablate.variants.tables import ACTIVATIONS

_NS = itertools.count()


class TorchLaunchers:
    """ops_base.Launchers in torch, float32 math; records each call's name and arguments."""

    def __init__(self):
        self.calls = []

    def _log(self, name, *args):
        self.calls.append((name, args))

    def act_fwd(self, act, x, y):
        self._log("act_fwd", x, y)
        y.copy_(ACTIVATIONS.get(ACTS[act])(x.float()))

    def act_bwd(self, act, x, dy, dx):
        self._log("act_bwd", x, dy, dx)
        with torch.enable_grad():  # a backward runs without grad mode
            xf = x.float().requires_grad_()
            dx.copy_(torch.autograd.grad(ACTIVATIONS.get(ACTS[act])(xf), xf, dy.float())[0])

    def norm_fwd(self, x, r, s, y, w, b, mean, rstd, eps, rms):
        self._log("norm_fwd", x, r, s, y, w, b, mean, rstd)
        xf = x.float() if r is None else s.copy_(x + r).float()
        mu = torch.zeros(xf.shape[0]) if rms else xf.mean(-1)
        var = (xf * xf).mean(-1) if rms else (xf - mu[:, None]).square().mean(-1)
        rstd.copy_((var + eps).rsqrt())
        if mean is not None:
            mean.copy_(mu)
        y.copy_((xf - mu[:, None]) * rstd[:, None] * w + (0 if b is None else b))

    def norm_bwd_programs(self, rows, cols, device):
        return min(rows, 3)

    def norm_bwd(self, dy, ds, x, w, mean, rstd, dx, dw_part, db_part, dw, db, count, rms):
        self._log("norm_bwd", dy, ds, x, w, mean, rstd, dx, dw_part, db_part, dw, db, count)
        xhat = (x.float() - (0 if mean is None else mean[:, None])) * rstd[:, None]
        wdy = w * dy.float()
        c1 = (xhat * wdy).mean(-1, keepdim=True)
        c2 = 0 if rms else wdy.mean(-1, keepdim=True)
        dx.copy_((wdy - xhat * c1 - c2) * rstd[:, None] + (0 if ds is None else ds.float()))
        dw.copy_((dy.float() * xhat).sum(0))
        if db is not None:
            db.copy_(dy.float().sum(0))

    def bias_act_fwd(self, act, x, b, y):
        self._log("bias_act_fwd", x, b, y)
        y.copy_(ACTIVATIONS.get(ACTS[act])(x.float() + b))

    def bias_act_programs(self, rows, cols, device):
        return min(rows, 2)

    def bias_act_bwd(self, act, x, b, dy, dx, db_part, db, count):
        self._log("bias_act_bwd", x, b, dy, dx, db_part, db, count)
        with torch.enable_grad():
            xf = (x.float() + b).requires_grad_()
            g = torch.autograd.grad(ACTIVATIONS.get(ACTS[act])(xf), xf, dy.float())[0]
        dx.copy_(g)
        db.copy_(g.sum(0))

    def gated_fwd(self, act, gate, up, y):
        y.copy_(ACTIVATIONS.get(ACTS[act])(gate.float()) * up.float())

    def gated_bwd(self, act, gate, up, dy, dgate, dup):
        with torch.enable_grad():
            g = gate.float().requires_grad_()
            a = ACTIVATIONS.get(ACTS[act])(g)
            dgate.copy_(torch.autograd.grad(a, g, dy.float() * up.float())[0])
        dup.copy_(dy.float() * a.detach())


class NoBiasAct:
    """TorchLaunchers without the optional bias_act kernels (a backend may leave them out)."""

    def __init__(self):
        self._k = TorchLaunchers()
        self.calls = self._k.calls

    def __getattr__(self, name):
        if name.startswith("bias_act"):
            raise AttributeError(name)
        return getattr(self._k, name)


class CpuKernels(KernelBackend):
    def device_ok(self, t):
        return t.device.type == "cpu"


def backend(launchers=None):
    k = launchers or TorchLaunchers()
    return CpuKernels(define_ops(f"ablate_test_ops_base_{next(_NS)}", k)), k


def names(k):
    return [c[0] for c in k.calls]


def test_eager_calls_launch_directly_not_through_the_custom_ops():
    be, k = backend()
    be.ops = SimpleNamespace()  # any custom-op call would raise AttributeError
    x = torch.randn(2, 3, 8, requires_grad=True)
    w, b = torch.ones(8, requires_grad=True), torch.zeros(8, requires_grad=True)
    y = be.layer_norm(be.activation("gelu", x), w, b, 1e-5)
    y.sum().backward()
    assert names(k) == ["act_fwd", "norm_fwd", "norm_bwd", "act_bwd"]
    ref = F.layer_norm(F.gelu(x.detach(), approximate="tanh"), (8,), eps=1e-5)
    assert torch.allclose(y, ref, atol=1e-5)


def test_add_norm_with_only_the_sum_used_launches_no_backward_and_leaves_weights_alone():
    """As eager: the unused norm output gets no zero-filled gradient and no kernel."""
    be, k = backend()
    x, r = (torch.randn(2, 4, 16, requires_grad=True) for _ in range(2))
    w = torch.ones(16, requires_grad=True)
    s, _ = be.add_layer_norm(x, r, w, None, 1e-5)
    (3 * s).sum().backward()
    assert "norm_bwd" not in names(k)
    assert w.grad is None
    assert torch.equal(x.grad, torch.full_like(x, 3.0)) and torch.equal(r.grad, x.grad)


class AtenOps(TorchDispatchMode):
    """Records every aten op that runs while active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


class QuietKernels(TorchLaunchers):
    """TorchLaunchers whose torch math, standing in for a kernel, is hidden from AtenOps."""

    def norm_bwd(self, *args):
        with _disable_current_modes():
            super().norm_bwd(*args)


def test_norm_backward_sums_dweight_and_dbias_in_the_kernel():
    """dweight and dbias come out of the kernel: no sum over partial rows runs after it."""
    be, _ = backend(QuietKernels())
    x = torch.randn(5, 8, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    loss = be.layer_norm(x, w, b, 1e-5).square().sum()
    with AtenOps() as seen:
        dx, dw, db = torch.autograd.grad(loss, (x, w, b))
    assert seen.ops and "sum" not in seen.ops, seen.ops
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    refs = torch.autograd.grad(F.layer_norm(xr, (8,), wr, br, 1e-5).square().sum(), (xr, wr, br))
    for got, ref in zip((dx, dw, db), refs):
        assert torch.allclose(got, ref, atol=1e-5)


def test_bfloat16_weights_are_cast_once_per_version():
    w = torch.randn(8).to(torch.bfloat16)
    first = float32_param(w)
    assert first.dtype == torch.float32 and float32_param(w) is first
    with torch.no_grad():
        w.add_(1)  # an optimizer step: a new version, a new cast
    again = float32_param(w)
    assert again is not first and torch.equal(again, w.float())
    f32 = torch.randn(8)
    assert float32_param(f32) is f32 and float32_param(None) is None


def test_reduce_scratch_is_made_once_per_shape_with_zeroed_counters():
    a = reduce_scratch(torch.device("cpu"), 3, 5)
    assert a is reduce_scratch(torch.device("cpu"), 3, 5)
    assert a[0].shape == a[1].shape == (3, 5) and a[2].dtype == torch.int32 and not a[2].any()
    assert reduce_scratch(torch.device("cpu"), 3, 1)[2].numel() >= 2  # a norm with a bias counts twice


def test_linear_activation_adds_the_bias_in_the_activation_kernel():
    be, k = backend()
    x = torch.randn(2, 3, 8, requires_grad=True)
    w, b = torch.randn(16, 8, requires_grad=True), torch.randn(16, requires_grad=True)
    y = be.linear_activation("gelu", x, w, b)
    y.square().sum().backward()
    assert names(k) == ["bias_act_fwd", "bias_act_bwd"]
    xr, wr, br = (t.detach().clone().requires_grad_() for t in (x, w, b))
    ReferenceBackend().linear_activation("gelu", xr, wr, br).square().sum().backward()
    assert torch.allclose(y, ReferenceBackend().linear_activation("gelu", xr, wr, br), atol=1e-5)
    for got, ref in ((x.grad, xr.grad), (w.grad, wr.grad), (b.grad, br.grad)):
        assert torch.allclose(got, ref, atol=1e-4)


def test_without_bias_act_kernels_the_matmul_adds_the_bias():
    be, k = backend(NoBiasAct())
    assert not be.impl.has_bias_act and be.ops.bias_act is None
    x, w, b = torch.randn(2, 8), torch.randn(16, 8), torch.randn(16)
    y = be.linear_activation("gelu", x, w, b)
    assert names(k) == ["act_fwd"]
    assert torch.allclose(y, F.gelu(F.linear(x, w, b), approximate="tanh"), atol=1e-6)
    assert torch.equal(be.bias_activation("gelu", x, torch.zeros(8)), ReferenceBackend().bias_activation(
        "gelu", x, torch.zeros(8)))


def test_under_compile_the_custom_ops_run(monkeypatch):
    be, k = backend()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    x = torch.randn(3, 8, requires_grad=True)
    w, b = torch.ones(8), torch.zeros(8)
    y = be.layer_norm(x, w, b, 1e-5)
    y.sum().backward()
    assert names(k) == ["norm_fwd", "norm_bwd"]
    assert torch.allclose(y, F.layer_norm(x.detach(), (8,), w, b, 1e-5), atol=1e-5)


@pytest.mark.parametrize("family", ["bias_act", "add_norm"])
def test_custom_ops_pass_opcheck(family):
    be, _ = backend()
    g = torch.Generator().manual_seed(0)
    x, r, w, b = (torch.randn(*s, generator=g) for s in ((3, 8), (3, 8), (8,), (8,)))
    if family == "bias_act":
        op, args = be.ops.bias_act, (x.requires_grad_(), b.requires_grad_(), "gelu")
    else:
        op, args = be.ops.add_norm, (x.requires_grad_(), r.requires_grad_(), w, b, 1e-5, False)
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_one_gpu_needs_no_device_switch():
    assert ops_base.device_of(torch.empty(1)) is ops_base.device_of(torch.empty(2))
