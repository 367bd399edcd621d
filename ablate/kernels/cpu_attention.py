"""Causal self-attention on the CPU, forward and backward, in a C kernel (cpu/attention.c) built
with the system's C compiler at first use and cached, called through ctypes: the reference
backend's `attention` on float32 CPU tensors (ablate/kernels/reference.py).

Why: at the harness's CPU sizes (head dimension 16, context 64) torch's CPU flash-attention
kernel reaches about a tenth of the matmul peak, and attention was a fifth of a `tiny` step:
most of what stood between the default block and nanoGPT's model (issue #29).

Forms (config.json `attention_cpu`; a resumed run keeps its own, ablate.train):
  blocked  cpu/attention.c: register tiles, an exact softmax with exp_poly.h's exponential,
           IEEE operations and fixed summation orders, so its AVX-512 and AVX2 copies give the
           same bits, at any thread count
  sdpa     torch's F.scaled_dot_product_attention: the fallback where no kernel builds, and the
           form of every run made before the kernel
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from ablate.kernels.cpu_build import AVX512, AVX512_NEEDS, EXACT, Copy, CpuKernel, pointer

SDPA = "sdpa"
# Loop distribution would turn the 64-byte row copies into calls to memcpy (10% of the time).
_FLAGS = (*EXACT, "-fno-tree-loop-distribute-patterns")
FORMS = {
    "blocked": (Copy("blocked_avx512", "attention.c", (*_FLAGS, *AVX512), AVX512_NEEDS),
                Copy("blocked_avx2", "attention.c", (*_FLAGS, "-mavx2", "-mfma"), ("avx2", "fma"))),
}
KERNEL = CpuKernel("attention", FORMS, SDPA, ("attention_fwd", "attention_bwd"),
                   headers=("exp_poly.h", "thread_mode.h"))
library, available, best, using, current = KERNEL.library, KERNEL.available, KERNEL.best, KERNEL.using, KERNEL.current


def _strides(*tensors: torch.Tensor):
    """The (batch, head, position) strides of each (B, H, T, D) tensor, in one int64 array."""
    values = [s for t in tensors for s in t.stride()[:3]]
    return (ctypes.c_int64 * len(values))(*values)


def _shape_args(q: torch.Tensor) -> list:
    B, H, T, D = q.shape
    return [*(ctypes.c_int64(n) for n in (B, H, T, D)), ctypes.c_float(D ** -0.5)]


def forward(q, k, v, copy: Copy | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The output (B, T, H, D) and each row's softmax maximum and sum (B, H, T, 2)."""
    B, H, T, D = q.shape
    out, stats = q.new_empty(B, T, H, D), q.new_empty(B, H, T, 2)
    KERNEL.function("attention_fwd", copy)(*map(pointer, (q, k, v)), _strides(q, k, v), *_shape_args(q),
                                           pointer(out), pointer(stats), ctypes.c_int(torch.get_num_threads()))
    return out, stats


def backward(q, k, v, out, stats, dout, copy: Copy | None = None) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv, each (B, T, H, D)."""
    B, H, T, D = q.shape
    grads = [q.new_empty(B, T, H, D) for _ in range(3)]
    KERNEL.function("attention_bwd", copy)(*map(pointer, (q, k, v, dout)), _strides(q, k, v, dout),
                                           *_shape_args(q), pointer(out), pointer(stats), *map(pointer, grads),
                                           ctypes.c_int(torch.get_num_threads()))
    return tuple(grads)


class _CausalAttention(torch.autograd.Function):
    """Saves q, k, v (views of c_attn's output), the output and two floats a row: the backward
    recomputes the probabilities, as flash attention does, instead of keeping T x T of them."""

    @staticmethod
    def forward(ctx, q, k, v):
        out, stats = forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, stats)
        return out.transpose(1, 2)  # (B, H, T, D), its memory (B, T, H, D): the block's reshape is free

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, stats = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        return tuple(g.transpose(1, 2) for g in backward(q, k, v, out, stats, dout))


def handles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether attention(q, k, v) goes to the kernel: float32 (B, H, T, D) on the CPU with the
    head dimension contiguous, eager, the kernel's form in use."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 and t.shape == q.shape and t.stride(-1) == 1
                for t in (q, k, v))
            and q.dim() == 4 and q.numel() > 0 and not torch.compiler.is_compiling() and current() != SDPA)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D), causal) v, (B, H, T, D)."""
    return _CausalAttention.apply(q, k, v)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The same function by torch (the `sdpa` form, and the truth in float64)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
