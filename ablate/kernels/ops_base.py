"""What the `triton` and `cuda` backends share: the op definitions, their autograd, the
fallback to `reference`, and buffer allocation. A backend only supplies *launchers*, functions
that run one kernel on 2-D views with preallocated outputs (see `Launchers`).

Each backend registers the same seven custom ops under its own namespace (`ablate_triton::`,
`ablate_cuda::`) with `torch.library.custom_op`, so autograd and `torch.compile` see opaque ops
with fake (shape-only) implementations and a registered backward:

    act(x, name)                          -> y               backward: act_bwd
    gated(gate, up, name)                 -> y               backward: gated_bwd
    norm(x, w, b?, eps, rms)              -> y, mean, rstd   backward: norm_bwd
    add_norm(x, r, w, b?, eps, rms)       -> s, y, mean, rstd  (s = x + r, y = norm(s))

Layouts. A launcher receives 2-D tensors (rows, cols) whose last dimension has stride 1 and
whose rows may be strided (the halves of `c_fc(x).chunk(2, -1)` are, with row stride 2H); a
fully contiguous input is passed as one row (1, numel). Anything else (a last-dimension stride
other than 1, leading dimensions that do not collapse) is copied with `.contiguous()` first;
see `as_rows`. Outputs are always fresh contiguous tensors.

Precision. Inputs are float32 or bfloat16; kernels compute in float32 and round once on
store. Norm weights and biases are handed to kernels as float32; dweight/dbias are summed in
float32 (per-program partial rows, summed here) and returned in the weight's dtype. Other
dtypes (float16, float64), empty tensors, unknown activation names and norms wider than the
backend's `max_norm_width` fall back to the `reference` backend.
"""
import contextlib
import functools
from types import SimpleNamespace
from typing import Optional, Protocol

import torch
import torch.nn.functional as F

from ablate.kernels.reference import ReferenceBackend

# Activations with a kernel, in the order of the integer ids the kernels switch on.
# The math of each is the reference function of the same name in variants/activations.py.
ACTS = ("gelu", "gelu_erf", "relu", "silu", "relu2")
ACT_IDS = {name: i for i, name in enumerate(ACTS)}
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
T = torch.Tensor  # short, for the custom ops' signatures: torch reads each op's schema from its annotations

_POISON = [False]


@contextlib.contextmanager
def poisoned_outputs():
    """Every buffer a kernel writes into starts as NaN while this is active, so an element a
    kernel forgets to write shows up as NaN in the parity suite instead of as stale memory."""
    old = _POISON[0]
    _POISON[0] = True
    try:
        yield
    finally:
        _POISON[0] = old


def new_buffer(shape, dtype, device) -> torch.Tensor:
    if _POISON[0]:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def as_rows(t: torch.Tensor, flat: bool) -> torch.Tensor:
    """`t` as a 2-D (rows, cols) tensor with unit column stride, without copying when the
    layout allows: (1, numel) when `flat` and `t` is contiguous, else (prod(leading), last)
    with a row stride. A layout no row stride describes is made contiguous (a copy)."""
    if flat and t.is_contiguous():
        return t.view(1, -1)
    cols = t.shape[-1]
    if t.stride(-1) == 1:
        try:
            return t.view(-1, cols)
        except RuntimeError:  # leading dims do not collapse into one row stride
            pass
    return t.contiguous().view(-1, cols)


def rows_pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two same-shape tensors as 2-D views of one shape (flat only when both are contiguous)."""
    flat = a.is_contiguous() and b.is_contiguous()
    return as_rows(a, flat), as_rows(b, flat)


def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors of a CUDA device: the norm backward launches a few
    programs per SM, each writing one partial row of dweight/dbias."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@contextlib.contextmanager
def device_of(t: torch.Tensor):
    """Launch on `t`'s GPU even when another one is current (kernels launch on the current one)."""
    if t.is_cuda and t.device.index is not None and t.device.index != torch.cuda.current_device():
        with torch.cuda.device(t.device):
            yield
    else:
        yield


