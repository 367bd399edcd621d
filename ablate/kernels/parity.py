"""The parity suite: every kernel backend against `reference` evaluated in float64.

A case is one op x shape x dtype x layout. For each case a backend gets fresh random inputs
(seeded per case, never zeros; norm inputs with an offset and a small variance so that eps and
the centring matter), runs forward and backward under `poisoned_outputs()` (every buffer a kernel
writes into starts as NaN, so an element left unwritten fails the case), and is compared with the
reference backend run in float64 on the same values (inputs and upstream gradients upcast).

The error of a tensor is max|out - ref| / max|ref| (relative to the tensor's scale, so it is
meaningful for reductions such as dweight); a case's forward error is the largest over its
outputs, its backward error the largest over the gradients of all its inputs (weights and biases
included). A case passes when both are within the dtype's tolerance: float32 kernels must agree
to a few float32 roundings, bfloat16 ones to a few bfloat16 roundings of the output.

Used by tests/ablate/kernels/test_parity.py, `ablate kernels check` and `--kernels auto` (a quick subset).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ablate.core.errors import ConfigError
from ablate.kernels import GPU_BACKENDS, get_backend
from ablate.kernels.cpu_backend import unchecked
from ablate.kernels.ops_base import ACTS, poisoned_outputs
from ablate.kernels.reference import ReferenceBackend

TOLERANCE = {torch.float32: 5e-6, torch.bfloat16: 1e-2}
DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16"}
GATED = ("silu", "gelu", "relu")  # SwiGLU, GEGLU, ReGLU
OPS = tuple(f"act:{a}" for a in ACTS) + tuple(f"gated:{a}" for a in GATED) + (
    "layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "bias_act:gelu")
# The ops the `cpu` backend has kernels for, the only ones it checks: the rest are `reference`'s
# own code. attention and dense_mlp are checked on it alone (the GPU backends' are torch's).
CPU_OPS = ("act:gelu", "gated:gelu", "attention", "dense_mlp:gelu")
EPS = 1e-5

# (shape, layout). contiguous: a plain tensor; strided: rows with a stride (x = wider[..., :C];
# for gated ops the two halves of one (..., 2C) tensor, as c_fc(x).chunk(2, -1) gives them);
# transposed: leading dims that do not collapse into one row stride.
SHAPES = (
    ((2, 3, 37), "contiguous"),
    ((1, 5, 64), "strided"),
    ((3, 1, 1001), "contiguous"),
    ((2, 2, 1000), "transposed"),
    ((4, 16, 64), "strided"),  # more rows than the backward has programs
    ((1, 2, 768), "strided"),
    ((1, 2, 2048), "contiguous"),
    ((1, 2, 3072), "strided"),
)
QUICK_SHAPES = (((2, 3, 37), "strided"), ((2, 4, 768), "contiguous"))
GPU_SHAPES = (  # realistic row counts, and the widest rows the backends take
    ((4, 256, 768), "contiguous"),
    ((4, 256, 3072), "strided"),
    ((2, 64, 2048), "strided"),
    ((2, 8, 8192), "contiguous"),
    ((1, 4, 16384), "contiguous"),
)


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str
    seed: int

    @property
    def id(self) -> str:
        return f"{self.op}-{'x'.join(map(str, self.shape))}-{DTYPE_NAMES[self.dtype]}-{self.layout}"

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]


@dataclass
class Row:
    backend: str
    case: Case
    fwd_err: float = math.nan
    bwd_err: float = math.nan
    error: str | None = None  # an exception raised by the backend
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        tol = self.case.tolerance
        return self.error is None and self.fwd_err <= tol and self.bwd_err <= tol


def cases(device: str = "cpu", quick: bool = False, ops: tuple[str, ...] = OPS) -> list[Case]:
    """The suite: every op x shape x dtype (more and larger shapes on a GPU)."""
    shapes = QUICK_SHAPES if quick else SHAPES + (GPU_SHAPES if str(device).startswith("cuda") else ())
    out = []
    for op in ops:
        for shape, layout in shapes:
            for dtype in (torch.float32, torch.bfloat16):
                out.append(Case(op, shape, dtype, layout, seed=len(out) + 1))
    return out


# ---- inputs ---------------------------------------------------------------------------------

def _randn(shape, g, dtype, device, scale=1.0, offset=0.0):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset).to(dtype).to(device)


def _leaf_and_view(case: Case, g, device, width=None, scale=1.0, offset=0.0):
    """A leaf tensor and the (B, T, C) view of it that the op sees, in the case's layout."""
    B, T, C = case.shape
    C = width or C
    if case.layout == "strided":
        leaf = _randn((B, T, C + 3), g, case.dtype, device, scale, offset).requires_grad_()
        return leaf, (lambda t: t[..., :C])
    if case.layout == "transposed":
        leaf = _randn((T, B, C), g, case.dtype, device, scale, offset).requires_grad_()
        return leaf, (lambda t: t.transpose(0, 1))
    leaf = _randn((B, T, C), g, case.dtype, device, scale, offset).requires_grad_()
    return leaf, (lambda t: t)


