"""`ablate bench`: its baseline is the harness's model, its tables have their shape, its
formulas count what they say, and bad arguments are refused. No timings are asserted."""
import re

import numpy as np
import pytest
import torch

from ablate.bench import flops
from ablate.bench.grid_scaling import Scaling
from ablate.bench.plain_gpt import PlainGPT, configure_optimizer, get_batch
from ablate.engine.model import build_model
from ablate.engine.sizes import get_size
from ablate.kernels import cpu_attention
from ablate.variants import make_variant

HARNESS_NAMES = {"ln_1": "wiring.norm_attn", "ln_2": "wiring.norm_mlp", "attn.c_attn": "attn.c_attn",
                 "attn.c_proj": "attn.c_proj", "mlp.c_fc": "mlp.c_fc", "mlp.c_proj": "mlp.c_proj"}


def harness_name(plain_name: str) -> str:
    if plain_name.startswith("h."):
        _, i, rest = plain_name.split(".", 2)
        sub, kind = rest.rsplit(".", 1)
        return f"blocks.{i}.{HARNESS_NAMES[sub]}.{kind}"
    return {"ln_f.weight": "norm_f.weight", "ln_f.bias": "norm_f.bias"}.get(plain_name, plain_name)


def twin_models(size, gelu: str, act: str):
    """The harness's model with activation `act` and the plain one with F.gelu(approximate=gelu),
    holding the same weights."""
    torch.manual_seed(0)
    harness = build_model(make_variant(act=act), size)
    plain = PlainGPT(size.vocab_size, size.context, size.d_model, size.n_layer, size.n_head, gelu)
    ours = dict(harness.named_parameters())
    assert len(ours) == len(dict(plain.named_parameters()))
    with torch.no_grad():
        for name, p in plain.named_parameters():
            p.copy_(ours[harness_name(name)])
    return plain, harness


def harness_optimizer(model):
    """The optimizer the harness trains `model` with at its default options."""
    from ablate.engine.config import resolve
    from ablate.engine.train import make_optimizer

    return make_optimizer(model, resolve({"lr": 1e-3}))


@pytest.mark.slow
@pytest.mark.parametrize("gelu, act", [("tanh", "gelu"), ("none", "gelu_erf")])
def test_plain_loop_computes_the_harness_models_losses_step_after_step(gelu, act):
    """GPT-2's tanh GELU is the harness's default block; nanoGPT's exact GELU is the plain
    loop's default, timed against the harness's act=gelu_erf as the same math."""
    size = get_size("tiny")
    plain, harness = twin_models(size, gelu, act)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in harness.parameters())
    # The plain loop's AdamW settings (weight decay 0.1, betas 0.9/0.95) are the harness's defaults.
    opts = [configure_optimizer(plain, 1e-3), harness_optimizer(harness)]
    tokens = np.random.default_rng(0).integers(0, size.vocab_size, 5000).astype(np.uint16)  # a token file's dtype
    torch.manual_seed(1)
    # The harness's attention as torch computes it (the `sdpa` form): its own kernel is another
    # float32 form of the function (tests/ablate/kernels/test_cpu_attention.py), whose rounding AdamW would amplify.
    with cpu_attention.using(cpu_attention.SDPA):
        _compare_steps(plain, harness, opts, tokens, size, 3 if gelu == "none" else 1)


def _compare_steps(plain, harness, opts, tokens, size, steps):
    # Forward, backward and the fused AdamW step agree, so the next step does. With the tanh GELU
    # the two sides are two float32 forms of one function, and AdamW's first steps (about
    # lr * sign(g)) turn rounding-sized gradient differences into lr-sized weight differences
    # where a gradient is near 0, so only the first step is compared there.
    for _ in range(steps):
        x, y = get_batch(tokens, 4, size.context)
        losses = []
        for model in (plain, harness):
            loss = model(x, y)[1]
            loss.backward()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], abs=1e-5)
        # Gradients tell the GELUs apart where the loss at init barely does (its MLPs write little):
        # erf against tanh differ by about 8e-5 of a parameter's largest gradient; the harness's
        # CPU tanh GELU (another float32 form of the same function) and torch's, by under 1e-6.
        grads = dict((n, p.grad) for n, p in harness.named_parameters())
        for name, p in plain.named_parameters():
            g = grads[harness_name(name)]
            assert (p.grad - g).abs().max() <= 1e-5 * g.abs().max(), name
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)