class Launchers(Protocol):
    """What a backend's kernel module provides. All tensors are 2-D (rows, cols) with unit
    column stride; `x`-like inputs may have a row stride, outputs are contiguous and share
    the inputs' (rows, cols). `act` is an index into ACTS. Float32 `w`, `b`, `mean`, `rstd`."""

    def act_fwd(self, act: int, x, y) -> None: ...
    def act_bwd(self, act: int, x, dy, dx) -> None: ...
    def gated_fwd(self, act: int, gate, up, y) -> None: ...
    def gated_bwd(self, act: int, gate, up, dy, dgate, dup) -> None: ...
    # s is written (s = x + r, rounded to x's dtype, then normalised) when r is given.
    # mean is None for RMSNorm.
    def norm_fwd(self, x, r, s, y, w, b, mean, rstd, eps: float, rms: bool) -> None: ...
    # How many partial rows of dweight/dbias the backward writes for (rows, cols).
    def norm_bwd_programs(self, rows: int, cols: int, device) -> int: ...
    # dx = norm backward(dy) (+ ds when given); dw_part/db_part (programs, cols) float32 partial
    # sums of dy * xhat and dy; db_part is None without a bias.
    def norm_bwd(self, dy, ds, x, w, mean, rstd, dx, dw_part, db_part, rms: bool) -> None: ...


def define_ops(ns: str, k: Launchers):
    """Register the seven custom ops (four forward, three backward) and their autograd under
    namespace `ns`, backed by `k`, one family at a time."""
    act, act_bwd = _activation_ops(ns, k)
    gated, gated_bwd = _gated_ops(ns, k)
    norm, add_norm = _norm_ops(ns, k)
    norm_bwd = _norm_bwd_op(ns, k)
    _norm_autograd(norm, add_norm, norm_bwd)
    return SimpleNamespace(act=act, act_bwd=act_bwd, gated=gated, gated_bwd=gated_bwd,
                           norm=norm, add_norm=add_norm, norm_bwd=norm_bwd)


def _activation_ops(ns: str, k: Launchers):
    """`ns::act(x, name)` and its backward `ns::act_bwd(x, dy, name)`."""
    @torch.library.custom_op(f"{ns}::act", mutates_args=())
    def act(x: T, name: str) -> T:
        y = new_buffer(x.shape, x.dtype, x.device)
        if x.numel():
            x2 = as_rows(x, flat=True)
            with device_of(x):
                k.act_fwd(ACT_IDS[name], x2, y.view(x2.shape))
        return y

    @act.register_fake
    def _(x, name):
        return x.new_empty(x.shape)

    @torch.library.custom_op(f"{ns}::act_bwd", mutates_args=())
    def act_bwd(x: T, dy: T, name: str) -> T:
        dx = new_buffer(x.shape, x.dtype, x.device)
        if x.numel():
            x2, dy2 = rows_pair(x, dy.to(x.dtype))
            with device_of(x):
                k.act_bwd(ACT_IDS[name], x2, dy2, dx.view(x2.shape))
        return dx

    @act_bwd.register_fake
    def _(x, dy, name):
        return x.new_empty(x.shape)

    def act_setup(ctx, inputs, output):
        x, name = inputs
        ctx.save_for_backward(x)
        ctx.name = name

    def act_backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return act_bwd(x, dy, ctx.name), None

    act.register_autograd(act_backward, setup_context=act_setup)
    return act, act_bwd


