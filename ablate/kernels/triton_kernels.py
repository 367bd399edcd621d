"""Triton kernels and their launchers (the `Launchers` protocol of ops_base).

The math mirrors the CUDA kernels in cuda/*.cu line for line (same formulas, float32
throughout, one rounding on store), so that the parity suite, which runs these under
TRITON_INTERPRET=1 on a CPU, also checks the formulas the CUDA code uses.

Whether the kernels are interpreted is fixed when this module is imported (Triton decides at
decoration time): with TRITON_INTERPRET=1 they run on CPU tensors, otherwise on CUDA tensors.
"""
from __future__ import annotations

import functools

import numpy as np
import triton
import triton.language as tl

from ablate.kernels.ops_base import sm_count

INTERPRETED = bool(triton.knobs.runtime.interpret)

# GELU tanh approximation: 0.5 x (1 + tanh(u)) with u = K (x + C x^3), written as the equal
# x * sigmoid(2u), whose derivative is s + x s (1 - s) 2 K (1 + 3 C x^2) with s = sigmoid(2u).
GELU_K = tl.constexpr(0.7978845608028654)  # sqrt(2 / pi)
GELU_C = tl.constexpr(0.044715)
INV_SQRT2 = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)

# Triton's interpreter converts float32 -> bfloat16 by truncation (compiled Triton, CUDA and
# torch round to nearest even); under the interpreter, stores round explicitly instead.
_RNE_BY_HAND = tl.constexpr(INTERPRETED)

# act ids: see ops_base.ACTS
GELU, GELU_ERF, RELU, SILU, RELU2 = 0, 1, 2, 3, 4


@triton.jit
def _cast(y, DTYPE: tl.constexpr):
    """float32 y rounded to DTYPE (round to nearest even)."""
    if _RNE_BY_HAND and DTYPE == tl.bfloat16:
        b = y.to(tl.uint32, bitcast=True)
        b = b + 0x7FFF + ((b >> 16) & 1)
        return (b >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return y.to(DTYPE)


@triton.jit
def _act_fwd(x, ACT: tl.constexpr):
    """act(x) for float32 x."""
    if ACT == 0:  # gelu (tanh)
        u = GELU_K * (x + GELU_C * x * x * x)
        y = x / (1.0 + tl.exp(-2.0 * u))
    elif ACT == 1:  # gelu_erf
        y = 0.5 * x * (1.0 + tl.math.erf(x * INV_SQRT2))
    elif ACT == 2:  # relu (NaN passes through, as torch.relu)
        y = tl.where(x <= 0.0, 0.0, x)
    elif ACT == 3:  # silu
        y = x / (1.0 + tl.exp(-x))
    else:  # relu2
        r = tl.where(x <= 0.0, 0.0, x)
        y = r * r
    return y


@triton.jit
def _act_fwd_grad(x, ACT: tl.constexpr):
    """(act(x), act'(x)) for float32 x; the derivatives are analytic."""
    if ACT == 0:
        x2 = x * x
        u = GELU_K * (x + GELU_C * x2 * x)
        e = tl.exp(-2.0 * u)
        s = 1.0 / (1.0 + e)
        om = tl.where(s > 0.5, e * s, 1.0 - s)  # 1 - s without cancellation as s -> 1
        y = x * s
        d = s + x * s * om * (2.0 * GELU_K) * (1.0 + 3.0 * GELU_C * x2)
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.math.erf(x * INV_SQRT2))
        y = x * cdf
        d = cdf + x * INV_SQRT_2PI * tl.exp(-0.5 * x * x)
    elif ACT == 2:
        y = tl.where(x <= 0.0, 0.0, x)
        d = tl.where(x > 0.0, 1.0, 0.0)
    elif ACT == 3:
        e = tl.exp(-x)
        s = 1.0 / (1.0 + e)
        om = tl.where(s > 0.5, e * s, 1.0 - s)
        y = x * s
        d = s * (1.0 + x * om)
    else:
        r = tl.where(x <= 0.0, 0.0, x)
        y = r * r
        d = 2.0 * r
    return y, d


# ---- elementwise: one program per BLOCK columns of one row -----------------------------------