def test_flops_per_token_counts_the_harness_models_parameters_and_causal_attention():
    size = get_size("tiny").with_layers(12)
    harness = build_model(make_variant(), size)
    n = sum(p.numel() for p in harness.parameters()) - size.context * size.d_model  # less the position embedding
    assert flops.flops_per_token(size) == 6 * n + 6 * 12 * size.context * size.d_model
    # The step's matmuls: a forward of 2 FLOPs per weight per token, and twice that backward.
    tokens = 1024
    matmul = sum(m.flops * m.count for m in flops.step_matmuls(size, tokens))
    weights = sum(p.numel() for name, p in harness.named_parameters() if name.endswith("weight") and p.dim() == 2
                  and not name.startswith("wpe"))
    assert matmul == 6 * weights * tokens


def test_the_peak_keeps_the_faster_measurement_of_each_shape():
    size = get_size("tiny").with_layers(1)
    shapes = flops.step_matmuls(size, 1024)
    slow = flops.Peak([(m, 10e9) for m in shapes], 50e9)
    fast = flops.Peak([(m, 20e9 if i % 2 else 5e9) for i, m in enumerate(shapes)], 40e9)
    best = slow.best_of(fast)
    assert [f for _, f in best.matmuls] == [20e9 if i % 2 else 10e9 for i in range(len(shapes))]
    assert best.square == 50e9 and slow.step_mix < best.step_mix


def test_grid_efficiency_is_ideal_over_actual():
    s = Scaling(cells=4, workers=2, layers=12, steps=100, alone_s=[15.0, 16.0], grid_s=[28.0, 30.0])
    # ideal / actual per interleaved pair: 15 x 4 / 2 / 28 and 16 x 4 / 2 / 30
    assert "ideal 31.0s" in s.describe() and "efficiency ideal / actual 1.07 [1.07..1.07] over 2" in s.describe()


RATIO = r"\d+\.\d{3}x \[\d+\.\d{3}\.\.\d+\.\d{3}\]"


