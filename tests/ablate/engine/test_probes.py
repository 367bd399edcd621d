"""The stability probes (ablate/engine/probes.py `Stability`): each against its definition on
hand-built inputs, through the model against the attention it actually computes, and in
training runs: probes change no loss, appear on the probe steps only, and repeat on resume."""
import contextlib
import json
import math

import pytest
import torch
import torch.nn.functional as F

import ablate.engine.train
from ablate.engine.cell import Cell, run_cell
from ablate.engine.config import resolve
from ablate.engine.data import load_data
from ablate.engine.model import build_model
from ablate.engine.probes import (PROBE_SEQUENCES, Probes, attention_logit_stats, mean_cosine_similarity,
                                  output_log_partition)
from ablate.engine.sizes import get_size
from ablate.kernels.reference import ReferenceBackend
from ablate.variants import make_variant

FAST = {"model": "tiny", "layers": 2, "batch_size": 4, "seq_len": 16, "eval_every": 100, "eval_batches": 1,
        "final_eval_batches": 1, "threads": 1}
STABILITY_PREFIXES = ("attn_logit_max/", "attn_entropy/", "cos_sim/", "logit_lse", "logit_max")


def causal_entropy_by_loop(q, k):
    """Mean attention entropy from the definition, one query at a time, in float64."""
    d, T = q.shape[-1], q.shape[-2]
    total, count = 0.0, 0
    for head in range(q.shape[0]):
        for t in range(T):
            s = [float(q[head, t] @ k[head, j]) / math.sqrt(d) for j in range(t + 1)]
            z = math.log(sum(math.exp(v - max(s)) for v in s)) + max(s)
            total -= sum(math.exp(v - z) * (v - z) for v in s)
            count += 1
    return total / count


def record_attention(monkeypatch) -> list[tuple[float, float]]:
    """From now on, every attention the model computes (the kernel interface's `attention`)
    appends (largest logit, mean entropy) of its first PROBE_SEQUENCES sequences, computed from
    the definition in float64."""
    seen, attention = [], ReferenceBackend.attention

    def recording(self, q, k, v):
        qs, ks = q[:PROBE_SEQUENCES].detach().double(), k[:PROBE_SEQUENCES].detach().double()
        scores = qs @ ks.transpose(-2, -1) / math.sqrt(q.shape[-1])
        causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        p = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        entropy = -(p * p.clamp_min(1e-300).log()).sum(-1).mean()
        seen.append((scores[..., causal].max().item(), entropy.item()))
        return attention(self, q, k, v)

    monkeypatch.setattr(ReferenceBackend, "attention", recording)
    return seen


# ------------------------------------------------------------------ the definitions


def test_equal_keys_give_uniform_attention_with_entropy_log_of_the_keys_seen():
    T, d = 6, 4
    q = torch.randn(2, T, d)
    k = torch.ones(2, T, d)  # every key the same: each query attends uniformly to its t + 1 keys
    top, entropy = attention_logit_stats(q[None], k[None])
    assert entropy.item() == pytest.approx(sum(math.log(t + 1) for t in range(T)) / T, rel=1e-6)
    assert top.item() == pytest.approx((q.sum(-1) / math.sqrt(d)).max().item(), rel=1e-6)


def test_one_dominant_key_gives_its_logit_and_zero_entropy_and_the_causal_mask_hides_the_future():
    T, d = 5, 4
    q, k = torch.zeros(1, T, d), torch.zeros(1, T, d)
    q[0, :-1, 0] = 1.0   # queries 0..T-2 point along e1; the last query is zero (uniform attention)
    k[0, 0, 0] = 100.0   # key 0, seen by every query: logit 100 / sqrt(4) = 50 dominates
    k[0, -1, 0] = 1e4    # key T-1 is larger still, but only the (zero) last query may see it
    top, entropy = attention_logit_stats(q[None], k[None])
    assert top.item() == pytest.approx(50.0)
    # Queries 0..T-2: all weight on key 0 (entropy ~0); the last query: uniform over T keys.
    assert entropy.item() == pytest.approx(math.log(T) / T, abs=1e-6)


def test_attention_entropy_matches_the_definition_on_random_heads():
    torch.manual_seed(0)
    q, k = torch.randn(3, 7, 8) * 2, torch.randn(3, 7, 8)
    expected = causal_entropy_by_loop(q.double(), k.double())
    assert attention_logit_stats(q[None], k[None])[1].item() == pytest.approx(expected, rel=1e-5)


def test_cosine_similarity_is_one_for_identical_tokens_zero_for_orthogonal_and_the_pairwise_mean():
    T, d = 5, 8
    same = torch.randn(d).expand(2, T, d)
    assert mean_cosine_similarity(same).item() == pytest.approx(1.0, abs=1e-6)
    orthogonal = torch.eye(d)[:T].expand(3, T, d) * 7.0
    assert mean_cosine_similarity(orthogonal).item() == pytest.approx(0.0, abs=1e-7)
    torch.manual_seed(0)
    h = torch.randn(4, 3, T, d)  # (layers, sequences, T, d)
    u = F.normalize(h.double(), dim=-1)
    cos = u @ u.transpose(-2, -1)
    off_diagonal = ~torch.eye(T, dtype=torch.bool)
    expected = cos[..., off_diagonal].mean(-1).mean(-1)  # pairs i != j per sequence, then sequences
    assert torch.allclose(mean_cosine_similarity(h).double(), expected, atol=1e-6)


