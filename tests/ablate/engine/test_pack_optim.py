"""A pack's flat parameters and stacked AdamW (ablate/engine/pack_optim.py) against torch's AdamW per member."""
import io

import torch

from ablate.engine.config import resolve
from ablate.engine.model import build_model
from ablate.engine.pack_optim import FlatParams, StackedAdamW, member_state_dict
from ablate.engine.train import make_optimizer

LRS = (1e-3, 3e-2, 1e-2)


def members():
    cfg = resolve({"model": "tiny", "layers": 1, "width": 16, "seq_len": 8, "weight_decay": 0.1})
    models = []
    for seed in range(len(LRS)):
        torch.manual_seed(seed)
        models.append(build_model(cfg.spec, cfg.size, device="cpu"))
    return cfg, models, [make_optimizer(m, cfg) for m in models]


def fake_grads(models, step):
    g = torch.Generator().manual_seed(step)
    return [{n: torch.randn(p.shape, generator=g) for n, p in m.named_parameters()} for m in models]


def test_the_stacked_adamw_is_torchs_adamw_per_member_with_its_own_rate_and_a_frozen_one_stays():
    cfg, models, opts = members()
    flat = FlatParams(models, opts, "cpu")
    stacked = StackedAdamW(flat, opts, "cpu")
    frozen_before = flat.member(flat.flat.detach(), 2)
    frozen_before = {n: t.clone() for n, t in frozen_before.items()}
    active = torch.tensor([True, True, False])
    for step in range(3):
        grads = fake_grads(models, step)
        grad = torch.zeros_like(flat.flat)
        for k in range(len(models)):
            for name, off in zip(flat.names, flat.offsets):
                grad[k, off:off + grads[k][name].numel()] = grads[k][name].reshape(-1)
            for group in opts[k].param_groups:
                group["lr"] = LRS[k]
            for n, p in models[k].named_parameters():
                p.grad = grads[k][n]
            opts[k].step()
        stacked.step(grad, torch.tensor(LRS), active)
    for k in range(2):
        for name, t in flat.member(flat.flat.detach(), k).items():
            torch.testing.assert_close(t, dict(models[k].named_parameters())[name].detach(), rtol=1e-6, atol=1e-7)
    for name, t in flat.member(flat.flat.detach(), 2).items():  # frozen: untouched, bit for bit
        assert torch.equal(t, frozen_before[name])
    # Its checkpoint state is the lone optimizer's: loadable, the same moments, in order.
    state = stacked.member_state(opts[0], 0)
    fresh = make_optimizer(models[0], cfg)
    fresh.load_state_dict(state)
    for p in (p for g in fresh.param_groups for p in g["params"]):
        torch.testing.assert_close(fresh.state[p]["exp_avg"], opts[0].state[p]["exp_avg"], rtol=1e-6, atol=1e-8)
        assert float(fresh.state[p]["step"]) == 3.0


def test_a_members_module_holds_its_row_and_saves_only_its_own_weights_with_ties_kept():
    cfg, models, opts = members()
    flat = FlatParams(models, opts, "cpu")
    want = {n: p.detach().clone() for n, p in models[1].named_parameters()}
    flat.rebind(models[1], 1)
    assert models[1].lm_head.weight is models[1].wte.weight
    with torch.no_grad():
        flat.flat.mul_(2)  # the module sees the pack's weights as they move
    for n, p in models[1].named_parameters():
        assert torch.equal(p, want[n] * 2)
    saved = member_state_dict(models[1])
    assert saved["lm_head.weight"] is saved["wte.weight"]
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    assert buffer.tell() < 4 * flat.n * 1.5  # one member's floats, not the pack's three
