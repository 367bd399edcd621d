"""Packs in a grid (ablate/engine/pack.py): which cells share one, `--stack` on the command line, a
grid trained in packs, and kill -9 of a packed grid resumed to the same results."""
import json
import os
import signal
import subprocess
import sys

import pytest

from ablate.core.errors import ConfigError
from ablate.engine.cell import Cell
from ablate.engine.pack import STACK_AUTO, STACK_DEFAULT, group_packs, pack_key, parse_stack
from ablate.engine.pack_run import dispatch
from ablate.grid.runner import GridRunOptions
from tests.helpers.cluster_helpers import wait_until

BASE = {"model": "tiny", "layers": 2, "width": 32, "batch_size": 2, "seq_len": 16, "steps": 4, "threads": 1,
        "kernels": "reference"}


def cell(**options):
    return Cell.from_options({**BASE, **options})


def test_stack_takes_a_count_or_auto_and_names_a_bad_value():
    assert parse_stack("auto") == STACK_AUTO == STACK_DEFAULT and parse_stack("4") == 4 and parse_stack(1) == 1
    for bad in ("0", "-2", "x", "2.5", "1e3"):
        with pytest.raises(ConfigError, match=f"--stack {bad!r} is not a member count; valid: auto"):
            parse_stack(bad)
    with pytest.raises(ConfigError, match="--stack 4 is for --backend local"):
        GridRunOptions(backend="ray", stack=4)
    assert GridRunOptions(backend="ray", stack="auto").stack == "auto"


def test_cells_that_differ_only_in_seed_lr_or_warmup_share_a_pack():
    a = [cell(seed=s) for s in range(5)] + [cell(seed=9, lr=3e-3, warmup=2)]
    b = [cell(seed=s, width=64) for s in range(2)]
    assert len({pack_key(c) for c in a}) == 1 and pack_key(a[0]) != pack_key(b[0])
    packs = group_packs([a[0], b[0], *a[1:], b[1]], 4)
    assert [[c.id for c in p] for p in packs] == [[c.id for c in a[:4]], [b[0].id, b[1].id], [a[4].id, a[5].id]]
    assert group_packs(a, 1) == [[c] for c in a]
    assert group_packs(a, STACK_AUTO) == [[c] for c in a]  # on a CPU, auto packs nothing


def test_stack_1_hands_the_backend_every_cell_as_before():
    todo = [cell(seed=s) for s in range(3)]
    assert dispatch(todo, {}, 1, None) == (todo, None, 0)
    dispatched, fn, n = dispatch(todo, {}, 3, None)
    assert [c.id for c in dispatched] == [todo[0].id] and n == 1
    assert [c.id for c, _ in fn.packs[todo[0].id]] == [c.id for c in todo]


def test_a_bad_stack_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    from ablate.cli import main

    for command in (["grid", "tiny-grid-that-is-not-read"], ["reproduce", "prenorm-wins"], ["ladder", "prenorm-wins"]):
        assert main([*command, "--stack", "zero", "--out", str(tmp_path / "out")]) == 2, command
        err = capsys.readouterr().err
        assert err == (f"ablate {command[0]}: error: --stack 'zero' is not a member count; valid: auto, or a whole "
                       "number 1 or more (1 trains every cell alone)\n")
    assert not (tmp_path / "out").exists()


GRID = """
name = "packs"
[base]
model = "tiny"
layers = 2
width = 32
batch_size = 2
seq_len = 16
eval_batches = 2
final_eval_batches = 2
eval_every = {steps}
checkpoint_every = 5
threads = 1
steps = {steps}
kernels = "reference"
[axes]
seed = [0, 1, 2]
"""


def grid(tmp_path, steps):
    path = tmp_path / "packs.toml"
    path.write_text(GRID.format(steps=steps))
    return path


def ablate(*argv, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "ablate", *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def untimed_rows(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time_s", "tokens_per_s")} for r in rows]


@pytest.mark.slow
def test_a_packed_grid_killed_mid_pack_resumes_to_the_same_results(tmp_path):
    path = grid(tmp_path, 150)
    whole = ablate("grid", path, "--out", tmp_path / "whole", "--stack", 3, "--quiet")
    out, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, err
    assert "seeds stacked in 1 pack" in out and "3 completed" in out
    killed = ablate("grid", path, "--out", tmp_path / "killed", "--stack", 3, "--quiet", start_new_session=True)
    ids = sorted(p.name for p in (tmp_path / "whole").iterdir() if p.is_dir())
    wait_until(lambda: all((tmp_path / "killed" / i / "checkpoint.pt").exists() for i in ids), 120,
               "every member's checkpoint")
    os.killpg(killed.pid, signal.SIGKILL)  # the grid and its worker, mid-pack
    killed.wait(timeout=30)
    assert not any((tmp_path / "killed" / i / "summary.json").exists() for i in ids)
    again = ablate("grid", path, "--out", tmp_path / "killed", "--stack", 3, "--quiet")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    for i in ids:
        assert untimed_rows(tmp_path / "killed" / i) == untimed_rows(tmp_path / "whole" / i)
        a, b = (json.loads((tmp_path / d / i / "summary.json").read_text()) for d in ("whole", "killed"))
        assert {k: v for k, v in a.items() if k != "wall_time_s"} == {k: v for k, v in b.items() if k != "wall_time_s"}


def test_a_huge_stack_value_is_shown_elided():
    """5,000 digits (past int()'s limit) were echoed whole in the refusal."""
    with pytest.raises(ConfigError) as e:
        parse_stack("9" * 5000)
    assert len(str(e.value)) < 300 and "5000 characters" in str(e.value)
