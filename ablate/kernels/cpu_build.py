"""The CPU C kernels' common machinery: compiled copies of a source per instruction set, built
with the system's C compiler at first use into one shared library cached in
$ABLATE_CACHE/kernels, and the *forms* a run can compute an op in.

A form is one computation of an op, to its last bit. Some forms have several copies (AVX-512,
AVX2) written so that they give the same bits: a machine uses the fastest copy its CPU runs.
A run records the form it trained with (config.json) and keeps it when resumed
(ablate/engine/train.py), so each kernel is a `CpuKernel` with its forms, best first, and a fallback
form computed by torch ops on any machine (the form of every run made before the kernel).
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

from ablate.core.paths import cache_root
from ablate.core.provenance import cpuinfo
from ablate.kernels import cpu_cache

SOURCES = Path(__file__).with_name("cpu")
# -ffast-math lets GCC call glibc's vector expf; the exact copies keep IEEE semantics (no
# contraction: every fused multiply-add is an fmaf in the source), only dropping errno and
# trap-preserving code so that their selects vectorize.
FAST = ["-O3", "-ffast-math", "-fopenmp", "-fPIC"]
EXACT = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp", "-fPIC"]
AVX512 = ("-mavx512f", "-mavx512vl", "-mfma", "-mprefer-vector-width=512")
AVX512_NEEDS = ("avx512f", "avx512vl", "fma")
_VERIFIED_FDS: list[int] = []  # the libraries loaded, their descriptors kept open (CpuKernel._load)


@dataclass(frozen=True)
class Copy:
    """One compiled copy of a kernel source: its symbol suffix, flags and the CPU flags it needs."""

    isa: str
    source: str
    flags: tuple[str, ...]
    needs: tuple[str, ...]


def _why(e: BaseException) -> str:
    """An error in a line: a compiler's own message when it has one."""
    detail = (getattr(e, "stderr", b"") or b"")
    detail = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
    return " ".join(detail.split())[:200] or str(e)


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


@functools.cache
def _cpu_flags() -> frozenset[str]:
    return frozenset(cpuinfo("flags").split())


def cpu_has(*flags: str) -> bool:
    return all(flag in _cpu_flags() for flag in flags)


def builds_here() -> bool:
    """Whether the C kernels are meant to build on this machine (given a C compiler)."""
    return sys.platform == "linux" and os.uname().machine == "x86_64"


_SAID: set[str] = set()


def say_fallbacks(kernels: dict, forms: dict) -> None:
    """One line on stderr (once a process) when a kernel that should build here did not, so
    that a new run computes its op in the fallback form: the run records that form
    (config.json), and the line says so, since it gives other bits than a run where the
    kernel built. `kernels`: config.json key -> (CpuKernel, what it computes); `forms`: the
    forms the run trains with, by the same keys."""
    failed = [(what, kernel) for key, (kernel, what) in kernels.items()
              if forms.get(key) == kernel.fallback and kernel.library()[0] is None]
    if not failed or not builds_here():
        return
    reasons = "; ".join(dict.fromkeys(kernel.library()[1] for _, kernel in failed))
    line = (f"ablate: the CPU kernels cannot be used here ({reasons}); this run computes "
            + " and ".join(f"{what} as {kernel.fallback!r}" for what, kernel in failed)
            + ", recorded in its config.json (other bits than where they build)")
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


