"""The kernel backends against `reference`, and the CUDA sources against the compiler.

On a CPU the Triton kernels run under TRITON_INTERPRET=1 (tests/conftest.py sets it) and the
CUDA sources are compile-checked with the machine's nvcc (warnings are errors); on a GPU the
same parity suite runs both backends natively.
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

from ablate.core.errors import ConfigError
from ablate.engine.model import build_model
from ablate.engine.sizes import get_size
from ablate.kernels import get_backend, parity
from ablate.kernels.ops_base import ACTS, as_rows
from ablate.kernels.reference import ReferenceBackend
from ablate.variants import make_variant
from ablate.variants.tables import ACTIVATIONS
from tests.helpers.repo import REPO

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CUDA_DIR = REPO / "ablate" / "kernels" / "cuda"
CUDA_EMU_DIR = REPO / "tests" / "cuda_emu"
HAS_TRITON = importlib.util.find_spec("triton") is not None
TRITON_RUNS = HAS_TRITON and (DEVICE == "cuda" or os.environ.get("TRITON_INTERPRET") == "1")


def _runnable() -> dict[str, str | None]:
    """Backend -> None when it can run in this session, else why not (cheap: builds nothing)."""
    out = {"triton": None if TRITON_RUNS else "needs triton and a GPU or TRITON_INTERPRET=1"}
    if DEVICE != "cuda":
        out["cuda"] = "no CUDA device"
    else:
        from ablate.kernels.cuda_backend import unavailable_reason

        out["cuda"] = unavailable_reason()
    return out


RUNNABLE = _runnable()
RUN_HERE = [name for name, why in RUNNABLE.items() if why is None]


@functools.lru_cache(maxsize=None)
def backend(name: str):
    return get_backend(name, DEVICE)


def needs_triton(f):
    return pytest.mark.skipif(not TRITON_RUNS, reason=RUNNABLE["triton"] or "")(f)


# ---- parity: every runnable backend x every case, forward and backward ------------------------

@pytest.mark.parametrize("case", parity.cases(DEVICE), ids=lambda c: c.id)
@pytest.mark.parametrize("name", RUN_HERE)
def test_parity_with_reference_in_float64(name, case):
    row = parity.run_case(backend(name), case, DEVICE)
    assert row.error is None, row.error
    assert row.passed, f"{name} {case.id}: fwd err {row.fwd_err:.3e}, bwd err {row.bwd_err:.3e}, tol {case.tolerance}"


@pytest.mark.parametrize("name", ["triton", "cuda"])
def test_backend_runs_here_or_says_why(name):
    if RUNNABLE[name] is not None:
        pytest.skip(f"{name}: {RUNNABLE[name]}")
    b = backend(name)
    assert b.name == name
    x = torch.randn(4, 8, device=DEVICE)
    assert torch.equal(b.activation("relu", x), torch.relu(x))


def test_parity_catches_an_unwritten_element():
    """The poisoned buffers: a kernel that skips an element must fail, not read stale memory."""

    class Lazy(ReferenceBackend):
        name = "lazy"

        def activation(self, name, x):
            from ablate.kernels.ops_base import new_buffer

            y = new_buffer(x.shape, x.dtype, x.device)
            y[..., :-1] = super().activation(name, x)[..., :-1]
            return y

    case = parity.Case("act:gelu", (2, 3, 37), torch.float32, "contiguous", seed=1)
    assert not parity.run_case(Lazy(), case, "cpu").passed
    assert parity.run_case(ReferenceBackend(), case, "cpu").passed


# ---- the model with kernels = the model with reference ---------------------------------------

MODEL_VARIANTS = {
    "pre.layernorm.gelu.dense": {},
    "pre.rmsnorm.swiglu": {"norm_type": "rmsnorm", "mlp": "swiglu"},
    "post.layernorm.gelu.dense": {"norm": "post"},
}


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(MODEL_VARIANTS))
@pytest.mark.parametrize("name", RUN_HERE)
def test_model_loss_and_gradients_match_reference(name, variant):
    spec = make_variant(**MODEL_VARIANTS[variant])
    size = get_size("tiny")
    torch.manual_seed(0)
    ref_model = build_model(spec, size, device=DEVICE)
    model = build_model(spec, size, ops=backend(name), device=DEVICE)
    model.load_state_dict(ref_model.state_dict())
    idx = torch.randint(0, size.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    _, ref_loss = ref_model(idx, idx)
    ref_loss.backward()
    _, loss = model(idx, idx)
    loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= 1e-5 * abs(ref_loss.item())
    ref_grads = dict(ref_model.named_parameters())
    for pname, p in model.named_parameters():
        g, rg = p.grad, ref_grads[pname].grad
        err = (g - rg).abs().max().item() / max(rg.abs().max().item(), 1e-12)
        assert err < 1e-4, f"{name} {variant}: gradient of {pname} differs by {err:.2e}"


# ---- fallbacks, layouts, autograd details ------------------------------------------------------

@needs_triton
def test_unknown_activation_falls_back_to_reference(monkeypatch):
    monkeypatch.setitem(ACTIVATIONS._items, "softsign_test", torch.nn.functional.softsign)
    b = backend("triton")
    x = torch.randn(3, 5, device=DEVICE, requires_grad=True)
    y = b.activation("softsign_test", x)
    assert torch.equal(y, torch.nn.functional.softsign(x))
    y.sum().backward()
    assert x.grad is not None
    g, u = torch.randn(2, 6, device=DEVICE).chunk(2, -1)
    assert torch.equal(b.gated("softsign_test", g, u), torch.nn.functional.softsign(g) * u)


@needs_triton
def test_unsupported_dtypes_and_widths_fall_back():
    b = backend("triton")
    x64 = torch.randn(2, 7, dtype=torch.float64, device=DEVICE)
    assert torch.equal(b.activation("gelu", x64), ReferenceBackend().activation("gelu", x64))
    w = torch.ones(7, dtype=torch.float64, device=DEVICE)
    assert torch.equal(b.rms_norm(x64, w, 1e-5), ReferenceBackend().rms_norm(x64, w, 1e-5))
    narrow = type(b)(b.ops)
    narrow.max_norm_width = 4
    x = torch.randn(2, 7, device=DEVICE)
    calls = []
    narrow.ops = type("Spy", (), {"norm": lambda *a: calls.append(a)})()
    out = narrow.layer_norm(x, torch.ones(7, device=DEVICE), None, 1e-5)
    assert not calls and torch.allclose(out, torch.nn.functional.layer_norm(x, (7,)))


@needs_triton
def test_add_norm_gradients_are_independent_and_s_alone_works():
    b = backend("triton")
    x, r = (torch.randn(2, 3, 16, device=DEVICE, requires_grad=True) for _ in range(2))
    w = torch.ones(16, device=DEVICE, requires_grad=True)
    s, y = b.add_rms_norm(x, r, w, 1e-5)
    (s.sum() + y.square().sum()).backward()
    before = r.grad.clone()
    x.grad.add_(1.0)  # must not leak into r.grad
    assert torch.equal(r.grad, before)
    x2, r2 = (t.detach().clone().requires_grad_() for t in (x, r))
    s2, _ = b.add_layer_norm(x2, r2, w, None, 1e-5)
    s2.sum().backward()  # only s used: the norm's gradient is absent
    assert torch.equal(x2.grad, torch.ones_like(x2)) and torch.equal(r2.grad, torch.ones_like(r2))


@needs_triton
def test_mixed_dtype_residual_add_promotes_like_torch():
    b = backend("triton")
    x = torch.randn(2, 4, 32, device=DEVICE)
    y = torch.randn(2, 4, 32, device=DEVICE).to(torch.bfloat16)
    w, bias = torch.ones(32, device=DEVICE), torch.zeros(32, device=DEVICE)
    s, h = b.add_layer_norm(x, y, w, bias, 1e-5)
    rs, rh = ReferenceBackend().add_layer_norm(x, y, w, bias, 1e-5)
    assert s.dtype == rs.dtype == torch.float32 and h.dtype == rh.dtype
    assert torch.allclose(s, rs) and torch.allclose(h, rh, atol=1e-5)


def test_as_rows_views_without_copying_when_it_can():
    t = torch.randn(2, 3, 8)
    assert as_rows(t, flat=True).shape == (1, 48) and as_rows(t, flat=True).data_ptr() == t.data_ptr()
    gate, up = torch.randn(2, 3, 16).chunk(2, -1)
    g2 = as_rows(gate, flat=True)
    assert g2.shape == (6, 8) and g2.stride() == (16, 1) and g2.data_ptr() == gate.data_ptr()
    tt = t.transpose(0, 1)  # leading dims that no row stride describes: a copy
    assert torch.equal(as_rows(tt, flat=False), tt.reshape(-1, 8))
    cols = t[..., ::2]  # a column stride: a copy
    assert as_rows(cols, flat=False).stride(1) == 1


# ---- torch.compile and the custom-op registrations --------------------------------------------

def _block(b, x, r, w, bias, h):
    s, n = b.add_layer_norm(x, r, w, bias, 1e-5)
    g, u = h.chunk(2, -1)
    return (s * b.activation("gelu", n) + b.gated("silu", g, u) + b.rms_norm(s, w, 1e-5)).square().mean()


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(compiler):
    b = backend("triton")
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=g).to(DEVICE).requires_grad_() for s in [(2, 4, 32), (2, 4, 32), (32,), (32,), (2, 4, 64)]]
    ref = _block(b, *args)
    ref_grads = torch.autograd.grad(ref, args)
    torch._dynamo.reset()
    compiled = torch.compile(functools.partial(_block, b), backend=compiler, fullgraph=True)
    out = compiled(*args)
    grads = torch.autograd.grad(out, args)
    assert torch.allclose(out, ref, rtol=1e-5)
    for a, r in zip(grads, ref_grads):
        assert torch.allclose(a, r, rtol=1e-4, atol=1e-6)


@needs_triton
def test_custom_op_registrations_pass_opcheck():
    from ablate.kernels.triton_backend import OPS

    g = torch.Generator().manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, generator=g).to(DEVICE)

    x, r, w, bias = rnd(3, 8), rnd(3, 8), rnd(8), rnd(8)
    h = rnd(3, 16)
    checks = [
        (OPS.act, (x.requires_grad_(), "gelu")),
        (OPS.gated, (*h.requires_grad_().chunk(2, -1), "silu")),
        (OPS.norm, (rnd(3, 8).requires_grad_(), w.requires_grad_(), bias.requires_grad_(), 1e-5, False)),
        (OPS.norm, (rnd(3, 8).requires_grad_(), w, None, 1e-5, True)),
        (OPS.add_norm, (rnd(3, 8).requires_grad_(), r.requires_grad_(), w, bias, 1e-5, False)),
    ]
    for op, args in checks:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


# ---- selection, errors and the command -----------------------------------------------------------

def test_auto_is_cpu_on_a_cpu():  # once its kernels pass parity: test_cpu_backend.py
    from ablate.kernels.select import pick_auto

    assert pick_auto("cpu") == "cpu"
    assert get_backend("auto", "cpu").name == "cpu"


@pytest.mark.skipif(DEVICE == "cuda", reason="a CUDA device is present")
def test_cuda_backend_without_a_gpu_is_a_one_line_config_error():
    with pytest.raises(ConfigError) as e:
        get_backend("cuda", "cpu")
    assert "\n" not in str(e.value) and "cuda" in str(e.value)


@pytest.mark.slow
@needs_triton
def test_kernels_check_command(monkeypatch, capsys):
    from ablate.cli import main

    monkeypatch.setattr(parity, "QUICK_SHAPES", (((2, 3, 37), "strided"),))
    assert main(["kernels", "check", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "layer_norm" in out and "pass" in out
    if DEVICE == "cpu":
        assert "cuda" in out and "unavailable" in out
    monkeypatch.setitem(parity.TOLERANCE, torch.float32, 1e-12)  # all but relu now fail
    assert main(["kernels", "check", "--quick", "--backends", "triton"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["kernels", "check", "--backends", "nope"]) == 2


def test_every_reference_activation_has_a_kernel_of_the_same_math():
    # A kernel exists for each activation the variants ship; new registrations fall back.
    assert set(ACTS) <= set(ACTIVATIONS.names())


# ---- the CUDA sources compile (nvcc -arch=sm_90, warnings as errors) --------------------------

NVCC = shutil.which("nvcc")
CUDA_SOURCES = sorted(p.name for p in CUDA_DIR.glob("*.cu"))
NVCC_FLAGS = [
    "-arch=sm_90", "-std=c++17", "-O3", "-c",
    "-Werror", "all-warnings",  # every nvcc front-end warning is an error
    "-Wdefault-stream-launch",  # a <<<>>> launch without an explicit stream warns (so fails)
    "-Xcompiler", "-Wall,-Wextra,-Werror",  # host compiler
    "-Xptxas", "-Werror",  # ptxas
    # as torch.utils.cpp_extension compiles them:
    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Compile every CUDA source and the binding at once (in parallel); name -> (rc, output)."""
    out = tmp_path_factory.mktemp("cuda_build")
    procs = {}
    if NVCC:
        for name in CUDA_SOURCES:
            cmd = [NVCC, *NVCC_FLAGS, "-I", str(CUDA_DIR), str(CUDA_DIR / name), "-o", str(out / f"{name}.o")]
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx:
        from torch.utils.cpp_extension import include_paths

        incs = [f"-isystem{p}" for p in [*include_paths(), sysconfig.get_paths()["include"]]]
        cmd = [cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
               "-DTORCH_EXTENSION_NAME=ablate_cuda_kernels", "-I", str(CUDA_DIR), *incs, str(CUDA_DIR / "binding.cpp")]
        procs["binding.cpp"] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return {name: (p.wait(), p.stdout.read()) for name, p in procs.items()}


