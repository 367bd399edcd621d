"""What keeps separate experiments from mixing: a grid refuses a folder holding another grid
or a file, a local grid refuses a device or kernel backend this machine lacks (exit 2, nothing
written), and the analysis never pairs cells trained under different settings."""
from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ablate.analysis.baseline import resolve_baseline
from ablate.analysis.load import load_runs
from tests.helpers.synthetic_runs import variant_axes, write_grid, write_run

GRID = """name = "{name}"
[base]
steps = 2
batch_size = 2
[axes]
act = ["gelu", "relu"]
"""


def ablate(*argv, env=None):
    """(exit status, stdout, stderr) of the command: in this process (start-up is most of these
    commands' time) unless it needs an environment of its own."""
    if env is not None:
        p = subprocess.run([sys.executable, "-m", "ablate", *map(str, argv)], capture_output=True, text=True, env=env)
        return p.returncode, p.stdout, p.stderr
    from ablate.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def grid_file(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(GRID.format(name=name))
    return path


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_a_grid_refuses_a_folder_holding_another_grid(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc, _, err = ablate("grid", grid_file(tmp_path, "first"), "--out", out, "--quiet")
    assert rc == 0, err
    before = snapshot(out)
    for extra in ([], ["--dry-run"]):
        rc, stdout, err = ablate("grid", grid_file(tmp_path, "second"), "--out", out, "--quiet", *extra)
        assert rc == 2 and stdout == ""
        assert err.strip().count("\n") == 0 and "holds grid 'first'" in err and "'second'" in err, err
    assert snapshot(out) == before  # grid.json and every cell untouched
    rc, _, err = ablate("grid", grid_file(tmp_path, "first"), "--out", out, "--quiet")
    assert rc == 0 and "already finished" not in err  # the same grid may rerun into its folder


@pytest.mark.parametrize("command", [["grid", "GRID"], ["reproduce", "prenorm-wins"]])
def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path, command):
    target = tmp_path / "results"
    target.write_text("keep me")
    argv = [grid_file(tmp_path, "g") if a == "GRID" else a for a in command]
    rc, stdout, err = ablate(*argv, "--out", target)
    assert rc == 2 and stdout == "" and err.count("\n") == 1, (stdout, err)
    assert f"--out {target} is a file" in err
    assert target.read_text() == "keep me"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
@pytest.mark.parametrize("setting", [["--set", "device=cuda"], ["--kernels", "cuda"]])
def test_a_local_grid_refuses_a_device_this_machine_lacks_before_writing(tmp_path, setting):
    out = tmp_path / "out"
    rc, stdout, err = ablate("grid", grid_file(tmp_path, "g"), "--out", out, *setting)
    assert rc == 2 and err.count("\n") == 1 and "cuda" in err, (stdout, err)
    assert not out.exists()


@pytest.mark.parametrize("flag, value", [("--rows", -5), ("--rows", 0), ("--repeats", 0)])
def test_kernels_bench_refuses_non_positive_sizes(flag, value):
    rc, stdout, err = ablate("kernels", "bench", flag, value)
    assert rc == 2 and stdout == "" and err.strip() == f"ablate kernels: error: {flag} {value} must be at least 1"


def test_kernels_bench_without_compile_shows_a_dash_not_nan():
    rc, stdout, err = ablate("kernels", "bench", "--rows", 8, "--repeats", 1, "--no-compile", "--ops", "act:relu")
    assert rc == 0, err
    header = next(line for line in stdout.splitlines() if line.startswith("op "))
    row = next(line for line in stdout.splitlines() if line.startswith("act:relu"))
    columns = dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip())))
    assert "nan" not in row and columns["vs comp"] == "-"


def test_cells_trained_under_other_settings_are_never_paired_with_the_baseline(tmp_path):
    """A stray run in a grid folder (another batch size, not a grid axis) becomes its own setting."""
    gelu = "pre.layernorm.gelu.dense.res"
    relu = "pre.layernorm.relu.dense.res"
    runs = [write_run(tmp_path, gelu, seed=0, losses=[3.0, 2.0]),
            write_run(tmp_path, relu, seed=0, losses=[3.0, 2.5]),
            write_run(tmp_path, relu, seed=0, losses=[3.0, 1.0], options={"batch_size": 2},
                      axes={**variant_axes(relu), "seed": 0})]  # batch_size missing from its axes
    write_grid(tmp_path, runs)
    loaded = load_runs(tmp_path)
    assert "batch_size" in loaded.option_axes
    baseline = resolve_baseline(loaded.cells, loaded.option_axes)
    by_group = {r.group: baseline.of[r.group] for r in runs}
    assert by_group[runs[1].group] == runs[0].group  # same settings: compared
    assert by_group[runs[2].group] is None  # other batch size: no baseline at its settings


def test_grid_kernels_flag_names_itself_in_its_error(tmp_path):
    rc, _, err = ablate("grid", grid_file(tmp_path, "g"), "--kernels", "fast", "--dry-run")
    assert rc == 2 and err.strip() == ("ablate grid: error: --kernels 'fast' is not a kernel backend; "
                                       "valid: reference, cpu, triton, cuda, auto")