def test_constant_logits_have_log_partition_log_vocab():
    vocab = 256
    assert output_log_partition(torch.full((2, 9, vocab), 3.5)).item() == pytest.approx(3.5 + math.log(vocab), rel=1e-6)
    assert output_log_partition(torch.zeros(1, 4, vocab)).item() == pytest.approx(math.log(vocab), rel=1e-6)


# ------------------------------------------------------------------ through the model


@pytest.mark.parametrize("axes", [{}, {"norm": "post", "qk_norm": "rmsnorm"}])
@pytest.mark.parametrize("compiled", [False, True])
def test_probes_see_the_attention_the_model_computes(monkeypatch, axes, compiled):
    """The attention logits the probes report are those the model's attention receives
    in the training forward (first PROBE_SEQUENCES sequences), for pre-norm and post-norm with
    qk-norm; `compiled` runs the probes' own eager forward of the slice instead of the hooks."""
    torch.manual_seed(0)
    size = get_size("tiny").with_layers(3)
    model = build_model(make_variant(**axes), size)
    probes = Probes(model, compiled=compiled)
    model.record_act_norms = True
    seen = record_attention(monkeypatch)
    idx = torch.randint(0, size.vocab_size, (6, 16))
    probes.stability.capture = not compiled  # as the training loop arms a probed step
    logits, loss = model(idx, idx)
    monkeypatch.undo()
    act_norms = list(model.act_norms)
    values = probes.stability.measure(idx, logits).tolist()
    got = dict(zip(probes.stability.names, values))
    assert [t.item() for t in model.act_norms] == [t.item() for t in act_norms]  # left as training left them
    with torch.no_grad():  # the residual stream after each block, by hand
        x = model.wte(idx) + model.wpe(torch.arange(16))
        for i, block in enumerate(model.blocks):
            x = block(x)
            expected = mean_cosine_similarity(x[:PROBE_SEQUENCES]).item()
            assert got[f"cos_sim/layer_{i}"] == pytest.approx(expected, rel=1e-5)
            assert got[f"attn_logit_max/layer_{i}"] == pytest.approx(seen[i][0], rel=1e-5)
            assert got[f"attn_entropy/layer_{i}"] == pytest.approx(seen[i][1], rel=1e-5)
    first = logits[:PROBE_SEQUENCES].detach()
    assert got["logit_lse"] == pytest.approx(torch.logsumexp(first, -1).mean().item(), rel=1e-6)
    assert got["logit_max"] == first.max().item()


# ------------------------------------------------------------------ in training runs


def run(out, **options):
    cell = Cell.from_options({**FAST, **options})
    run_cell(cell, out)
    with open(out / cell.id / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def stability_keys(row):
    return {k for k in row if k.startswith(STABILITY_PREFIXES)}


def test_probes_on_and_off_give_identical_losses(tmp_path):
    on = run(tmp_path / "on", steps=6, probe_every=1)
    off = run(tmp_path / "off", steps=6, probes=False)
    assert all(stability_keys(r) for r in on) and not any(stability_keys(r) for r in off)
    assert [r["loss"] for r in on] == [r["loss"] for r in off]
    assert on[-1]["val_loss"] == off[-1]["val_loss"]


def test_clipping_with_the_probes_norms_gives_torchs_bits(tmp_path, monkeypatch):
    """On logged steps the clip reuses the per-gradient norms the probes computed: the run is
    bit for bit torch's clip_grad_norm_ (forced here), and with probes off, where it is used."""
    clipped = {"steps": 6, "grad_clip": 0.05, "lr": 3e-2, "log_every": 2}  # small enough to clip every step
    reused = run(tmp_path / "reused", **clipped)
    real = ablate.engine.train.clip_gradients
    calls = []
    monkeypatch.setattr(ablate.engine.train, "clip_gradients", lambda m, c, norms=None: calls.append(norms) or real(m, c))
    fresh = run(tmp_path / "fresh", **clipped)
    assert [n is None for n in calls] == [False, True, False, True, False, True]  # logged steps had norms
    assert [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")} for r in reused] == \
        [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")} for r in fresh]
    off = run(tmp_path / "off", probes=False, **clipped)
    unclipped = run(tmp_path / "unclipped", **{**clipped, "grad_clip": 0.0})
    assert [r["loss"] for r in off] == [r["loss"] for r in fresh] != [r["loss"] for r in unclipped]