class CpuKernel:
    """An op's C kernel: `forms` maps a form to its copies, fastest first (best form first);
    `fallback` names the torch-ops form; `symbols` maps the functions the copies define, named
    `{symbol}_{copy.isa}`, to their ctypes argument types (a source may leave some out, but each
    is defined by at least one); `headers` the sources' includes (part of the build's hash)."""
    def __init__(self, name: str, forms: dict[str, tuple[Copy, ...]], fallback: str, symbols: dict[str, tuple],
                 headers: tuple[str, ...] = ()):
        self.name, self.forms, self.fallback, self.symbols, self.headers = name, forms, fallback, symbols, headers
        self.copies = list({c.isa: c for copies in forms.values() for c in copies}.values())  # forms may share copies
        self._lib: list = []  # [(ctypes library, why not)], built or found once per process
        self._form: str | None = None  # the form in use for the current run (None: the best available)
        self._copy: Copy | None = None  # a copy pinned by `pinned` (None: the form's fastest here)
        # Looked up on every call of a training step, so kept once found (for the _lib they came from).
        self._best: tuple[list, str] | None = None
        self._copy_of: dict[str, Copy | None] = {}
        self._functions: tuple[list, dict] = (self._lib, {})

    @staticmethod
    def _folder() -> Path:
        return cache_root() / "kernels"

    def _target(self, cc: str) -> Path:
        """The library's path: named by the hash of the sources, the flags and the compiler's
        version (another compiler builds anew)."""
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
        names = sorted({c.source for c in self.copies} | set(self.headers))
        sources = "".join((SOURCES / name).read_text() for name in names)
        key = hashlib.sha256((sources + repr(self.copies) + version).encode()).hexdigest()[:16]
        return self._folder() / f"{self.name}-{key}.so"

    def _compile(self, cc: str, target: Path) -> None:
        """Compile every copy into one shared library and publish it at `target` with its build
        record (cpu_cache.publish)."""
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=cpu_cache.BUILD_PREFIX) as tmp:
            objects = []
            for copy in self.copies:
                obj = Path(tmp) / f"{copy.isa}.o"
                subprocess.run([cc, *copy.flags, f"-DISA={copy.isa}", "-c", str(SOURCES / copy.source), "-o", str(obj)],
                               check=True, capture_output=True, timeout=300)
                objects.append(str(obj))
            # Linked without -ffast-math: GCC before 13 would add crtfastmath.o, which turns on
            # flush-to-zero for the whole process when the library loads (ablate/engine/fpmode.py owns that).
            so = Path(tmp) / "lib.so"
            subprocess.run([cc, "-shared", "-fopenmp", *objects, "-o", str(so), "-lmvec", "-lm"],
                           check=True, capture_output=True, timeout=300)
            cpu_cache.publish(so, target)

    def _load(self, cc: str) -> ctypes.CDLL:
        """The cached library, loaded once it verifies (cpu_cache.open_verified); built first
        when missing, and built again, with one line saying why, when it does not verify."""
        target = self._target(cc)
        opened, why = cpu_cache.open_verified(target)
        if opened is None:
            try:
                with cpu_cache.build_lock(target.parent):
                    opened, why = cpu_cache.open_verified(target)  # another process may have built it
                    if opened is None:
                        if why:
                            print(f"ablate: cached kernel library {target} {why}; rebuilding", file=sys.stderr,
                                  flush=True)
                        self._compile(cc, target)
                        opened, why = cpu_cache.open_verified(target)
            except (OSError, subprocess.SubprocessError) as e:
                if why:  # say what was wrong with the cached one, and why it could not be rebuilt
                    raise OSError(f"cached library {target} {why} and cannot be rebuilt: {_why(e)}") from None
                raise
            if opened is None:
                raise OSError(f"the library just built at {target} {why}")
        # Loaded from the very file that was verified. The descriptor stays open: the dynamic
        # loader knows a library by its path, and a closed descriptor's number, reused for the
        # next library, would name this one to it.
        with opened:
            fd = os.dup(opened.fileno())
        _VERIFIED_FDS.append(fd)
        return ctypes.CDLL(f"/proc/self/fd/{fd}")

    def library(self):
        """(the ctypes library, None) once built, or (None, why not)."""
        if not self._lib:
            cc = _compiler()
            if not builds_here():
                self._lib.append((None, "needs Linux on x86-64"))
            elif cc is None:
                self._lib.append((None, "no C compiler (CC, cc or gcc)"))
            elif shared := cpu_cache.not_private(self._folder()):
                self._lib.append((None, shared))
            else:
                try:
                    lib = self._load(cc)
                    for copy in self.copies:
                        for symbol, argtypes in self.symbols.items():
                            function = getattr(lib, f"{symbol}_{copy.isa}", None)  # None: not in this source
                            if function is not None:
                                function.restype, function.argtypes = None, argtypes
                    undefined = [s for s in self.symbols if not any(hasattr(lib, f"{s}_{c.isa}") for c in self.copies)]
                    if undefined:
                        raise OSError(f"no copy defines {', '.join(undefined)}")
                    self._lib.append((lib, None))
                except (OSError, subprocess.SubprocessError) as e:
                    self._lib.append((None, f"the build failed ({type(e).__name__}: {_why(e)})"))
        return self._lib[0]

    def copy_for(self, form: str) -> Copy | None:
        """The fastest copy of `form` this CPU runs (None: none does)."""
        if form not in self._copy_of:
            self._copy_of[form] = next((c for c in self.forms[form] if cpu_has(*c.needs)), None)
        return self._copy_of[form]

    def available(self) -> list[str]:
        """The forms this machine can compute, best first (the fallback always)."""
        if self.library()[0] is None:
            return [self.fallback]
        return [form for form in self.forms if self.copy_for(form) is not None] + [self.fallback]

    def best(self) -> str:
        if self._best is None or self._best[0] is not self._lib:
            self.library()
            self._best = (self._lib, self.available()[0])
        return self._best[1]

    @contextlib.contextmanager
    def using(self, form: str):
        """Compute the op in `form` (one of available()) while a run trains."""
        old, self._form = self._form, form
        try:
            yield
        finally:
            self._form = old

    def current(self) -> str:
        return self._form or self.best()

    @contextlib.contextmanager
    def pinned(self, copy: Copy):
        """Run every call through `copy` (one this CPU runs), autograd's backward included: a
        bench times each copy of a form, which give the same bits."""
        old, self._copy = self._copy, copy
        try:
            yield
        finally:
            self._copy = old

    def function(self, symbol: str, copy: Copy | None = None):
        """The ctypes function `symbol` of `copy` (default: the pinned copy, else the current
        form's fastest here)."""
        isa = (copy or self._copy or self.copy_for(self.current())).isa
        if self._functions[0] is not self._lib:
            self._functions = (self._lib, {})
        found = self._functions[1]
        if (symbol, isa) not in found:
            found[symbol, isa] = getattr(self.library()[0], f"{symbol}_{isa}")
        return found[symbol, isa]

