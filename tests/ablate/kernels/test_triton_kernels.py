"""The Triton kernels' reductions and the fused bias + activation, at tiny shapes (on a CPU they
run in Triton's interpreter, TRITON_INTERPRET=1 from tests/conftest.py). Parity over the
suite's shapes is test_parity.py's."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from ablate.kernels.ops_base import reduce_scratch
from ablate.kernels.reference import ReferenceBackend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or (DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1"),
    reason="needs triton and a GPU or TRITON_INTERPRET=1")


@pytest.fixture(scope="module")
def triton_backend():
    from ablate.kernels import get_backend

    return get_backend("triton", DEVICE)


def _grads(be, x, w, b):
    x, w, b = (t.detach().clone().requires_grad_() for t in (x, w, b))
    y = be.layer_norm(x, w, b, 1e-5)
    return torch.autograd.grad(y, (x, w, b), torch.linspace(-1, 1, y.numel()).view_as(y).to(y))


def test_norm_backward_sums_in_kernel_repeatably_and_leaves_its_counters_zero(triton_backend):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(11, 40, generator=g).to(DEVICE)  # 11 rows over 4 programs (3 on a GPU's SMs: more)
    w, b = torch.randn(40, generator=g).to(DEVICE), torch.randn(40, generator=g).to(DEVICE)
    first, second = _grads(triton_backend, x, w, b), _grads(triton_backend, x, w, b)
    for a, c in zip(first, second):
        assert torch.equal(a, c)  # a fixed summation order: bitwise the same
    ref = _grads(ReferenceBackend(), x.double(), w.double(), b.double())
    for got, want in zip(first, ref):
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    programs = triton_backend.impl.k.norm_bwd_programs(11, 40, x.device)
    assert not reduce_scratch(x.device, programs, 40)[2].any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bias_gelu_backward_sums_dbias_over_column_blocks(triton_backend, dtype):
    from ablate.kernels import triton_kernels as tk

    cols = tk._ew_block(4096) + 5  # two column blocks, the second nearly empty
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(3, cols, generator=g) * 2).to(dtype).to(DEVICE).requires_grad_()
    bias = (torch.randn(cols, generator=g) * 0.5).to(DEVICE).requires_grad_()
    y = triton_backend.bias_activation("gelu", x, bias)
    dy = torch.randn(y.shape, generator=g).to(dtype).to(DEVICE)
    dx, db = torch.autograd.grad(y, (x, bias), dy)
    x64, b64 = x.detach().double().requires_grad_(), bias.detach().double().requires_grad_()
    y64 = ReferenceBackend().bias_activation("gelu", x64, b64)
    dx64, db64 = torch.autograd.grad(y64, (x64, b64), dy.double())
    tol = 5e-6 if dtype == torch.float32 else 1e-2
    assert y.dtype == dtype and db.dtype == torch.float32
    for got, want in ((y, y64), (dx, dx64), (db, db64)):
        assert (got.double() - want).abs().max() <= tol * want.abs().max()


def test_bias_act_custom_op_passes_opcheck(triton_backend):
    g = torch.Generator().manual_seed(0)
    x, b = torch.randn(3, 8, generator=g).to(DEVICE), torch.randn(8, generator=g).to(DEVICE)
    torch.library.opcheck(triton_backend.ops.bias_act, (x.requires_grad_(), b.requires_grad_(), "gelu"),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_bias_gelu_under_torch_compile_matches_eager(triton_backend):
    """Under compile (fullgraph: no break) bias + GELU gives eager's values and gradients."""
    g = torch.Generator().manual_seed(5)
    args = [torch.randn(*s, generator=g).to(DEVICE).requires_grad_() for s in ((2, 3, 8), (16, 8), (16,))]

    def f(x, w, b):
        return triton_backend.linear_activation("gelu", x, w, b).square().mean()

    ref = f(*args)
    ref_grads = torch.autograd.grad(ref, args)
    torch._dynamo.reset()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(*args)
    for got, want in zip((out, *torch.autograd.grad(out, args)), (ref, *ref_grads)):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)