def test_there_are_cuda_sources():
    assert {"activations.cu", "norms.cu"} <= set(CUDA_SOURCES)
    assert (CUDA_DIR / "binding.cpp").exists() and (CUDA_DIR / "ablate_kernels.h").exists()


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("source", CUDA_SOURCES)
def test_cuda_source_compiles_for_sm90_without_warnings(compiled, source):
    rc, output = compiled[source]
    assert rc == 0, f"nvcc failed on {source}:\n{output}"


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="no C++ compiler")
def test_torch_binding_compiles_without_cuda_headers(compiled):
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("Python development headers are missing")
    rc, output = compiled["binding.cpp"]
    assert rc == 0, f"g++ failed on binding.cpp:\n{output}"


# ---- the CUDA kernels, run on the CPU in an emulation of the CUDA thread model ------------------
# tests/cuda_emu/ (test-only, not shipped) emulates blocks, threads, barriers, shuffles and shared memory with OS
# threads. The .cu files (kernels and host launchers, unchanged but for the launch syntax) are
# compiled as C++ against it and driven through ops_base like the real extension, so the parity
# suite checks the CUDA index math, vectorisation choices, reductions and launch configurations
# here. It cannot check what only hardware shows (memory ordering, timing, occupancy).

EMU_API = r"""
#include "ablate_kernels.h"
extern "C" {
int e_act_forward(int a, int d, const void* x, int64_t xrs, void* y, int64_t r, int64_t c) {
  return ablate::act_forward(a, d, x, xrs, y, r, c, nullptr); }
int e_act_backward(int a, int d, const void* x, int64_t xrs, const void* dy, int64_t dyrs, void* dx, int64_t r,
                   int64_t c) { return ablate::act_backward(a, d, x, xrs, dy, dyrs, dx, r, c, nullptr); }
int e_gated_forward(int a, int d, const void* g, int64_t grs, const void* u, int64_t urs, void* y, int64_t r,
                    int64_t c) { return ablate::gated_forward(a, d, g, grs, u, urs, y, r, c, nullptr); }
int e_gated_backward(int a, int d, const void* g, int64_t grs, const void* u, int64_t urs, const void* dy, int64_t dyrs,
                     void* dg, void* du, int64_t r, int64_t c) {
  return ablate::gated_backward(a, d, g, grs, u, urs, dy, dyrs, dg, du, r, c, nullptr); }
int e_bias_act_forward(int a, int d, const void* x, int64_t xrs, const float* b, void* y, int64_t r, int64_t c) {
  return ablate::bias_act_forward(a, d, x, xrs, b, y, r, c, nullptr); }
int e_bias_act_backward(int a, int d, const void* x, int64_t xrs, const float* b, const void* dy, int64_t dyrs,
                        void* dx, float* dbp, float* db, unsigned* count, int64_t r, int64_t c, int64_t p) {
  return ablate::bias_act_backward(a, d, x, xrs, b, dy, dyrs, dx, dbp, db, count, r, c, p, nullptr); }
int e_norm_forward(int d, const void* x, int64_t xrs, const void* res, int64_t rrs, void* s, void* y, const float* w,
                   const float* b, float* m, float* rs, int64_t r, int64_t c, float eps, int rms) {
  return ablate::norm_forward(d, x, xrs, res, rrs, s, y, w, b, m, rs, r, c, eps, rms, nullptr); }
int e_norm_backward(int d, const void* dy, int64_t dyrs, const void* ds, int64_t dsrs, const void* x, int64_t xrs,
                    const float* w, const float* m, const float* rs, void* dx, float* dwp, float* dbp, float* dw,
                    float* db, unsigned* count, int64_t r, int64_t c, int64_t p, int rms) {
  return ablate::norm_backward(d, dy, dyrs, ds, dsrs, x, xrs, w, m, rs, dx, dwp, dbp, dw, db, count, r, c, p, rms,
                               nullptr); }
}
"""
LAUNCH = re.compile(r"(\b\w+_kernel<[^;{}]*?>)\s*<<<(.*?)>>>\((.*?)\);", re.S)
EMU_PROGRAMS = 3  # partial rows of the norm backward (a GPU uses 4 per SM)


