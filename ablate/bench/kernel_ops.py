"""The kernel bench (`ablate bench --only kernels`, or `ablate kernels bench` with its flags): per op, each implementation's time and achieved bandwidth, in one run.

Implementations: `eager` (the reference backend, i.e. PyTorch eager), `compile` (the reference
ops under torch.compile, as the model would get with a compiled step), and the kernel backends
(`triton`, `cuda`), all on the same inputs. Each is timed forward only and forward + backward.

Bytes are the minimum an op must move (read every input once, write every output once), the
same for every implementation, so GB/s compares fairly and reads as a fraction of the device's
measured copy bandwidth (a large device-to-device `copy_`, read + write):

    act      fwd: x -> y               2N     bwd: x, dy -> dx                3N
    gated    fwd: gate, up -> y        3N     bwd: gate, up, dy -> dg, du     5N   (N = rows x hidden)
    norm     fwd: x -> y               2N     bwd: x, dy -> dx                3N   (+ weights, stats)
    add+norm fwd: x, r -> s, y         4N     bwd: s, dy, ds -> dx            4N

Timing on a GPU: CUDA events around each call, after a 256 MiB write that evicts the L2 and gives
the host time to enqueue the call (so Python overhead does not show as GPU time); the median of
the repeats. On a CPU: wall time (perf_counter), median of the repeats.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from ablate.bench.timing import time_calls
from ablate.kernels import parity
from ablate.kernels.reference import ReferenceBackend

# Targets from issue 7 (fraction of copy bandwidth, forward + backward).
TARGET_ELEMENTWISE = 0.80
TARGET_NORM = 0.70


@dataclass(frozen=True)
class BenchCase:
    op: str
    rows: int
    cols: int  # the op's width: hidden for gated ops (the input is rows x 2 hidden)
    dtype: torch.dtype

    @property
    def label(self) -> str:
        return f"{self.op} {self.rows}x{self.cols} {parity.DTYPE_NAMES[self.dtype]}"

    @property
    def bytes(self) -> tuple[int, int]:
        n = self.rows * self.cols * torch.empty(0, dtype=self.dtype).element_size()
        if self.op.startswith("act:"):
            return 2 * n, 3 * n
        if self.op.startswith("gated:"):
            return 3 * n, 5 * n
        if self.op.startswith("add_"):
            return 4 * n, 4 * n
        return 2 * n, 3 * n

    @property
    def target(self) -> float:
        return TARGET_NORM if "norm" in self.op else TARGET_ELEMENTWISE


def default_cases(rows: int) -> list[BenchCase]:
    """The shapes andrea-120m trains at (d_model 768, MLP 3072, gated hidden 2048): activations
    and gated products in bfloat16 (autocast's matmul outputs), norms in float32 (the residual
    stream under autocast) and bfloat16."""
    out = [BenchCase(f"act:{a}", rows, 3072, torch.bfloat16) for a in ("gelu", "gelu_erf", "relu", "silu", "relu2")]
    out += [BenchCase(f"gated:{a}", rows, 2048, torch.bfloat16) for a in parity.GATED]
    for op in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm"):
        out += [BenchCase(op, rows, 768, torch.float32), BenchCase(op, rows, 768, torch.bfloat16)]
    return out


def _inputs(case: BenchCase, device):
    layout = "strided" if case.op.startswith("gated:") else "contiguous"  # gated: c_fc(x).chunk(2)
    pc = parity.Case(case.op, (1, case.rows, case.cols), case.dtype, layout, seed=1)
    leaves, fn = parity.build(pc, device)
    with torch.no_grad():
        outs = fn(ReferenceBackend(), *leaves)
    grads = [torch.randn_like(o) for o in outs]
    return leaves, fn, grads


class Timer:
    def __init__(self, device, repeats: int = 20, warmup: int = 3):
        self.device = torch.device(device)
        self.repeats, self.warmup = repeats, warmup
        self.cuda = self.device.type == "cuda"
        self._flush = torch.empty(256 << 20, dtype=torch.int8, device=self.device) if self.cuda else None

    def __call__(self, f) -> float:
        """Median seconds of one call of f. On a GPU: CUDA events around each call after the L2
        flush, so neither the flush nor the host's Python shows as GPU time."""
        if not self.cuda:
            return statistics.median(time_calls(f, self.repeats, self.warmup))
        for _ in range(self.warmup):
            f()
        torch.cuda.synchronize(self.device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.repeats)]
        for start, end in events:
            self._flush.zero_()
            start.record()
            f()
            end.record()
        torch.cuda.synchronize(self.device)
        return statistics.median(s.elapsed_time(e) for s, e in events) / 1e3


def copy_bandwidth(device, nbytes: int | None = None, timer: Timer | None = None) -> float:
    """Bytes per second of a large copy (read + write) on `device`."""
    device = torch.device(device)
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    timer = timer or Timer(device)
    return 2 * nbytes / timer(lambda: dst.copy_(src))


