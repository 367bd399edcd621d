"""What the `triton` and `cuda` backends share: the op definitions, their autograd, the
fallback to `reference`, and buffer allocation. A backend only supplies *launchers*, functions
that run one kernel on 2-D views with preallocated outputs (see `Launchers`).

Two bindings of the same kernels, chosen per call by `KernelBackend`:

- eager (the training loop, CUDA-graph capture): one `torch.autograd.Function` per op that
  calls the launchers directly. A custom op's autograd goes through the dispatcher twice and
  builds the same kind of Function inside; calling the Function ourselves skips that (about 3x
  less host time per call, see docs/kernels.md). No Python-free backward exists for a kernel
  defined from Python: that needs a C++ autograd kernel.
- under `torch.compile` (`torch.compiler.is_compiling()`): the custom ops registered here with
  `torch.library.custom_op` under the backend's namespace (`ablate_triton::`, `ablate_cuda::`),
  opaque to the compiler, with fake (shape-only) implementations and a registered backward:

    act(x, name)                          -> y               backward: act_bwd
    gated(gate, up, name)                 -> y               backward: gated_bwd
    norm(x, w, b?, eps, rms)              -> y, mean, rstd   backward: norm_bwd
    add_norm(x, r, w, b?, eps, rms)       -> s, y, mean, rstd  (s = x + r, y = norm(s))
    bias_act(x, b, name)                  -> y = act(x + b)  backward: bias_act_bwd (dx, db)
                                             (only for launchers that have bias_act kernels)

Layouts. A launcher receives 2-D tensors (rows, cols) whose last dimension has stride 1 and
whose rows may be strided (the halves of `c_fc(x).chunk(2, -1)` are, with row stride 2H); a
fully contiguous input is passed as one row (1, numel). Anything else (a last-dimension stride
other than 1, leading dimensions that do not collapse) is copied with `.contiguous()` first;
see `as_rows`. Outputs are always fresh contiguous tensors.

Precision. Inputs are float32 or bfloat16; kernels compute in float32 and round once on
store. Norm weights and biases are handed to kernels as float32 (a float32 parameter as it is;
another dtype cast once per parameter version and cached); dweight/dbias are summed in float32
inside the backward kernel (per-program partial rows in a cached scratch buffer, summed in a
fixed order by the program that finishes last: deterministic, no extra launch) and returned in
the weight's dtype. Other dtypes (float16, float64), empty tensors, unknown activation names
and norms wider than the backend's `max_norm_width` fall back to the `reference` backend.
"""
import contextlib
import functools
from types import SimpleNamespace
from typing import Optional, Protocol

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from ablate.kernels.reference import ReferenceBackend

