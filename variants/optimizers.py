"""Optimizers (the `optimizer` option). Each is a registered class whose `build(model, cfg)`
returns a torch optimizer; the engine sets every param group's `lr` each step and
checkpoints `state_dict()`.

    adamw  decoupled weight decay on matrices, none on biases and gains (GPT-2; the default)
    adam   Adam with the L2 penalty `weight_decay` on matrices added to the gradient (coupled)
    sgd    SGD with momentum (`momentum`, 0.9 by default), weight decay on matrices
    muon   torch.optim.Muon for the blocks' 2-D weight matrices, AdamW for the rest (embeddings,
           biases, norm gains), as modded-nanogpt does; Muon's update is scaled to AdamW's RMS
           (Moonshot's "match_rms_adamw"), so both take the same `lr` and `weight_decay`

Each optimizer declares the options it reads (`options=` at registration: name, type, default,
help, range check); ablate/engine/config.py turns them into flags and refuses one given with an optimizer
that does not declare it. Two optimizers may share an option with different defaults (momentum:
0.9 for sgd, 0.95 for muon): the flag's default is then "the optimizer's own", and `build` reads
`OPTIMIZERS.settings(name, cfg)`, which fills in its own default.
"""
from __future__ import annotations

import torch

from ablate.core.checks import beta
from ablate.variants.tables import ComponentOption, OPTIMIZERS

BETA1 = ComponentOption("beta1", float, 0.9, "Adam beta1", beta)
BETA2 = ComponentOption("beta2", float, 0.95, "Adam beta2", beta)
ADAM_OPTIONS = (BETA1, BETA2)


def decay_groups(params: list[tuple[str, torch.nn.Parameter]], weight_decay: float) -> list[dict]:
    """Weight decay on matrices (embeddings included, as GPT-2), none on biases and gains."""
    return [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}]


def _named(model) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


@OPTIMIZERS.register("adamw", options=ADAM_OPTIONS)
class AdamW:
    @staticmethod
    def build(model, cfg) -> torch.optim.Optimizer:
        o = OPTIMIZERS.settings("adamw", cfg)
        # fused: one kernel for all parameters, on the CPU too (5x faster than the per-tensor loop
        # torch picks by default there; measured with `ablate bench`).
        return torch.optim.AdamW(decay_groups(_named(model), cfg.weight_decay), lr=cfg.lr,
                                 betas=(o["beta1"], o["beta2"]), fused=True)


@OPTIMIZERS.register("adam", options=ADAM_OPTIONS)
class Adam:
    @staticmethod
    def build(model, cfg) -> torch.optim.Optimizer:
        o = OPTIMIZERS.settings("adam", cfg)
        return torch.optim.Adam(decay_groups(_named(model), cfg.weight_decay), lr=cfg.lr,
                                betas=(o["beta1"], o["beta2"]), fused=True)


@OPTIMIZERS.register("sgd", options=(ComponentOption("momentum", float, 0.9, "momentum", beta),
                                     ComponentOption("nesterov", bool, False, "Nesterov momentum")))
class SGD:
    @staticmethod
    def build(model, cfg) -> torch.optim.Optimizer:
        o = OPTIMIZERS.settings("sgd", cfg)
        return torch.optim.SGD(decay_groups(_named(model), cfg.weight_decay), lr=cfg.lr, momentum=o["momentum"],
                               nesterov=o["nesterov"] and o["momentum"] > 0)


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


@OPTIMIZERS.register("muon", options=(*ADAM_OPTIONS, ComponentOption("momentum", float, 0.95, "momentum", beta),
                                      ComponentOption("nesterov", bool, True, "Nesterov momentum")))
class Muon:
    @staticmethod
    def build(model, cfg) -> Combined:
        o = OPTIMIZERS.settings("muon", cfg)  # beta1/beta2: its AdamW part's
        named = _named(model)
        hidden = [p for n, p in named if is_hidden_matrix(n, p)]
        rest = [(n, p) for n, p in named if not is_hidden_matrix(n, p)]
        muon = torch.optim.Muon(hidden, lr=cfg.lr, weight_decay=cfg.weight_decay, momentum=o["momentum"],
                                nesterov=o["nesterov"], adjust_lr_fn="match_rms_adamw")
        adamw = torch.optim.AdamW(decay_groups(rest, cfg.weight_decay), lr=cfg.lr, betas=(o["beta1"], o["beta2"]),
                                  fused=True)
        return Combined({"muon": muon, "adamw": adamw})
