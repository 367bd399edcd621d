"""Grid files (ablate/grid/spec.py) and `ablate grid` without real training: expansion, errors,
listing, dry runs, grid.json, a grid file's imports."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ablate.cli import main
from ablate.core.errors import ConfigError
from ablate.core.rundir import CellLock, write_json_atomic
from ablate.engine.cell import CellResources
from ablate.grid import state as grid_state
from ablate.grid.spec import load_grid, shipped_grids
from tests.helpers.fake_trainer import SMALL, write_grid

# --------------------------------------------------------------------------- grid files


def test_shipped_grids_have_the_documented_sizes():
    documented = {"mission", "prenorm-wins", "glu", "residual"}  # (claims ship their own grids too)
    assert set(shipped_grids()) >= documented
    mission = load_grid("mission")
    assert (len(mission.cells), mission.combinations, len(mission.duplicates)) == (36, 48, 12)
    assert len({c.group for c in mission.cells}) == 12  # 16 combinations, 12 distinct blocks
    glu = load_grid("glu")
    assert (len(glu.cells), len({c.group for c in glu.cells})) == (15, 5)
    residual = load_grid("residual")
    assert len(residual.cells) == 18 and residual.id_keys == ("layers",)
    for name in sorted(documented):
        cpu, gpu = load_grid(name), load_grid(name, "gpu")
        assert cpu.total_steps <= 7_200  # minutes on 2 cores
        assert gpu.total_steps > cpu.total_steps


def test_prenorm_wins_grid_is_the_issue_6_experiment():
    grid = load_grid("prenorm-wins")
    assert len(grid.cells) == 24 and grid.total_steps == 7_200
    seen = set()
    for cell in grid.cells:
        cfg = grid.configs[cell.id]
        spec = cfg.spec
        assert (spec.norm_type, spec.act, spec.mlp, spec.residual) == ("layernorm", "gelu", "dense", True)
        assert (cfg.size.n_layer, cfg.size.d_model, cfg.context, cfg.batch_size) == (12, 64, 64, 16)
        assert (cfg.steps, cfg.grad_clip, cfg.schedule) == (300, 0.0, "constant")
        seen.add((spec.norm, cfg.warmup, cfg.lr, cfg.seed))
        assert cell.id == f"{spec.id}__lr={cfg.lr:g}__warmup={cfg.warmup}__seed={cfg.seed}"
        assert cell.axes == {"norm": spec.norm, "lr": cfg.lr, "warmup": cfg.warmup, "seed": cfg.seed}
    assert {s[0] for s in seen} == {"pre", "post"} and {s[1] for s in seen} == {0, 100}
    assert {s[2] for s in seen} == {3e-3, 3e-4} and {s[3] for s in seen} == {0, 1, 2}
    gpu = load_grid("prenorm-wins", "gpu")
    assert len(gpu.cells) == 120
    assert {gpu.configs[c.id].size.n_layer for c in gpu.cells} == {6, 12, 24}
    assert {gpu.configs[c.id].seed for c in gpu.cells} == {0, 1, 2, 3, 4}
    assert {gpu.configs[c.id].model for c in gpu.cells} == {"medium"}


def test_act_crossed_with_a_gated_mlp_collapses(tmp_path):
    path = write_grid(tmp_path, """
        [axes]
        act = ["gelu", "relu"]
        mlp = ["dense", "swiglu"]
    """)
    grid = load_grid(path)
    assert grid.name == "g" and grid.combinations == 4
    assert [c.id for c in grid.cells] == ["pre.layernorm.gelu.dense.res__seed=0", "pre.layernorm.swiglu.res__seed=0",
                                          "pre.layernorm.relu.dense.res__seed=0"]
    assert grid.duplicates == [("act=relu,mlp=swiglu", "pre.layernorm.swiglu.res__seed=0")]
    swiglu = grid.cells[1]
    assert swiglu.options["act"] is None and swiglu.axes == {"act": None, "mlp": "swiglu", "seed": 0}


def test_same_config_spelled_two_ways_runs_once(tmp_path):
    path = write_grid(tmp_path, """
        [base]
        steps = 7
        [axes]
        variant = ["post-ln", "norm=post", "gpt2"]
        lr = [0.001, 1e-3]
    """)
    grid = load_grid(path)
    assert [c.id for c in grid.cells] == ["post.layernorm.gelu.dense.res__seed=0", "pre.layernorm.gelu.dense.res__seed=0"]
    assert grid.total_steps == 14


def test_include_exclude_scales_and_set(tmp_path):
    path = write_grid(tmp_path, """
        name = "mix"
        [base]
        steps = 10
        [axes]
        norm = ["pre", "post"]
        warmup = [0, 5]
        [[exclude]]
        norm = "post"
        warmup = 5
        [[include]]
        norm = "sandwich"
        seed = [0, 1]
        [scales.gpu]
        base = { warmup = 0, model = "small" }
        axes = { seed = [0, 1, 2] }
    """)
    grid = load_grid(path)
    ids = [c.id for c in grid.cells]
    assert "post.layernorm.gelu.dense.res__warmup=5__seed=0" not in ids
    assert "sandwich.layernorm.gelu.dense.res__warmup=0__seed=1" in ids
    assert len(ids) == 5 and grid.id_keys == ("warmup",)
    gpu = load_grid(path, "gpu")  # warmup fixed by the scale's base, so it leaves the axes
    assert gpu.axes == {"norm": ["pre", "post"], "seed": [0, 1, 2]}
    assert {gpu.configs[c.id].model for c in gpu.cells} == {"small"} and len(gpu.cells) == 6 + 2
    smoke = load_grid(path, overrides={"steps": 3, "warmup": 0})  # --set collapses the warmup axis
    assert smoke.total_steps == 3 * len(smoke.cells) and smoke.id_keys == ()
    assert len(smoke.cells) == 4


def test_contradictory_crossings_are_dropped_and_reported(tmp_path):
    path = write_grid(tmp_path, """
        [axes]
        norm = ["pre", "deepnorm"]
        residual = [true, false]
    """)
    grid = load_grid(path)
    assert len(grid.cells) == 3
    assert len(grid.refused) == 1 and "deepnorm" in grid.refused[0] and "residual" in grid.refused[0]


def test_threads_is_recorded_but_never_changes_the_id(tmp_path):
    path = write_grid(tmp_path, "[axes]\nseed = [0, 1]\n")
    plain = load_grid(path)
    threaded = load_grid(path, overrides={"threads": 3})
    assert [c.id for c in plain.cells] == [c.id for c in threaded.cells]
    assert threaded.cells[0].options["threads"] == 3 and "threads" not in plain.cells[0].options
    # A worker's count travels beside the cell; the grid's own count wins over it.
    assert CellResources(2).threads_for(plain.cells[0]) == 2 and CellResources(2).threads_for(threaded.cells[0]) == 3


BAD_GRIDS = [
    ("[base]\nlearning_rate = 0.001\n", ["[base]", "'learning_rate'", "valid:", "lr", "warmup"]),
    ("[axes]\nnorm = ['pre', 'middle']\n", ["[axes]", "'middle'", "valid:", "post", "sandwich"]),
    ("[axes]\nlr = ['fast']\n", ["[axes]", "lr", "'fast'", "float"]),
    ("[axes]\nsteps = [1.5]\n", ["[axes]", "steps", "int"]),
    ("[axes]\nseed = 3\n", ["[axes]", "seed must be a list"]),
    ("[axes]\nseed = []\n", ["[axes]", "seed = []", "valid:"]),
    ("[axes]\nmodel = ['huge']\n", ["[axes]", "'huge'", "valid:", "tiny", "andrea-120m"]),
    ("[axes\nnorm = \n", ["not valid TOML"]),
    ("grid = 'x'\n", ["unknown key 'grid'", "valid:", "base", "axes", "include"]),
    ("[axes]\nnorm = ['pre']\n[[exclude]]\nnorm = 'pre'\n", ["no cells", "valid:"]),
    ("[[exclude]]\nact = 'tanh'\n", ["[[exclude]][0]", "'tanh'", "valid:", "relu"]),
    ("[[include]]\nnorm = 'pre'\nbogus = 1\n", ["[[include]][0]", "'bogus'", "valid:"]),
    ("[scales.gpu]\nbase = { stepz = 5 }\n", ["[scales.gpu].base", "'stepz'", "valid:"]),
    ("[scales.gpu]\nmodel = 'medium'\n", ["[scales.gpu]", "'model'", "valid:", "base", "axes"]),
]


@pytest.mark.parametrize("text,fragments", BAD_GRIDS, ids=[f"bad{i}" for i in range(len(BAD_GRIDS))])
def test_malformed_grid_files_exit_2_naming_file_key_and_choices(tmp_path, capsys, text, fragments):
    path = write_grid(tmp_path, text, "bad.toml")
    out = tmp_path / "out"
    assert main(["grid", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(path) in err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not out.exists()


@pytest.mark.parametrize("argv,fragment", [
    (["nope"], "unknown grid 'nope'; valid: a TOML file or a shipped grid (claim-gelu-vs-relu, "),
    (["missing.toml"], "does not exist"),
    (["mission", "--scale", "tpu"], "unknown scale 'tpu'; valid: cpu, gpu"),
    (["mission", "--set", "stepz=3"], "unknown key 'stepz'; valid:"),
    (["mission", "--set", "steps"], "not KEY=VALUE"),
    (["mission", "--set", "steps=-1"], "steps -1 must be at least 1"),
    (["mission", "--kernels", "fast"], "--kernels 'fast' is not a kernel backend; valid: reference"),
    (["mission", "--workers", "-1"], "--workers -1 must be 0 or more"),
    (["mission", "--backend", "ray", "--workers", "2"], "--workers is for --backend local"),
    ([], "missing GRID"),
])
def test_bad_command_lines_exit_2_and_write_nothing(tmp_path, capsys, argv, fragment):
    out = tmp_path / "out"
    assert main(["grid", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err
    assert not out.exists()


def test_list_shows_every_shipped_grid(capsys):
    assert main(["grid", "--list"]) == 0
    out = capsys.readouterr().out
    for name, cells, steps in [("mission", 36, "7,200"), ("prenorm-wins", 24, "7,200"), ("glu", 15, "4,500"),
                               ("residual", 18, "5,400")]:
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert f" {cells} " in line and steps in line and len(line.split()) > 5  # and a description


def test_dry_run_prints_cells_and_total_steps_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["grid", "mission", "--dry-run", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "36 cells (48 crossings, 12 duplicates collapsed), 7,200 steps in total" in text
    assert "post.layernorm.relu.dense.nores__seed=2" in text
    assert "act=relu,mlp=swiglu,residual=False,seed=1  ->  post.layernorm.swiglu.nores__seed=1" in text
    assert text.strip().endswith("total: 36 cells, 7,200 steps")
    assert not out.exists()
    assert main(["grid", "prenorm-wins", "--dry-run", "--scale", "gpu", "--set", "steps=10", "--out", str(out)]) == 0
    assert "120 cells" in capsys.readouterr().out and not out.exists()


# --------------------------------------------------------------------------- grid.json, refusals, backend hints


def test_grid_json_is_rederived_from_the_run_directories(tmp_path):
    path = write_grid(tmp_path, SMALL)
    grid, out = load_grid(path), tmp_path / "out"
    a, b, c = grid.cells[:3]
    (out / a.id).mkdir(parents=True)
    write_json_atomic(out / a.id / "summary.json", {"status": "diverged"})
    lock = CellLock(out / b.id)
    assert lock.acquire()
    try:
        state = grid_state.write_grid_json(out, grid.record())
    finally:
        lock.release()
    status = {cell["id"]: cell["status"] for cell in state["cells"]}
    assert (status[a.id], status[b.id], status[c.id]) == ("diverged", "running", "pending")
    assert state["counts"] == {"diverged": 1, "running": 1, "pending": 4}
    assert set(state) >= {"name", "source", "base", "axes", "cells", "updated"}
    assert sorted(p.name for p in out.iterdir()) == sorted([".grid.lock", "grid.json", a.id, b.id])


def test_a_rerun_with_different_options_is_refused_up_front(tmp_path, capsys):
    path = write_grid(tmp_path, SMALL)
    out = tmp_path / "out"
    grid = load_grid(path)
    cell = grid.cells[0]
    (out / cell.id).mkdir(parents=True)
    (out / cell.id / "config.json").write_text(json.dumps({"train": {**grid.configs[cell.id].as_dict(), "steps": 99}}))
    assert main(["grid", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a run with a different" in err and "steps=99" in err and "asks for steps=300" in err, err
    assert not (out / "grid.json").exists()


def test_missing_optional_backends_give_one_line_install_hints(monkeypatch):
    import builtins

    from ablate.backends import ray_backend, slurm_backend

    real_import = builtins.__import__

    def no_extras(name, *args, **kwargs):
        if name in ("ray", "submitit"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_extras)
    with pytest.raises(ConfigError, match=r"pip install -e \.\[ray\]"):
        ray_backend.import_ray()
    with pytest.raises(ConfigError, match=r"pip install -e \.\[slurm\]"):
        slurm_backend.import_submitit()


def run_cli(*args, cwd=None, env=None, timeout=60):
    """`python -m ablate ...` in a child process (a hang is a failure, not a stuck suite)."""
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, args)], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True)


def one_line(err: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


PLUGIN = """
import torch
from ablate.variants import ACTIVATIONS