# Activations with a kernel, in the order of the integer ids the kernels switch on.
# The math of each is the reference function of the same name in variants/activations.py.
ACTS = ("gelu", "gelu_erf", "relu", "silu", "relu2")
ACT_IDS = {name: i for i, name in enumerate(ACTS)}
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
T = torch.Tensor  # short, for the custom ops' signatures: torch reads each op's schema from its annotations
F32 = torch.float32

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
    """The streaming multiprocessors of a CUDA device: the reducing backwards launch a few
    programs per SM, each writing one partial row of dweight/dbias."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _several_gpus() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 1


_SAME_DEVICE = contextlib.nullcontext()


def device_of(t: torch.Tensor):
    """Launch on `t`'s GPU even when another one is current (kernels launch on the current one).
    With one GPU (or none) it is a shared no-op context: nothing to look up per call."""
    if t.is_cuda and _several_gpus() and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return _SAME_DEVICE


def _stream_key(device: torch.device) -> int:
    """The current CUDA stream as an integer (0 on a CPU): scratch is per stream, so kernels
    on two streams never share a counter."""
    if device.type != "cuda":
        return 0
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


_SCRATCH: dict[tuple, tuple[T, T, T]] = {}


def reduce_scratch(device: torch.device, programs: int, cols: int) -> tuple[T, T, T]:
    """(first partials, second partials, counters) for a reducing backward: two float32
    (programs, cols) buffers every program overwrites its row of, and `cols` int32 counters,
    zero between launches (the last program of a launch resets what it counted; at least 2). Allocated
    once per device, stream and shape; kernels on one stream run in order, so they can share."""
    key = (device, _stream_key(device), programs, cols)
    got = _SCRATCH.get(key)
    if got is None:
        part = torch.empty((2, programs, cols), dtype=F32, device=device)
        got = _SCRATCH[key] = (part[0], part[1], torch.zeros(max(cols, 2), dtype=torch.int32, device=device))
    return got


_F32_CACHE = WeakIdKeyDictionary()  # parameter -> (its version, its float32 copy); by identity


def float32_param(t: Optional[T]) -> Optional[T]:
    """A norm weight or bias as the contiguous float32 vector the kernels read: a float32
    parameter as it is (no op at all); another dtype cast once per version of the tensor."""
    if t is None or (t.dtype is F32 and t.is_contiguous()):
        return t
    version = t._version
    hit = _F32_CACHE.get(t)
    if hit is not None and hit[0] == version:
        return hit[1]
    cast = t.detach().to(F32).contiguous()
    _F32_CACHE[t] = (version, cast)
    return cast


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
    # How many programs (partial rows of dweight/dbias) the backward launches for (rows, cols).
    def norm_bwd_programs(self, rows: int, cols: int, device) -> int: ...
    # dx = norm backward(dy) (+ ds when given); dw (and db unless None), float32 (cols,): the
    # sums over rows of dy * xhat and dy, through dw_part/db_part (programs, cols) scratch and
    # the zeroed int32 `count`, which the kernel leaves zeroed.
    def norm_bwd(self, dy, ds, x, w, mean, rstd, dx, dw_part, db_part, dw, db, count, rms: bool) -> None: ...
    # Optional (a launcher without them leaves the bias to the matmul): y = act(x + b), and
    # dx = dy act'(x + b) with db = sum over rows of dx (float32, before rounding), as above.
    # def bias_act_fwd(self, act: int, x, b, y) -> None: ...
    # def bias_act_programs(self, rows: int, cols: int, device) -> int: ...
    # def bias_act_bwd(self, act: int, x, b, dy, dx, db_part, db, count) -> None: ...


class Impl:
    """The ops on launchers `k`, once, for both bindings: fresh outputs, 2-D views, launch."""

    def __init__(self, k: Launchers):
        self.k = k
        self.has_bias_act = hasattr(k, "bias_act_fwd")

    def act(self, x: T, act: int) -> T:
        y = new_buffer(x.shape, x.dtype, x.device)
        if x.numel():
            x2 = as_rows(x, flat=True)
            with device_of(x):
                self.k.act_fwd(act, x2, y.view(x2.shape))
        return y

    def act_bwd(self, x: T, dy: T, act: int) -> T:
        dx = new_buffer(x.shape, x.dtype, x.device)
        if x.numel():
            x2, dy2 = rows_pair(x, dy.to(x.dtype))
            with device_of(x):
                self.k.act_bwd(act, x2, dy2, dx.view(x2.shape))
        return dx

    def gated(self, gate: T, up: T, act: int) -> T:
        y = new_buffer(gate.shape, gate.dtype, gate.device)
        if gate.numel():
            g2, u2 = rows_pair(gate, up)
            with device_of(gate):
                self.k.gated_fwd(act, g2, u2, y.view(g2.shape))
        return y

    def gated_bwd(self, gate: T, up: T, dy: T, act: int) -> tuple[T, T]:
        dg = new_buffer(gate.shape, gate.dtype, gate.device)
        du = new_buffer(gate.shape, gate.dtype, gate.device)
        if gate.numel():
            dy = dy.to(gate.dtype)
            flat = gate.is_contiguous() and up.is_contiguous() and dy.is_contiguous()
            g2, u2, dy2 = as_rows(gate, flat), as_rows(up, flat), as_rows(dy, flat)
            with device_of(gate):
                self.k.gated_bwd(act, g2, u2, dy2, dg.view(g2.shape), du.view(g2.shape))
        return dg, du

    def norm(self, x: T, r: Optional[T], w: T, b: Optional[T], eps: float, rms: bool):
        """(s or None, y, mean or None, rstd); w and b float32 (float32_param)."""
        cols = x.shape[-1]
        rows = x.numel() // cols
        s = None if r is None else new_buffer(x.shape, x.dtype, x.device)
        y = new_buffer(x.shape, x.dtype, x.device)
        mean = None if rms else new_buffer((rows,), F32, x.device)
        rstd = new_buffer((rows,), F32, x.device)
        if rows:
            x2 = as_rows(x, flat=False)
            r2 = None if r is None else as_rows(r, flat=False)
            with device_of(x):
                self.k.norm_fwd(x2, r2, None if s is None else s.view(rows, cols), y.view(rows, cols), w, b,
                                mean, rstd, eps, rms)
        return s, y, mean, rstd

    def norm_bwd(self, dy: T, ds: Optional[T], x: T, w: T, mean: Optional[T], rstd: T, has_bias: bool, rms: bool):
        """(dx, dw, db or None), dw and db float32. x is the norm's input (for add_norm: the
        sum s); ds, when given, is added to dx."""
        cols = x.shape[-1]
        rows = x.numel() // cols
        dx = new_buffer(x.shape, x.dtype, x.device)
        if not rows:
            return dx, torch.zeros(cols, dtype=F32, device=x.device), (
                torch.zeros(cols, dtype=F32, device=x.device) if has_bias else None)
        dw = new_buffer((cols,), F32, x.device)
        db = new_buffer((cols,), F32, x.device) if has_bias else None
        programs = self.k.norm_bwd_programs(rows, cols, x.device)
        dw_part, db_part, count = reduce_scratch(x.device, programs, cols)
        x2 = as_rows(x, flat=False)
        dy2 = as_rows(dy.to(x.dtype), flat=False)
        ds2 = None if ds is None else as_rows(ds.to(x.dtype), flat=False)
        with device_of(x):
            self.k.norm_bwd(dy2, ds2, x2, w, mean, rstd, dx.view(rows, cols), dw_part,
                            db_part if has_bias else None, dw, db, count, rms)
        return dx, dw, db

    def bias_act(self, x: T, b: T, act: int) -> T:
        y = new_buffer(x.shape, x.dtype, x.device)
        if x.numel():
            x2 = as_rows(x, flat=False)
            with device_of(x):
                self.k.bias_act_fwd(act, x2, b, y.view(x2.shape))
        return y

    def bias_act_bwd(self, x: T, b: T, dy: T, act: int) -> tuple[T, T]:
        """(dx, db float32): db sums dx over every row."""
        cols = x.shape[-1]
        rows = x.numel() // cols
        dx = new_buffer(x.shape, x.dtype, x.device)
        if not rows:
            return dx, torch.zeros(cols, dtype=F32, device=x.device)
        db = new_buffer((cols,), F32, x.device)
        programs = self.k.bias_act_programs(rows, cols, x.device)
        part, _, count = reduce_scratch(x.device, programs, cols)
        x2, dy2 = as_rows(x, flat=False), as_rows(dy.to(x.dtype), flat=False)
        with device_of(x):
            self.k.bias_act_bwd(act, x2, b, dy2, dx.view(rows, cols), part, db, count)
        return dx, db


def _as(t: Optional[T], like: T) -> Optional[T]:
    """A float32 gradient in the dtype of the parameter it belongs to (no op when float32)."""
    return t if t is None or t.dtype == like.dtype else t.to(like.dtype)


# ---- eager binding: one autograd.Function per op, launching directly ------------------------

class _ActFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, impl, act):
        ctx.save_for_backward(x)
        ctx.impl, ctx.act = impl, act
        return impl.act(x, act)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return ctx.impl.act_bwd(x, dy, ctx.act), None, None


class _GatedFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, impl, act):
        ctx.save_for_backward(gate, up)
        ctx.impl, ctx.act = impl, act
        return impl.gated(gate, up, act)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        dg, du = ctx.impl.gated_bwd(gate, up, dy, ctx.act)
        return dg, du, None, None


class _NormFn(torch.autograd.Function):
    """y = norm(x); without r. Only y is an output: no statistics for autograd to zero-fill."""

    @staticmethod
    def forward(ctx, x, weight, bias, impl, eps, rms):
        w, b = float32_param(weight), float32_param(bias)
        _, y, mean, rstd = impl.norm(x, None, w, b, eps, rms)
        ctx.save_for_backward(x, w, mean, rstd)
        ctx.impl, ctx.rms, ctx.weight, ctx.bias = impl, rms, weight, bias
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = ctx.impl.norm_bwd(dy, None, x, w, mean, rstd, ctx.bias is not None, ctx.rms)
        return dx, _as(dw, ctx.weight), _as(db, ctx.bias) if ctx.bias is not None else None, None, None, None


class _AddNormFn(torch.autograd.Function):
    """(s, y) = (x + r, norm(x + r)). An unused output's gradient arrives as None (not zeros):
    with only s used, x and r get ds and the norm's parameters no gradient, as in eager."""

    @staticmethod
    def forward(ctx, x, r, weight, bias, impl, eps, rms):
        w, b = float32_param(weight), float32_param(bias)
        s, y, mean, rstd = impl.norm(x, r, w, b, eps, rms)
        ctx.save_for_backward(s, w, mean, rstd)
        ctx.impl, ctx.rms, ctx.weight, ctx.bias = impl, rms, weight, bias
        ctx.set_materialize_grads(False)
        return s, y

    @staticmethod
    def backward(ctx, ds, dy):
        if dy is None:
            return ds, ds, None, None, None, None, None
        s, w, mean, rstd = ctx.saved_tensors
        dx, dw, db = ctx.impl.norm_bwd(dy, ds, s, w, mean, rstd, ctx.bias is not None, ctx.rms)
        # x and r receive the same gradient; autograd copies before accumulating into either.
        return dx, dx, _as(dw, ctx.weight), _as(db, ctx.bias) if ctx.bias is not None else None, None, None, None