def _norm_stats(case: Case) -> tuple[float, float]:
    # An offset (centring matters) and, for float32, sometimes a variance near eps (eps matters).
    # bfloat16 add+norm rounds x + r to bfloat16 first (as torch does), so there the inputs
    # keep their spread well above bfloat16's resolution of the offset.
    choices = [(0.0, 1.0), (0.4, 2.0), (0.05, 0.01)] if case.dtype == torch.float32 else [(0.0, 1.0), (0.4, 2.0)]
    return choices[case.seed % len(choices)]


def _build_attention(case: Case, g, device):
    """Causal attention on (B, 2 heads, 8 T, 16) heads: for the `strided` layout the heads of one
    packed (B, T, 3 C) tensor, as the model splits c_attn's output, else three tensors."""
    B, T, H, D = case.shape[0], 8 * case.shape[1], 2, 16
    if case.layout == "strided":
        qkv = _randn((B, T, 3 * H * D), g, case.dtype, device).requires_grad_()

        def packed(be, qkv):
            q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=2))
            return (be.attention(q, k, v),)
        return [qkv], packed
    leaves = [_randn((B, H, T, D), g, case.dtype, device).requires_grad_() for _ in range(3)]
    return leaves, lambda be, q, k, v: (be.attention(q, k, v),)


def _build_dense_mlp(case: Case, g, device):
    """act(x W^T + b) W2^T + b2 at width min(C, 64), the MLP 4x as wide."""
    name, C = case.op.split(":")[1], min(case.shape[-1], 64)
    x, view = _leaf_and_view(case, g, device, width=C)
    w, b = _randn((4 * C, C), g, case.dtype, device, C**-0.5).requires_grad_(), _randn((4 * C,), g, case.dtype, device, 0.5)
    w2, b2 = _randn((C, 4 * C), g, case.dtype, device, (4 * C)**-0.5), _randn((C,), g, case.dtype, device, 0.1)
    leaves = [x, w, b.requires_grad_(), w2.requires_grad_(), b2.requires_grad_()]
    return leaves, lambda be, x, w, b, w2, b2: (be.dense_mlp(name, view(x), w, b, w2, b2),)


