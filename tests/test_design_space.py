"""The open design space: inits, optimizers, schedules, qk-norm, z-loss, mlp_ratio, plugins, and
the option schema as the only list of what defines a run."""
import json
import math
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ablate.config import EXECUTION_KEYS, IDENTITY_KEYS, OPTIONS, TRAIN_ID_OPTIONS, cell_id, resolve
from ablate.errors import ConfigError
from ablate.model import build_model
from ablate.schedule import lr_at
from ablate.sizes import get_size
from ablate.variants import OPTIMIZERS, make_variant
from ablate.variants.optimizers import is_hidden_matrix

REPO = Path(__file__).resolve().parents[1]
TINY = get_size("tiny").with_layers(6)


def run_cli(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


# ------------------------------------------------------------------------------- inits


def _std(t):
    return float(t.detach().double().std())


@pytest.mark.parametrize("init", ["gpt2", "normal", "xavier", "small", "deepnet"])
def test_each_init_matches_its_definition(init):
    torch.manual_seed(0)
    spec = make_variant(norm="deepnorm") if init == "deepnet" else make_variant(mlp="swiglu")
    size = get_size("small")  # d 128: enough entries for tight std estimates
    model = build_model(spec, size, init=init)
    d, n = size.d_model, size.n_layer
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        elif p.dim() == 1:
            assert torch.all(p == 1), name
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    q, k, v = attn.c_attn.weight.chunk(3, dim=0)
    tol = 0.08  # relative: several thousand entries per matrix
    if init == "gpt2":
        expected = {"wte": 0.02, "q": 0.02, "c_proj": 0.02 / math.sqrt(2 * n), "fc": 0.02}
    elif init == "normal":
        expected = {"wte": 0.02, "q": 0.02, "c_proj": 0.02, "fc": 0.02}
    elif init == "xavier":
        h = mlp.c_proj.weight.shape[1]
        expected = {"wte": math.sqrt(2 / (size.vocab_size + d)), "q": math.sqrt(2 / (2 * d)),
                    "c_proj": math.sqrt(2 / (2 * d)), "fc": math.sqrt(2 / (h + d))}  # each gated half its own
    elif init == "small":
        s = math.sqrt(2 / (5 * d))
        expected = {"wte": s, "q": s, "c_proj": s, "fc": s}
    else:
        beta = (8 * n) ** -0.25
        expected = {"wte": 0.02, "q": math.sqrt(2 / (2 * d)), "c_proj": beta * math.sqrt(2 / (2 * d))}
        assert _std(v) == pytest.approx(beta * math.sqrt(2 / (2 * d)), rel=tol)
    assert _std(model.wte.weight) == pytest.approx(expected["wte"], rel=tol)
    assert _std(q) == pytest.approx(expected["q"], rel=tol)
    assert _std(k) == pytest.approx(expected["q"], rel=tol)
    assert _std(attn.c_proj.weight) == pytest.approx(expected["c_proj"], rel=tol)
    if "fc" in expected:
        assert _std(mlp.c_fc.weight.chunk(2, dim=0)[0]) == pytest.approx(expected["fc"], rel=tol)


def test_default_init_is_the_placements_and_gpt2_is_bitwise_the_old_one():
    assert resolve({}).init_name == "gpt2"
    assert resolve({"norm": "deepnorm"}).init_name == "deepnet"
    model = build_model(make_variant(), TINY)
    torch.manual_seed(1)
    model.reset_parameters()
    torch.manual_seed(1)
    expected = {}
    for name, p in model.named_parameters():  # the pre-registry reset_parameters, written out
        t = torch.empty_like(p)
        if name.endswith("bias"):
            t.zero_()
        elif p.dim() == 1:
            t.fill_(1)
        elif name.endswith("c_proj.weight"):
            t.normal_(0, 0.02 / math.sqrt(2 * TINY.n_layer))
        else:
            t.normal_(0, 0.02)
        expected[name] = t
    for name, p in model.named_parameters():
        assert torch.equal(p, expected[name]), name


# ------------------------------------------------------------------------------- optimizers


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


# ------------------------------------------------------------------------------- schedules


def test_wsd_gives_the_specified_lr_at_chosen_steps():
    cfg = resolve({"schedule": "wsd", "steps": 110, "warmup": 10, "decay_fraction": 0.2, "min_lr_ratio": 0.1,
                   "lr": 1.0})
    assert lr_at(0, cfg) == pytest.approx(0.1)  # warmup: (step + 1) / warmup
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == 1.0 and lr_at(89, cfg) == 1.0 and lr_at(90, cfg) == 1.0  # stable
    assert lr_at(100, cfg) == pytest.approx(1 - 0.9 * 0.5)  # halfway through the decay
    assert lr_at(110, cfg) == pytest.approx(0.1)  # progress 1: min_lr_ratio
    cosine = resolve({"schedule": "cosine", "steps": 100, "lr": 1.0, "min_lr_ratio": 0.0})
    assert lr_at(50, cosine) == pytest.approx(0.5) and lr_at(0, cosine) == 1.0
    assert lr_at(77, resolve({"schedule": "constant", "lr": 0.5})) == 0.5


# ------------------------------------------------------------------------------- qk-norm, z-loss


@pytest.mark.parametrize("qk", ["layernorm", "rmsnorm"])
def test_qk_norm_normalises_queries_and_keys_per_head(qk):
    torch.manual_seed(0)
    model = build_model(make_variant(qk_norm=qk), TINY)
    attn = model.blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.0)
        attn.k_norm.weight.fill_(1.0)
    x = torch.randn(2, 8, TINY.d_model) * 5
    q, k, v = attn.qkv(x)
    raw_q, raw_k, _ = attn.c_attn(x).split(TINY.d_model, dim=2)
    d_head = TINY.d_model // TINY.n_head
    for t, raw in ((q, raw_q), (k, raw_k)):
        heads = raw.view(2, 8, TINY.n_head, d_head).transpose(1, 2)
        if qk == "layernorm":
            expected = F.layer_norm(heads, (d_head,))
            assert torch.allclose(t.mean(-1), torch.zeros(()), atol=1e-5)
        else:
            expected = heads * torch.rsqrt(heads.square().mean(-1, keepdim=True) + 1e-5)
        assert torch.allclose(t, expected, atol=1e-5)
        assert torch.allclose(t.square().mean(-1), torch.ones(()), atol=1e-3)  # unit RMS per head
    # ... and the attention is computed from the normalised ones.
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 8, TINY.d_model)
    assert torch.allclose(attn(x), attn.c_proj(y), atol=1e-6)
    plain = build_model(make_variant(), TINY)
    assert plain.blocks[0].attn.q_norm is None
    assert make_variant(qk_norm=qk).id == f"pre.layernorm.gelu.dense.res.qk-{qk}"
    assert make_variant().id == "pre.layernorm.gelu.dense.res"  # the default leaves ids unchanged