class _BiasActFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, impl, act):
        b = float32_param(bias)
        ctx.save_for_backward(x, b)
        ctx.impl, ctx.act, ctx.bias = impl, act, bias
        return impl.bias_act(x, b, act)

    @staticmethod
    def backward(ctx, dy):
        x, b = ctx.saved_tensors
        dx, db = ctx.impl.bias_act_bwd(x, b, dy, ctx.act)
        return dx, _as(db, ctx.bias), None, None


# ---- custom-op binding (torch.compile) ------------------------------------------------------

def define_ops(ns: str, k: Launchers):
    """Register the custom ops and their autograd under namespace `ns`, backed by `k`, one
    family at a time; `impl` is what the eager binding launches through."""
    impl = Impl(k)
    act, act_bwd = _activation_ops(ns, impl)
    gated, gated_bwd = _gated_ops(ns, impl)
    norm, add_norm = _norm_ops(ns, impl)
    norm_bwd = _norm_bwd_op(ns, impl)
    _norm_autograd(norm, add_norm, norm_bwd)
    bias_act, bias_act_bwd = _bias_act_ops(ns, impl) if impl.has_bias_act else (None, None)
    return SimpleNamespace(act=act, act_bwd=act_bwd, gated=gated, gated_bwd=gated_bwd, norm=norm,
                           add_norm=add_norm, norm_bwd=norm_bwd, bias_act=bias_act, bias_act_bwd=bias_act_bwd,
                           impl=impl)


