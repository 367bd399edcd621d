"""Elementwise activations. Each function here is the reference math for its name:
kernel backends may replace it with a faster kernel of the same name, never change it."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ablate.variants.tables import ACTIVATIONS

# GELU's tanh approximation: 0.5x(1 + tanh(u)) with u = sqrt(2/pi)(x + 0.044715x^3). Since
# 0.5(1 + tanh(u)) = sigmoid(2u), it is also x * sigmoid(x * (_K + _KC * x^2)).
_C = 0.044715
_K = 2 * math.sqrt(2 / math.pi)
_KC = _K * _C


class _GeluTanhCPU(torch.autograd.Function):
    """GPT-2's GELU written as x * sigmoid(2u), with its derivative written out, for float
    tensors on the CPU. torch's CPU tanh-GELU kernels evaluate tanh to 1 ulp, which costs
    about twice the exact GELU's time (forward plus backward, measured at `tiny`'s and `small`'s
    MLP widths); these few cheap passes cost about as much as the exact GELU. It is the same
    function (float64: within 1e-14 of F.gelu(approximate="tanh"), values and gradients); in
    float32 the gradient is within a few 1e-6 of the exact one, where torch's own is within 1e-6.
    Saved for the backward: the input, the sigmoid and the output (which the next linear layer
    keeps anyway), so it adds one activation-sized tensor per MLP to what F.gelu keeps."""

    # Written in functorch's form (forward without ctx, setup_context) so that vmap can batch
    # it: a pack of stacked seeds (ablate/engine/pack_train.py) runs the model under torch.func.vmap.
    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = torch.addcmul(x.new_tensor(_K), x, x, value=_KC).mul_(x).sigmoid_()  # sigmoid(2u)
        return x * s, s

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        (x,), (y, s) = inputs, output
        ctx.mark_non_differentiable(s)
        ctx.set_materialize_grads(False)  # no zeros made for `s`, which nothing differentiates
        ctx.save_for_backward(x, s, y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _grad_s: torch.Tensor | None = None) -> torch.Tensor:
        if grad is None:  # no gradient reached y (grads are not materialised, see setup_context)
            return None
        x, s, y = ctx.saved_tensors
        # d/dx x*s(2u) = s + x*s*(1 - s) * d(2u)/dx, with d(2u)/dx = _K + 3*_KC*x^2 and x*s = y.
        d = torch.addcmul(y, y, s, value=-1).mul_(torch.addcmul(x.new_tensor(_K), x, x, value=3 * _KC)).add_(s)
        return d.mul_(grad)


@ACTIVATIONS.register("gelu")
def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), as GPT-2.
    On the CPU in float32 or float64, eagerly, as `_GeluTanhCPU` (the same function, faster
    there); elsewhere (GPUs, bfloat16, inside torch.compile) torch's own fused kernel."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not torch.compiler.is_compiling():
        return _GeluTanhCPU.apply(x)[0]
    return F.gelu(x, approximate="tanh")


@ACTIVATIONS.register("gelu_erf")
def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU, x * Phi(x)."""
    return F.gelu(x)


@ACTIVATIONS.register("relu")
def relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)


@ACTIVATIONS.register("silu")
def silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


@ACTIVATIONS.register("relu2")
def relu2(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU (So et al. 2021, Primer)."""
    return F.relu(x).square()