def test_z_loss_adds_exactly_its_coefficient_times_mean_squared_log_partition():
    from ablate.train import z_loss_term

    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, requires_grad=True)
    expected = torch.logsumexp(logits, -1).pow(2).mean()
    assert torch.allclose(z_loss_term(logits), expected)
    assert torch.allclose(z_loss_term(torch.zeros(1, 3, 10)), torch.tensor(math.log(10) ** 2))


def test_z_loss_changes_training_but_not_what_the_logged_loss_means(tmp_path):
    from ablate.cell import Cell
    from ablate.train import train

    def losses(z):
        cell = Cell.from_options({"layers": 2, "steps": 6, "z_loss": z, "probes": False}, id_keys=["z_loss"])
        train(cell, tmp_path / cell.id)
        return [json.loads(line)["loss"] for line in (tmp_path / cell.id / "metrics.jsonl").read_text().splitlines()]

    off, on = losses(0.0), losses(0.5)
    assert off[0] == on[0]  # step 0: the same weights, the same cross-entropy (the z term is not logged)
    assert off[1:] != on[1:]  # the gradient differs from the first update on


def test_mlp_ratio_sets_the_dense_width_and_its_default_leaves_ids_unchanged():
    assert resolve({"mlp_ratio": 2}).size.mlp_hidden == 128
    assert resolve({}).size.mlp_hidden == 256
    swiglu = resolve({"mlp": "swiglu", "mlp_ratio": 2})
    model = build_model(swiglu.spec, swiglu.size)
    assert model.blocks[0].mlp.c_proj.weight.shape[1] == round(2 * 128 / 3)  # gated: 2/3, parameter-matched
    assert cell_id(resolve({"mlp_ratio": 4}), ["mlp_ratio"]) == "pre.layernorm.gelu.dense.res__seed=0"
    assert cell_id(resolve({"mlp_ratio": 2}), ["mlp_ratio"]) == "pre.layernorm.gelu.dense.res__mlp_ratio=2__seed=0"


