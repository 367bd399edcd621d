"""GPT-2's tanh-GELU on the CPU in one pass forward and one backward: small C kernels
(cpu/gelu_tanh_poly.c, cpu/gelu_tanh.c) built with the system's C compiler at first use and
cached, called through ctypes; the reference backend's `gelu` on float32 CPU tensors
(ablate/kernels/reference.py).

Why: torch's CPU tanh-GELU is four elementwise passes forward and five backward in the form
variants/activations.py uses (torch's own kernel is slower still), while the erf GELU of
nanoGPT has one fused kernel; at the harness's CPU widths that gap was most of the default
block's deficit against nanoGPT's model (issue #29).

Forms. Which code computed a run's GELU is part of its bits, so a run records its form
(config.json `gelu_cpu`) and keeps it when resumed (ablate.train). Best first:
  poly        gelu_tanh_poly.c: its own inlined exponential, IEEE operations and explicit
              fused multiply-adds, so its AVX-512 and AVX2 copies give the same bits (the
              faster one the CPU has is used); on CPUs with FMA
  fused-avx2  gelu_tanh.c (glibc's vector expf, fast math) for AVX2 + FMA: the default of the
              runs made before `poly`, kept so that they resume on their own bits
  fused-sse2  the same for x86-64's baseline (4 floats a vector)
  passes      variants/activations.py's torch ops: the fallback where no kernel builds (no C
              compiler, another architecture), and the form of every run made before the kernels
"""
from __future__ import annotations

import ctypes

import torch

from ablate.kernels.cpu_build import AVX512, AVX512_NEEDS, EXACT, FAST, Copy, CpuKernel

PASSES = "passes"
# form -> its copies, fastest first: a machine computes a form with the first copy its CPU runs.
FORMS = {
    "poly": (Copy("poly_avx512", "gelu_tanh_poly.c", (*EXACT, *AVX512), AVX512_NEEDS),
             Copy("poly_avx2", "gelu_tanh_poly.c", (*EXACT, "-mavx2", "-mfma"), ("avx2", "fma"))),
    "fused-avx2": (Copy("avx2", "gelu_tanh.c", (*FAST, "-mavx2", "-mfma"), ("avx2", "fma")),),
    "fused-sse2": (Copy("sse2", "gelu_tanh.c", FAST, ()),),
}
_P = ctypes.c_void_p
SIGNATURES = {"gelu_tanh_fwd": (_P, _P, ctypes.c_int64, ctypes.c_int),
              "gelu_tanh_bwd": (_P, _P, _P, ctypes.c_int64, ctypes.c_int)}
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


def handles(x: torch.Tensor) -> bool:
    """Whether gelu(x) goes to the fused kernel: float32 on the CPU, eager, a fused form in use."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and not torch.compiler.is_compiling()
            and current() != PASSES)


def gelu(x: torch.Tensor) -> torch.Tensor:
    return _GeluTanhFused.apply(x)
