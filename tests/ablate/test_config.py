"""ablate/config.py: the option schema, with the options a component declares (an optimizer's
beta1, a schedule's decay_fraction, a plugin's own) and the per-axis options derived from their
declarations, and configs that record and compare as before."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import fields

import pytest

from ablate import config
from ablate.config import IDENTITY_KEYS, OPTION_NAMES, OPTIONS, TRAIN_ID_OPTIONS, cell_id, resolve, with_seed
from ablate.errors import ConfigError
from ablate.registry import ComponentOption, Registry
from ablate.variant_axes import AXES, DEFAULTS
from ablate.variants import OPTIMIZERS, SCHEDULES, VariantSpec

# config.json's `train` keys before the components declared their options: a run folder made
# then must resume, so a config records exactly these (with the lead's later additions allowed).
TRAIN_KEYS_BEFORE = {
    "variant", "norm", "norm_type", "act", "mlp", "residual", "qk_norm", "model", "layers", "mlp_ratio", "init",
    "optimizer", "lr", "weight_decay", "beta1", "beta2", "momentum", "nesterov", "grad_clip", "z_loss", "steps",
    "warmup", "schedule", "min_lr_ratio", "decay_fraction", "seed", "data", "batch_size", "seq_len", "dtype",
    "diverge_factor", "eval_batches", "final_eval_batches", "eval_every", "log_every", "probes", "probe_every",
    "kernels", "device", "threads", "compile", "flush_denormal", "checkpoint_every"}


def test_a_config_records_the_same_keys_and_values_as_before():
    recorded = resolve({}).as_dict()
    assert TRAIN_KEYS_BEFORE <= set(recorded) and set(recorded) == set(OPTION_NAMES)
    assert (recorded["beta1"], recorded["beta2"], recorded["momentum"], recorded["nesterov"],
            recorded["decay_fraction"]) == (0.9, 0.95, None, None, 0.2)
    assert "extra_options" not in recorded
    assert {"beta1", "beta2", "momentum", "nesterov", "decay_fraction"} <= set(IDENTITY_KEYS) & set(TRAIN_ID_OPTIONS)


def test_the_optimizers_and_schedules_declare_their_options_and_the_schema_derives_the_rest():
    assert OPTIONS["beta1"].applies == ("optimizer", ("adamw", "adam", "muon"))
    assert OPTIONS["momentum"].applies == ("optimizer", ("sgd", "muon"))
    assert OPTIONS["decay_fraction"].applies == ("schedule", ("wsd",))
    # one default where the declarations agree, else "each one's own", said in the help
    assert (OPTIONS["beta1"].default, OPTIONS["beta1"].optional) == (0.9, False)
    assert (OPTIONS["momentum"].default, OPTIONS["momentum"].optional) == (None, True)
    assert OPTIONS["momentum"].help == "momentum (default 0.9 for sgd, 0.95 for muon)"
    assert OPTIONS["nesterov"].help == "Nesterov momentum (default false for sgd, true for muon)"
    declared = {o.name: o.default for o in OPTIMIZERS.options("adamw")}
    assert declared == {"beta1": 0.9, "beta2": 0.95}
    assert [o.name for o in SCHEDULES.options("wsd")] == ["decay_fraction"] and SCHEDULES.options("cosine") == ()
    # each follows the option that picks its component
    names = list(OPTION_NAMES)
    assert names[names.index("optimizer") + 1:names.index("optimizer") + 5] == ["beta1", "beta2", "momentum", "nesterov"]
    assert names[names.index("schedule") + 1] == "decay_fraction"


def test_a_component_reads_its_own_default_where_the_option_is_unset():
    assert OPTIMIZERS.settings("sgd", resolve({"optimizer": "sgd"})) == {"momentum": 0.9, "nesterov": False}
    assert OPTIMIZERS.settings("muon", resolve({"optimizer": "muon"})) == {
        "beta1": 0.9, "beta2": 0.95, "momentum": 0.95, "nesterov": True}
    assert OPTIMIZERS.settings("muon", resolve({"optimizer": "muon", "momentum": "0.5"}))["momentum"] == 0.5


def test_a_components_option_is_checked_and_refused_for_another_component():
    with pytest.raises(ConfigError, match=r"^beta1 1.0 must be in \[0, 1\)$"):
        resolve({"beta1": 1.0})
    with pytest.raises(ConfigError, match=r"^nesterov 'maybe' is not a valid bool$"):
        resolve({"optimizer": "sgd", "nesterov": "maybe"})
    with pytest.raises(ConfigError, match=r"^beta2 does not apply to optimizer=sgd; valid: leave beta2 out, or "
                                          r"optimizer adamw / adam / muon$"):
        resolve({"optimizer": "sgd", "beta2": 0.9})


def test_equal_settings_make_equal_configs_that_survive_pickling_and_a_new_seed():
    assert resolve({"beta1": "0.9", "norm": "pre"}) != resolve({})  # an axis given is a different request
    assert resolve({"beta1": "0.9"}) == resolve({}) and hash(resolve({"beta1": 0.9})) == hash(resolve({}))
    cfg = resolve({"optimizer": "sgd", "momentum": 0.5, "norm": "post", "seed": 3})
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    other = with_seed(cfg, 4)
    assert (other.seed, other.momentum, other.norm, other.spec.id) == (4, 0.5, "post", cfg.spec.id)
    assert cell_id(cfg, ["momentum"]) == "post.layernorm.gelu.dense.res__momentum=0.5__seed=3"
    with pytest.raises(AttributeError):
        cfg.not_an_option


def test_a_component_option_named_like_another_option_is_refused(monkeypatch):
    fake: Registry = Registry("optimizer")
    fake.register("mine", object, options=(ComponentOption("lr", float, 1.0, "my own lr"),))
    monkeypatch.setitem(config._COMPONENT_REGISTRIES, "optimizer", fake)
    with pytest.raises(ConfigError, match=r"^optimizer 'mine' declares option 'lr', which is the engine's own; "
                                          r"valid: another name for it$"):
        list(OPTIONS)


def test_a_variant_axis_is_declared_once():
    assert tuple(f.name for f in fields(VariantSpec)) == AXES
    assert VariantSpec() == VariantSpec(**DEFAULTS)
    names = list(OPTION_NAMES)
    assert names[names.index("variant") + 1:names.index("variant") + 1 + len(AXES)] == list(AXES)
    assert all(OPTIONS[a].default is None and OPTIONS[a].optional for a in AXES)
    assert resolve({"norm": "post", "residual": "false"}).spec.id == "post.layernorm.gelu.dense.nores"
    with pytest.raises(ConfigError, match="unknown qk_norm 'x'; valid: none, layernorm, rmsnorm"):
        resolve({"qk_norm": "x"})


PLUGIN = '''
import os
from pathlib import Path

import torch

from ablate.checks import positive
from ablate.variants import OPTIMIZERS
from ablate.variants.optimizers import ADAM_OPTIONS, decay_groups
from ablate.variants.tables import ComponentOption


@OPTIMIZERS.register("adamw_eps", options=(*ADAM_OPTIONS, ComponentOption("eps", float, 1e-8, "Adam epsilon", positive)))
class AdamWEps:
    @staticmethod
    def build(model, cfg):
        o = OPTIMIZERS.settings("adamw_eps", cfg)
        Path(os.environ["EPS_SEEN"]).write_text(f"{o['eps']} {o['beta1']}")
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return torch.optim.AdamW(decay_groups(named, cfg.weight_decay), lr=cfg.lr, betas=(o["beta1"], o["beta2"]),
                                 eps=o["eps"])
'''
TINY = ("--layers", "1", "--steps", "2", "--eval-batches", "1", "--final-eval-batches", "1", "--probes", "false",
        "--quiet")


def _ablate(*args, env):
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.slow
def test_a_plugin_optimizer_with_its_own_option_works_end_to_end_from_a_users_file(tmp_path):
    plugin = tmp_path / "my_optim.py"
    plugin.write_text(PLUGIN)
    env = {**os.environ, "EPS_SEEN": str(tmp_path / "seen")}
    out = tmp_path / "runs"
    done = _ablate("train", "--import", plugin, "--optimizer", "adamw_eps", "--eps", "1e-6", "--set", "beta1=0.8",
                   *TINY, "--out", out, env=env)
    assert done.returncode == 0, done.stderr
    (run_dir,) = out.iterdir()
    assert run_dir.name == "pre.layernorm.gelu.dense.res__beta1=0.8__eps=1e-06__layers=1__optimizer=adamw_eps__steps=2__seed=0"
    recorded = json.loads((run_dir / "config.json").read_text())
    assert (recorded["train"]["eps"], recorded["train"]["beta1"]) == (1e-6, 0.8) and "eps" in recorded["identity_keys"]
    assert (tmp_path / "seen").read_text() == "1e-06 0.8"  # the optimizer was built with them
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"

    refused = _ablate("train", "--import", plugin, "--optimizer", "adamw_eps", "--set", "eps=-1", *TINY, "--out", out,
                      env=env)
    assert (refused.returncode, refused.stderr) == (2, "ablate train: error: --set: eps -1.0 must be positive\n")
    other = _ablate("train", "--import", plugin, "--eps", "1e-6", *TINY, "--out", out, env=env)
    assert (other.returncode, other.stderr) == (2, "ablate train: error: eps does not apply to optimizer=adamw; "
                                                   "valid: leave eps out, or optimizer adamw_eps\n")
    assert "--eps" in _ablate("train", "--import", plugin, "--help", env=env).stdout
    without = _ablate("train", "--eps", "1e-6", *TINY, "--out", out, env=env)
    assert without.returncode == 2 and "unrecognized arguments: --eps" in without.stderr


@pytest.mark.slow
def test_a_grid_file_crosses_a_plugin_optimizers_own_option(tmp_path):
    (tmp_path / "my_optim.py").write_text(PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\nimports = ["my_optim.py"]\n[base]\noptimizer = "adamw_eps"\nsteps = 2\n'
                    '[axes]\neps = [1e-6, 1e-7]\n')
    code = ("import sys; from pathlib import Path; from ablate.grid.spec import RUN_IMPORTS, load_grid; "
            "print(' '.join(c.id for c in load_grid(Path(sys.argv[1]), imports_policy=RUN_IMPORTS).cells))")
    loaded = subprocess.run([sys.executable, "-c", code, str(grid)], capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == ["pre.layernorm.gelu.dense.res__eps=1e-06__seed=0",
                                     "pre.layernorm.gelu.dense.res__eps=1e-07__seed=0"]