# ------------------------------------------------------------------------------- the schema


def test_the_schema_is_the_only_list_of_identity_keys():
    assert set(IDENTITY_KEYS).isdisjoint(EXECUTION_KEYS)
    assert {"threads", "device", "kernels", "compile", "flush_denormal", "checkpoint_every"} == set(EXECUTION_KEYS)
    assert {"lr", "init", "optimizer", "z_loss", "mlp_ratio", "qk_norm", "seed"} <= set(IDENTITY_KEYS)
    for name in ("log_every", "probes", "probe_every", "eval_every"):
        assert OPTIONS[name].role == "observation"


# A value other than the default for every experiment option, valid with the others at default.
OTHER = {"variant": "post-ln", "norm": "post", "norm_type": "rmsnorm", "act": "relu", "mlp": "swiglu",
         "residual": False, "qk_norm": "layernorm", "model": "small", "layers": 3, "mlp_ratio": 2.0,
         "init": "xavier", "optimizer": "adam", "lr": 2e-3, "weight_decay": 0.0, "beta1": 0.8, "beta2": 0.9,
         "grad_clip": 1.0, "z_loss": 1e-4, "steps": 3, "warmup": 1, "schedule": "constant", "min_lr_ratio": 0.5,
         "seed": 1, "batch_size": 4, "seq_len": 32, "dtype": "bfloat16", "diverge_factor": 3.0,
         "eval_batches": 2, "final_eval_batches": 3}
NEEDS = {"momentum": {"optimizer": "sgd"}, "nesterov": {"optimizer": "sgd"}, "decay_fraction": {"schedule": "wsd"}}
OTHER.update({"momentum": 0.5, "nesterov": True, "decay_fraction": 0.5, "data": None})


def test_every_identity_option_has_a_test_value():
    assert set(IDENTITY_KEYS) <= set(OTHER)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished run per base configuration, shared by the cases (training is the slow part)."""
    from ablate.cell import Cell
    from ablate.train import train

    root, done = tmp_path_factory.mktemp("identity"), {}

    def get(base):
        key = json.dumps(base, sort_keys=True)
        if key not in done:
            cell = Cell.from_options(base, id_keys=TRAIN_ID_OPTIONS)
            train(cell, root / key.__hash__().__str__() / cell.id)
            done[key] = (cell, root / key.__hash__().__str__() / cell.id)
        return done[key]

    return get


@pytest.mark.parametrize("key", [k for k in IDENTITY_KEYS if k != "data"])
def test_changing_an_identity_option_changes_the_cell_id_or_is_refused_on_the_run(trained, key):
    from ablate.cell import Cell
    from ablate.train import check_existing_run

    base = {"layers": 2, "steps": 2, "eval_batches": 1, "final_eval_batches": 1, "probes": False, **NEEDS.get(key, {})}
    first, run_dir = trained(base)
    other = Cell.from_options({**base, key: OTHER[key]}, id_keys=TRAIN_ID_OPTIONS)
    if other.id != first.id:  # named in the folder: a different run directory
        return
    assert not OPTIONS[key].in_id or key in ("variant", "norm", "norm_type", "act", "mlp", "residual", "qk_norm")
    with pytest.raises(ConfigError, match="holds a run with a different"):
        check_existing_run(other, run_dir)


def test_a_run_directory_from_before_the_schema_still_resumes_and_reports(tmp_path, monkeypatch):
    """An old config.json (no identity_keys, plugins, model.init, and none of the new options in
    `train`) of an interrupted run: the same command resumes it to the uninterrupted metrics."""
    import ablate.train as T
    from interrupting import interrupted_at
    from ablate.analysis.load import load_runs
    from ablate.cell import Cell

    options = {"layers": 2, "steps": 6, "checkpoint_every": 100, "probes": False}
    T.train(Cell.from_options(options), tmp_path / "reference")
    cell = Cell.from_options(options)
    run_dir = tmp_path / "grid" / cell.id
    with interrupted_at(monkeypatch, 2), pytest.raises(T.Interrupted):  # checkpoints after step 2
        T.train(cell, run_dir)
    config = json.loads((run_dir / "config.json").read_text())
    for key in ("init", "optimizer", "z_loss", "mlp_ratio", "qk_norm", "momentum", "nesterov", "decay_fraction",
                "final_eval_batches", "probe_every"):
        del config["train"][key]
    for section, key in (("model", "init"), ("model", "mlp_ratio"), ("variant", "qk_norm")):
        del config[section][key]
    del config["identity_keys"], config["plugins"]
    (run_dir / "config.json").write_text(json.dumps(config))
    T.check_existing_run(cell, run_dir)  # the same run: not refused
    T.train(cell, run_dir)

    def losses(d):
        return [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]

    assert losses(run_dir) == losses(tmp_path / "reference")
    runs = load_runs(tmp_path / "grid")
    assert list(runs.cells["cell_id"]) == [cell.id] and runs.cells["status"].iloc[0] == "completed"


# ------------------------------------------------------------------------------- plugins

PLUGIN = """
import torch
from ablate.variants import ACTIVATIONS, INITS
from ablate.variants.inits import gpt2