def build(case: Case, device):
    """(leaves, fn): fn(backend, *leaves) -> tuple of outputs."""
    g = torch.Generator().manual_seed(case.seed)
    op = case.op
    C = case.shape[-1]
    if op == "attention":
        return _build_attention(case, g, device)
    if op.startswith("dense_mlp:"):
        return _build_dense_mlp(case, g, device)
    if op.startswith("act:"):
        name = op[4:]
        leaf, view = _leaf_and_view(case, g, device, scale=3.0)  # reach the tails
        return [leaf], lambda be, x: (be.activation(name, view(x)),)
    if op.startswith("bias_act:"):  # act(x + b), b a float32 parameter as under autocast
        name = op[9:]
        leaf, view = _leaf_and_view(case, g, device, scale=3.0)
        bias = _randn((C,), g, torch.float32, device, 0.5).requires_grad_()
        return [leaf, bias], lambda be, x, b: (be.bias_activation(name, view(x), b),)
    if op.startswith("gated:"):
        name = op[6:]
        if case.layout == "strided":  # the halves of c_fc(x).chunk(2, -1): row stride 2C
            h = _randn((*case.shape[:-1], 2 * C), g, case.dtype, device, 2.0).requires_grad_()
            return [h], lambda be, h: (be.gated(name, *h.chunk(2, dim=-1)),)
        a, view = _leaf_and_view(case, g, device, scale=2.0)
        b, _ = _leaf_and_view(case, g, device, scale=2.0)
        return [a, b], lambda be, x, y: (be.gated(name, view(x), view(y)),)
    offset, scale = _norm_stats(case)
    wdt = case.dtype
    weight = _randn((C,), g, wdt, device, 0.5, 1.0).requires_grad_()
    x, view = _leaf_and_view(case, g, device, scale=scale, offset=offset)
    if op in ("add_layer_norm", "add_rms_norm"):
        r, _ = _leaf_and_view(case, g, device, scale=scale, offset=offset / 2)
        if op == "add_layer_norm":
            bias = _randn((C,), g, wdt, device, 0.1).requires_grad_()
            return [x, r, weight, bias], lambda be, x, r, w, b: be.add_layer_norm(view(x), view(r), w, b, EPS)
        return [x, r, weight], lambda be, x, r, w: be.add_rms_norm(view(x), view(r), w, EPS)
    if op == "layer_norm":
        bias = _randn((C,), g, wdt, device, 0.1).requires_grad_()
        return [x, weight, bias], lambda be, x, w, b: (be.layer_norm(view(x), w, b, EPS),)
    return [x, weight], lambda be, x, w: (be.rms_norm(view(x), w, EPS),)


def _err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.shape != ref.shape:
        return math.inf
    out, ref = out.detach().to(torch.float64), ref.detach()
    if not torch.isfinite(out).all():
        return math.inf
    scale = ref.abs().max().item() if ref.numel() else 0.0
    diff = (out - ref).abs().max().item() if ref.numel() else 0.0
    return diff / scale if scale > 0 else diff


def run_case(backend, case: Case, device) -> Row:
    row = Row(getattr(backend, "name", str(backend)), case)
    t0 = time.perf_counter()
    try:
        leaves, fn = build(case, device)
        g = torch.Generator().manual_seed(10_000 + case.seed)
        leaves64 = [t.detach().to(torch.float64).requires_grad_() for t in leaves]
        refs = fn(ReferenceBackend(), *leaves64)
        grads_out = [_randn(r.shape, g, case.dtype, device, 1.0) for r in refs]
        ref_grads = torch.autograd.grad(refs, leaves64, [d.to(torch.float64) for d in grads_out])
        with poisoned_outputs():
            outs = fn(backend, *leaves)
            got = torch.autograd.grad(outs, leaves, grads_out)
        row.fwd_err = max(_err(o, r) for o, r in zip(outs, refs))
        row.bwd_err = max(_err(o, r) for o, r in zip(got, ref_grads))
    except Exception as e:  # reported per case, so one broken op does not hide the others
        row.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    row.seconds = time.perf_counter() - t0
    return row


# ---- backends and the whole suite -----------------------------------------------------------

def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_backends(names=GPU_BACKENDS, device: str | None = None) -> dict[str, object]:
    """name -> backend object, or the one-line reason it cannot run on `device`."""
    device = device or default_device()
    out: dict[str, object] = {}
    for name in names:
        try:
            # `cpu` unchecked: this suite is its check (its loader refuses a backend that fails it)
            backend = _unchecked_cpu(device) if name == "cpu" else get_backend(name, device)
        except ConfigError as e:
            out[name] = str(e)
            continue
        probe = torch.empty(1, device=device)
        ok = getattr(backend, "device_ok", lambda t: True)(probe)
        out[name] = backend if ok else f"kernels {name!r} does not run on {device} tensors in this process"
    return out