def _emu_source(text: str) -> tuple[str, int]:
    text = text.replace("extern __shared__ float acc[];",
                        "float* acc = reinterpret_cast<float*>(emu::blk->smem.data());")
    return LAUNCH.subn(lambda m: f"emu::launch({m[1]}, emu::Cfg{{{m[2]}}}, {m[3]});", text)


class _EmuLaunchers:
    """ops_base.Launchers on the emulated extension (the binding's role, through ctypes)."""

    def __init__(self, lib):
        self.lib = lib

    @staticmethod
    def _a(*values):
        out = []
        for v in values:
            if isinstance(v, torch.Tensor):
                out.append(ctypes.c_void_p(v.data_ptr()))
            elif v is None:
                out.append(ctypes.c_void_p(0))
            elif isinstance(v, float):
                out.append(ctypes.c_float(v))
            else:
                out.append(ctypes.c_int64(int(v)) if not isinstance(v, bool) else ctypes.c_int(int(v)))
        return out

    def _call(self, fn, *args):
        rc = getattr(self.lib, fn)(*args)
        if rc != 0:
            raise RuntimeError(f"emulated {fn} failed with code {rc}")

    @staticmethod
    def _dt(t):
        return ctypes.c_int(0 if t.dtype == torch.float32 else 1)

    def act_fwd(self, act, x, y):
        self._call("e_act_forward", ctypes.c_int(act), self._dt(x), *self._a(x, x.stride(0), y, *x.shape))

    def act_bwd(self, act, x, dy, dx):
        self._call("e_act_backward", ctypes.c_int(act), self._dt(x),
                   *self._a(x, x.stride(0), dy, dy.stride(0), dx, *x.shape))

    def gated_fwd(self, act, g, u, y):
        self._call("e_gated_forward", ctypes.c_int(act), self._dt(g), *self._a(g, g.stride(0), u, u.stride(0), y, *g.shape))

    def gated_bwd(self, act, g, u, dy, dg, du):
        self._call("e_gated_backward", ctypes.c_int(act), self._dt(g),
                   *self._a(g, g.stride(0), u, u.stride(0), dy, dy.stride(0), dg, du, *g.shape))

    def bias_act_fwd(self, act, x, b, y):
        self._call("e_bias_act_forward", ctypes.c_int(act), self._dt(x), *self._a(x, x.stride(0), b, y, *x.shape))

    def bias_act_programs(self, rows, cols, device):
        return max(1, min(rows, EMU_PROGRAMS))

    def bias_act_bwd(self, act, x, b, dy, dx, db_part, db, count):
        self._call("e_bias_act_backward", ctypes.c_int(act), self._dt(x),
                   *self._a(x, x.stride(0), b, dy, dy.stride(0), dx, db_part, db, count, *x.shape, db_part.shape[0]))

    def norm_fwd(self, x, r, s, y, w, b, mean, rstd, eps, rms):
        self._call("e_norm_forward", self._dt(x), *self._a(x, x.stride(0), r, 0 if r is None else r.stride(0), s, y,
                                                           w, b, mean, rstd, *x.shape, float(eps), bool(rms)))

    def norm_bwd_programs(self, rows, cols, device):
        return max(1, min(rows, EMU_PROGRAMS))

    def norm_bwd(self, dy, ds, x, w, mean, rstd, dx, dw_part, db_part, dw, db, count, rms):
        self._call("e_norm_backward", self._dt(x),
                   *self._a(dy, dy.stride(0), ds, 0 if ds is None else ds.stride(0), x, x.stride(0), w, mean, rstd,
                            dx, dw_part, db_part, dw, db, count, *x.shape, dw_part.shape[0], bool(rms)))


