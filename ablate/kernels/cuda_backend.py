"""The `cuda` backend: the handwritten kernels of cuda/*.cu behind the ops of ops_base.

Importing this module registers the loader `cuda` with ablate.kernels; nothing is built until
the backend is first asked for. Then `torch.utils.cpp_extension.load` compiles cuda/*.cu and
cuda/binding.cpp for the current device's architecture only (TORCH_CUDA_ARCH_LIST=<major.minor>
during the build) into torch's extension cache (TORCH_EXTENSIONS_DIR, by default
~/.cache/torch_extensions), under a name that includes the architecture; later processes reuse
the build unless a source changed. Without a CUDA device or nvcc the loader raises a one-line
ConfigError, which `--kernels auto` takes as "not available" and passes over.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import torch
from torch.utils.cpp_extension import CUDA_HOME

from ablate.core.errors import ConfigError
from ablate.kernels.ops_base import KernelBackend, define_ops, sm_count

SOURCE_DIR = Path(__file__).with_name("cuda")
SOURCES = ("binding.cpp", "activations.cu", "norms.cu")
MAX_NORM_WIDTH = 8192  # ablate_kernels.h: kMaxNormCols


def nvcc_path() -> str | None:
    """The nvcc torch would build with, or None."""
    if CUDA_HOME and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")):
        return os.path.join(CUDA_HOME, "bin", "nvcc")
    return shutil.which("nvcc")


def unavailable_reason() -> str | None:
    """Why the backend cannot run here (None when it can try to build)."""
    if not torch.cuda.is_available():
        return "no CUDA device is visible"
    if torch.version.cuda is None:
        return "this torch build has no CUDA support"
    if nvcc_path() is None:
        return "nvcc was not found (set CUDA_HOME or put nvcc on PATH)"
    return None


@functools.lru_cache(maxsize=None)
def device_arch(index: int | None = None) -> str:
    major, minor = torch.cuda.get_device_capability(index)
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=None)
def extension(arch: str):
    """Build (or load from the cache) the extension for compute capability `arch`."""
    from torch.utils.cpp_extension import load  # lazy: the name is this module's own too

    old = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = arch  # this device's architecture only
    try:
        return load(
            name=f"ablate_cuda_kernels_sm{arch.replace('.', '')}",
            sources=[str(SOURCE_DIR / s) for s in SOURCES],
            extra_include_paths=[str(SOURCE_DIR)],
            extra_cflags=["-O3", "-std=c++17"],
            extra_cuda_cflags=["-O3", "-std=c++17"],
            verbose=bool(os.environ.get("ABLATE_CUDA_VERBOSE")),
        )
    finally:
        if old is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old


def _stream(t: torch.Tensor) -> int:
    # The raw stream handle without building a torch.cuda.Stream object (a few us a call).
    return torch._C._cuda_getCurrentRawStream(t.device.index)


_EXT_BY_INDEX: dict = {}  # device index -> its architecture's extension: one dict lookup a call


class _Launchers:
    """ops_base.Launchers on the compiled extension (built on first use)."""
    @staticmethod
    def _ext(t: torch.Tensor):
        index = t.device.index
        ext = _EXT_BY_INDEX.get(index)
        if ext is None:
            ext = _EXT_BY_INDEX[index] = extension(device_arch(index))
        return ext

    def act_fwd(self, act, x, y):
        self._ext(x).act_forward(act, x, y, _stream(x))

    def act_bwd(self, act, x, dy, dx):
        self._ext(x).act_backward(act, x, dy, dx, _stream(x))

    def gated_fwd(self, act, gate, up, y):
        self._ext(gate).gated_forward(act, gate, up, y, _stream(gate))

    def gated_bwd(self, act, gate, up, dy, dgate, dup):
        self._ext(gate).gated_backward(act, gate, up, dy, dgate, dup, _stream(gate))

    def bias_act_fwd(self, act, x, b, y):
        self._ext(x).bias_act_forward(act, x, b, y, _stream(x))

    def bias_act_programs(self, rows, cols, device):
        # row programs per column block; the last of them sums their partial rows (activations.cu)
        return max(1, min(rows, 2 * sm_count(device), 65535))

    def bias_act_bwd(self, act, x, b, dy, dx, db_part, db, count):
        self._ext(x).bias_act_backward(act, x, b, dy, dx, db_part, db, count, _stream(x))

    def norm_fwd(self, x, r, s, y, w, b, mean, rstd, eps, rms):
        self._ext(x).norm_forward(x, r, s, y, w, b, mean, rstd, eps, rms, _stream(x))

    def norm_bwd_programs(self, rows, cols, device):
        # 2 blocks per SM: the last block sums every block's partial row (norms.cu)
        return max(1, min(rows, 2 * sm_count(device)))

    def norm_bwd(self, dy, ds, x, w, mean, rstd, dx, dw_part, db_part, dw, db, count, rms):
        self._ext(x).norm_backward(dy, ds, x, w, mean, rstd, dx, dw_part, db_part, dw, db, count, rms, _stream(x))


OPS = define_ops("ablate_cuda", _Launchers())


class CudaBackend(KernelBackend):
    name = "cuda"
    max_norm_width = MAX_NORM_WIDTH

    def device_ok(self, t: torch.Tensor) -> bool:
        return t.is_cuda


@functools.lru_cache(maxsize=None)
def load() -> CudaBackend:
    reason = unavailable_reason()
    if reason is not None:
        raise ConfigError(f"kernels 'cuda' is not available here: {reason}")
    try:
        extension(device_arch())
    except Exception as e:  # a failed build: one line, the full log is in the exception
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise ConfigError(f"kernels 'cuda' failed to build its extension: {first} "
                          "(set ABLATE_CUDA_VERBOSE=1 for the compiler output)") from None
    return CudaBackend(OPS)