def _gated_ops(ns: str, k: Launchers):
    """Gated products act(gate) * up: `ns::gated(gate, up, name)` and `ns::gated_bwd`."""
    @torch.library.custom_op(f"{ns}::gated", mutates_args=())
    def gated(gate: T, up: T, name: str) -> T:
        y = new_buffer(gate.shape, gate.dtype, gate.device)
        if gate.numel():
            g2, u2 = rows_pair(gate, up)
            with device_of(gate):
                k.gated_fwd(ACT_IDS[name], g2, u2, y.view(g2.shape))
        return y

    @gated.register_fake
    def _(gate, up, name):
        return gate.new_empty(gate.shape)

    @torch.library.custom_op(f"{ns}::gated_bwd", mutates_args=())
    def gated_bwd(gate: T, up: T, dy: T, name: str) -> tuple[T, T]:
        dg = new_buffer(gate.shape, gate.dtype, gate.device)
        du = new_buffer(gate.shape, gate.dtype, gate.device)
        if gate.numel():
            dy = dy.to(gate.dtype)
            flat = gate.is_contiguous() and up.is_contiguous() and dy.is_contiguous()
            g2, u2, dy2 = (as_rows(t, flat) for t in (gate, up, dy))
            with device_of(gate):
                k.gated_bwd(ACT_IDS[name], g2, u2, dy2, dg.view(g2.shape), du.view(g2.shape))
        return dg, du

    @gated_bwd.register_fake
    def _(gate, up, dy, name):
        return gate.new_empty(gate.shape), gate.new_empty(gate.shape)

    def gated_setup(ctx, inputs, output):
        gate, up, name = inputs
        ctx.save_for_backward(gate, up)
        ctx.name = name

    def gated_backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dg, du = gated_bwd(gate, up, dy, ctx.name)
        return dg, du, None

    gated.register_autograd(gated_backward, setup_context=gated_setup)
    return gated, gated_bwd


# ---- LayerNorm / RMSNorm, and the fused residual add + norm ---------------------------------
def _norm_stats(x: T, rows: int, rms: bool) -> tuple[T, T]:
    """The float32 per-row mean (empty for RMSNorm) and rstd buffers a norm forward writes."""
    mean = new_buffer((0,) if rms else (rows,), torch.float32, x.device)
    rstd = new_buffer((rows,), torch.float32, x.device)
    return mean, rstd


def _float32_weights(weight: T, bias: Optional[T]) -> tuple[T, Optional[T]]:
    w = weight.to(torch.float32).contiguous()
    b = None if bias is None else bias.to(torch.float32).contiguous()
    return w, b


def _norm_ops(ns: str, k: Launchers):
    """The norm forwards: `ns::norm(x, w, b?, eps, rms)` and `ns::add_norm(x, r, w, b?, eps, rms)`."""
    @torch.library.custom_op(f"{ns}::norm", mutates_args=())
    def norm(x: T, weight: T, bias: Optional[T], eps: float, rms: bool) -> tuple[T, T, T]:
        cols = x.shape[-1]
        rows = x.numel() // cols
        y = new_buffer(x.shape, x.dtype, x.device)
        mean, rstd = _norm_stats(x, rows, rms)
        if rows:
            x2 = as_rows(x, flat=False)
            w, b = _float32_weights(weight, bias)
            with device_of(x):
                k.norm_fwd(x2, None, None, y.view(rows, cols), w, b, None if rms else mean, rstd, eps, rms)
        return y, mean, rstd

    @norm.register_fake
    def _(x, weight, bias, eps, rms):
        rows = x.numel() // x.shape[-1]
        f32 = dict(dtype=torch.float32)
        return x.new_empty(x.shape), x.new_empty((0,) if rms else (rows,), **f32), x.new_empty((rows,), **f32)

    @torch.library.custom_op(f"{ns}::add_norm", mutates_args=())
    def add_norm(x: T, r: T, weight: T, bias: Optional[T], eps: float, rms: bool) -> tuple[T, T, T, T]:
        cols = x.shape[-1]
        rows = x.numel() // cols
        s = new_buffer(x.shape, x.dtype, x.device)
        y = new_buffer(x.shape, x.dtype, x.device)
        mean, rstd = _norm_stats(x, rows, rms)
        if rows:
            x2, r2 = as_rows(x, flat=False), as_rows(r, flat=False)
            w, b = _float32_weights(weight, bias)
            with device_of(x):
                k.norm_fwd(x2, r2, s.view(rows, cols), y.view(rows, cols), w, b,
                           None if rms else mean, rstd, eps, rms)
        return s, y, mean, rstd

    @add_norm.register_fake
    def _(x, r, weight, bias, eps, rms):
        rows = x.numel() // x.shape[-1]
        f32 = dict(dtype=torch.float32)
        return (x.new_empty(x.shape), x.new_empty(x.shape),
                x.new_empty((0,) if rms else (rows,), **f32), x.new_empty((rows,), **f32))

    return norm, add_norm


