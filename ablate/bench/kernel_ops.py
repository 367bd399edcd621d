"""The kernel bench (`ablate kernels bench`, or `ablate bench --only kernels`): per op, each
implementation's time forward and forward + backward and its achieved bandwidth: `eager` (the
reference backend), `compile` (the reference ops under torch.compile) and the kernel backends,
on the same inputs. Bytes are the fewest an op must move (every input read once, every output
written once), so GB/s compares fairly and reads as a fraction of the device's measured copy
bandwidth.

Two times per measurement, never mixed (bench/timing.py):
- device time: on a GPU, `CALLS` calls captured in one CUDA graph and the graph replayed
  between CUDA events (`graph`), or, where an implementation cannot be captured, `CALLS`
  back-to-back calls between CUDA events (`loop`, which shows host time whenever the host is the
  slower side); on a CPU the wall clock (`wall`). Steady state: the same inputs call after call,
  so an op whose tensors fit in the L2 cache (50 MB on an H100) may be read from there.
- host time: the wall-clock seconds a call takes to return on the CPU side, the device drained
  before each sample: on a GPU the cost of launching the work (Python, the dispatcher, the
  launcher), which a training step pays per op unless it is captured.
Each is the median over the repeats of the mean of `CALLS` calls.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from ablate.bench.timing import graph_seconds, host_seconds, steady_seconds, time_calls
from ablate.core.errors import ConfigError
from ablate.kernels import parity
from ablate.kernels.check import interpret_triton_on_cpu
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
    """The shapes andrea-120m trains at (d_model 768, MLP 3072, gated hidden 2048): activations,
    gated products and bias + GELU in bfloat16 (autocast's matmul outputs), norms in float32 (the
    residual stream under autocast) and bfloat16."""
    out = [BenchCase(f"act:{a}", rows, 3072, torch.bfloat16) for a in ("gelu", "gelu_erf", "relu", "silu", "relu2")]
    out += [BenchCase(f"gated:{a}", rows, 2048, torch.bfloat16) for a in parity.GATED]
    out.append(BenchCase("bias_act:gelu", rows, 3072, torch.bfloat16))  # c_fc's bias + GELU, fused
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


CALLS = 20  # calls per sample: a captured graph holds this many, a loop runs this many


def _sync(device):
    return (lambda: torch.cuda.synchronize(device)) if torch.device(device).type == "cuda" else (lambda: None)


def device_time(f, device, repeats: int = 20, calls: int = CALLS) -> tuple[float, str]:
    """(median seconds of one call of f on `device`, how: graph | loop | wall)."""
    if torch.device(device).type != "cuda":
        return statistics.median(time_calls(f, repeats, warmup=3, calls=max(1, calls // 4))), "wall"
    try:
        return statistics.median(graph_seconds(f, device, repeats, calls)), "graph"
    except Exception:  # not capturable: time a steady loop instead, and say so
        torch.cuda.synchronize(device)
        return statistics.median(steady_seconds(f, repeats, calls)), "loop"


def host_time(f, device, repeats: int = 20, calls: int = CALLS) -> float:
    """Median wall seconds a call of f takes to return, the device drained before each sample."""
    if torch.device(device).type != "cuda":
        calls = max(1, calls // 4)  # on a CPU the work is the host time: fewer calls suffice
    return statistics.median(host_seconds(f, repeats, warmup=3, calls=calls, sync=_sync(device)))


def timer(device, repeats: int = 20, warmup: int = 3):
    """f -> median device seconds of one call of f (see device_time)."""
    return lambda f: device_time(f, device, repeats)[0]


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
    fwd_s: float = math.nan  # device time
    fwdbwd_s: float = math.nan
    fwd_host_s: float = math.nan  # host time
    fwdbwd_host_s: float = math.nan
    how: str = ""  # how the device time was taken: graph, loop or wall
    error: str | None = None

    def gbps(self, which: str) -> float:
        fwd, bwd = self.case.bytes
        return (fwd / self.fwd_s if which == "fwd" else (fwd + bwd) / self.fwdbwd_s) / 1e9


def _impl_fns(fn, be, compiled: bool, leaves, grads):
    """(forward without grad, forward + backward) of one implementation, as zero-argument calls."""
    if compiled:
        torch._dynamo.reset()
        fwd_fn, train_fn = (torch.compile(lambda *ls: fn(be, *ls), dynamic=False) for _ in range(2))
    else:
        fwd_fn = train_fn = (lambda *ls: fn(be, *ls))

    def fwd():
        with torch.no_grad():
            return fwd_fn(*leaves)

    return fwd, (lambda: torch.autograd.grad(train_fn(*leaves), leaves, grads))


def measure(case: BenchCase, name: str, fwd, train, device, repeats: int) -> Result:
    r = Result(case, name)
    try:
        r.fwd_s, how_f = device_time(fwd, device, repeats)
        r.fwdbwd_s, how_t = device_time(train, device, repeats)
        r.how = how_f if how_f == how_t else f"{how_f}/{how_t}"
        r.fwd_host_s = host_time(fwd, device, repeats)
        r.fwdbwd_host_s = host_time(train, device, repeats)
    except Exception as e:
        r.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return r


def run_bench(cases: list[BenchCase], backends: dict, device, use_compile: bool = True, repeats: int = 20,
              progress=lambda case_results: None) -> None:
    """Time every implementation on every case; progress(case_results) after each case."""
    ref = ReferenceBackend()
    impls = [("eager", ref, False), *([("compile", ref, True)] if use_compile else []),
             *((name, be, False) for name, be in backends.items() if not isinstance(be, str))]
    for case in cases:
        leaves, fn, grads = _inputs(case, device)
        case_results = []
        for name, be, compiled in impls:
            try:
                fwd, train = _impl_fns(fn, be, compiled, leaves, grads)
            except Exception as e:
                case_results.append(Result(case, name, error=f"{type(e).__name__}: {e}"))
                continue
            case_results.append(measure(case, name, fwd, train, device, repeats))
        del leaves, grads
        progress(case_results)


def bench(device: str | None = None, names: list[str] | None = None, rows: int | None = None,
          ops: list[str] | None = None, repeats: int = 20, use_compile: bool = True) -> int:
    """Print the table of every op of `ops` (None: all) timed per implementation on `device`
    (None: cuda when present, else cpu): eager, torch.compile, and the kernel backends `names`
    (None: the GPU ones on a GPU, none on a CPU, where they would only run interpreted, which
    measures Python)."""
    device = device or parity.default_device()
    on_gpu = device.startswith("cuda")
    if names is None:
        names = list(parity.GPU_BACKENDS) if on_gpu else []
    if names and not on_gpu:
        interpret_triton_on_cpu(device)
    loaded = parity.load_backends(names, device) if names else {}
    for n, b in loaded.items():
        if isinstance(b, str):
            print(f"{n}: unavailable ({b})")
    rows = rows if rows is not None else (16384 if on_gpu else 256)
    cases = default_cases(rows)
    if ops is not None:
        known = sorted({c.op for c in cases})
        bad = [o for o in ops if o not in known]
        if bad:
            raise ConfigError(f"unknown op {bad[0]!r}; valid: {', '.join(known)}")
        cases = [c for c in cases if c.op in ops]
    copy_bw = copy_bandwidth(device, timer(device, repeats))
    gpu = torch.cuda.get_device_name(torch.device(device)) if on_gpu else "CPU"
    print(f"ablate kernels bench on {device} ({gpu}), rows {rows}, median of {repeats}", flush=True)
    print(format_header(copy_bw), flush=True)
    run_bench(cases, loaded, device, use_compile=use_compile, repeats=repeats,
              progress=lambda rs: print(format_case(rs, copy_bw), flush=True))
    return 0


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
        "device us: time on the device (by: graph = CUDA-graph replay, loop = back-to-back calls, wall = CPU "
        "wall clock); host us: wall time for a call to return on the CPU side (launch cost on a GPU)",
        f"{'op':<34}{'impl':<9}{'fwd us':>9}{'GB/s':>8}{'%copy':>7}{'f+b us':>10}{'GB/s':>8}{'%copy':>7}"
        f"{'vs eager':>10}{'vs comp':>9}{'host fwd':>10}{'host f+b':>10}{'by':>7}  target"])


def format_case(rs: list[Result], copy_bw: float) -> str:
    """The lines of one case: one per implementation; speed-ups are forward + backward device time."""
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
                     f"{_ratio(vs_e):>10}{_ratio(vs_c):>9}{r.fwd_host_s * 1e6:>10.1f}{r.fwdbwd_host_s * 1e6:>10.1f}"
                     f"{r.how:>7}  {verdict}")
    return "\n".join(lines)


def _ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}x"  # "-": that baseline was not run (--no-compile)
