"""The optimizers of variants/optimizers.py and their options."""
import math

import pytest
import torch

from ablate.core.errors import ConfigError
from ablate.engine.config import resolve
from ablate.engine.lr import lr_at
from ablate.engine.model import build_model
from ablate.variants import OPTIMIZERS
from ablate.variants.optimizers import is_hidden_matrix


def _train_losses(options, steps=30):
    cfg = resolve({"model": "tiny", "layers": 2, "steps": steps, **options})
    torch.manual_seed(0)
    model = build_model(cfg.spec, cfg.size, init=cfg.init_name)
    opt = OPTIMIZERS.get(cfg.optimizer).build(model, cfg)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 16, (8, 33), generator=g)  # a tiny repeated batch: loss must fall
    losses = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        _, loss = model(data[:, :-1], data[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("options", [{"optimizer": "adamw"}, {"optimizer": "adam", "weight_decay": 0.0},
                                     {"optimizer": "sgd", "lr": 0.3}, {"optimizer": "muon", "lr": 3e-3}])
@pytest.mark.slow
def test_every_optimizer_trains_tiny_with_falling_loss(options):
    losses = _train_losses(options)
    assert all(map(math.isfinite, losses))
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5, losses


def test_muon_owns_the_hidden_matrices_and_adamw_the_rest():
    cfg = resolve({"optimizer": "muon", "layers": 2})
    model = build_model(cfg.spec, cfg.size)
    opt = OPTIMIZERS.get("muon").build(model, cfg)
    owned = {name: {id(p) for g in part.param_groups for p in g["params"]} for name, part in opt.parts.items()}
    assert isinstance(opt.parts["muon"], torch.optim.Muon) and isinstance(opt.parts["adamw"], torch.optim.AdamW)
    for name, p in model.named_parameters():
        want = "muon" if name.startswith("blocks.") and p.dim() == 2 else "adamw"
        assert id(p) in owned[want] and id(p) not in owned[{"muon": "adamw", "adamw": "muon"}[want]], name
        assert is_hidden_matrix(name, p) == (want == "muon")
    assert id(model.wte.weight) in owned["adamw"]  # the tied embedding is not a hidden matrix


def test_optimizer_specific_options_are_refused_with_another_optimizer():
    with pytest.raises(ConfigError, match="momentum does not apply to optimizer=adamw"):
        resolve({"momentum": 0.9})
    with pytest.raises(ConfigError, match="beta1 does not apply to optimizer=sgd"):
        resolve({"optimizer": "sgd", "beta1": 0.8})
    with pytest.raises(ConfigError, match="decay_fraction does not apply to schedule=cosine"):
        resolve({"decay_fraction": 0.3})
    with pytest.raises(ConfigError, match="unknown optimizer 'lion'; valid: adamw, adam, sgd, muon"):
        resolve({"optimizer": "lion"})
    assert resolve({"optimizer": "sgd", "momentum": 0.5}).momentum == 0.5
