"""How options become a variant and a cell id: `none` as a variant-axis value, explicit
contradictions refused for one run (but collapsed in grid crossings), and cell ids that do
not change when an option is given its default value."""
import textwrap

import pytest

from ablate.cli import build_parser, main
from ablate.commands.train import collect_options
from ablate.config import cell_id, coerce_option, resolve
from ablate.errors import ConfigError
from ablate.grid.spec import load_grid, parse_overrides

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


# ------------------------------------------------------------ 1. `none` is a variant-axis value


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


# ------------------------------------------------------------ 2. explicit contradictions are refused


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


# ------------------------------------------------------------ 3. canonical cell ids


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
