"""A pack's parameters and optimizer: K members' weights in one (K, N) tensor, updated together.

Each member is built (and resumed) exactly as its cell would be alone (ablate/engine/train.py), with its
own torch optimizer; then its parameters are copied into row k of one flat leaf tensor, grouped
by that optimizer's param groups so each group is a contiguous segment. The forward reads views of
that tensor, so the backward leaves every member's gradients in one (K, N) tensor; the optimizer
then runs about ten elementwise ops per group over all members at once, with per-member learning
rates (a (K, 1) tensor), and a mask that freezes a member from the step it diverges. The member's
module is rebound to views of its row, so evaluation, the stability probes and its checkpoint see
its current weights without a copy.

A member's checkpoint is written in its lone run's format (model state dict, the torch optimizer's
state dict), so a packed cell resumes alone and a lone cell joins a pack.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# The optimizers a pack can step as one (their update written here for (K, N) tensors): the
# registered name -> its state keys in torch's state dict. Any other is refused in one line.
STACKED_OPTIMIZERS = {"adamw": ("exp_avg", "exp_avg_sq")}


@dataclass
class Segment:
    """One param group of the members' optimizers: its columns of the flat tensor and settings."""

    start: int
    stop: int
    weight_decay: float
    betas: tuple[float, float]
    eps: float