def _activation_ops(ns: str, impl: Impl):
    """`ns::act(x, name)` and its backward `ns::act_bwd(x, dy, name)`."""
    @torch.library.custom_op(f"{ns}::act", mutates_args=())
    def act(x: T, name: str) -> T:
        return impl.act(x, ACT_IDS[name])

    @act.register_fake
    def _(x, name):
        return x.new_empty(x.shape)

    @torch.library.custom_op(f"{ns}::act_bwd", mutates_args=())
    def act_bwd(x: T, dy: T, name: str) -> T:
        return impl.act_bwd(x, dy, ACT_IDS[name])

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


def _gated_ops(ns: str, impl: Impl):
    """Gated products act(gate) * up: `ns::gated(gate, up, name)` and `ns::gated_bwd`."""
    @torch.library.custom_op(f"{ns}::gated", mutates_args=())
    def gated(gate: T, up: T, name: str) -> T:
        return impl.gated(gate, up, ACT_IDS[name])

    @gated.register_fake
    def _(gate, up, name):
        return gate.new_empty(gate.shape)

    @torch.library.custom_op(f"{ns}::gated_bwd", mutates_args=())
    def gated_bwd(gate: T, up: T, dy: T, name: str) -> tuple[T, T]:
        return impl.gated_bwd(gate, up, dy, ACT_IDS[name])

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
def _stats_fake(x: T, rms: bool) -> tuple[T, T]:
    rows = x.numel() // x.shape[-1]
    return x.new_empty((0,) if rms else (rows,), dtype=F32), x.new_empty((rows,), dtype=F32)


def _empty_mean(x: T, mean: Optional[T]) -> T:
    # A custom op returns tensors only: RMSNorm's absent mean travels as an empty one.
    return mean if mean is not None else x.new_empty((0,), dtype=F32)


