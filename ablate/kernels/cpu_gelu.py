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

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

SOURCES = Path(__file__).with_name("cpu")
PASSES = "passes"
# -ffast-math lets GCC call glibc's vector expf; the poly copies keep IEEE semantics (no
# contraction: every fused multiply-add is an fmaf in the source), only dropping errno and
# trap-preserving code so that their selects vectorize.
FAST = ["-O3", "-ffast-math", "-fopenmp", "-fPIC"]
EXACT = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp", "-fPIC"]


@dataclass(frozen=True)
class Copy:
    """One compiled copy of a kernel source: its symbol suffix, flags and the CPU flags it needs."""

    isa: str
    source: str
    flags: tuple[str, ...]
    needs: tuple[str, ...]


AVX512 = ("-mavx512f", "-mavx512vl", "-mfma", "-mprefer-vector-width=512")
# form -> its copies, fastest first: a machine computes a form with the first copy its CPU runs.
FORMS = {
    "poly": (Copy("poly_avx512", "gelu_tanh_poly.c", (*EXACT, *AVX512), ("avx512f", "avx512vl", "fma")),
             Copy("poly_avx2", "gelu_tanh_poly.c", (*EXACT, "-mavx2", "-mfma"), ("avx2", "fma"))),
    "fused-avx2": (Copy("avx2", "gelu_tanh.c", (*FAST, "-mavx2", "-mfma"), ("avx2", "fma")),),
    "fused-sse2": (Copy("sse2", "gelu_tanh.c", FAST, ()),),
}
COPIES = [c for copies in FORMS.values() for c in copies]

_lib: list = []  # [(ctypes library, why not) ], built or found once per process
_form = [None]  # the form in use for the current run (None: the best available)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build(cc: str) -> Path:
    """Compile every copy into one shared library in $ABLATE_CACHE/kernels, named by the hash
    of the sources, the flags and the compiler's version (another compiler builds anew)."""
    from ablate.data import cache_root

    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    sources = "".join((SOURCES / name).read_text() for name in sorted({c.source for c in COPIES}))
    key = hashlib.sha256((sources + repr(COPIES) + version).encode()).hexdigest()[:16]
    target = cache_root() / "kernels" / f"gelu_tanh-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objects = []
        for copy in COPIES:
            obj = Path(tmp) / f"{copy.isa}.o"
            subprocess.run([cc, *copy.flags, f"-DISA={copy.isa}", "-c", str(SOURCES / copy.source), "-o", str(obj)],
                           check=True, capture_output=True, timeout=300)
            objects.append(str(obj))
        # Linked without -ffast-math: GCC before 13 would add crtfastmath.o, which turns on
        # flush-to-zero for the whole process when the library loads (ablate/fpmode.py owns that).
        so = Path(tmp) / "lib.so"
        subprocess.run([cc, "-shared", "-fopenmp", *objects, "-o", str(so), "-lmvec", "-lm"],
                       check=True, capture_output=True, timeout=300)
        os.replace(so, target)
    return target


def library():
    """(the ctypes library, None) once built, or (None, why not)."""
    if not _lib:
        cc = _compiler()
        if sys.platform != "linux" or os.uname().machine != "x86_64" or cc is None:
            _lib.append((None, "needs Linux on x86-64 and a C compiler (CC, cc or gcc)"))
        else:
            try:
                lib = ctypes.CDLL(str(_build(cc)))
                for copy in COPIES:
                    for name in (f"gelu_tanh_fwd_{copy.isa}", f"gelu_tanh_bwd_{copy.isa}"):
                        getattr(lib, name).restype = None
                _lib.append((lib, None))
            except (OSError, subprocess.SubprocessError) as e:
                detail = (getattr(e, "stderr", b"") or b"").decode(errors="replace")[:200] or e
                _lib.append((None, f"the build failed ({type(e).__name__}: {detail})"))
    return _lib[0]


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def _cpu_has(*flags: str) -> bool:
    return all(flag in _cpu_flags() for flag in flags)


def _copy_for(form: str) -> Copy | None:
    """The fastest copy of `form` this CPU runs (None: none does)."""
    return next((c for c in FORMS[form] if _cpu_has(*c.needs)), None)


def available() -> list[str]:
    """The forms this machine can compute, best first (`passes` always)."""
    if library()[0] is None:
        return [PASSES]
    return [form for form in FORMS if _copy_for(form) is not None] + [PASSES]


def best() -> str:
    return available()[0]


@contextlib.contextmanager
def using(form: str):
    """Compute the CPU tanh-GELU in `form` (one of available()) while a run trains."""
    old = _form[0]
    _form[0] = form
    try:
        yield
    finally:
        _form[0] = old


def current() -> str:
    return _form[0] or best()


def _call(kind: str, *tensors: torch.Tensor, copy: Copy | None = None) -> None:
    """Run the `kind` ("fwd", "bwd") kernel of `copy` (default: the current form's fastest here)."""
    lib = library()[0]
    isa = (copy or _copy_for(current())).isa
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
    getattr(lib, f"gelu_tanh_{kind}_{isa}")(*pointers, ctypes.c_int64(tensors[0].numel()),
                                            ctypes.c_int(torch.get_num_threads()))


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