def _norm_bwd_op(ns: str, k: Launchers):
    """`ns::norm_bwd`, the backward both norm forwards share."""
    @torch.library.custom_op(f"{ns}::norm_bwd", mutates_args=())
    def norm_bwd(dy: T, ds: Optional[T], x: T, weight: T, mean: T, rstd: T,
                 has_bias: bool, rms: bool) -> tuple[T, T, T]:
        """x is the norm's input (for add_norm: the sum s). ds, when given, is added to dx."""
        cols = x.shape[-1]
        rows = x.numel() // cols
        dx = new_buffer(x.shape, x.dtype, x.device)
        if not rows:
            dw = torch.zeros_like(weight)
            return dx, dw, torch.zeros_like(weight) if has_bias else weight.new_empty(0)
        programs = k.norm_bwd_programs(rows, cols, x.device)
        dw_part = new_buffer((programs, cols), torch.float32, x.device)
        db_part = new_buffer((programs, cols), torch.float32, x.device) if has_bias else None
        x2 = as_rows(x, flat=False)
        dy2 = as_rows(dy.to(x.dtype), flat=False)
        ds2 = None if ds is None else as_rows(ds.to(x.dtype), flat=False)
        w, _ = _float32_weights(weight, None)
        with device_of(x):
            k.norm_bwd(dy2, ds2, x2, w, None if rms else mean, rstd, dx.view(rows, cols), dw_part, db_part, rms)
        dw = dw_part.sum(0).to(weight.dtype)
        db = db_part.sum(0).to(weight.dtype) if has_bias else weight.new_empty(0)
        return dx, dw, db

    @norm_bwd.register_fake
    def _(dy, ds, x, weight, mean, rstd, has_bias, rms):
        return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape if has_bias else (0,))

    return norm_bwd


def _norm_autograd(norm, add_norm, norm_bwd) -> None:
    """Register the backward of `norm` and `add_norm`, both through `norm_bwd`."""
    def norm_setup(ctx, inputs, output):
        x, weight, bias, eps, rms = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_bias, ctx.rms = bias is not None, rms

    def norm_backward(ctx, dy, _dmean, _drstd):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = norm_bwd(dy, None, x, weight, mean, rstd, ctx.has_bias, ctx.rms)
        return dx, dw, (db if ctx.has_bias else None), None, None

    norm.register_autograd(norm_backward, setup_context=norm_setup)

    def add_norm_setup(ctx, inputs, output):
        x, r, weight, bias, eps, rms = inputs
        s, _, mean, rstd = output
        ctx.save_for_backward(s, weight, mean, rstd)
        ctx.has_bias, ctx.rms = bias is not None, rms
        ctx.set_materialize_grads(False)  # post-norm never uses s: no zero tensor to read

    def add_norm_backward(ctx, ds, dy, _dmean, _drstd):
        s, weight, mean, rstd = ctx.saved_tensors
        if dy is None:  # only s was used
            if ds is None:
                return None, None, None, None, None, None
            dy = torch.zeros_like(s)
        dx, dw, db = norm_bwd(dy, ds, s, weight, mean, rstd, ctx.has_bias, ctx.rms)
        # x and r receive the same gradient; autograd copies before accumulating into either.
        return dx, dx, dw, (db if ctx.has_bias else None), None, None

    add_norm.register_autograd(add_norm_backward, setup_context=add_norm_setup)


