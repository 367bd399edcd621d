"""ablate/engine/config.py: the option schema as the only list of what defines a run, with the options
a component declares (an optimizer's beta1, a schedule's decay_fraction, a plugin's own) and the
per-axis options derived from their declarations; configs that record and compare as before; and
how options become a variant and a cell id: `none` as a variant-axis value, explicit
contradictions refused for one run (but collapsed in grid crossings), and cell ids that do not
change when an option is given its default value."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import fields

import pytest

import ablate.engine.train as T
from ablate.analysis.load import load_runs
from ablate.cli import build_parser, main
from ablate.commands.train import collect_options
from ablate.core.errors import ConfigError
from ablate.core.registry import ComponentOption, Registry
from ablate.core.variant_axes import AXES, DEFAULTS
from ablate.engine import config
from ablate.engine.cell import Cell
from ablate.engine.config import (EXECUTION_KEYS, IDENTITY_KEYS, OPTIONS, OPTION_NAMES, TRAIN_ID_OPTIONS, cell_id,
                                  coerce_option, resolve, with_seed)
from ablate.grid.spec import load_grid, parse_overrides
from ablate.variants import OPTIMIZERS, SCHEDULES, VariantSpec
from tests.helpers.interrupting import interrupted_at

TINY_RUN = ["--steps", "1", "--batch-size", "2", "--eval-every", "1", "--eval-batches", "1", "--threads", "1", "--quiet"]


def train_config(argv):
    """The config `ablate train ARGV` would train, through the command's own option parsing."""
    args = build_parser().parse_args(["train", *argv])
    options, _ = collect_options(args)
    return resolve(options)


