"""Compile every Triton kernel specialization our launchers produce for a GPU, without a GPU.

Triton's interpreter (TRITON_INTERPRET=1), which the parity suite uses on a CPU, runs the
kernels' math in numpy and never runs the compiler, so a kernel can pass every CPU check and
still fail to lower to PTX (an op or type the GPU backend does not support, a constexpr branch
only one specialization takes). This module calls the real launchers of triton_kernels.py with
small CPU tensors, records each launch instead of running it, and compiles what was recorded to
a cubin for the target (default sm_90, the H100/H200) with Triton's own compiler and ptxas.
It also reads each cubin's registers and local memory (spills) with cuobjdump when Triton ships
one. Nothing here touches a GPU driver.

    python -m ablate.kernels.triton_aot [--arch 90] [-v]

It must run in a process where TRITON_INTERPRET is unset (kernels are decorated as compiled
JIT functions at import time); `main` re-executes itself in such a process when it is not.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

# Widths that reach the launchers with different block sizes and warp counts: elementwise blocks
# are min(1024, next_pow2(cols)); a norm row is one block of next_pow2(cols) (64 .. 16384).
ELEMENTWISE_WIDTHS = (37, 3072)
NORM_WIDTHS = (37, 768, 3072, 16384)
ROWS = 3


@dataclass
class Launch:
    """One recorded kernel launch: what Triton would specialize and compile for it."""
    kernel: object  # the JITFunction
    signature: dict[str, str]
    constexprs: dict[str, object]
    attrs: dict[tuple, list]
    options: dict[str, object] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.kernel.__name__

    def key(self) -> tuple:
        return (self.name, tuple(self.signature.items()), tuple(sorted(self.constexprs.items())),
                tuple(sorted(self.attrs)), tuple(sorted(self.options.items())))

    def label(self) -> str:
        dtypes = sorted({t[1:] for t in self.signature.values() if t.startswith("*")})
        consts = ",".join(f"{k}={v}" for k, v in self.constexprs.items() if k.isupper())
        warps = self.options.get("num_warps", 4)
        return f"{self.name}[{'/'.join(dtypes)}; {consts}; warps={warps}]"


_POINTER_TYPES = {"torch.float32": "*fp32", "torch.bfloat16": "*bf16", "torch.int32": "*i32"}


def _arg_type(v) -> tuple[str, bool]:
    """(Triton signature type, divisible by 16) for one runtime argument, as Triton's JIT
    specializes it: 16-byte aligned pointers and ints divisible by 16 get a divisibility hint."""
    import torch  # lazy: torch only when used

    if isinstance(v, torch.Tensor):
        return _POINTER_TYPES[str(v.dtype)], v.data_ptr() % 16 == 0
    if isinstance(v, bool):
        return "i1", False
    if isinstance(v, int):
        return ("i32" if -2**31 <= v < 2**31 else "i64"), v % 16 == 0
    if isinstance(v, float):
        return "fp32", False
    raise TypeError(f"unexpected kernel argument {v!r}")


class _Recorder:
    """Stands in for a JITFunction: `kernel[grid](*args, **kwargs)` records a Launch."""
    def __init__(self, kernel, sink: list[Launch]):
        self.kernel, self.sink = kernel, sink

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            names = self.kernel.arg_names
            options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
            bound = dict(zip(names, args)) | kwargs
            signature, constexprs, attrs = {}, {}, {}
            for i, name in enumerate(names):
                v = bound[name]
                if self.kernel.params[i].is_constexpr or (isinstance(v, int) and not isinstance(v, bool) and v == 1):
                    # Triton also folds an int argument equal to 1 into a constant
                    signature[name], constexprs[name] = "constexpr", v
                    continue
                signature[name], div16 = _arg_type(v)
                if div16:
                    attrs[(i,)] = [["tt.divisibility", 16]]
            self.sink.append(Launch(self.kernel, signature, constexprs, attrs, options))
        return launch


@contextlib.contextmanager
def recording(tk):
    """Replace every kernel of module `tk` by a recorder; yields the list of launches."""
    import triton  # lazy: an optional package (triton)

    launches: list[Launch] = []
    kernels = {n: k for n, k in vars(tk).items() if isinstance(k, triton.runtime.jit.JITFunction)
               and "program_id" in k.src}
    for n, k in kernels.items():
        setattr(tk, n, _Recorder(k, launches))
    try:
        yield launches
    finally:
        for n, k in kernels.items():
            setattr(tk, n, k)


def _drive_launchers(tk) -> None:
    """Call each launcher once per (dtype, activation or norm flavour, width) the backend can
    produce, with the tensors ops_base would hand it (inputs and outputs in the data dtype;
    weights, biases, statistics and partial gradients in float32)."""
    import torch  # lazy: torch only when used

    from ablate.kernels.ops_base import ACTS  # lazy: torch only when used

    f32 = torch.float32
    for dt in (torch.float32, torch.bfloat16):
        for cols in ELEMENTWISE_WIDTHS:
            x = torch.zeros(ROWS, cols, dtype=dt)
            for act in range(len(ACTS)):
                tk.act_fwd(act, x, x.clone())
                tk.act_bwd(act, x, x.clone(), x.clone())
                tk.gated_fwd(act, x, x.clone(), x.clone())
                tk.gated_bwd(act, x, x.clone(), x.clone(), x.clone(), x.clone())
                b = torch.zeros(cols, dtype=f32)
                tk.bias_act_fwd(act, x, b, x.clone())
                tk.bias_act_bwd(act, x, b, x.clone(), x.clone(), torch.zeros(2, cols, dtype=f32),
                                b.clone(), torch.zeros(cols, dtype=torch.int32))
        for cols in NORM_WIDTHS:
            x = torch.zeros(ROWS, cols, dtype=dt)
            w = torch.ones(cols, dtype=f32)
            stats = torch.zeros(ROWS, dtype=f32)
            for rms, bias in ((False, True), (False, False), (True, False)):
                b = None if not bias else torch.zeros(cols, dtype=f32)
                mean = None if rms else stats.clone()
                for res in (False, True):
                    r, s = (x.clone(), x.clone()) if res else (None, None)
                    tk.norm_fwd(x, r, s, x.clone(), w, b, mean, stats.clone(), 1e-5, rms)
                    programs = 2
                    part = torch.zeros(programs, cols, dtype=f32)
                    count = torch.zeros(2, dtype=torch.int32)
                    tk.norm_bwd(x, x.clone() if res else None, x, w, mean, stats, x.clone(), part,
                                part.clone() if bias else None, w.clone(), w.clone() if bias else None, count, rms)


def launches() -> list[Launch]:
    """Every distinct specialization the launchers produce (compiled-mode triton_kernels)."""
    from ablate.kernels import triton_kernels as tk  # lazy: torch only when used

    if tk.INTERPRETED:
        raise RuntimeError("triton_kernels was imported with TRITON_INTERPRET=1; run this in a fresh process without it")
    with recording(tk) as recorded:
        _drive_launchers(tk)
    distinct = {}
    for launch in recorded:
        distinct.setdefault(launch.key(), launch)
    return list(distinct.values())


@dataclass
class Compiled:
    label: str
    seconds: float
    error: str | None = None
    registers: int | None = None
    spill_bytes: int | None = None  # local memory per thread: register spills


def _resource_usage(cubin: bytes) -> tuple[int | None, int | None]:
    """(registers, local memory bytes) from `cuobjdump -res-usage`, or (None, None)."""
    from triton import knobs  # lazy: an optional package (triton)

    try:
        tool = knobs.nvidia.cuobjdump.path
    except Exception:
        return None, None
    if not tool or not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    regs, local = re.search(r"REG:(\d+)", out), re.search(r"LOCAL:(\d+)", out)
    return (int(regs.group(1)) if regs else None), (int(local.group(1)) if local else None)


def compile_launch(launch: Launch, arch: int) -> Compiled:
    import triton  # lazy: an optional package (triton)
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    t = time.perf_counter()
    try:
        src = ASTSource(launch.kernel, launch.signature, launch.constexprs, launch.attrs)
        k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=dict(launch.options))
        regs, local = _resource_usage(k.asm["cubin"])
        return Compiled(launch.label(), time.perf_counter() - t, None, regs, local)
    except Exception as e:  # report every failure, do not stop at the first
        # Triton's CompilationError reads "at L:C:", the source line, a caret, then the message
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
        where = f" ({lines[0]})" if len(lines) > 1 else ""
        return Compiled(launch.label(), time.perf_counter() - t, f"{type(e).__name__}: {lines[-1]}{where}")


_FORKED: tuple[list, int] = ([], 90)  # (launches, arch) for forked compile workers


def _compile_nth(i: int) -> Compiled:
    launches_, arch = _FORKED
    return compile_launch(launches_[i], arch)


def compile_all(arch: int = 90, workers: int | None = None) -> list[Compiled]:
    """Compile every specialization, on `workers` forked processes (default: one per CPU the
    process may use): each compile is independent, CPU-bound and holds the GIL in Python."""
    global _FORKED
    # Triton 3.9 warns once when this is unset; the GPU backend runs with its default (fused).
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    todo = launches()
    workers = workers or len(os.sched_getaffinity(0))
    if workers <= 1 or len(todo) < 2:
        return [compile_launch(launch, arch) for launch in todo]

    _FORKED = (todo, arch)  # children inherit the launches (kernel objects do not pickle)
    try:
        with mp.get_context("fork").Pool(min(workers, len(todo))) as pool:
            return pool.map(_compile_nth, range(len(todo)))
    finally:
        _FORKED = ([], arch)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ablate.kernels.triton_aot", description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability as an integer (default 90: sm_90)")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per specialization")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        return subprocess.call([sys.executable, "-m", "ablate.kernels.triton_aot", *(argv or sys.argv[1:])], env=env)
    t = time.perf_counter()
    results = compile_all(args.arch)
    failed = [r for r in results if r.error]
    spilled = [r for r in results if r.spill_bytes]
    for r in results:
        if args.verbose or r.error or r.spill_bytes:
            usage = "" if r.registers is None else f" regs {r.registers}, spills {r.spill_bytes} B"
            print(f"  {'FAIL' if r.error else 'ok  '} {r.label} ({r.seconds:.1f}s){usage}"
                  + (f"\n       {r.error}" if r.error else ""))
    regs = [r.registers for r in results if r.registers is not None]
    usage = f"; registers per thread {min(regs)}-{max(regs)}, {len(spilled)} spill" if regs else ""
    print(f"triton kernels for sm_{args.arch}: {len(results) - len(failed)}/{len(results)} specializations "
          f"compiled in {time.perf_counter() - t:.0f}s{usage}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
