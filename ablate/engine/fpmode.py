"""Subnormal floats on the CPU: flushed to zero (option `flush_denormal`) or kept.

Why: a cell that goes unstable fills its gradients and Adam's squared moments with values
below float32's smallest normal number (~1.18e-38). x86 CPUs handle those subnormals in
microcode, and such a cell ran 1.5-4x slower than a healthy one (issue #29). With the FTZ and
DAZ bits set, subnormal results become 0 and subnormal inputs read as 0, as most GPUs do in
their fast paths; a healthy cell never meets them and is unchanged bit for bit.

The bits live in each thread's MXCSR register, and `torch.set_flush_denormal` sets only the
calling thread's: torch's intra-op (OpenMP) threads, which run the large elementwise ops and
the matmuls, keep theirs. So the setting is applied once in every thread of the OpenMP team
(libgomp's GOMP_parallel with a callback, the library torch itself runs its parallel regions
in), then checked with a parallel multiply whose every result is subnormal.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys

import torch

# A subnormal result in float32: 1e-30 * 1e-10 = 1e-40 < 1.18e-38.
_TINY, _SCALE = 1e-30, 1e-10
# at::parallel_for hands an elementwise op one chunk per thread once it has 32768 elements a
# thread (its grain size); four grains a thread makes sure every thread gets one.
_PER_THREAD = 4 * 32768

_gomp: list = []  # [GOMP_parallel or None], found once


def _gomp_parallel():
    """libgomp's GOMP_parallel(fn, data, num_threads, flags) as torch loaded it, or None
    (another OpenMP runtime, a native-threads build)."""
    if not _gomp:
        found = None
        lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
        for path in [None, *sorted(glob.glob(os.path.join(lib_dir, "libgomp*.so*")))]:
            try:
                fn = ctypes.CDLL(path).GOMP_parallel  # path None: what the process has loaded already
            except (OSError, AttributeError):
                continue
            fn.argtypes = [_BODY, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
            fn.restype = None
            found = fn
            break
        _gomp.append(found)
    return _gomp[0]


_BODY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def flushing() -> bool | None:
    """Whether subnormal results come out as 0: True in every torch thread, False in none,
    None when the threads disagree."""
    n = torch.get_num_threads()
    main = main_thread_flushing()
    zeros = int((torch.full((n * _PER_THREAD,), _TINY).mul(_SCALE) == 0).sum())
    every = zeros == n * _PER_THREAD and main
    none = zeros == 0 and not main
    return True if every else (False if none else None)


def set_flush_denormal(on: bool) -> bool:
    """Flush subnormals to zero (on) or keep them, in this thread and every thread of torch's
    intra-op pool at its current size. Returns whether that now holds in all of them."""
    if not torch.set_flush_denormal(on):  # a CPU without the bits: nothing to set
        return flushing() is on
    gomp = _gomp_parallel()
    if gomp is not None and torch.get_num_threads() > 1:
        body = _BODY(lambda _: torch.set_flush_denormal(on))  # runs once in each thread of the team
        gomp(body, None, torch.get_num_threads(), 0)
    return flushing() is on


_WARNED: set[bool] = set()


def apply(on: bool) -> bool:
    """set_flush_denormal, saying once per process (one line on stderr) when it could not be
    applied in every thread: the run trains, but not as its config.json says."""
    ok = set_flush_denormal(on)
    if not ok and on not in _WARNED:
        _WARNED.add(on)
        state = "flushed to zero" if on else "kept"
        print(f"ablate: subnormal floats could not be {state} in every torch thread here (flush_denormal="
              f"{str(on).lower()}); results may differ in their last bits from a machine where they were",
              file=sys.stderr)
    return ok


def main_thread_flushing() -> bool:
    """The calling thread's own setting (what to restore after a run): a one-element op runs
    in the calling thread."""
    return bool(torch.tensor([_TINY]).mul(_SCALE).item() == 0)