@ACTIVATIONS.register("mish_test")
def mish(x):
    return x * torch.tanh(torch.nn.functional.softplus(x))

@INITS.register("gpt2_half_test")
def gpt2_half(model):
    gpt2(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(0.5)
"""


def test_a_plugin_file_registers_values_that_train_in_a_two_worker_grid(tmp_path):
    plugin = tmp_path / "lab" / "my_blocks.py"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text(textwrap.dedent("""
        name = "plug"
        imports = ["lab/my_blocks.py"]
        [base]
        layers = 2
        steps = 3
        eval_batches = 1
        final_eval_batches = 1
        init = "gpt2_half_test"
        [axes]
        act = ["mish_test", "gelu"]
    """))
    result = run_cli("grid", grid, "--out", tmp_path / "out", "--workers", 2, "--quiet", cwd=tmp_path / "lab")
    assert result.returncode == 0, result.stderr
    import hashlib

    digest = "sha256:" + hashlib.sha256(plugin.read_bytes()).hexdigest()
    config = json.loads((tmp_path / "out" / "pre.layernorm.mish_test.dense.res__seed=0" / "config.json").read_text())
    assert config["model"]["init"] == "gpt2_half_test"
    assert [p["sha256"] for p in config["plugins"]] == [digest]
    assert config["plugins"][0]["file"] == str(plugin.resolve())
    listed = run_cli("variants", "--model", "tiny", "--import", plugin)
    assert listed.returncode == 0 and "mish_test" in listed.stdout


def test_a_plugin_that_raises_on_import_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("raise RuntimeError('boom at import')\n")
    result = run_cli("train", "--import", bad, "--steps", 1, "--out", tmp_path / "o")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "bad_plugin.py" in result.stderr and "boom at import" in result.stderr
    assert not (tmp_path / "o").exists()
    missing = run_cli("train", "--import", "no_such_module_xyz", "--steps", 1, "--out", tmp_path / "o")
    assert missing.returncode == 2 and "no_such_module_xyz" in missing.stderr and missing.stderr.count("\n") == 1


# ------------------------------------------------------------------------------- install names


def test_a_normal_install_puts_nothing_named_variants_or_analysis_in_site_packages(tmp_path):
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(REPO)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("ablate-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"ablate", next(n.split("/")[0] for n in names if ".dist-info" in n)}
    for folder, package in (("variants", "ablate/variants"), ("analysis", "ablate/analysis"), ("ablate", "ablate")):
        for source in (REPO / folder).rglob("*.py"):
            assert f"{package}/{source.relative_to(REPO / folder).as_posix()}" in names, source
    assert "ablate/variants/grids/prenorm-wins.toml" in names
