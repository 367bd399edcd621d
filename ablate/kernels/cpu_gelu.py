"""GPT-2's tanh-GELU on the CPU in one pass forward and one backward: small C kernels
(cpu/gelu_tanh_poly.c) built with the system's C compiler at first use and
cached, called through ctypes; the `cpu` backend's `gelu` on float32 CPU tensors
(ablate/kernels/cpu_backend.py).

Why: torch's CPU tanh-GELU is four elementwise passes forward and five backward in the form
variants/activations.py uses (torch's own kernel is slower still), while the erf GELU of
nanoGPT has one fused kernel; at the harness's CPU widths that gap was most of the default
block's deficit against nanoGPT's model (issue #29).

Forms. Which code computed a run's GELU is part of its bits, so a run records its form
(config.json `gelu_cpu`) and keeps it when resumed (ablate.engine.train). Best first:
  poly-bias   gelu_tanh_poly.c: its own inlined exponential, IEEE operations and explicit fused
              multiply-adds, so its AVX-512 and AVX2 copies give the same bits (the faster one
              the CPU has is used); on CPUs with FMA. The dense MLP's first layer adds its bias
              in the kernel: torch's matmul without the bias, then gelu(h + b) forward and,
              backward, the bias's gradient in the same pass as the activation's (`linear_gelu`).
              torch's addmm first copies the bias into every row of its output, and its backward
              sums the gradient's columns in a pass of its own.
  passes      variants/activations.py's torch ops: the fallback where no kernel builds (no C
              compiler, another architecture), and the form of every run made before the kernels
RETIRED forms (`poly`: the same kernel with torch's addmm; `fused-avx2`, `fused-sse2`: glibc's
vector expf) are refused when a run made with one would resume: this code no longer computes
their bits.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from ablate.kernels.cpu_build import AVX512, AVX512_NEEDS, Copy, CpuKernel, EXACT

PASSES = "passes"
# form -> its copies, fastest first: a machine computes a form with the first copy its CPU runs.
POLY = (Copy("poly_avx512", "gelu_tanh_poly.c", (*EXACT, *AVX512), AVX512_NEEDS),
        Copy("poly_avx2", "gelu_tanh_poly.c", (*EXACT, "-mavx2", "-mfma"), ("avx2", "fma")))
FORMS = {"poly-bias": POLY}
RETIRED = ("poly", "fused-avx2", "fused-sse2")  # forms of earlier runs this code no longer computes
# The forms whose dense MLP adds c_fc's bias in the kernel (`linear_gelu`).
BIAS_FORMS = ("poly-bias",)
_P, _I64, _I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
SIGNATURES = {"gelu_tanh_fwd": (_P, _P, _I64, _I),
              "gelu_tanh_bwd": (_P, _P, _P, _I64, _I),
              "gelu_bias_fwd": (_P, _P, _P, _I64, _I64, _I64, _I),
              "gelu_bias_bwd": (_P, _P, _P, _P, _P, _P, _I64, _I64, _I64, _I)}
KERNEL = CpuKernel("gelu_tanh", FORMS, PASSES, SIGNATURES, headers=("vec.h", "exp_poly.h", "thread_mode.h"))
COPIES = KERNEL.copies
library, available, best, using, current = KERNEL.library, KERNEL.available, KERNEL.best, KERNEL.using, KERNEL.current


def _call(kind: str, *tensors: torch.Tensor, copy: Copy | None = None) -> None:
    """Run the `kind` ("fwd", "bwd") kernel of `copy` (default: the current form's fastest here)."""
    KERNEL.function(f"gelu_tanh_{kind}", copy)(*(t.data_ptr() for t in tensors), tensors[0].numel(),
                                               torch.get_num_threads())


class _GeluTanhFused(torch.autograd.Function):
    """Saves only its input (the passes form keeps two more activation-sized tensors)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        if x.numel():
            _call("fwd", x, y)
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        grad = grad.contiguous()
        dx = torch.empty_like(x)
        if x.numel():
            _call("bwd", x, grad, dx)
        return dx


# The bias's gradient is summed in fixed blocks of rows: at least this many rows a block, and at
# most BLOCKS blocks (their partial sums are scratch), so the bits depend on the shape alone.
ROWS_PER_BLOCK, BLOCKS = 16, 64


def _rows_per_block(rows: int) -> int:
    return max(ROWS_PER_BLOCK, -(-rows // BLOCKS))


def _bias_fwd(h: torch.Tensor, bias: torch.Tensor, y: torch.Tensor, copy: Copy | None = None) -> None:
    """y = gelu(h + bias), h and y contiguous (..., cols), bias (cols,)."""
    cols = h.shape[-1]
    rows = h.numel() // cols
    KERNEL.function("gelu_bias_fwd", copy)(h.data_ptr(), bias.data_ptr(), y.data_ptr(), rows, cols,
                                           _rows_per_block(rows), torch.get_num_threads())


def _bias_bwd(h: torch.Tensor, bias: torch.Tensor, dy: torch.Tensor, dz: torch.Tensor, db: torch.Tensor,
              copy: Copy | None = None) -> None:
    """dz = gelu'(h + bias) dy and db = dz summed over the rows, all contiguous; dz may be dy
    (the kernel reads each element before it writes it)."""
    cols = h.shape[-1]
    rows = h.numel() // cols
    rpb = _rows_per_block(rows)
    partial = torch.empty(-(-rows // rpb), cols)  # each block's sum, added in block order
    KERNEL.function("gelu_bias_bwd", copy)(h.data_ptr(), bias.data_ptr(), dy.data_ptr(), dz.data_ptr(),
                                           partial.data_ptr(), db.data_ptr(), rows, cols, rpb,
                                           torch.get_num_threads())


class _GeluTanhBias(torch.autograd.Function):
    """gelu(h + b) for h (..., cols) and b (cols,): the bias and the activation in one pass, the
    bias's gradient in the backward's. Saves h, as the unfused path saves h + b."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h, bias = h.contiguous(), bias.contiguous()
        y = torch.empty_like(h)
        if h.numel():
            _bias_fwd(h, bias, y)
        ctx.save_for_backward(h, bias)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        h, bias = ctx.saved_tensors
        dz, db = torch.empty_like(h), torch.zeros_like(bias)
        if h.numel():
            _bias_bwd(h, bias, dy.contiguous(), dz, db)
        return dz, db


class _GeluBiasLinear(torch.autograd.Function):
    """F.linear(gelu(h + b), weight, bias): the dense MLP's activation and its second layer.
    The second layer is F.linear forward and, backward, the very ops autograd runs for it (the
    same bits). What this buys: the activation's output gradient is the matmul this backward
    makes itself, so nothing else reads that buffer and the input gradient is written over it,
    where an op of its own (`_GeluTanhBias`) must take a fresh 4x-wide buffer, cold in cache,
    from whatever autograd hands it (a residual sum may hand the same tensor to two ops)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        h, b = h.contiguous(), b.contiguous()
        y = torch.empty_like(h)
        if h.numel():
            _bias_fwd(h, b, y)
        ctx.save_for_backward(h, b, y, weight)
        return F.linear(y, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h, b, y, weight = ctx.saved_tensors
        need_h, need_b, need_weight, need_bias = ctx.needs_input_grad
        g = grad.reshape(-1, grad.shape[-1])  # F.linear's flattened matmul: autograd's order of ops
        dweight = g.t().mm(y.reshape(-1, y.shape[-1])) if need_weight else None
        dbias = g.sum(0) if need_bias else None
        dz = db = None
        if need_h or need_b:
            dz = g.mm(weight).view(h.shape)  # the activation's output gradient, overwritten below
            db = torch.zeros_like(b)
            if h.numel():
                _bias_bwd(h, b, dz, dz, db)
        return dz, db, dweight, dbias


def handles_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether gelu(F.linear(x, weight, bias)) goes to `linear_gelu`: handles(x), a form that adds
    the bias in the kernel, float32 weights on the CPU, a bias, and no autocast."""
    return (bias is not None and handles(x) and current() in BIAS_FORMS and weight.dtype == bias.dtype == x.dtype
            and weight.device.type == bias.device.type == "cpu" and weight.dim() == 2 and bias.dim() == 1
            and x.shape[-1] == weight.shape[1] and bias.shape[0] == weight.shape[0]
            and not torch.is_autocast_enabled("cpu"))


def handles_mlp(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, weight2: torch.Tensor,
                bias2: torch.Tensor | None) -> bool:
    """Whether F.linear(gelu(F.linear(x, weight, bias)), weight2, bias2) goes to
    `linear_gelu_linear`: handles_linear, and a second layer of float32 CPU weights that fits."""
    return (handles_linear(x, weight, bias) and weight2.dtype == x.dtype and weight2.device.type == "cpu"
            and weight2.dim() == 2 and weight2.shape[1] == weight.shape[0]
            and (bias2 is None or (bias2.dtype == x.dtype and bias2.device.type == "cpu"
                                   and bias2.shape == weight2.shape[:1])))


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(F.linear(x, weight, bias)), GPT-2's tanh GELU: torch's matmul without the bias (its
    backward is autograd's own), then the bias added in the activation's kernel."""
    return _GeluTanhBias.apply(F.linear(x, weight), bias)


def linear_gelu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, weight2: torch.Tensor,
                       bias2: torch.Tensor | None) -> torch.Tensor:
    """F.linear(linear_gelu(x, weight, bias), weight2, bias2), with linear_gelu's bits, its
    backward writing the activation's gradient in place (`_GeluBiasLinear`)."""
    return _GeluBiasLinear.apply(F.linear(x, weight), bias, weight2, bias2)


def handles(x: torch.Tensor) -> bool:
    """Whether gelu(x) goes to the fused kernel: float32 on the CPU, eager, a fused form in use."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and not torch.compiler.is_compiling()
            and current() != PASSES)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return _GeluTanhFused.apply(x)
