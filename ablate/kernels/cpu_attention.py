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


def backward(q, k, v, out, stats, dout, copy: Copy | None = None, packed: bool = False) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv, each (B, T, H, D); `packed`: (dqkv,), one (B, T, 3 H D) tensor holding them."""
    B, H, T, D = q.shape
    if packed:
        grads = (q.new_empty(B, T, 3 * H * D),)
        pointers, row = [ctypes.c_void_p(grads[0].data_ptr() + i * H * D * 4) for i in range(3)], 3 * H * D
    else:
        grads = tuple(q.new_empty(B, T, H, D) for _ in range(3))
        pointers, row = list(map(pointer, grads)), H * D
    KERNEL.function("attention_bwd", copy)(*map(pointer, (q, k, v, dout)), _strides(q, k, v, dout),
                                           *_shape_args(q), pointer(out), pointer(stats), *pointers,
                                           ctypes.c_int64(row), ctypes.c_int(torch.get_num_threads()))
    return grads


class _CausalAttention(torch.autograd.Function):
    """Saves q, k, v, the output and two floats a row: the backward recomputes the
    probabilities, as flash attention does, instead of keeping T x T of them. Used where q, k, v
    are not c_attn's output's heads (qk-norm's normalised queries and keys, a caller's own)."""

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


def heads_of(qkv: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """q, k, v as (B, H, T, D) views of a (B, T, 3 H D) tensor: c_attn's output as the model
    splits it, the layout the kernel takes whole."""
    B, T, C3 = qkv.shape
    return [t.view(B, T, heads, C3 // 3 // heads).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2)]


class _PackedCausalAttention(torch.autograd.Function):
    """The same on c_attn's output itself, when q, k and v are its thirds as heads (the model
    without qk-norm): the backward writes dq, dk and dv into one gradient of it, where autograd
    would join three (a copy of c_attn's output's size a block, about 1% of a `tiny` step)."""

    @staticmethod
    def forward(ctx, qkv, heads: int):
        q, k, v = heads_of(qkv, heads)
        out, stats = forward(q, k, v)
        ctx.heads = heads
        ctx.save_for_backward(qkv, out, stats)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, dout):
        qkv, out, stats = ctx.saved_tensors
        if dout.stride(-1) != 1:
            dout = dout.contiguous()
        (dqkv,) = backward(*heads_of(qkv, ctx.heads), out, stats, dout, packed=True)
        return dqkv, None


def packed_source(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """The (B, T, 3 H D) tensor q, k, v are the heads of (as CausalSelfAttention.heads views
    them), or None. It is read from the views' common base (for nn.Linear on a 3-D input, its
    2-D output), so the gradient reaches c_attn as through the views."""
    base, (B, H, T, D) = q._base, q.shape
    if (base is None or k._base is not base or v._base is not base or not base.is_contiguous()
            or base.numel() != B * T * 3 * H * D):
        return None
    qkv = base.view(B, T, 3 * H * D)
    return qkv if all(t.storage_offset() == w.storage_offset() and t.stride() == w.stride()
                      for t, w in zip((q, k, v), heads_of(qkv, H))) else None


def handles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether attention(q, k, v) goes to the kernel: float32 (B, H, T, D) on the CPU with the
    head dimension contiguous, eager, the kernel's form in use."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 and t.shape == q.shape and t.stride(-1) == 1
                for t in (q, k, v))
            and q.dim() == 4 and q.numel() > 0 and not torch.compiler.is_compiling() and current() != SDPA)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(D), causal) v, (B, H, T, D). The same bits either way."""
    qkv = packed_source(q, k, v)
    if qkv is not None:
        return _PackedCausalAttention.apply(qkv, q.shape[1])
    return _CausalAttention.apply(q, k, v)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The same function by torch (the `sdpa` form, and the truth in float64)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)