class KernelBackend:
    """The backend interface of ReferenceBackend, on a set of custom ops from `define_ops`.
    Whatever the ops do not cover goes to `reference`, so the result is always defined."""

    name = "kernels"
    max_norm_width = 8192

    def __init__(self, ops):
        self.ops = ops
        self.ref = ReferenceBackend()

    # Which devices this backend's kernels run on (a tensor's device).
    def device_ok(self, t: torch.Tensor) -> bool:
        return t.is_cuda

    def _ok(self, *ts) -> bool:
        first = ts[0]
        return all(
            t.dtype in KERNEL_DTYPES and t.device == first.device and t.numel() > 0 and self.device_ok(t)
            for t in ts
        )

    def _norm_ok(self, x, weight, bias) -> bool:
        if x.dim() < 1 or not self._ok(x):
            return False
        cols = x.shape[-1]
        if not 1 <= cols <= self.max_norm_width or weight is None or weight.shape != (cols,):
            return False
        if weight.device != x.device or not weight.is_floating_point():
            return False
        return bias is None or (bias.shape == (cols,) and bias.device == x.device and bias.is_floating_point())

    # ---- the interface -----------------------------------------------------------------
    def activation(self, name: str, x: torch.Tensor) -> torch.Tensor:
        if name not in ACT_IDS or not self._ok(x):
            return self.ref.activation(name, x)
        return self.ops.act(x, name)

    def linear_activation(self, name: str, x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
        return self.activation(name, F.linear(x, weight, bias))  # torch's matmul, then the kernel

    def dense_mlp(self, name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  weight2: torch.Tensor, bias2: torch.Tensor | None) -> torch.Tensor:
        return F.linear(self.linear_activation(name, x, weight, bias), weight2, bias2)

    def gated(self, gate_act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if (gate_act not in ACT_IDS or gate.shape != up.shape or gate.dtype != up.dtype
                or not self._ok(gate, up)):
            return self.ref.gated(gate_act, gate, up)
        return self.ops.gated(gate, up, gate_act)

    def attention(self, q, k, v):
        return self.ref.attention(q, k, v)  # torch's flash kernels on a GPU

    @staticmethod
    def _autocast_fp32(x: torch.Tensor) -> bool:
        # Under CUDA autocast, torch runs layer_norm in float32 and returns float32; mirror it
        # so that a backend never changes the dtype flowing through the model.
        return x.is_cuda and x.dtype != torch.float32 and torch.is_autocast_enabled("cuda")

    def layer_norm(self, x, weight, bias, eps: float):
        if self._autocast_fp32(x):
            x = x.float()
        if not self._norm_ok(x, weight, bias):
            return self.ref.layer_norm(x, weight, bias, eps)
        return self.ops.norm(x, weight, bias, float(eps), False)[0]

    def rms_norm(self, x, weight, eps: float):
        if not self._norm_ok(x, weight, None):
            return self.ref.rms_norm(x, weight, eps)
        return self.ops.norm(x, weight, None, float(eps), True)[0]

    def _add_norm(self, x, y, weight, bias, eps, rms):
        if x.shape != y.shape:  # broadcasting add: not fused
            return None
        if x.dtype != y.dtype:  # mixed (e.g. float32 stream + bfloat16 branch): promote, as x + y does
            dt = torch.promote_types(x.dtype, y.dtype)
            x, y = x.to(dt), y.to(dt)
        if not self._norm_ok(x, weight, bias) or not self._ok(x, y):
            return None
        s, out, _, _ = self.ops.add_norm(x, y, weight, bias, float(eps), rms)
        return s, out

    def add_layer_norm(self, x, y, weight, bias, eps: float):
        if self._autocast_fp32(x) or self._autocast_fp32(y):
            if torch.promote_types(x.dtype, y.dtype) != torch.float32:
                s = x + y
                return s, self.layer_norm(s, weight, bias, eps)
        r = self._add_norm(x, y, weight, bias, eps, False)
        return r if r is not None else self.ref.add_layer_norm(x, y, weight, bias, eps)

    def add_rms_norm(self, x, y, weight, eps: float):
        r = self._add_norm(x, y, weight, None, eps, True)
        return r if r is not None else self.ref.add_rms_norm(x, y, weight, eps)