class FlatParams:
    """The members' parameters as rows of one leaf tensor `flat` (K, N). `names`, `shapes` and
    `offsets` follow the members' optimizer param order (group by group)."""

    def __init__(self, models: list[nn.Module], optimizers: list, device):
        named = dict(models[0].named_parameters())  # deduplicated: a tied weight appears once
        by_id = {id(p): n for n, p in named.items()}
        self.names: list[str] = []
        self.offsets: list[int] = []
        self.segments: list[Segment] = []
        offset = 0
        for group in optimizers[0].param_groups:
            start = offset
            for p in group["params"]:
                self.names.append(by_id[id(p)])
                self.offsets.append(offset)
                offset += p.numel()
            self.segments.append(Segment(start, offset, group["weight_decay"], tuple(group["betas"]), group["eps"]))
        left = [n for n in named if n not in set(self.names)]
        if left:
            raise PackRefused(f"parameters outside the optimizer ({', '.join(left[:3])})")
        self.shapes = [named[n].shape for n in self.names]
        self.k, self.n = len(models), offset
        self.flat = torch.empty(self.k, self.n, device=device)
        with torch.no_grad():
            for k, model in enumerate(models):
                params = dict(model.named_parameters())
                for name, off in zip(self.names, self.offsets):
                    self.flat[k, off:off + params[name].numel()].copy_(params[name].reshape(-1))
        self.flat.requires_grad_(True)

    def views(self, source: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """name -> (K, *shape) view of `source` (the flat leaf: gradients flow back into it)."""
        source = self.flat if source is None else source
        return {name: source[:, off:off + _numel(shape)].view(self.k, *shape)
                for name, off, shape in zip(self.names, self.offsets, self.shapes)}

    def member(self, source: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        """name -> member k's (shape) view of `source`."""
        return {name: source[k, off:off + _numel(shape)].view(shape)
                for name, off, shape in zip(self.names, self.offsets, self.shapes)}

    def rebind(self, model: nn.Module, k: int) -> None:
        """Make `model`'s parameters views of row k (ties kept): it then always holds member k's
        current weights, for evaluation, probes and checkpoints, at no copy."""
        named = dict(model.named_parameters())
        views = self.member(self.flat.detach(), k)
        fresh = {id(named[n]): nn.Parameter(views[n], requires_grad=named[n].requires_grad) for n in self.names}
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None:
                    module._parameters[name] = fresh[id(p)]

    def param_norms_sq(self, source: torch.Tensor) -> torch.Tensor:
        """(K, P) squared L2 norm of each parameter of each member, in `names` order: one
        reduction per parameter over all members, each a full parallel reduction on a GPU
        (torch.segment_reduce would be one op, but its speed and syncs on long segments on CUDA
        are unmeasured here)."""
        norms = [torch.linalg.vector_norm(source[:, off:off + _numel(shape)], dim=1, dtype=torch.float32)
                 for off, shape in zip(self.offsets, self.shapes)]
        return torch.stack(norms, dim=1).square()


class PackRefused(ValueError):
    """What makes a set of cells unable to train as one pack: the message says why, in a few words."""


class StackedAdamW:
    """AdamW (torch's algorithm, decoupled weight decay) over the flat (K, N) tensor: per-member
    learning rates, and members outside `active` left exactly as they were."""

    state_keys = STACKED_OPTIMIZERS["adamw"]

    def __init__(self, flat: FlatParams, optimizers: list, device):
        self.flat = flat
        self.exp_avg = torch.zeros_like(flat.flat, requires_grad=False)
        self.exp_avg_sq = torch.zeros_like(flat.flat, requires_grad=False)
        steps = set()
        for k, opt in enumerate(optimizers):  # a resumed member's state (ablate.engine.train._resume loaded it)
            params = [p for g in opt.param_groups for p in g["params"]]
            for p, off in zip(params, flat.offsets):
                st = opt.state.get(p)
                steps.add(int(float(st["step"])) if st else 0)
                if st:
                    self.exp_avg[k, off:off + p.numel()].copy_(st["exp_avg"].reshape(-1))
                    self.exp_avg_sq[k, off:off + p.numel()].copy_(st["exp_avg_sq"].reshape(-1))
        if len(steps) > 1:
            raise PackRefused(f"members at different optimizer steps ({sorted(steps)})")
        # The step count on the device (float32, as torch keeps it): the update never reads it back.
        self.step_t = torch.tensor(float(steps.pop() if steps else 0), device=device)

    @torch.no_grad()
    def step(self, grad: torch.Tensor, lr: torch.Tensor, active: torch.Tensor) -> None:
        """One update of every active member. lr: (K,) this step's rates; active: (K,) bool."""
        p_all, lr, keep = self.flat.flat.detach(), lr.view(-1, 1), active.view(-1, 1)
        self.step_t += 1
        for seg in self.flat.segments:
            if seg.stop == seg.start:
                continue
            cols = slice(seg.start, seg.stop)
            p, m, v = p_all[:, cols], self.exp_avg[:, cols], self.exp_avg_sq[:, cols]
            g = torch.where(keep, grad[:, cols], 0.0)  # a frozen member's NaN never reaches its state
            beta1, beta2 = seg.betas
            m.lerp_(g, 1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            step_size = lr / (1 - beta1 ** self.step_t)
            denom = (v.sqrt() / (1 - beta2 ** self.step_t).sqrt()).add_(seg.eps)
            new = p * (1 - lr * seg.weight_decay) - step_size * (m / denom)
            p.copy_(torch.where(keep, new, p))

    def member_state(self, optimizer, k: int) -> dict:
        """Member k's optimizer state dict in its lone torch optimizer's format."""
        sd = optimizer.state_dict()
        step = self.step_t.detach().to("cpu", torch.float32).clone()
        views_m, views_v = self.flat.member(self.exp_avg, k), self.flat.member(self.exp_avg_sq, k)
        sd["state"] = {i: {"step": step.clone(), "exp_avg": views_m[n].clone(), "exp_avg_sq": views_v[n].clone()}
                       for i, n in enumerate(self.flat.names)}
        return sd


def member_state_dict(model: nn.Module) -> dict:
    """`model.state_dict()` with every view copied out of the pack's storage (saving a view
    would save all members), tensors that shared storage still sharing it (tied weights)."""
    copies: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, t in model.state_dict().items():
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        if key not in copies:
            copies[key] = t.clone()
        out[name] = copies[key]
    return out


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