@triton.jit
def _act_fwd_kernel(X, Y, cols, x_rs, col_blocks, ACT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // col_blocks
    c = (pid % col_blocks) * BLOCK + tl.arange(0, BLOCK)
    m = c < cols
    x = tl.load(X + row * x_rs + c, mask=m, other=0.0).to(tl.float32)
    y = _act_fwd(x, ACT)
    tl.store(Y + row * cols + c, _cast(y, Y.dtype.element_ty), mask=m)


@triton.jit
def _act_bwd_kernel(X, DY, DX, cols, x_rs, dy_rs, col_blocks, ACT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // col_blocks
    c = (pid % col_blocks) * BLOCK + tl.arange(0, BLOCK)
    m = c < cols
    x = tl.load(X + row * x_rs + c, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * dy_rs + c, mask=m, other=0.0).to(tl.float32)
    _, d = _act_fwd_grad(x, ACT)
    tl.store(DX + row * cols + c, _cast(dy * d, DX.dtype.element_ty), mask=m)


@triton.jit
def _gated_fwd_kernel(G, U, Y, cols, g_rs, u_rs, col_blocks, ACT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // col_blocks
    c = (pid % col_blocks) * BLOCK + tl.arange(0, BLOCK)
    m = c < cols
    g = tl.load(G + row * g_rs + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(U + row * u_rs + c, mask=m, other=0.0).to(tl.float32)
    y = _act_fwd(g, ACT) * u
    tl.store(Y + row * cols + c, _cast(y, Y.dtype.element_ty), mask=m)


@triton.jit
def _gated_bwd_kernel(G, U, DY, DG, DU, cols, g_rs, u_rs, dy_rs, col_blocks,
                      ACT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // col_blocks
    c = (pid % col_blocks) * BLOCK + tl.arange(0, BLOCK)
    m = c < cols
    g = tl.load(G + row * g_rs + c, mask=m, other=0.0).to(tl.float32)
    u = tl.load(U + row * u_rs + c, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * dy_rs + c, mask=m, other=0.0).to(tl.float32)
    a, d = _act_fwd_grad(g, ACT)
    tl.store(DG + row * cols + c, _cast(dy * u * d, DG.dtype.element_ty), mask=m)
    tl.store(DU + row * cols + c, _cast(dy * a, DU.dtype.element_ty), mask=m)


# ---- norms: forward one program per row; backward one program per group of rows ------------

@triton.jit
def _norm_fwd_kernel(X, R, S, Y, W, B, Mean, Rstd, cols, x_rs, r_rs, eps,
                     HAS_RES: tl.constexpr, HAS_BIAS: tl.constexpr, RMS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    m = c < cols
    x = tl.load(X + row * x_rs + c, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        # s = x + r rounded to the input dtype (as torch's x + r), then normalised as rounded
        r = tl.load(R + row * r_rs + c, mask=m, other=0.0).to(tl.float32)
        s = _cast(x + r, S.dtype.element_ty)
        tl.store(S + row * cols + c, s, mask=m)
        x = s.to(tl.float32)
    if RMS:
        var = tl.sum(x * x, axis=0) / cols
        xc = x
    else:
        mean = tl.sum(x, axis=0) / cols
        xc = tl.where(m, x - mean, 0.0)
        var = tl.sum(xc * xc, axis=0) / cols
        tl.store(Mean + row, mean)
    rstd = 1.0 / tl.sqrt_rn(var + eps)
    tl.store(Rstd + row, rstd)
    w = tl.load(W + c, mask=m, other=0.0)
    y = xc * rstd * w
    if HAS_BIAS:
        y += tl.load(B + c, mask=m, other=0.0)
    tl.store(Y + row * cols + c, _cast(y, Y.dtype.element_ty), mask=m)


@triton.jit
def _sum_partials_if_last(Part, Out, Count, n_parts, cols, c, m):
    """Called by every program of a reducing backward after it stored its row of Part
    (n_parts, cols): the program that arrives last sums the rows in a fixed order into Out
    (float32) and resets the counter. The barrier puts the program's stores ahead of its
    counter update (acq_rel at GPU scope); the last program's loads bypass L1 (.cg)."""
    tl.debug_barrier()
    done = tl.atomic_add(Count, 1)
    if done == n_parts - 1:
        acc = tl.zeros(c.shape, dtype=tl.float32)
        for p in range(0, n_parts):
            acc += tl.load(Part + p * cols + c, mask=m, other=0.0, cache_modifier=".cg")
        tl.store(Out + c, acc, mask=m)
        tl.atomic_xchg(Count, 0)


@triton.jit
def _norm_bwd_kernel(DY, DS, X, W, Mean, Rstd, DX, DWp, DBp, DW, DB, Count, rows, cols, dy_rs, ds_rs, x_rs,
                     rows_per_prog, HAS_DS: tl.constexpr, HAS_BIAS: tl.constexpr, RMS: tl.constexpr,
                     BLOCK: tl.constexpr):
    """dx = rstd (w dy - xhat c1 - c2) with c1 = mean(xhat w dy), c2 = mean(w dy) (c2 = 0 for
    RMSNorm); partial dw += dy xhat and db += dy over this program's rows, summed into DW, DB
    by the last program (Count[0] counts dw's partial rows, Count[1] db's)."""
    pid = tl.program_id(0)
    c = tl.arange(0, BLOCK)
    m = c < cols
    w = tl.load(W + c, mask=m, other=0.0)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    start = pid.to(tl.int64) * rows_per_prog
    end = tl.minimum(start + rows_per_prog, rows)
    for row in range(start, end):
        x = tl.load(X + row * x_rs + c, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * dy_rs + c, mask=m, other=0.0).to(tl.float32)
        rstd = tl.load(Rstd + row)
        if RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(m, (x - tl.load(Mean + row)) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / cols
        if RMS:
            dx = (wdy - xhat * c1) * rstd
        else:
            c2 = tl.sum(wdy, axis=0) / cols
            dx = (wdy - (xhat * c1 + c2)) * rstd
        if HAS_DS:
            dx += tl.load(DS + row * ds_rs + c, mask=m, other=0.0).to(tl.float32)
        tl.store(DX + row * cols + c, _cast(dx, DX.dtype.element_ty), mask=m)
        dw += dy * xhat
        db += dy
    n = tl.num_programs(0)
    tl.store(DWp + pid * cols + c, dw, mask=m)
    _sum_partials_if_last(DWp, DW, Count, n, cols, c, m)
    if HAS_BIAS:
        tl.store(DBp + pid * cols + c, db, mask=m)
        _sum_partials_if_last(DBp, DB, Count + 1, n, cols, c, m)


# ---- bias + activation: y = act(x + b); backward dx and db = sum over rows of dx ------------

@triton.jit
def _bias_act_fwd_kernel(X, B, Y, cols, x_rs, col_blocks, ACT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // col_blocks
    c = (pid % col_blocks) * BLOCK + tl.arange(0, BLOCK)
    m = c < cols
    x = tl.load(X + row * x_rs + c, mask=m, other=0.0).to(tl.float32) + tl.load(B + c, mask=m, other=0.0)
    tl.store(Y + row * cols + c, _cast(_act_fwd(x, ACT), Y.dtype.element_ty), mask=m)


@triton.jit
def _bias_act_bwd_kernel(X, B, DY, DX, DBp, DB, Count, rows, cols, x_rs, dy_rs, rows_per_prog,
                         ACT: tl.constexpr, BLOCK: tl.constexpr):
    """Program (i, j): rows i*rows_per_prog.. of column block j; its float32 sum of dx over
    those rows is row i of DBp, and the last program of column block j sums them into DB."""
    pid = tl.program_id(0)
    cb = tl.program_id(1)
    c = cb * BLOCK + tl.arange(0, BLOCK)
    m = c < cols
    b = tl.load(B + c, mask=m, other=0.0)
    db = tl.zeros([BLOCK], dtype=tl.float32)
    start = pid.to(tl.int64) * rows_per_prog
    end = tl.minimum(start + rows_per_prog, rows)
    for row in range(start, end):
        x = tl.load(X + row * x_rs + c, mask=m, other=0.0).to(tl.float32) + b
        dy = tl.load(DY + row * dy_rs + c, mask=m, other=0.0).to(tl.float32)
        _, d = _act_fwd_grad(x, ACT)
        dx = tl.where(m, dy * d, 0.0)
        tl.store(DX + row * cols + c, _cast(dx, DX.dtype.element_ty), mask=m)
        db += dx
    tl.store(DBp + pid * cols + c, db, mask=m)
    _sum_partials_if_last(DBp, DB, Count + cb, tl.num_programs(0), cols, c, m)


# ---- launchers ------------------------------------------------------------------------------

MAX_NORM_WIDTH = 16384  # one row per program held in registers; wider rows use `reference`


def _ew_block(cols: int) -> int:
    # Interpreted programs cost per program, not per element: take bigger blocks there.
    return min(4096 if INTERPRETED else 1024, triton.next_power_of_2(cols))


def _norm_warps(block: int) -> int:
    return min(max(block // 256, 1), 16)


def _quiet(fn):
    """Under the interpreter, numpy warns where the GPU silently overflows (exp(-x) -> inf)."""
    if not INTERPRETED:
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            return fn(*args, **kwargs)

    return wrapper


@_quiet
def act_fwd(act, x, y):
    rows, cols = x.shape
    block = _ew_block(cols)
    nb = triton.cdiv(cols, block)
    _act_fwd_kernel[(rows * nb,)](x, y, cols, x.stride(0), nb, ACT=act, BLOCK=block)


@_quiet
def act_bwd(act, x, dy, dx):
    rows, cols = x.shape
    block = _ew_block(cols)
    nb = triton.cdiv(cols, block)
    _act_bwd_kernel[(rows * nb,)](x, dy, dx, cols, x.stride(0), dy.stride(0), nb, ACT=act, BLOCK=block)


@_quiet
def gated_fwd(act, gate, up, y):
    rows, cols = gate.shape
    block = _ew_block(cols)
    nb = triton.cdiv(cols, block)
    _gated_fwd_kernel[(rows * nb,)](gate, up, y, cols, gate.stride(0), up.stride(0), nb, ACT=act, BLOCK=block)


@_quiet
def gated_bwd(act, gate, up, dy, dgate, dup):
    rows, cols = gate.shape
    block = _ew_block(cols)
    nb = triton.cdiv(cols, block)
    _gated_bwd_kernel[(rows * nb,)](gate, up, dy, dgate, dup, cols, gate.stride(0), up.stride(0), dy.stride(0),
                                    nb, ACT=act, BLOCK=block)


@_quiet
def norm_fwd(x, r, s, y, w, b, mean, rstd, eps, rms):
    rows, cols = x.shape
    block = triton.next_power_of_2(cols)
    has_res = r is not None
    _norm_fwd_kernel[(rows,)](
        x, r if has_res else x, s if has_res else y, y, w, b if b is not None else w,
        mean if mean is not None else rstd, rstd, cols, x.stride(0), r.stride(0) if has_res else 0, eps,
        HAS_RES=has_res, HAS_BIAS=b is not None, RMS=rms, BLOCK=block, num_warps=_norm_warps(block))


def _reducing_programs(rows: int, device) -> int:
    """Programs of a reducing backward (each a partial row): 2 per SM on a GPU, 4 interpreted.
    The last one sums them all, so more would make that sum the long pole."""
    if device.type != "cuda" or INTERPRETED:
        return max(1, min(rows, 4))
    return max(1, min(rows, 2 * sm_count(device)))


def norm_bwd_programs(rows, cols, device):
    return _reducing_programs(rows, device)


@_quiet
def norm_bwd(dy, ds, x, w, mean, rstd, dx, dw_part, db_part, dw, db, count, rms):
    rows, cols = x.shape
    programs = dw_part.shape[0]
    rows_per_prog = triton.cdiv(rows, programs)
    block = triton.next_power_of_2(cols)
    has_ds, has_bias = ds is not None, db is not None
    _norm_bwd_kernel[(programs,)](
        dy, ds if has_ds else dy, x, w, mean if mean is not None else rstd, rstd, dx, dw_part,
        db_part if has_bias else dw_part, dw, db if has_bias else dw, count, rows, cols, dy.stride(0),
        ds.stride(0) if has_ds else 0, x.stride(0), rows_per_prog,
        HAS_DS=has_ds, HAS_BIAS=has_bias, RMS=rms, BLOCK=block, num_warps=_norm_warps(block))


@_quiet
def bias_act_fwd(act, x, b, y):
    rows, cols = x.shape
    block = _ew_block(cols)
    nb = triton.cdiv(cols, block)
    _bias_act_fwd_kernel[(rows * nb,)](x, b, y, cols, x.stride(0), nb, ACT=act, BLOCK=block)


def bias_act_programs(rows, cols, device):
    return _reducing_programs(rows, device)


@_quiet
def bias_act_bwd(act, x, b, dy, dx, db_part, db, count):
    rows, cols = x.shape
    programs = db_part.shape[0]
    block = _ew_block(cols)
    _bias_act_bwd_kernel[(programs, triton.cdiv(cols, block))](
        x, b, dy, dx, db_part, db, count, rows, cols, x.stride(0), dy.stride(0), triton.cdiv(rows, programs),
        ACT=act, BLOCK=block)
