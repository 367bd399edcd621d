"""The CPU kernels against torch's ops (`ablate bench --only cpu-gelu,cpu-attention,cpu-mlp`).

cpu-gelu and cpu-attention time each implementation forward and backward at one thread, taking
turns round after round (timing.interleaved) so that a machine whose speed drifts slows them
all alike: a figure is the median over the rounds of a round's mean microseconds a call, with
the rounds' range. cpu-gelu times every GELU form this machine computes (ablate/kernels/
cpu_gelu.py) and torch's erf and tanh GELUs; a bias form is timed on what it computes, gelu(h +
b) and backward the bias's gradient too, against "poly + bias", the same work unfused.
cpu-attention times every copy of the `blocked` kernel (ablate/kernels/cpu_attention.py) and
torch's causal F.scaled_dot_product_attention, q, k and v views of one (B, T, 3 H D) tensor as
the model's c_attn makes them; bwd runs back through autograd (its overhead on both sides).

cpu-mlp times the dense MLP's backward in place (cpu_gelu's `_GeluBiasLinear`) in whole training
steps against the same MLP as its two layers in turn: what the in-place write saves is a fresh
4x-wide buffer, cold in cache, which a kernel timed alone in a loop finds warm. Both compute the
same bits, so two models from one seed step in turn through the training loop's own step
(bench/lockstep.py), 1 thread, probes off; a round's ratio is their summed step times after the
first steps, and the losses are checked to be the same bits.
"""
from __future__ import annotations

import contextlib
import statistics

import torch
import torch.nn.functional as F

from ablate.bench.timing import interleaved, spread

ROUNDS, CALLS = 15, 50
GELU_SHAPE, ATTENTION_SHAPE = (16, 64, 256), (16, 4, 64, 16)  # tiny's MLP activation; tiny's attention


def timed_pairs(impls: dict[str, tuple], rounds: int = ROUNDS, calls: int = CALLS) -> list[tuple[str, str, list[float]]]:
    """[(implementation, 'fwd' or 'bwd', microseconds a call per round)] for name -> (fwd, bwd)."""
    fns = {(name, kind): fn for name, pair in impls.items() for kind, fn in zip(("fwd", "bwd"), pair)}
    with _one_thread():
        samples = interleaved(fns, rounds, calls=calls)
    return [(name, kind, [s * 1e6 for s in values]) for (name, kind), values in samples.items()]


@contextlib.contextmanager
def _one_thread():
    outer = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(outer)


def table(title: str, rows: list[tuple[str, str, list[float]]], rounds: int = ROUNDS, calls: int = CALLS) -> str:
    lines = [f"{title}, 1 thread (median of {rounds} interleaved rounds of {calls} calls, and their range)",
             f"{'implementation':<14} {'kind':<4} {'us/call':>9}  range"]
    lines += [f"{name:<14} {kind:<4} {statistics.median(v):9.1f}  {min(v):.1f}..{max(v):.1f}" for name, kind, v in rows]
    return "\n".join(lines)


def _gelu_form(cpu_gelu, name, x, dy):
    def fwd():
        with cpu_gelu.using(name):
            return cpu_gelu.gelu(x)

    def bwd():  # the backward kernel alone, as torch's gelu_backward is timed
        with cpu_gelu.using(name):
            cpu_gelu._call("bwd", x, dy, torch.empty_like(x))

    return fwd, bwd


def _gelu_with_bias(cpu_gelu, fused: bool, x, dy):
    """gelu(x + b) and its backward with the bias's gradient: one kernel, or the GELU kernel and torch."""
    b, db = torch.randn(x.shape[-1]), torch.empty(x.shape[-1])
    form = "poly-bias"

    def fwd():
        with cpu_gelu.using(form):
            if not fused:
                return cpu_gelu.gelu(x + b)
            y = torch.empty_like(x)
            cpu_gelu._bias_fwd(x, b, y)
            return y

    def bwd():
        dx = torch.empty_like(x)
        with cpu_gelu.using(form):
            if fused:
                return cpu_gelu._bias_bwd(x, b, dy, dx, db)
            cpu_gelu._call("bwd", x + b, dy, dx)
            return dx.view(-1, x.shape[-1]).sum(0)

    return fwd, bwd