def test_probes_are_logged_exactly_on_the_logged_steps_divisible_by_probe_every(tmp_path):
    rows = run(tmp_path / "a", steps=8, probe_every=3)
    expected = {f"{p}layer_{i}" for p in ("attn_logit_max/", "attn_entropy/", "cos_sim/") for i in range(2)}
    expected |= {"logit_lse", "logit_max"}
    assert [r["step"] for r in rows if stability_keys(r)] == [0, 3, 6]  # not the last step (7) as such
    assert all(stability_keys(r) == expected for r in rows if r["step"] % 3 == 0)
    assert all(v is None or math.isfinite(v) for r in rows for k, v in r.items() if k in expected)
    # With log_every 2 only the logged steps can carry them: those divisible by both.
    rows = run(tmp_path / "b", steps=8, probe_every=3, log_every=2)
    assert [r["step"] for r in rows] == [0, 2, 4, 6, 7]
    assert [r["step"] for r in rows if stability_keys(r)] == [0, 6]


def test_the_capture_hooks_copy_only_on_armed_forwards_and_each_capture_is_measured_once():
    """Unprobed steps copy nothing (the hooks run every forward); a measure() with nothing kept
    for it refuses rather than report another step's activations."""
    torch.manual_seed(0)
    size = get_size("tiny").with_layers(2)
    model = build_model(make_variant(), size)
    stability = Probes(model).stability
    idx = torch.randint(0, size.vocab_size, (4, 16))
    kept = lambda: stability.qkv_out + stability.stream_in + stability.block_out  # noqa: E731
    hooked = lambda: sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())  # noqa: E731
    assert hooked() == 0  # an unarmed forward does not even call a hook
    logits = model(idx, idx)[0]
    assert all(t is None for t in kept())
    with pytest.raises(RuntimeError, match="set capture = True"):
        stability.measure(idx, logits)
    stability.capture = True
    logits = model(idx, idx)[0]
    assert all(t is not None and t.shape[0] == PROBE_SEQUENCES for t in kept())
    stability.measure(idx, logits)
    assert all(t is None for t in kept())
    with pytest.raises(RuntimeError, match="kept nothing"):
        stability.measure(idx, logits)
    assert hooked() == 1 + 2 * size.n_layer  # armed: each c_attn, each block, block 0's input
    stability.capture = False
    assert hooked() == 0


def test_a_run_logs_the_probes_of_the_weights_and_batch_its_step_ran_with(tmp_path, monkeypatch):
    """Step 0's probes equal the definitions on the initial model and batch 0: computed
    before the optimizer moved the weights, on the first sequences of that step's batch."""
    options = {**FAST, "steps": 1, "probe_every": 1}
    row = run(tmp_path, **options)[0]
    cfg = resolve(Cell.from_options(options).options)
    torch.manual_seed(cfg.seed)  # as the run builds its model
    model = build_model(cfg.spec, cfg.size, init=cfg.init_name)
    x, y = load_data(None, cfg.size.tokenizer, cfg.size.vocab_size).batch("train", 0, cfg.seed, cfg.batch_size,
                                                                          cfg.context)
    seen = record_attention(monkeypatch)
    logits = model(x, y)[0][:PROBE_SEQUENCES].detach()
    for i in range(cfg.size.n_layer):
        assert row[f"attn_logit_max/layer_{i}"] == pytest.approx(seen[i][0], rel=1e-5)
        assert row[f"attn_entropy/layer_{i}"] == pytest.approx(seen[i][1], rel=1e-5)
    assert row["logit_lse"] == pytest.approx(torch.logsumexp(logits, -1).mean().item(), rel=1e-6)


def test_a_resumed_run_logs_the_probe_values_of_an_uninterrupted_one(tmp_path, monkeypatch):
    options = {"steps": 8, "probe_every": 2, "checkpoint_every": 100}
    full = run(tmp_path / "full", **options)
    # Stop after step 4 with a checkpoint, as Ctrl-C would, then run the same cell again.
    real_lr_at, received = ablate.engine.train.lr_at, []

    def lr_at(step, *args, **kwargs):
        if step == 4:
            received.append(2)  # SIGINT
        return real_lr_at(step, *args, **kwargs)

    monkeypatch.setattr(ablate.engine.train, "lr_at", lr_at)
    monkeypatch.setattr(ablate.engine.train, "_graceful_signals", lambda: contextlib.nullcontext(received))
    with pytest.raises(ablate.engine.train.Interrupted):
        run(tmp_path / "cut", **options)
    monkeypatch.setattr(ablate.engine.train, "lr_at", real_lr_at)
    received.clear()
    cut = run(tmp_path / "cut", **options)
    timing = ("time_s", "tokens_per_s")
    assert [{k: v for k, v in r.items() if k not in timing} for r in cut] == \
           [{k: v for k, v in r.items() if k not in timing} for r in full]
    assert stability_keys(cut[6]) and cut[6]["attn_logit_max/layer_1"] == full[6]["attn_logit_max/layer_1"]


def test_block_change_is_the_relative_rms_change_through_each_block():
    from ablate.engine.probes import relative_change

    x = torch.ones(3, 2, 4, 8)
    assert torch.allclose(relative_change(x, x), torch.zeros(3))
    assert torch.allclose(relative_change(x, 3 * x), torch.full((3,), 2.0))
    y = x.clone()
    y[1] += torch.randn(2, 4, 8)
    expected = torch.linalg.vector_norm((y[1] - x[1]).flatten()) / torch.linalg.vector_norm(x[1].flatten())
    assert torch.allclose(relative_change(x, y)[1], expected)
