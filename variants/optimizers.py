"""Optimizers (the `optimizer` option). Each is a registered class whose `build(model, cfg)`
returns a torch optimizer; the engine sets every param group's `lr` each step and
checkpoints `state_dict()`.

    adamw  decoupled weight decay on matrices, none on biases and gains (GPT-2; the default)
    adam   Adam with the L2 penalty `weight_decay` on matrices added to the gradient (coupled)
    sgd    SGD with momentum (0.9 unless `momentum` says otherwise), weight decay on matrices
    muon   torch.optim.Muon for the blocks' 2-D weight matrices, AdamW for the rest (embeddings,
           biases, norm gains), as modded-nanogpt does; Muon's update is scaled to AdamW's RMS
           (Moonshot's "match_rms_adamw"), so both take the same `lr` and `weight_decay`

Options specific to some optimizers (beta1/beta2, momentum, nesterov) are refused with another
(ablate/config.py `applies`).
"""
from __future__ import annotations

import torch

from ablate.variants.registry import OPTIMIZERS


def decay_groups(params: list[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict]:
    """Weight decay on matrices (embeddings included, as GPT-2), none on biases and gains."""
    return [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}]


def _named(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@OPTIMIZERS.register("adamw")
class AdamW:
    @staticmethod
    def build(model, cfg) -> torch.optim.Optimizer:
        # fused: one kernel for all parameters, on the CPU too (5x faster than the per-tensor loop
        # torch picks by default there; measured with `ablate bench`).
        return torch.optim.AdamW(decay_groups(_named(model), cfg.weight_decay), lr=cfg.lr,
                                 betas=(cfg.beta1, cfg.beta2), fused=True)


@OPTIMIZERS.register("adam")
class Adam:
    @staticmethod
    def build(model, cfg) -> torch.optim.Optimizer:
        return torch.optim.Adam(decay_groups(_named(model), cfg.weight_decay), lr=cfg.lr,
                                betas=(cfg.beta1, cfg.beta2), fused=True)


@OPTIMIZERS.register("sgd")
class SGD:
    @staticmethod
    def build(model, cfg) -> torch.optim.Optimizer:
        momentum = 0.9 if cfg.momentum is None else cfg.momentum
        nesterov = bool(cfg.nesterov) and momentum > 0
        return torch.optim.SGD(decay_groups(_named(model), cfg.weight_decay), lr=cfg.lr, momentum=momentum,
                               nesterov=nesterov)


def is_hidden_matrix(name: str, p: torch.Tensor) -> bool:
    """What Muon orthogonalises: the blocks' 2-D weights (attention and MLP matrices). The
    embeddings (tied to the output layer), biases and gains stay with AdamW."""
    return name.startswith("blocks.") and p.dim() == 2


class Combined:
    """Several optimizers stepped as one: their param groups are this one's (so the engine's lr
    updates reach them all), and the state dict holds each one's under its name."""

    def __init__(self, parts: dict[str, torch.optim.Optimizer]):
        self.parts = parts
        self.param_groups = [g for opt in parts.values() for g in opt.param_groups]

    @torch.no_grad()
    def step(self, closure=None):
        for opt in self.parts.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True):
        for opt in self.parts.values():
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {name: opt.state_dict() for name, opt in self.parts.items()}

    def load_state_dict(self, state_dict):
        for name, opt in self.parts.items():
            opt.load_state_dict(state_dict[name])


@OPTIMIZERS.register("muon")
class Muon:
    @staticmethod
    def build(model, cfg) -> Combined:
        named = _named(model)
        hidden = [p for n, p in named if is_hidden_matrix(n, p)]
        rest = [(n, p) for n, p in named if not is_hidden_matrix(n, p)]
        momentum = 0.95 if cfg.momentum is None else cfg.momentum
        nesterov = True if cfg.nesterov is None else cfg.nesterov
        muon = torch.optim.Muon(hidden, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=momentum,
                                nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
        adamw = torch.optim.AdamW(decay_groups(rest, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  fused=True)
        return Combined({"muon": muon, "adamw": adamw})
