"""The CPU kernels against torch's ops (`ablate bench --only cpu-gelu,cpu-attention,cpu-mlp`).

cpu-gelu and cpu-attention time each implementation forward and backward at one thread, taking
turns round after round (timing.interleaved): the median and range over the rounds of a round's
mean microseconds a call. A GELU bias form is timed on what it computes, gelu(h + b) and its
backward with the bias's gradient, beside "poly + bias", the same work unfused. Attention takes
q, k and v as views of one (B, T, 3 H D) tensor, as the model's c_attn makes them; its backward
runs through autograd on both sides. cpu-mlp times the dense MLP's in-place backward in whole
training steps against its two layers in turn (bench/lockstep.py): a kernel timed alone in a
loop finds warm in cache the 4x-wide buffer the in-place write saves.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ablate.bench.lockstep import build_copy, plan_cell, rounds_in_turn
from ablate.bench.steps import harness_options
from ablate.bench.timing import header, interleaved, row, spread, threads
from ablate.kernels import cpu_attention, cpu_gelu
from ablate.kernels.cpu_backend import CpuBackend
from ablate.kernels.cpu_build import cpu_has

ROUNDS, CALLS = 15, 50
GELU_SHAPE, ATTENTION_SHAPE = (16, 64, 256), (16, 4, 64, 16)  # tiny's MLP activation; tiny's attention


def _table(title: str, impls: dict[str, tuple], rounds: int, calls: int) -> str:
    """`impls`: name -> (fwd, bwd), timed in turn at one thread."""
    fns = {(name, kind): fn for name, pair in impls.items() for kind, fn in zip(("fwd", "bwd"), pair)}
    with threads(1):
        samples = interleaved(fns, rounds, calls=calls)
    return "\n".join([f"{title}, 1 thread (median [range] of {rounds} interleaved rounds of {calls} calls)",
                      header("implementation", "kind", "us/call"),
                      *(row(name, kind, spread([s * 1e6 for s in values], ".1f"))
                        for (name, kind), values in samples.items())])


def gelu(shape: tuple[int, ...] = GELU_SHAPE, rounds: int = ROUNDS, calls: int = CALLS) -> str:
    """Every GELU form this machine computes (ablate/kernels/cpu_gelu.py) and torch's erf and tanh GELUs;
    a form's backward is its kernel alone, as torch's gelu_backward is timed."""
    torch.manual_seed(0)
    x, dy = torch.randn(shape) * 3, torch.randn(shape)
    b, db = torch.randn(shape[-1]), torch.empty(shape[-1])

    def using(form: str, fn):
        def run():
            with cpu_gelu.using(form):
                return fn()
        return run

    def unfused_bwd():  # the GELU kernel's backward at h + b, and torch's sum for the bias's gradient
        dx = torch.empty_like(x)
        cpu_gelu._call("bwd", x + b, dy, dx)
        return dx.view(-1, x.shape[-1]).sum(0)

    impls = {}
    for form in (f for f in cpu_gelu.available() if f != cpu_gelu.PASSES):
        if form in cpu_gelu.BIAS_FORMS:
            impls[form] = (using(form, lambda: cpu_gelu._bias_fwd(x, b, torch.empty_like(x))),
                           using(form, lambda: cpu_gelu._bias_bwd(x, b, dy, torch.empty_like(x), db)))
            impls["poly + bias"] = using(form, lambda: cpu_gelu.gelu(x + b)), using(form, unfused_bwd)
        else:
            impls[form] = (using(form, lambda: cpu_gelu.gelu(x)),
                           using(form, lambda: cpu_gelu._call("bwd", x, dy, torch.empty_like(x))))
    for name, approximate in (("torch erf", "none"), ("torch tanh", "tanh")):
        impls[name] = ((lambda a=approximate: F.gelu(x, approximate=a)),
                       (lambda a=approximate: torch.ops.aten.gelu_backward(dy, x, approximate=a)))
    title = f"CPU tanh-GELU forms and torch's GELUs on {' x '.join(map(str, shape))} float32"
    return _table(title, impls, rounds, calls)


def attention(shape: tuple[int, ...] = ATTENTION_SHAPE, rounds: int = ROUNDS, calls: int = CALLS) -> str:
    """Every copy of the `blocked` kernel (ablate/kernels/cpu_attention.py) and torch's causal
    F.scaled_dot_product_attention."""
    B, H, T, D = shape
    torch.manual_seed(0)
    qkv, dout = torch.randn(B, T, 3 * H * D, requires_grad=True), torch.randn(B, H, T, D)
    q, k, v = cpu_attention.heads_of(qkv, H)

    def timed(forward, attend, pin=contextlib.nullcontext) -> tuple:
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
        return _table(f"CPU attention and torch's on batch {B}, {H} heads, T {T}, head dimension {D}, float32",
                      impls, rounds, calls)


def mlp(size: str, blocks: int | None, steps: int, rounds: int) -> tuple[str, bool]:
    """(two layers' time over in place's per round, one thread, probes off; whether every round's
    losses were the same bits)."""
    class TwoLayers(CpuBackend):
        def dense_mlp(self, name, x, weight, bias, weight2, bias2):
            return F.linear(self.linear_activation(name, x, weight, bias), weight2, bias2)

    if cpu_gelu.current() not in cpu_gelu.BIAS_FORMS:
        return (f"cpu-mlp: this machine's GELU form is {cpu_gelu.current()!r}, which does not run the dense MLP "
                "in place: nothing to compare"), True
    with threads(1):
        plan = plan_cell(harness_options(size, blocks, steps, False, 1))
        ratios, differing = rounds_in_turn(
            plan, lambda: [build_copy(plan, CpuBackend()), build_copy(plan, TwoLayers())], rounds)
    return (f"the dense MLP in place against its two layers in turn, {size} x {plan.size.n_layer} blocks, {steps} "
            f"steps a round, 1 thread: two layers' time / in place's {spread(ratios)} over {rounds} rounds "
            f"(median [range]){'; THE LOSSES DIFFER: they should be the same bits' if differing else ''}"), \
        not differing