@dataclass
class Result:
    case: BenchCase
    impl: str
    fwd_s: float = math.nan
    fwdbwd_s: float = math.nan
    error: str | None = None

    def gbps(self, which: str) -> float:
        fwd, bwd = self.case.bytes
        return (fwd / self.fwd_s if which == "fwd" else (fwd + bwd) / self.fwdbwd_s) / 1e9


def _implementations(backends: dict, use_compile: bool):
    ref = ReferenceBackend()
    impls = [("eager", ref, False)]
    if use_compile:
        impls.append(("compile", ref, True))
    impls += [(name, be, False) for name, be in backends.items() if not isinstance(be, str)]
    return impls


def run_bench(cases: list[BenchCase], backends: dict, device, use_compile: bool = True,
              repeats: int = 20, progress=None) -> list[Result]:
    """Time every implementation on every case; progress(case_results) after each case."""
    timer = Timer(device, repeats=repeats)
    results = []
    for case in cases:
        leaves, fn, grads = _inputs(case, device)
        case_results = []
        for name, be, compiled in _implementations(backends, use_compile):
            r = Result(case, name)
            try:
                if compiled:
                    torch._dynamo.reset()
                    fwd_fn = torch.compile(lambda *ls: fn(be, *ls), dynamic=False)
                    train_fn = torch.compile(lambda *ls: fn(be, *ls), dynamic=False)
                else:
                    fwd_fn = train_fn = (lambda *ls, be=be: fn(be, *ls))

                def fwd():
                    with torch.no_grad():
                        return fwd_fn(*leaves)

                def fwdbwd():
                    return torch.autograd.grad(train_fn(*leaves), leaves, grads)

                r.fwd_s = timer(fwd)
                r.fwdbwd_s = timer(fwdbwd)
            except Exception as e:
                r.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            case_results.append(r)
        results += case_results
        del leaves, grads
        if progress:
            progress(case_results)
    return results


def quick_time(backend, device, rows: int = 4096, repeats: int = 10) -> float:
    """Seconds of forward + backward over a representative set of ops (for `--kernels auto`)."""
    timer = Timer(device, repeats=repeats, warmup=2)
    total = 0.0
    for case in (BenchCase("layer_norm", rows, 768, torch.float32), BenchCase("add_layer_norm", rows, 768, torch.float32),
                 BenchCase("act:gelu", rows, 3072, torch.bfloat16), BenchCase("gated:silu", rows, 2048, torch.bfloat16)):
        leaves, fn, grads = _inputs(case, device)
        total += timer(lambda: torch.autograd.grad(fn(backend, *leaves), leaves, grads))
    return total


def format_header(copy_bw: float) -> str:
    return "\n".join([
        f"copy bandwidth (measured): {copy_bw / 1e9:,.0f} GB/s; %copy = achieved / copy bandwidth; targets "
        "(fwd+bwd): elementwise and gated >= 80%, norms >= 70%, no slower than eager, within 10% of compile",
        f"{'op':<34}{'impl':<9}{'fwd us':>9}{'GB/s':>8}{'%copy':>7}{'f+b us':>10}{'GB/s':>8}{'%copy':>7}"
        f"{'vs eager':>10}{'vs comp':>9}  target"])


def format_case(rs: list[Result], copy_bw: float) -> str:
    """The lines of one case: one per implementation; speed-ups are forward + backward."""
    lines = []
    base = {r.impl: r for r in rs}
    eager, comp = base.get("eager"), base.get("compile")
    for r in rs:
        case = r.case
        if r.error:
            lines.append(f"{case.label:<34}{r.impl:<9}error: {r.error}")
            continue
        fg, tg = r.gbps("fwd"), r.gbps("fwdbwd")
        vs_e = eager.fwdbwd_s / r.fwdbwd_s if eager and not eager.error else math.nan
        vs_c = comp.fwdbwd_s / r.fwdbwd_s if comp and not comp.error else math.nan
        verdict = ""
        if r.impl not in ("eager", "compile"):
            ok = (tg * 1e9 / copy_bw >= case.target and (math.isnan(vs_e) or vs_e >= 1.0)
                  and (math.isnan(vs_c) or vs_c >= 1 / 1.1))
            verdict = "met" if ok else "missed"
        lines.append(f"{case.label:<34}{r.impl:<9}{r.fwd_s * 1e6:>9.1f}{fg:>8.0f}{fg * 1e9 / copy_bw:>7.0%}"
                     f"{r.fwdbwd_s * 1e6:>10.1f}{tg:>8.0f}{tg * 1e9 / copy_bw:>7.0%}"
                     f"{_ratio(vs_e):>10}{_ratio(vs_c):>9}  {verdict}")
    return "\n".join(lines)


def _ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}x"  # "-": that baseline was not run (--no-compile)
