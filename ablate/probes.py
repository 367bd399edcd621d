"""Per-layer training metrics, computed on the device with fused foreach ops and brought
to the host in one copy per logged step.

Parameters are bucketed once at start-up: embeddings (token and position), and for each
block its attention, MLP and norm parameters. Gradient norms per bucket come from one
`_foreach_norm` over all gradients and one `index_add_`; update ratios from one foreach
copy before the optimizer step and one foreach subtraction after it.
"""
from __future__ import annotations

import torch

from ablate.model import GPT
from ablate.rundir import finite_or_none

KINDS = ("attn", "mlp", "norm")


def _bucket(name: str) -> tuple[int, str] | None:
    """(layer, kind) for a block parameter, (-1, 'embed') for embeddings, None otherwise."""
    if name.startswith(("wte.", "wpe.")):
        return -1, "embed"
    if name.startswith("blocks."):
        layer, sub = name.split(".")[1:3]
        return int(layer), sub if sub in ("attn", "mlp") else "norm"
    return None  # the final norm: counted in the total only


class Probes:
    def __init__(self, model: GPT):
        self.n_layer = len(model.blocks)
        self.params = [p for p in model.parameters() if p.requires_grad]
        names = {id(p): n for n, p in model.named_parameters()}
        # Bucket index per parameter: 0 = embed, 1 + 3*layer + kind, last = unbucketed.
        n_buckets = 2 + 3 * self.n_layer
        index = []
        for p in self.params:
            b = _bucket(names[id(p)])
            if b is None:
                index.append(n_buckets - 1)
            elif b[1] == "embed":
                index.append(0)
            else:
                index.append(1 + 3 * b[0] + KINDS.index(b[1]))
        device = self.params[0].device
        self.bucket = torch.tensor(index, device=device)
        self.n_buckets = n_buckets
        # Update ratios: the block parameters and their layer, copied before each step.
        self.block_params = [p for p, i in zip(self.params, index) if 0 < i < n_buckets - 1]
        self.block_layer = torch.tensor([(i - 1) // 3 for i in index if 0 < i < n_buckets - 1], device=device)
        self._before: list[torch.Tensor] | None = None
        self._weight_sq: torch.Tensor | None = None
        self.names = self._names()

    def _names(self) -> list[str]:
        L = range(self.n_layer)
        return (
            ["grad_norm", "grad_norm/embed"]
            + [f"grad_norm/layer_{i}" for i in L]
            + [f"grad_norm/layer_{i}/{k}" for i in L for k in KINDS]
            + [f"act_norm/layer_{i}" for i in L]
            + [f"update_ratio/layer_{i}" for i in L]
        )

    @torch.no_grad()
    def grad_norms(self) -> torch.Tensor:
        """[total, embed, layer_0..L-1, layer_i/kind...] as one device tensor."""
        grads = [p.grad for p in self.params]
        sq = torch.stack(torch._foreach_norm(grads)).float().square()
        per_bucket = torch.zeros(self.n_buckets, device=sq.device).index_add_(0, self.bucket, sq)
        kinds = per_bucket[1:-1].view(self.n_layer, 3)
        return torch.cat([sq.sum().view(1), per_bucket[:1], kinds.sum(1), kinds.flatten()]).sqrt()

    @torch.no_grad()
    def before_step(self) -> None:
        """Remember the block weights (and their norms) before the optimizer moves them."""
        if self._before is None:
            self._before = [torch.empty_like(p) for p in self.block_params]
        torch._foreach_copy_(self._before, self.block_params)
        self._weight_sq = torch.stack(torch._foreach_norm(self._before)).float().square()

    @torch.no_grad()
    def update_ratios(self) -> torch.Tensor:
        """|update| / |weights before the update|, per block."""
        torch._foreach_sub_(self._before, self.block_params)  # in place: the buffer now holds -update
        d2 = torch.stack(torch._foreach_norm(self._before)).float().square()
        zeros = torch.zeros(self.n_layer, device=d2.device)
        return (zeros.index_add(0, self.block_layer, d2) / zeros.index_add(0, self.block_layer, self._weight_sq)).sqrt()

    def collect(self, loss: torch.Tensor, grad_norms: torch.Tensor, act_norms: list[torch.Tensor],
                stream_elements: int) -> tuple[float, dict]:
        """One device-to-host copy for everything logged this step. `act_norms` are the L2
        norms of the residual stream after each block; over `stream_elements` they are RMS."""
        act_rms = torch.stack(act_norms).float() * stream_elements**-0.5
        parts = [loss.detach().float().view(1), grad_norms, act_rms, self.update_ratios()]
        values = torch.cat(parts).tolist()
        metrics = {name: finite_or_none(v) for name, v in zip(self.names, values[1:])}
        return values[0], metrics

