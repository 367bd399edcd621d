"""The kernel bench (`ablate kernels bench`, or `ablate bench --only kernels`): per op, each
implementation's time forward and forward + backward and its achieved bandwidth: `eager` (the
reference backend), `compile` (the reference ops under torch.compile) and the kernel backends,
on the same inputs. Bytes are the fewest an op must move (every input read once, every output
written once), so GB/s compares fairly and reads as a fraction of the device's measured copy
bandwidth. Timed by the one loop (bench/timing.py): on a GPU on its own timeline after a write
that evicts the L2, on a CPU by the wall clock; the median of the repeats.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from ablate.bench.timing import cuda_events, time_calls
from ablate.kernels import parity
from ablate.kernels.reference import ReferenceBackend

# Fractions of copy bandwidth, forward + backward, a backend must reach.
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
        """(forward, backward): act x -> y, x dy -> dx: 2N, 3N; gated gate up -> y, gate up dy ->
        dg du: 3N, 5N; norm as act (+ weights, stats); add+norm x r -> s y, s dy ds -> dx: 4N, 4N."""
        n = self.rows * self.cols * torch.empty(0, dtype=self.dtype).element_size()
        if self.op.startswith("gated:"):
            return 3 * n, 5 * n
        return (4 * n, 4 * n) if self.op.startswith("add_") else (2 * n, 3 * n)

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


def timer(device, repeats: int = 20, warmup: int = 3):
    """f -> median seconds of one call of f on `device`; on a GPU each call follows a 256 MiB
    write that evicts the L2 and gives the host time to enqueue the call."""
    if torch.device(device).type != "cuda":
        return lambda f: statistics.median(time_calls(f, repeats, warmup))
    flush = torch.empty(256 << 20, dtype=torch.int8, device=device)
    return lambda f: statistics.median(time_calls(f, repeats, warmup, clock=cuda_events(), before=flush.zero_))


def copy_bandwidth(device, time_call=None) -> float:
    """Bytes per second of a large copy (read + write) on `device`."""
    device = torch.device(device)
    nbytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / (time_call or timer(device))(lambda: dst.copy_(src))


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


def run_bench(cases: list[BenchCase], backends: dict, device, use_compile: bool = True, repeats: int = 20,
              progress=lambda case_results: None) -> None:
    """Time every implementation on every case; progress(case_results) after each case."""
    time_call, ref = timer(device, repeats), ReferenceBackend()
    impls = [("eager", ref, False), *([("compile", ref, True)] if use_compile else []),
             *((name, be, False) for name, be in backends.items() if not isinstance(be, str))]
    for case in cases:
        leaves, fn, grads = _inputs(case, device)
        case_results = []
        for name, be, compiled in impls:
            r = Result(case, name)
            try:
                if compiled:
                    torch._dynamo.reset()
                    fwd_fn, train_fn = (torch.compile(lambda *ls: fn(be, *ls), dynamic=False) for _ in range(2))
                else:
                    fwd_fn = train_fn = (lambda *ls, be=be: fn(be, *ls))

                def fwd():
                    with torch.no_grad():
                        return fwd_fn(*leaves)

                r.fwd_s = time_call(fwd)
                r.fwdbwd_s = time_call(lambda: torch.autograd.grad(train_fn(*leaves), leaves, grads))
            except Exception as e:
                r.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            case_results.append(r)
        del leaves, grads
        progress(case_results)


def quick_time(backend, device, rows: int = 4096, repeats: int = 10) -> float:
    """Seconds of forward + backward over a representative set of ops (for `--kernels auto`)."""
    time_call = timer(device, repeats, warmup=2)
    total = 0.0
    for case in (BenchCase("layer_norm", rows, 768, torch.float32), BenchCase("add_layer_norm", rows, 768, torch.float32),
                 BenchCase("act:gelu", rows, 3072, torch.bfloat16),
                 BenchCase("gated:silu", rows, 2048, torch.bfloat16)):
        leaves, fn, grads = _inputs(case, device)
        total += time_call(lambda: torch.autograd.grad(fn(backend, *leaves), leaves, grads))
    return total


def format_header(copy_bw: float) -> str:
    return "\n".join([
        f"copy bandwidth (measured): {copy_bw / 1e9:,.0f} GB/s; %copy = achieved / copy bandwidth; targets "
        "(fwd+bwd): elementwise and gated >= 80%, norms >= 70%, no slower than eager, within 10% of compile",
        f"{'op':<34}{'impl':<9}{'fwd us':>9}{'GB/s':>8}{'%copy':>7}{'f+b us':>10}{'GB/s':>8}{'%copy':>7}"
        f"{'vs eager':>10}{'vs comp':>9}  target"])


def format_case(rs: list[Result], copy_bw: float) -> str:
    """The lines of one case: one per implementation; speed-ups are forward + backward."""
    base = {r.impl: r for r in rs if not r.error}
    lines = []
    for r in rs:
        if r.error:
            lines.append(f"{r.case.label:<34}{r.impl:<9}error: {r.error}")
            continue
        fg, tg = r.gbps("fwd"), r.gbps("fwdbwd")
        vs_e, vs_c = (base[b].fwdbwd_s / r.fwdbwd_s if b in base else math.nan for b in ("eager", "compile"))
        verdict = ""
        if r.impl not in ("eager", "compile"):
            met = tg * 1e9 / copy_bw >= r.case.target and not vs_e < 1.0 and not vs_c < 1 / 1.1  # nan: not run
            verdict = "met" if met else "missed"
        lines.append(f"{r.case.label:<34}{r.impl:<9}{r.fwd_s * 1e6:>9.1f}{fg:>8.0f}{fg * 1e9 / copy_bw:>7.0%}"
                     f"{r.fwdbwd_s * 1e6:>10.1f}{tg:>8.0f}{tg * 1e9 / copy_bw:>7.0%}"
                     f"{_ratio(vs_e):>10}{_ratio(vs_c):>9}  {verdict}")
    return "\n".join(lines)


def _ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}x"  # "-": that baseline was not run (--no-compile)
