"""Plugins (ablate.engine.plugins): a file's registered values train in a grid, a plugin edited under a
run is refused, and a plugin that is not Python or raises is one line."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run_cli(*args, cwd=None, env=None, timeout=60):
    """`python -m ablate ...` in a child process (a hang is a failure, not a stuck suite)."""
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, args)], cwd=cwd, env=env, timeout=timeout,
                          capture_output=True, text=True)


def run_ablate(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "ablate", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


PLUGIN = """
import torch
from ablate.variants import ACTIVATIONS

@ACTIVATIONS.register("mish_r2")
def mish(x):
    return x * torch.tanh(torch.nn.functional.softplus(x))
"""


TINY = ("--layers", 2, "--steps", 2, "--eval-batches", 1, "--final-eval-batches", 1, "--quiet")


def sha256(path: Path) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


BLOCKS_PLUGIN = """
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


@pytest.mark.slow
def test_a_plugin_edited_between_kill_and_rerun_is_refused_naming_both_hashes(tmp_path):
    plugin = tmp_path / "m.py"
    plugin.write_text(PLUGIN)
    args = ("train", "--import", plugin, "--act", "mish_r2", *TINY, "--out", tmp_path / "o")
    first = run_cli(*args, timeout=300)
    assert first.returncode == 0, first.stderr
    (run_dir,) = (tmp_path / "o").iterdir()
    (run_dir / "summary.json").unlink()  # as if killed before it finished: the rerun resumes it
    before = sha256(plugin)
    plugin.write_text(PLUGIN.replace("softplus(x)", "softplus(x) * 0.5"))
    config = (run_dir / "config.json").read_text()
    rerun = run_cli(*args, timeout=300)
    assert rerun.returncode == 2, rerun.stderr
    assert rerun.stderr.count("\n") == 1 and "Traceback" not in rerun.stderr
    assert str(plugin) in rerun.stderr and before in rerun.stderr and sha256(plugin) in rerun.stderr
    assert (run_dir / "config.json").read_text() == config  # its record is not overwritten
    assert not (run_dir / "summary.json").exists()


def test_a_plugin_file_that_is_not_python_is_one_line(tmp_path):
    plugin = tmp_path / "m.txt"
    plugin.write_text(PLUGIN)
    result = run_cli("variants", "--import", plugin)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "m.txt" in result.stderr and ".py" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_plugin_file_registers_values_that_train_in_a_two_worker_grid(tmp_path):
    plugin = tmp_path / "lab" / "my_blocks.py"
    plugin.parent.mkdir()
    plugin.write_text(BLOCKS_PLUGIN)
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
    result = run_ablate("grid", grid, "--trust-imports", "--out", tmp_path / "out", "--workers", 2, "--quiet",
                     cwd=tmp_path / "lab")
    assert result.returncode == 0, result.stderr
    import hashlib

    digest = "sha256:" + hashlib.sha256(plugin.read_bytes()).hexdigest()
    config = json.loads((tmp_path / "out" / "pre.layernorm.mish_test.dense.res__seed=0" / "config.json").read_text())
    assert config["model"]["init"] == "gpt2_half_test"
    assert [p["sha256"] for p in config["plugins"]] == [digest]
    assert config["plugins"][0]["file"] == str(plugin.resolve())
    listed = run_ablate("variants", "--model", "tiny", "--import", plugin)
    assert listed.returncode == 0 and "mish_test" in listed.stdout


def test_a_plugin_that_raises_on_import_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad_plugin.py"
    bad.write_text("raise RuntimeError('boom at import')\n")
    result = run_ablate("train", "--import", bad, "--steps", 1, "--out", tmp_path / "o")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "bad_plugin.py" in result.stderr and "boom at import" in result.stderr
    assert not (tmp_path / "o").exists()
    missing = run_ablate("train", "--import", "no_such_module_xyz", "--steps", 1, "--out", tmp_path / "o")
    assert missing.returncode == 2 and "no_such_module_xyz" in missing.stderr and missing.stderr.count("\n") == 1