def cells_of(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.mark.slow
def test_bench_prints_what_it_times_the_step_table_and_the_fraction_of_peak(capsys, monkeypatch):
    from ablate.cli import main

    monkeypatch.setattr(flops, "SQUARE", 128)  # the table's shape, not the figure, is tested
    threads = torch.get_num_threads()
    assert main(["bench", "--only", "steps", "--models", "tiny", "--layers", "2", "--steps", "8",
                 "--repeats", "1", "--threads", "1"]) == 0
    assert torch.get_num_threads() == threads  # the process is left as it was
    out = capsys.readouterr().out
    assert "nanoGPT's model and loop" in out and "in lockstep" in out and "6 x N + 6 x n_layer x seq_len x d_model" in out
    rows = [cells_of(line) for line in out.splitlines() if line.startswith("| tiny |")]
    assert len(rows) == 2
    steps_row, flops_row = rows
    assert len(steps_row) == 11 and steps_row[1] == "2"
    for cell in steps_row[4:9]:
        assert re.fullmatch(RATIO, cell), cell
    assert re.fullmatch(r"[+-]\d+\.\d% \[[+-]\d+\.\d%\.\.[+-]\d+\.\d%\]", steps_row[10])
    assert len(flops_row) == 10 and flops_row[2] == f"{flops.flops_per_token(get_size('tiny').with_layers(2)):,}"
    assert all(re.fullmatch(r"\d+%", c) for c in flops_row[7:])
    assert "(1 torch thread, " in out and "matmul GFLOP/s: attn qkv: fwd 1024x64x192" in out
    breakdown = re.search(r"where a harness step goes .*: matmul (\d+)%, attention (\d+)%, norms (\d+)%, "
                          r"optimizer (\d+)%, the rest \(.*\) (\d+)%; the matmuls ran at \d+% of the step-mix peak", out)
    assert breakdown and 98 <= sum(map(int, breakdown.groups())) <= 102  # shares of one total, rounded


def test_the_probes_part_steps_one_model_twice_in_turn_probes_on_and_off(capsys, monkeypatch):
    """`--only probes`: a row per size; the probed copy logs and measures (collect and the stability
    probes run on it), the other copy runs no probe, and their losses are the same bits."""
    from ablate.cli import main
    from ablate.engine.probes import Probes, Stability

    calls = {"collect": 0, "measure": 0}
    for cls, name in ((Probes, "collect"), (Stability, "measure")):
        real = getattr(cls, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(self, *args, **kwargs)
        monkeypatch.setattr(cls, name, counted)
    threads = torch.get_num_threads()
    assert main(["bench", "--only", "probes", "--models", "tiny", "--layers", "1", "--steps", "8",
                 "--repeats", "2", "--threads", "1", "--probe-every", "4"]) == 0
    assert torch.get_num_threads() == threads
    assert calls == {"collect": 2 * 8, "measure": 2 * 2}  # every step of the probed copy; steps 0 and 4
    out = capsys.readouterr().out
    assert "every probe on / none, step by step" in out
    row = [cells_of(line) for line in out.splitlines() if line.startswith("| tiny |")]
    assert len(row) == 1 and row[0][1:3] == ["1", "2 x 8"] and row[0][5] == "yes"
    assert re.fullmatch(r"[+-]\d+\.\d\d% \[[+-]\d+\.\d\d%\.\.[+-]\d+\.\d\d%\]", row[0][3]), row[0][3]


def test_lockstep_partners_step_once_after_each_harness_step_outside_its_logged_and_period_times():
    """Partner steps run between harness steps, taking turns to go first, and their seconds are
    kept out of both the logged step and the period (a partner here sleeps 0.1 s a step)."""
    import time as time_module

    from ablate.bench.steps import SKIP, harness_options, lockstep_run

    calls = []

    class Sleeper:
        def __init__(self, name):
            self.name = name

        def step(self):
            calls.append(self.name)
            time_module.sleep(0.1)
            return 0.1

    steps = SKIP + 3
    run = lockstep_run(harness_options("tiny", 1, steps, True, 1), {"a": Sleeper("a"), "b": Sleeper("b")})
    assert calls == ["a", "b", "b", "a"] * (steps // 2) + ["a", "b"] * (steps % 2)
    # The last row's time_s comes after the final evaluation: one span fewer than steps timed.
    assert run.partners == {"a": [0.1] * 3, "b": [0.1] * 3} and len(run.logged_s) == 3 and len(run.period_s) == 2
    assert all(p < 0.1 for p in run.period_s) and all(p < 0.1 for p in run.logged_s)
    assert run.ratio("a") == pytest.approx(0.3 / sum(run.logged_s))
    assert run.ratio("b", "period_s") == pytest.approx(0.2 / sum(run.period_s))


def test_the_breakdown_buckets_ops_by_name_and_holds_the_matmuls_against_the_peak():
    from ablate.bench.harness import REST, category, describe_breakdown

    assert [category(op) for op in ("aten::mm", "aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                                     "_CausalAttention", "_CausalAttentionBackward",  # the CPU kernel's
                                     "aten::native_layer_norm_backward", "aten::_fused_adamw_",
                                     "Optimizer.step#AdamW.step", "aten::gelu", "aten::mm_backward_hint")] == \
        ["matmul", "matmul", "attention", "attention", "attention", "norms", "optimizer", "optimizer", REST, REST]
    line = describe_breakdown(2, {"matmul": 1.0, "attention": 0.5, "norms": 0.0, "optimizer": 0.0, REST: 0.5},
                              matmul_flops=30e9, peak=60e9)
    assert "matmul 50%, attention 25%" in line and "ran at 50% of the step-mix peak" in line


def test_a_cpu_profile_drops_kinetos_usdt_lines_and_passes_on_the_rest_of_stderr(capfd):
    import os
    import sys

    from ablate.bench.harness import cpu_profile

    with cpu_profile() as prof:
        torch.ones(3).add_(1)
        os.write(2, b"USDT:2026-12-01 00:00:00 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a warning from C++\n")
        print("a warning from Python", file=sys.stderr)
    err = capfd.readouterr().err
    assert "USDT" not in err
    assert "a warning from C++\n" in err and "a warning from Python\n" in err
    assert any(e.key == "aten::add_" for e in prof.key_averages())
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "after\n"  # stderr is the terminal's again


@pytest.mark.parametrize("argv, message", [
    (["--steps", "1"], "--steps 1: need at least 8"),
    (["--repeats", "0"], "--repeats 0: need a whole number in 1..1000"),
    (["--repeats", "1001"], "--repeats 1001: need a whole number in 1..1000"),  # a ceiling on every count
    (["--steps", "9" * 401], "(401 characters): need a whole number in 8..100000"),
    (["--workers", "1025"], "--workers 1025: need a whole number in 1..1024"),
    (["--only", "cpu-gelu", "--shape", "2,\u00b2,2"], "--shape '2,\u00b2,2': valid: up to 8 positive integers"),  # E11
    (["--only", "cpu-gelu", "--shape", "65536,65536,2"], "--shape 65536,65536,2: 8,589,934,592 elements; valid: at "
                                                         "most 268,435,456"),
    (["--layers", "0"], "--layers 0: need"),
    (["--threads", "0"], "--threads 0: need"),
    (["--grid-steps", "0"], "--grid-steps 0: need"),
    (["--workers", "0"], "--workers 0: need"),
    (["--probe-every", "0"], "--probe-every 0: need"),
    (["--models", "huge"], "unknown model 'huge'"),
    (["--models", ","], "--models ',': need at least one size"),
])
def test_bench_refuses_bad_arguments_with_one_line(capsys, argv, message):
    from ablate.cli import main

    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