@pytest.fixture(scope="module")
def cuda_emu(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    from ablate.kernels.ops_base import KernelBackend, define_ops

    out = tmp_path_factory.mktemp("cuda_emu")
    srcs, launches = [], 0
    for name in CUDA_SOURCES:
        text, n = _emu_source((CUDA_DIR / name).read_text())
        launches += n
        (out / f"{name}.cpp").write_text(text)
        srcs.append(str(out / f"{name}.cpp"))
    assert launches == (CUDA_DIR / "activations.cu").read_text().count("<<<") + \
        (CUDA_DIR / "norms.cu").read_text().count("<<<"), "a kernel launch was not rewritten for the emulator"
    (out / "api.cpp").write_text(EMU_API)
    lib_path = out / "libablate_cuda_emu.so"
    cmd = [cxx, "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread", "-Wno-unknown-pragmas",
           "-I", str(CUDA_EMU_DIR), "-I", str(CUDA_DIR), *srcs, str(out / "api.cpp"), "-o", str(lib_path)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, f"emulated build failed:\n{build.stdout}{build.stderr}"

    class EmulatedCuda(KernelBackend):
        name = "cuda-emu"
        max_norm_width = 8192

        def device_ok(self, t):
            return t.device.type == "cpu"

    return EmulatedCuda(define_ops("ablate_cuda_emu", _EmuLaunchers(ctypes.CDLL(str(lib_path)))))


EMU_CASES = parity.cases("cpu", quick=True) + [
    parity.Case(op, shape, dtype, layout, seed=500 + i)
    for i, (op, shape, layout, dtype) in enumerate([
        *((op, (3, 40, 96), "contiguous", torch.float32) for op in ("layer_norm", "add_rms_norm")),  # 16 row groups x 3 programs
        *((op, (2, 2, 8192), "contiguous", torch.bfloat16) for op in ("add_layer_norm", "rms_norm")),  # the widest rows
        *((op, (1, 2, 8191), "strided", torch.float32) for op in ("layer_norm", "add_rms_norm")),  # scalar, 16 per thread
        ("gated:gelu", (2, 3, 2048), "strided", torch.bfloat16),  # the GEGLU halves, vectorised
        ("act:silu", (1, 1, 5000), "contiguous", torch.float32),  # flat, more than one block
        ("bias_act:gelu", (2, 4, 2500), "strided", torch.float32),  # scalar: 10 column blocks x 3 programs
        ("bias_act:gelu", (1, 7, 3072), "contiguous", torch.bfloat16),  # vectorised, 2 column blocks
    ])
]


@pytest.mark.parametrize("case", EMU_CASES, ids=lambda c: c.id)
def test_cuda_kernels_in_emulation_match_reference(cuda_emu, case):
    row = parity.run_case(cuda_emu, case, "cpu")
    assert row.error is None, row.error
    assert row.passed, f"emulated cuda {case.id}: fwd err {row.fwd_err:.3e}, bwd err {row.bwd_err:.3e}"


def test_cuda_sources_ship_with_the_package():
    text = (REPO / "pyproject.toml").read_text()
    assert '"ablate.kernels" = ["cuda/*.cu", "cuda/*.cpp", "cuda/*.h", "cpu/*.c", "cpu/*.h"]' in text
    assert all(p.suffix in (".cu", ".cpp", ".h") for p in CUDA_DIR.iterdir() if p.is_file())
    assert not (CUDA_DIR / "emu").exists()  # the emulator is the tests' own (tests/cuda_emu/)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