@ACTIVATIONS.register("mish_r2")
def mish(x):
    return x * torch.tanh(torch.nn.functional.softplus(x))
"""


def sha256(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


MARKING_PLUGIN = PLUGIN + """
from pathlib import Path
Path(__file__).with_name("RAN").write_text("the plugin ran")
"""


def grid_with_import(tmp_path: Path) -> tuple[Path, Path]:
    plugin = tmp_path / "x.py"
    plugin.write_text(MARKING_PLUGIN)
    grid = tmp_path / "g.toml"
    grid.write_text('name = "imp"\nimports = ["x.py"]\n[base]\nlayers = 2\nsteps = 2\n[axes]\nact = ["mish_r2", "gelu"]\n')
    return grid, plugin


@pytest.mark.slow
def test_a_cell_id_too_long_for_a_file_name_is_refused_at_dry_run(tmp_path, capsys):
    path = tmp_path / "long.toml"
    path.write_text(textwrap.dedent("""
        [axes]
        lr = [0.00123456, 0.00234567]
        warmup = [1111111, 2222222]
        min_lr_ratio = [0.111111, 0.222222]
        weight_decay = [0.0111111, 0.0222222]
        beta1 = [0.811111, 0.822222]
        beta2 = [0.911111, 0.922222]
        grad_clip = [1.11111, 2.22222]
        diverge_factor = [3.11111, 4.22222]
        eval_every = [1111111, 2222222]
        batch_size = [11, 12]
        steps = [1111111, 2222222]
        z_loss = [0.0001111, 0.0002222]
        log_every = [1111111, 2222222]
    """))
    out = tmp_path / "out"
    assert main(["grid", str(path), "--dry-run", "--out", str(out)]) == 2
    err = one_line(capsys.readouterr().err)
    assert "longer than a file name may be (255)" in err and "fewer axes" in err and "weight_decay" in err
    assert not out.exists()


def test_empty_grid_files_are_refused_and_a_file_name_names_a_nameless_grid(tmp_path, capsys):
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing yet\n")
    assert main(["grid", str(empty), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    assert "defines no cells" in one_line(capsys.readouterr().err)
    spaced = tmp_path / "my grid.toml"
    spaced.write_text("[axes]\nseed = [0, 1]\n")
    assert load_grid(spaced).name == "my-grid"
    odd = tmp_path / "%%%.toml"
    odd.write_text("[axes]\nseed = [0, 1]\n")
    assert main(["grid", str(odd), "--dry-run"]) == 2
    assert "the file name '%%%.toml' gives no grid name" in one_line(capsys.readouterr().err)


@pytest.mark.slow
def test_a_grid_files_import_is_listed_with_its_hash_and_not_run_on_dry_run(tmp_path):
    grid, plugin = grid_with_import(tmp_path)
    dry = run_cli("grid", grid, "--dry-run", "--out", tmp_path / "out", cwd=tmp_path)
    assert not (tmp_path / "RAN").exists()
    assert f"imports {plugin} ({sha256(plugin)}; registers ACTIVATIONS 'mish_r2', not run)" in dry.stderr
    assert dry.returncode == 2 and "--trust-imports" in dry.stderr.splitlines()[-1]
    assert "Traceback" not in dry.stderr
    trusted = run_cli("grid", grid, "--dry-run", "--trust-imports", "--out", tmp_path / "out", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    assert (tmp_path / "RAN").exists() and "pre.layernorm.mish_r2.dense.res" in trusted.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_grid_files_import_runs_only_with_consent(tmp_path):
    grid, plugin = grid_with_import(tmp_path)
    refused = run_cli("grid", grid, "--out", tmp_path / "out", "--set", "steps=1", cwd=tmp_path)
    assert refused.returncode == 2 and not (tmp_path / "RAN").exists() and not (tmp_path / "out").exists()
    assert sha256(plugin) in refused.stderr and "Traceback" not in refused.stderr
    assert "--trust-imports" in refused.stderr.splitlines()[-1] and f"--import {plugin}" in refused.stderr
    # The same file named on the command line is the user's consent.
    named = run_cli("grid", grid, "--import", plugin, "--dry-run", "--out", tmp_path / "out", cwd=tmp_path)
    assert named.returncode == 0, named.stderr
    assert (tmp_path / "RAN").exists() and "pre.layernorm.mish_r2.dense.res" in named.stdout