def _unchecked_cpu(device: str):
    if not str(device).startswith("cpu"):
        return get_backend("cpu", device)  # refused in its one line

    return unchecked()


def ops_for(backend: str) -> tuple[str, ...]:
    """The ops a backend is checked on: `cpu` on those it has kernels for (CPU_OPS)."""
    return CPU_OPS if backend == "cpu" else OPS


def run_suite(backends: dict[str, object], device: str, quick: bool = False, progress=None) -> list[Row]:
    rows = []
    for name, backend in backends.items():
        if isinstance(backend, str):
            continue
        for case in cases(device, quick, ops_for(name)):
            row = run_case(backend, case, device)
            row.backend = name
            rows.append(row)
            if progress:
                progress(row)
    return rows


@dataclass
class Summary:
    op: str
    backend: str
    errors: dict = field(default_factory=dict)  # (dtype name, "fwd"|"bwd") -> max error
    worst_tol_ratio: float = 0.0
    passed: int = 0
    total: int = 0
    failures: list[str] = field(default_factory=list)


def summarize(rows: list[Row]) -> list[Summary]:
    """One entry per (op, backend): the largest errors per dtype over its cases, pass count."""
    table: dict[tuple[str, str], Summary] = {}
    for r in rows:
        s = table.setdefault((r.case.op, r.backend), Summary(r.case.op, r.backend))
        s.total += 1
        dt = DTYPE_NAMES[r.case.dtype]
        for key, err in (("fwd", r.fwd_err), ("bwd", r.bwd_err)):
            err = err if r.error is None else math.inf
            s.errors[(dt, key)] = max(s.errors.get((dt, key), 0.0), err)
        ratio = max(r.fwd_err, r.bwd_err) / r.case.tolerance if r.error is None else math.inf
        s.worst_tol_ratio = max(s.worst_tol_ratio, ratio)
        if r.passed:
            s.passed += 1
        else:
            s.failures.append(r.case.id + (f" ({r.error})" if r.error else f" (fwd {r.fwd_err:.2e}, bwd {r.bwd_err:.2e})"))
    return list(table.values())


def format_table(rows: list[Row], unavailable: dict[str, str] | None = None) -> str:
    """op x backend: the max relative error forward and backward per dtype (over all shapes and
    layouts), the worst error as a fraction of its tolerance, and pass/fail."""
    sums = summarize(rows)
    dts = [DTYPE_NAMES[d] for d in TOLERANCE]
    lines = [
        "max relative error = max|out - ref| / max|ref| per tensor, ref = `reference` in float64; "
        f"tolerance float32 {TOLERANCE[torch.float32]:.0e}, bfloat16 {TOLERANCE[torch.bfloat16]:.0e}",
        f"{'op':<16}{'backend':<10}" + "".join(f"{d + ' fwd':>11}{d + ' bwd':>11}" for d in dts)
        + f"{'err/tol':>9}  result",
    ]
    for s in sums:
        errs = "".join(f"{s.errors.get((d, k), math.nan):>11.1e}" for d in dts for k in ("fwd", "bwd"))
        verdict = "pass" if s.passed == s.total else "FAIL"
        lines.append(f"{s.op:<16}{s.backend:<10}{errs}{s.worst_tol_ratio:>9.2f}  {verdict} ({s.passed}/{s.total} cases)")
    for name, reason in (unavailable or {}).items():
        lines.append(f"{'(all ops)':<16}{name:<10}unavailable: {reason}")
    failed = [f"  {s.backend} {f}" for s in sums for f in s.failures]
    if failed:
        lines.append("failed cases:")
        lines.extend(failed)
    return "\n".join(lines)
