"""Causal self-attention on the CPU, forward and backward, in a C kernel (cpu/attention.c) built
with the system's C compiler at first use and cached, called through ctypes: the `cpu`
backend's `attention` on float32 CPU tensors (ablate/kernels/cpu_backend.py).

Why: at the harness's CPU sizes (head dimension 16, context 64) torch's CPU flash-attention
kernel reaches about a tenth of the matmul peak, and attention was a fifth of a `tiny` step:
most of what stood between the default block and nanoGPT's model (issue #29).

Forms (config.json `attention_cpu`; a resumed run keeps its own, ablate.engine.train):
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

from ablate.kernels.cpu_build import AVX512, AVX512_NEEDS, Copy, CpuKernel, EXACT

SDPA = "sdpa"
# Loop distribution would turn the 64-byte row copies into calls to memcpy (10% of the time).
_FLAGS = (*EXACT, "-fno-tree-loop-distribute-patterns")
FORMS = {
    "blocked": (Copy("blocked_avx512", "attention.c", (*_FLAGS, *AVX512), AVX512_NEEDS),
                Copy("blocked_avx2", "attention.c", (*_FLAGS, "-mavx2", "-mfma"), ("avx2", "fma"))),
}
_P, _I64, _I, _F, _ARRAY = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.POINTER(ctypes.c_int64)
SIGNATURES = {  # argument types, so a call passes Python ints and floats (ctypes converts them in C)
    "attention_fwd": (_P, _P, _P, _ARRAY, _I64, _I64, _I64, _I64, _F, _P, _P, _I),
    "attention_bwd": (_P, _P, _P, _P, _ARRAY, _I64, _I64, _I64, _I64, _F, _P, _P, _P, _P, _P, _I64, _I),
}
KERNEL = CpuKernel("attention", FORMS, SDPA, SIGNATURES, headers=("exp_poly.h", "thread_mode.h"))
library, available, best, using, current = KERNEL.library, KERNEL.available, KERNEL.best, KERNEL.using, KERNEL.current

# The kernels take each tensor as its data pointer and (batch, head, position) strides, in one
# int64 array a call; a training step passes the same strides every time, so each array is kept.
_ARRAYS: dict[tuple[int, ...], ctypes.Array] = {}


def _array(strides: tuple[int, ...]) -> ctypes.Array:
    if strides not in _ARRAYS:
        if len(_ARRAYS) > 256:  # shapes that come and go (a test's, a bench's)
            _ARRAYS.clear()
        _ARRAYS[strides] = (ctypes.c_int64 * len(strides))(*strides)
    return _ARRAYS[strides]


def _heads(*tensors: torch.Tensor) -> tuple[list[int], tuple[int, ...]]:
    """Data pointers and strides of (B, H, T, D) tensors, as the kernels take them."""
    return [t.data_ptr() for t in tensors], tuple(s for t in tensors for s in t.stride()[:3])


def _packed_heads(qkv: torch.Tensor, heads: int) -> tuple[list[int], tuple[int, ...]]:
    """The same for heads_of(qkv, heads)'s q, k and v, without making the views (~15 us)."""
    B, T, C3 = qkv.shape
    base, C = qkv.data_ptr(), C3 // 3
    return [base + i * C * 4 for i in range(3)], (T * C3, C // heads, C3) * 3


def _forward(pointers: list[int], strides: tuple[int, ...], shape: torch.Size, copy: Copy | None = None):
    B, H, T, D = shape
    out, stats = torch.empty(B, T, H, D, dtype=torch.float32), torch.empty(B, H, T, 2, dtype=torch.float32)
    KERNEL.function("attention_fwd", copy)(*pointers, _array(strides), B, H, T, D, D ** -0.5, out.data_ptr(),
                                           stats.data_ptr(), torch.get_num_threads())
    return out, stats


def _backward(pointers: list[int], strides: tuple[int, ...], shape: torch.Size, out: torch.Tensor,
              stats: torch.Tensor, dout: torch.Tensor, grads: list[int], grad_row: int, copy: Copy | None = None):
    """Writes dq, dk, dv at the pointers `grads`, rows `grad_row` floats apart."""
    B, H, T, D = shape
    (dout_pointer,), dout_strides = _heads(dout)
    KERNEL.function("attention_bwd", copy)(*pointers, dout_pointer, _array(strides + dout_strides), B, H, T, D,
                                           D ** -0.5, out.data_ptr(), stats.data_ptr(), *grads, grad_row,
                                           torch.get_num_threads())


def forward(q, k, v, copy: Copy | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The output (B, T, H, D) and each row's softmax maximum and sum (B, H, T, 2)."""
    return _forward(*_heads(q, k, v), q.shape, copy)


def backward(q, k, v, out, stats, dout, copy: Copy | None = None) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv, each (B, T, H, D)."""
    B, H, T, D = q.shape
    grads = tuple(torch.empty(B, T, H, D, dtype=torch.float32) for _ in range(3))
    _backward(*_heads(q, k, v), q.shape, out, stats, dout, [g.data_ptr() for g in grads], H * D, copy)
    return grads


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


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
        return tuple(g.transpose(1, 2) for g in backward(q, k, v, out, stats, _last_dim_contiguous(dout)))


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
        B, T, C3 = qkv.shape
        ctx.shape = torch.Size((B, heads, T, C3 // 3 // heads))
        out, stats = _forward(*_packed_heads(qkv, heads), ctx.shape)
        ctx.save_for_backward(qkv, out, stats)
        return out.transpose(1, 2)

    @staticmethod
    def backward(ctx, dout):
        qkv, out, stats = ctx.saved_tensors
        heads, dqkv = ctx.shape[1], torch.empty(qkv.shape, dtype=torch.float32)
        _backward(*_packed_heads(qkv, heads), ctx.shape, out, stats, _last_dim_contiguous(dout),
                  _packed_heads(dqkv, heads)[0], qkv.shape[2])  # dq, dk, dv where q, k, v sit in qkv
        return dqkv, None


def packed_source(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """The (B, T, 3 H D) tensor q, k, v are the heads of (as heads_of views them), or None. It
    is read from the views' common base (for nn.Linear on a 3-D input, its 2-D output), so the
    gradient reaches c_attn as through the views. Checked against _packed_heads' pointers and
    strides: building heads_of's views costs more than the kernel's call (~30 us)."""
    base, (B, H, T, D) = q._base, q.shape
    if (base is None or k._base is not base or v._base is not base or not base.is_contiguous()
            or base.numel() != B * T * 3 * H * D):
        return None
    qkv = base.view(B, T, 3 * H * D)
    pointers, strides = _packed_heads(qkv, H)
    for t, pointer in zip((q, k, v), pointers):  # a dimension of size 1 may have any stride
        if t.data_ptr() != pointer or t.stride(-1) != 1 or any(
                n > 1 and s != want for n, s, want in zip(t.shape[:3], t.stride()[:3], strides[:3])):
            return None
    return qkv


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