def _norm_ops(ns: str, impl: Impl):
    """The norm forwards: `ns::norm(x, w, b?, eps, rms)` and `ns::add_norm(x, r, w, b?, eps, rms)`."""
    @torch.library.custom_op(f"{ns}::norm", mutates_args=())
    def norm(x: T, weight: T, bias: Optional[T], eps: float, rms: bool) -> tuple[T, T, T]:
        _, y, mean, rstd = impl.norm(x, None, float32_param(weight), float32_param(bias), eps, rms)
        return y, _empty_mean(x, mean), rstd

    @norm.register_fake
    def _(x, weight, bias, eps, rms):
        return (x.new_empty(x.shape), *_stats_fake(x, rms))

    @torch.library.custom_op(f"{ns}::add_norm", mutates_args=())
    def add_norm(x: T, r: T, weight: T, bias: Optional[T], eps: float, rms: bool) -> tuple[T, T, T, T]:
        s, y, mean, rstd = impl.norm(x, r, float32_param(weight), float32_param(bias), eps, rms)
        return s, y, _empty_mean(x, mean), rstd

    @add_norm.register_fake
    def _(x, r, weight, bias, eps, rms):
        return (x.new_empty(x.shape), x.new_empty(x.shape), *_stats_fake(x, rms))

    return norm, add_norm


def _norm_bwd_op(ns: str, impl: Impl):
    """`ns::norm_bwd`, the backward both norm forwards share."""
    @torch.library.custom_op(f"{ns}::norm_bwd", mutates_args=())
    def norm_bwd(dy: T, ds: Optional[T], x: T, weight: T, mean: T, rstd: T,
                 has_bias: bool, rms: bool) -> tuple[T, T, T]:
        """x is the norm's input (for add_norm: the sum s). ds, when given, is added to dx."""
        dx, dw, db = impl.norm_bwd(dy, ds, x, float32_param(weight), None if rms else mean, rstd, has_bias, rms)
        return dx, _as(dw, weight), _as(db, weight) if has_bias else weight.new_empty(0)

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
        if dy is None:  # only s was used (or nothing): the norm's parameters get no gradient
            return ds, ds, None, None, None, None
        s, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = norm_bwd(dy, ds, s, weight, mean, rstd, ctx.has_bias, ctx.rms)
        # x and r receive the same gradient; autograd copies before accumulating into either.
        return dx, dx, dw, (db if ctx.has_bias else None), None, None

    add_norm.register_autograd(add_norm_backward, setup_context=add_norm_setup)


def _bias_act_ops(ns: str, impl: Impl):
    """`ns::bias_act(x, b, name)` = act(x + b) and its backward `ns::bias_act_bwd` -> (dx, db)."""
    @torch.library.custom_op(f"{ns}::bias_act", mutates_args=())
    def bias_act(x: T, bias: T, name: str) -> T:
        return impl.bias_act(x, float32_param(bias), ACT_IDS[name])

    @bias_act.register_fake
    def _(x, bias, name):
        return x.new_empty(x.shape)

    @torch.library.custom_op(f"{ns}::bias_act_bwd", mutates_args=())
    def bias_act_bwd(x: T, bias: T, dy: T, name: str) -> tuple[T, T]:
        dx, db = impl.bias_act_bwd(x, float32_param(bias), dy, ACT_IDS[name])
        return dx, _as(db, bias)

    @bias_act_bwd.register_fake
    def _(x, bias, dy, name):
        return x.new_empty(x.shape), bias.new_empty(bias.shape)

    def setup(ctx, inputs, output):
        x, bias, name = inputs
        ctx.save_for_backward(x, bias)
        ctx.name = name

    def backward(ctx, dy):
        x, bias = ctx.saved_tensors
        dx, db = bias_act_bwd(x, bias, dy, ctx.name)
        return dx, db, None

    bias_act.register_autograd(backward, setup_context=setup)
    return bias_act, bias_act_bwd