def write(tmp_path, text, name="g.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ------------------------------------------------------------ the options a component declares

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

from ablate.core.checks import positive
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


# --------------------------------------------- the schema: the only list of what defines a run

# A value other than the default for every experiment option, valid with the others at default.
OTHER = {"variant": "post-ln", "norm": "post", "norm_type": "rmsnorm", "act": "relu", "mlp": "swiglu",
         "residual": False, "qk_norm": "layernorm", "model": "small", "layers": 3, "width": 32, "mlp_ratio": 2.0,
         "init": "xavier", "optimizer": "adam", "lr": 2e-3, "weight_decay": 0.0, "beta1": 0.8, "beta2": 0.9,
         "grad_clip": 1.0, "z_loss": 1e-4, "steps": 3, "warmup": 1, "schedule": "constant", "min_lr_ratio": 0.5,
         "seed": 1, "batch_size": 4, "seq_len": 32, "dtype": "bfloat16", "diverge_factor": 3.0,
         "eval_batches": 2, "final_eval_batches": 3, "stop_dead": 5}

NEEDS = {"momentum": {"optimizer": "sgd"}, "nesterov": {"optimizer": "sgd"}, "decay_fraction": {"schedule": "wsd"},
         "stop_dead": {"probes": True}}
OTHER.update({"momentum": 0.5, "nesterov": True, "decay_fraction": 0.5, "data": None})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One finished run per base configuration, shared by the cases (training is the slow part)."""
    root, done = tmp_path_factory.mktemp("identity"), {}

    def get(base):
        key = json.dumps(base, sort_keys=True)
        if key not in done:
            cell = Cell.from_options(base, id_keys=TRAIN_ID_OPTIONS)
            T.train(cell, root / key.__hash__().__str__() / cell.id)
            done[key] = (cell, root / key.__hash__().__str__() / cell.id)
        return done[key]

    return get


def test_the_schema_is_the_only_list_of_identity_keys():
    assert set(IDENTITY_KEYS).isdisjoint(EXECUTION_KEYS)
    assert {"threads", "device", "kernels", "compile", "flush_denormal", "checkpoint_every"} == set(EXECUTION_KEYS)
    assert {"lr", "init", "optimizer", "z_loss", "mlp_ratio", "qk_norm", "seed"} <= set(IDENTITY_KEYS)
    for name in ("log_every", "probes", "probe_every", "eval_every"):
        assert OPTIONS[name].role == "observation"


def test_every_identity_option_has_a_test_value():
    assert set(IDENTITY_KEYS) <= set(OTHER)


@pytest.mark.parametrize("key", [k for k in IDENTITY_KEYS if k != "data"])
def test_changing_an_identity_option_changes_the_cell_id_or_is_refused_on_the_run(trained, key):
    base = {"layers": 2, "steps": 2, "eval_batches": 1, "final_eval_batches": 1, "probes": False, **NEEDS.get(key, {})}
    first, run_dir = trained(base)
    other = Cell.from_options({**base, key: OTHER[key]}, id_keys=TRAIN_ID_OPTIONS)
    if other.id != first.id:  # named in the folder: a different run directory
        return
    assert not OPTIONS[key].in_id or key in ("variant", "norm", "norm_type", "act", "mlp", "residual", "qk_norm")
    with pytest.raises(ConfigError, match="holds a run with a different"):
        T.check_existing_run(other, run_dir)


@pytest.mark.slow
def test_a_run_directory_from_before_the_schema_still_resumes_and_reports(tmp_path, monkeypatch):
    """An old config.json (no identity_keys, plugins, model.init, and none of the new options in
    `train`) of an interrupted run: the same command resumes it to the uninterrupted metrics."""
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


# -------------------------------------------------------------- `none` is a variant-axis value


def test_the_string_none_is_the_norm_axis_value_not_unset():
    assert coerce_option("norm", "none") == "none"
    assert resolve({"norm": "none"}).spec.id == "none.gelu.dense.res"


@pytest.mark.parametrize("argv", [
    ["--norm", "none"],
    ["--set", "norm=none"],
    ["--variant", "gpt2", "--norm", "none"],
])
def test_norm_none_from_flags_and_set(argv):
    assert train_config(argv).spec.id == "none.gelu.dense.res"


def test_norm_none_from_a_config_file(tmp_path):
    path = write(tmp_path, 'norm = "none"\nsteps = 3\n', "c.toml")
    assert train_config(["--config", str(path)]).spec.id == "none.gelu.dense.res"


def test_train_norm_none_trains_a_block_without_norms(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", "--norm", "none", *TINY_RUN, "--out", str(out)]) == 0
    assert [p.name.split("__")[0] for p in out.iterdir()] == ["none.gelu.dense.res"]


def test_none_still_means_unset_for_plain_optional_options():
    assert coerce_option("seq_len", "none") is None
    assert coerce_option("layers", "null") is None
    assert resolve({"seq_len": "none"}).context == 64


@pytest.mark.parametrize("key, value, fragment", [
    ("norm", "null", "unknown norm 'null'; valid: pre, post, sandwich, deepnorm, none"),
    ("act", "none", "unknown act 'none'; valid: gelu"),
    ("residual", "none", "residual 'none' is not a valid bool"),
])
def test_none_or_null_on_an_axis_without_such_value_is_refused(key, value, fragment):
    with pytest.raises(ConfigError, match=fragment):
        resolve({key: value})


def test_grid_norm_axis_with_none_gives_no_norm_cells(tmp_path):
    path = write(tmp_path, """
        [base]
        steps = 3
        [axes]
        norm = ["pre", "none"]
    """)
    grid = load_grid(path)
    assert [c.id for c in grid.cells] == ["pre.layernorm.gelu.dense.res__seed=0", "none.gelu.dense.res__seed=0"]
    assert grid.duplicates == []


def test_grid_base_norm_none(tmp_path):
    path = write(tmp_path, """
        [base]
        norm = "none"
        [axes]
        seed = [0, 1]
    """)
    assert [c.id for c in load_grid(path).cells] == ["none.gelu.dense.res__seed=0", "none.gelu.dense.res__seed=1"]


def test_set_norm_none_on_a_shipped_grid(capsys, tmp_path):
    grid = load_grid("mission", overrides=parse_overrides(["norm=none"]))
    assert grid.cells and all(c.id.startswith("none.") for c in grid.cells)
    assert main(["grid", "mission", "--set", "norm=none", "--dry-run", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "--set: norm=none" in text and "pre.layernorm" not in text


# --------------------------------------------------------- explicit contradictions are refused


@pytest.mark.parametrize("argv, fragment", [
    (["--variant", "llama", "--act", "relu"], "act=relu does not apply to mlp=swiglu"),
    (["--mlp", "swiglu", "--act", "relu"], "act=relu does not apply to mlp=swiglu"),
    (["--set", "mlp=geglu", "--set", "act=relu"], "act=relu does not apply to mlp=geglu"),
    (["--variant", "act=relu", "--mlp", "swiglu"], "act=relu does not apply to mlp=swiglu"),
    (["--variant", "mlp=swiglu", "--act", "gelu"], "act=gelu does not apply to mlp=swiglu"),
    (["--variant", "no-norm", "--norm-type", "rmsnorm"], "norm_type=rmsnorm does not apply to norm=none"),
    (["--norm", "none", "--norm-type", "rmsnorm"], "norm_type=rmsnorm does not apply to norm=none"),
    (["--variant", "norm=none", "--norm-type", "rmsnorm"], "norm_type=rmsnorm does not apply to norm=none"),
    (["--variant", "norm=pre,norm=post"], "variant 'norm=pre,norm=post' gives norm twice"),
])
def test_contradictory_options_are_refused_like_variant(argv, fragment):
    with pytest.raises(ConfigError, match=fragment):
        train_config(argv)


@pytest.mark.parametrize("argv, expected", [
    (["--variant", "llama"], "pre.rmsnorm.swiglu.res"),
    (["--variant", "gpt2", "--norm", "post"], "post.layernorm.gelu.dense.res"),  # an override
    (["--variant", "gpt2", "--mlp", "swiglu"], "pre.layernorm.swiglu.res"),  # the preset's act goes
    (["--variant", "llama", "--norm", "none"], "none.swiglu.res"),  # the preset's norm_type goes
    (["--variant", "no-norm", "--norm", "pre"], "pre.layernorm.gelu.dense.res"),
    (["--variant", "llama", "--mlp", "dense", "--act", "relu"], "pre.rmsnorm.relu.dense.res"),
    (["--variant", "act=relu", "--act", "gelu"], "pre.layernorm.gelu.dense.res"),  # a flag overrides
    (["--variant", "post.layernorm.relu.dense.res", "--mlp", "swiglu"], "post.layernorm.swiglu.res"),
    (["--mlp", "swiglu", "--act", "silu"], "pre.layernorm.swiglu.res"),  # as --variant mlp=swiglu,act=silu
])
def test_overrides_that_are_not_contradictions_still_work(argv, expected):
    assert train_config(argv).spec.id == expected


def test_train_refuses_a_contradiction_in_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", "--variant", "llama", "--act", "relu", *TINY_RUN, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "act=relu does not apply to mlp=swiglu" in err
    assert not out.exists()


def test_grid_base_and_set_contradictions_are_refused(tmp_path):
    path = write(tmp_path, """
        [base]
        variant = "llama"
        act = "relu"
        [axes]
        seed = [0, 1]
    """)
    with pytest.raises(ConfigError, match=r"\[base\]: act=relu does not apply to mlp=swiglu"):
        load_grid(path)
    with pytest.raises(ConfigError, match="--set: act=relu does not apply to mlp=swiglu"):
        load_grid("mission", overrides=parse_overrides(["variant=llama", "act=relu"]))
    with pytest.raises(ConfigError, match="--set: variant 'norm=pre,norm=post' gives norm twice"):
        load_grid("mission", overrides=parse_overrides(["variant=norm=pre,norm=post"]))


def test_grid_crossings_still_collapse(tmp_path):
    assert len(load_grid("glu").cells) == 15 and len(load_grid("mission").cells) == 36
    # --set crossed with an axis collapses too: act=relu is dropped by the gated mlps only
    ids = [c.id for c in load_grid("glu", overrides=parse_overrides(["act=relu"])).cells]
    assert len(ids) == 12 and {i.split("__")[0] for i in ids} == {
        "pre.layernorm.relu.dense.res", "pre.layernorm.swiglu.res", "pre.layernorm.geglu.res", "pre.layernorm.reglu.res"}
    # an axis written in [base]'s variant, crossed with an mlp that drops it
    path = write(tmp_path, """
        [base]
        variant = "act=relu"
        [axes]
        mlp = ["dense", "swiglu"]
        norm = ["pre", "none"]
        norm_type = ["layernorm", "rmsnorm"]
    """)
    grid = load_grid(path)
    assert len(grid.cells) == 6  # none x norm_type collapses
    for cell in grid.cells:  # each cell, trained as one run, resolves to the block it names
        assert cell_id(resolve(cell.options)) == cell.id


# -------------------------------------------------------------------------- canonical cell ids


def test_a_default_value_given_explicitly_does_not_change_the_id():
    keys = ["model", "layers", "seq_len", "lr", "steps", "warmup", "batch_size"]
    plain = cell_id(resolve({}), [])
    assert plain == "pre.layernorm.gelu.dense.res__seed=0"
    assert cell_id(resolve({"seq_len": 64}), ["seq_len"]) == plain  # tiny's context
    explicit = {"model": "tiny", "layers": 4, "seq_len": "64", "lr": "1e-3", "steps": 300, "warmup": 0, "batch_size": 16}
    assert cell_id(resolve(explicit), keys) == plain
    assert cell_id(resolve({"variant": "post-ln", "lr": 3e-3, "steps": 300}), ["lr", "steps"]) == \
        "post.layernorm.gelu.dense.res__lr=0.003__seed=0"  # steps=300 is the default
    assert cell_id(resolve({"model": "small", "seq_len": 128, "layers": 6}), keys) == \
        "pre.layernorm.gelu.dense.res__model=small__seed=0"


def test_ids_for_non_default_values_are_unchanged():
    assert cell_id(resolve({"lr": 3e-3, "steps": 200}), ["lr", "steps"]) == \
        "pre.layernorm.gelu.dense.res__lr=0.003__steps=200__seed=0"
    options = {"batch_size": 4, "seq_len": 32, "steps": 40}
    assert cell_id(resolve(options), list(options)) == \
        "pre.layernorm.gelu.dense.res__batch_size=4__seq_len=32__steps=40__seed=0"
    assert cell_id(resolve({"model": "small", "seq_len": 64}), ["model", "seq_len"]) == \
        "pre.layernorm.gelu.dense.res__model=small__seq_len=64__seed=0"


def test_grid_ids_keep_every_varying_option_even_at_its_default():
    ids = {c.id for c in load_grid("prenorm-wins").cells}
    assert "pre.layernorm.gelu.dense.res__lr=0.003__warmup=0__seed=0" in ids
    assert "post.layernorm.gelu.dense.res__lr=0.0003__warmup=100__seed=2" in ids
    assert "pre.layernorm.gelu.dense.res__layers=4__seed=0" in {c.id for c in load_grid("residual").cells}


def test_train_with_the_default_seq_len_finds_the_finished_run(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train", *TINY_RUN, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", *TINY_RUN, "--model", "tiny", "--seq-len", "64", "--lr", "1e-3", "--out", str(out)]) == 0
    assert "already finished" in capsys.readouterr().out
    assert len(list(out.iterdir())) == 1