def gelu(shape: tuple[int, ...] = GELU_SHAPE, rounds: int = ROUNDS, calls: int = CALLS) -> str:
    from ablate.kernels import cpu_gelu

    torch.manual_seed(0)
    x, dy = torch.randn(shape) * 3, torch.randn(shape)
    forms = [f for f in cpu_gelu.available() if f != cpu_gelu.PASSES]
    impls = {f: _gelu_with_bias(cpu_gelu, True, x, dy) if f in cpu_gelu.BIAS_FORMS else _gelu_form(cpu_gelu, f, x, dy)
             for f in forms}
    if set(forms) & set(cpu_gelu.BIAS_FORMS):
        impls["poly + bias"] = _gelu_with_bias(cpu_gelu, False, x, dy)
    for name, approximate in (("torch erf", "none"), ("torch tanh", "tanh")):
        impls[name] = ((lambda a=approximate: F.gelu(x, approximate=a)),
                       (lambda a=approximate: torch.ops.aten.gelu_backward(dy, x, approximate=a)))
    rows = timed_pairs(impls, rounds, calls)
    return table(f"CPU tanh-GELU forms and torch's GELUs on {' x '.join(map(str, shape))} float32", rows, rounds, calls)


def attention(shape: tuple[int, ...] = ATTENTION_SHAPE, rounds: int = ROUNDS, calls: int = CALLS) -> str:
    from ablate.kernels import cpu_attention
    from ablate.kernels.cpu_build import cpu_has

    B, H, T, D = shape
    torch.manual_seed(0)
    qkv, dout = torch.randn(B, T, 3 * H * D, requires_grad=True), torch.randn(B, H, T, D)
    q, k, v = cpu_attention.heads_of(qkv, H)

    def timed(forward, attend, pin=contextlib.nullcontext):
        out = attend()  # the graph every bwd call runs back through

        def fwd():
            with pin():
                forward()

        def bwd():
            with pin():
                torch.autograd.grad(out, qkv, dout, retain_graph=True)

        return fwd, bwd

    blocked = "blocked" in cpu_attention.available()
    with cpu_attention.using("blocked" if blocked else cpu_attention.SDPA):
        impls = {copy.isa: timed(lambda: cpu_attention.forward(q, k, v), lambda: cpu_attention.attention(q, k, v),
                                 lambda copy=copy: cpu_attention.KERNEL.pinned(copy))
                 for copy in (cpu_attention.FORMS["blocked"] if blocked else ()) if cpu_has(*copy.needs)}
        impls["torch sdpa"] = timed(lambda: F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(),
                                                                           is_causal=True),
                                    lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        rows = timed_pairs(impls, rounds, calls)
    return table(f"CPU attention and torch's on batch {B}, {H} heads, T {T}, head dimension {D}, float32",
                 rows, rounds, calls)


def mlp(size: str, blocks: int | None, steps: int, rounds: int) -> tuple[str, bool]:
    """(the in-place MLP's ratio, two layers' time over in place's, per round and in all;
    whether every round's losses were the same bits)."""
    from ablate.bench.lockstep import build_copy, plan_for, round_in_turn, threads_and_flushing
    from ablate.kernels import cpu_gelu
    from ablate.kernels.cpu_backend import CpuBackend

    class TwoLayers(CpuBackend):
        def dense_mlp(self, name, x, weight, bias, weight2, bias2):
            return F.linear(self.linear_activation(name, x, weight, bias), weight2, bias2)

    if cpu_gelu.current() not in cpu_gelu.BIAS_FORMS:
        return (f"cpu-mlp: this machine's GELU form is {cpu_gelu.current()!r}, which does not run the dense MLP "
                "in place: nothing to compare"), True
    ratios, same = [], True
    with threads_and_flushing(1):
        plan = plan_for(size, blocks, steps, 1, False)
        for r in range(rounds):
            seconds, alike = round_in_turn(plan, [build_copy(plan, CpuBackend()), build_copy(plan, TwoLayers())],
                                           r % 2)
            ratios.append(seconds[1] / seconds[0])
            same &= alike
    return (f"the dense MLP in place against its two layers in turn, {size} x {plan.size.n_layer} blocks, {steps} "
            f"steps a round, 1 thread: two layers' time / in place's {spread(ratios)} over {rounds} rounds "
            f"(median [range]){'' if same else '; THE LOSSES DIFFER: they should be the same bits'}"), same