class KernelBackend:
    """The backend interface of ReferenceBackend, on a set of custom ops from `define_ops`.
    Whatever the ops do not cover goes to `reference`, so the result is always defined."""

    name = "kernels"
    max_norm_width = 8192

    def __init__(self, ops):
        self.ops = ops
        self.impl = ops.impl
        self.ref = ReferenceBackend()

    # Which devices this backend's kernels run on (a tensor's device).
    def device_ok(self, t: torch.Tensor) -> bool:
        return t.is_cuda

    def _ok(self, x) -> bool:
        return x.dtype in KERNEL_DTYPES and x.numel() > 0 and self.device_ok(x)

    def _ok2(self, a, b) -> bool:
        return self._ok(a) and b.dtype == a.dtype and b.device == a.device

    def _norm_ok(self, x, weight, bias) -> bool:
        if x.dim() < 1 or not self._ok(x) or weight is None:
            return False
        cols = x.shape[-1]
        # dim() and shape[0], not shape == (cols,): comparing a torch.Size with a tuple runs Python
        if not (1 <= cols <= self.max_norm_width and weight.dim() == 1 and weight.shape[0] == cols
                and weight.device == x.device and weight.is_floating_point()):
            return False
        return bias is None or (bias.dim() == 1 and bias.shape[0] == cols and bias.device == x.device
                                and bias.is_floating_point())

    # ---- the interface -----------------------------------------------------------------
    def activation(self, name: str, x: torch.Tensor) -> torch.Tensor:
        act = ACT_IDS.get(name)
        if act is None or not self._ok(x):
            return self.ref.activation(name, x)
        if torch.compiler.is_compiling():
            return self.ops.act(x, name)
        return _ActFn.apply(x, self.impl, act)

    def _bias_act_ok(self, name, h, bias) -> bool:
        return (self.impl.has_bias_act and bias is not None and name in ACT_IDS and h.dim() >= 1
                and bias.dim() == 1 and bias.shape[0] == h.shape[-1] and bias.device == h.device
                and bias.is_floating_point()
                and self._ok(h))

    def bias_activation(self, name: str, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        if not self._bias_act_ok(name, x, bias):
            return self.ref.bias_activation(name, x, bias)
        if torch.compiler.is_compiling():
            return self.ops.bias_act(x, bias, name)
        return _BiasActFn.apply(x, bias, self.impl, ACT_IDS[name])

    def linear_activation(self, name: str, x: torch.Tensor, weight: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
        """act(x W^T + b). With bias_act kernels the bias is added in the activation's pass
        (forward and backward, dbias summed there too); else torch's matmul adds it."""
        if not (self.impl.has_bias_act and bias is not None and name in ACT_IDS and self._ok(x)):
            return self.activation(name, F.linear(x, weight, bias))
        return self.bias_activation(name, F.linear(x, weight), bias)

    def dense_mlp(self, name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  weight2: torch.Tensor, bias2: torch.Tensor | None) -> torch.Tensor:
        return F.linear(self.linear_activation(name, x, weight, bias), weight2, bias2)

    def gated(self, gate_act: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        act = ACT_IDS.get(gate_act)
        if act is None or gate.shape != up.shape or not self._ok2(gate, up):
            return self.ref.gated(gate_act, gate, up)
        if torch.compiler.is_compiling():
            return self.ops.gated(gate, up, gate_act)
        return _GatedFn.apply(gate, up, self.impl, act)

    def attention(self, q, k, v):
        return self.ref.attention(q, k, v)  # torch's flash kernels on a GPU

    @staticmethod
    def _autocast_fp32(x: torch.Tensor) -> bool:
        # Under CUDA autocast, torch runs layer_norm in float32 and returns float32; mirror it
        # so that a backend never changes the dtype flowing through the model.
        return x.is_cuda and x.dtype != torch.float32 and torch.is_autocast_enabled("cuda")

    def _norm(self, x, weight, bias, eps, rms):
        if torch.compiler.is_compiling():
            return self.ops.norm(x, weight, bias, float(eps), rms)[0]
        return _NormFn.apply(x, weight, bias, self.impl, float(eps), rms)

    def layer_norm(self, x, weight, bias, eps: float):
        if self._autocast_fp32(x):
            x = x.float()
        if not self._norm_ok(x, weight, bias):
            return self.ref.layer_norm(x, weight, bias, eps)
        return self._norm(x, weight, bias, eps, False)

    def rms_norm(self, x, weight, eps: float):
        if not self._norm_ok(x, weight, None):
            return self.ref.rms_norm(x, weight, eps)
        return self._norm(x, weight, None, eps, True)

    def _add_norm(self, x, y, weight, bias, eps, rms):
        if x.shape != y.shape:  # broadcasting add: not fused
            return None
        if x.dtype != y.dtype:  # mixed (e.g. float32 stream + bfloat16 branch): promote, as x + y does
            dt = torch.promote_types(x.dtype, y.dtype)
            x, y = x.to(dt), y.to(dt)
        if not self._norm_ok(x, weight, bias) or y.device != x.device:
            return None
        if torch.compiler.is_compiling():
            s, out, _, _ = self.ops.add_norm(x, y, weight, bias, float(eps), rms)
            return s, out
        return _AddNormFn.apply(x, y, weight, bias, self.impl, float(eps), rms)

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
