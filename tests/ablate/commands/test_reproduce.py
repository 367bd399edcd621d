"""`ablate reproduce` designs beyond the grid's own: `--seeds N` (a fixed design of N seeds),
`--decide [--budget]` (looks of more seeds until each clause is decided, ablate/claims/looks.py),
and the grid's execution flags (--backend, --workers, the cluster options)."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ablate.claims.claim_measures import stable_edge
from ablate.claims.design import seed_sequence
from ablate.claims.options import parse_budget
from ablate.claims.options import UNDECIDED
from ablate.cli import main
from ablate.core.errors import ConfigError
from tests.helpers.cluster_helpers import engine_missing, one_ray_at_a_time, wait_until
from tests.helpers.decide_double import DECIDED_AT, decide_double, report_double
from tests.helpers.repo import REPO
from tests.helpers.synthetic_reproduce import edge


# A miniature claim: three activations, the clause reads two of them (silu is read by no clause,
# so a look never adds its seeds); one-block tiny models of 8 steps: a cell takes about a second,
# so a look of 6 cells lasts seconds after its first cell starts (the kill below lands in it).
MINI_GRID = """
name = "mini-decide"
[base]
model = "tiny"
layers = 1
steps = 8
eval_every = 4
eval_batches = 1
final_eval_batches = 1
warmup = 0
batch_size = 2
probes = false
threads = 1
[axes]
act = ["gelu", "relu", "silu"]
seed = [0, 1, 2]
"""
MINI_CLAIM = """
name = "mini-decide"
statement = "GELU trains to a lower loss than ReLU."
source = "a test"
grid = "{grid}"
[[clause]]
label = "gelu below relu"
sentence = "GELU trains to a lower loss than ReLU."
[[clause.compare]]
measure = "final_val_loss"
a = {{ act = "gelu" }}
b = {{ act = "relu" }}
expect = "lower"
effect = 0.01
"""


def mini_claim(tmp_path) -> Path:
    grid = tmp_path / "mini.toml"
    grid.write_text(textwrap.dedent(MINI_GRID))
    claim = tmp_path / "claim.toml"
    claim.write_text(textwrap.dedent(MINI_CLAIM.format(grid=grid)))
    return claim


def cell_ids(folder: Path) -> set:
    return {p.name for p in folder.iterdir() if (p / "config.json").is_file()}


def seeds_of(ids, act: str) -> list:
    return sorted(int(i.rsplit("=", 1)[1]) for i in ids if f".{act}." in i)


# ---------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("text, seconds", [("30m", 1800), ("90s", 90), ("1h", 3600), ("1.5h", 5400), (" 2m ", 120)])
def test_a_budget_reads_as_a_duration(text, seconds):
    assert parse_budget(text) == seconds


@pytest.mark.parametrize("argv, message", [
    (["--decide", "--budget", "30"], "--budget '30' is not a duration; valid: a positive number with a unit s, m or h"),
    (["--decide", "--budget", "0m"], "--budget '0m' is not a duration"),
    (["--decide", "--budget=-5m"], "--budget '-5m' is not a duration"),
    (["--decide", "--budget", "ten"], "--budget 'ten' is not a duration"),
    (["--budget", "30m"], "--budget 30m is for --decide"),
    (["--seeds", "1"], "--seeds '1' is not a number of seeds; valid: a whole number in 2..10000"),
    # E1: a ceiling, checked before any list of seeds is built (a billion took 5 GB and never answered)
    (["--seeds", "1000000000", "--dry-run"], "--seeds '1000000000' is not a number of seeds; valid: a whole number "
                                             "in 2..10000"),
    (["--seeds", "9" * 401, "--dry-run"], "(401 characters) is not a number of seeds; valid: a whole number in"),
    # E7: a 400-digit budget is no infinite budget
    (["--decide", "--budget", "9" * 400 + "h"], "(401 characters) is not a duration; valid: a positive number with a "
                                                "unit s, m or h, up to 672h"),
    (["--decide", "--budget", "673h"], "--budget '673h' is not a duration"),
    (["--seeds", "six"], "--seeds 'six' is not a number of seeds"),
    (["--seeds=-3"], "--seeds '-3' is not a number of seeds"),
    (["--seeds", "6", "--set", "seed=1"], "--set seed=1 and --seeds 6 contradict each other"),
    (["--decide", "--set", "seed=1"], "--set seed=1 and --decide contradict each other"),
    (["--backend", "ray", "--workers", "2"], "--workers is for --backend local"),
])
def test_bad_design_and_execution_values_are_one_line_and_exit_2(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(["reproduce", "prenorm-wins", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_seeds_extend_the_grid_s_own_after_the_largest():
    assert seed_sequence([0, 1, 2], 6) == [0, 1, 2, 3, 4, 5]
    assert seed_sequence([0, 1, 2, 3, 4], 3) == [0, 1, 2]
    assert seed_sequence([3, 7], 4) == [3, 7, 8, 9]


def test_a_dry_run_of_six_seeds_lists_six_seeds_of_every_cell_and_writes_nothing(tmp_path, capsys):
    from ablate.grid.spec import load_grid

    out = tmp_path / "pw"
    assert main(["reproduce", "prenorm-wins", "--seeds", "6", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    own = load_grid("claim-prenorm-wins")
    listed = {line.split()[-1] for line in printed.splitlines() if line.startswith("  pending")}
    assert len(listed) == 2 * len(own.cells) == 84
    assert {c.id for c in own.cells} < listed  # seeds 0-2 are the quick run's own cells
    assert {int(i.rsplit("=", 1)[1]) for i in listed} == set(range(6))
    assert f"report and verdict -> {out / 'seeds-6'}" in printed
    assert not out.exists()


def test_a_dry_run_of_decide_lists_the_first_look_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "pw"
    assert main(["reproduce", "prenorm-wins", "--decide", "--budget", "30m", "--dry-run", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert sum(line.startswith("  pending") for line in printed.splitlines()) == 42  # the grid's own design
    assert "then looks add seeds only to the clauses still undecided" in printed and "30.0 min" in printed
    assert f"-> {out / 'decide'}" in printed and not out.exists()


def test_execution_flags_reach_the_grid_runner(tmp_path, monkeypatch, capsys):
    import ablate.grid.runner as grid_runner

    seen = []
    monkeypatch.setattr(grid_runner, "run_grid", lambda grid, out, options=None, **_: seen.append(options) or 2)
    argv = ["reproduce", "prenorm-wins", "--seeds", "4", "--out", str(tmp_path / "x"), "--quiet"]
    assert main([*argv, "--backend", "slurm", "--slurm-cluster", "debug", "--partition", "p", "--time", "7",
                 "--cpus-per-cell", "2", "--array-parallelism", "3", "--retries", "0", "--no-wait"]) == 2
    assert main([*argv, "--backend", "ray", "--address", "auto", "--gpus-per-cell", "0.5"]) == 2
    assert main([*argv, "--workers", "3"]) == 2
    slurm, ray, local = seen
    assert (slurm.backend, slurm.slurm_cluster, slurm.partition, slurm.time, slurm.cpus_per_cell,
            slurm.array_parallelism, slurm.retries, slurm.no_wait, slurm.workers) == \
        ("slurm", "debug", "p", 7, 2.0, 3, 0, True, None)
    assert (ray.backend, ray.address, ray.gpus_per_cell, ray.workers) == ("ray", "auto", 0.5, None)
    assert (local.backend, local.workers, local.quiet) == ("local", 3, True)


def test_ladder_takes_a_cluster_backend_without_local_workers(capsys):
    # `ladder` set its local --workers default whatever the backend, and ray/slurm refuse --workers
    assert main(["ladder", "gelu-vs-relu", "--backend", "ray", "--dry-run"]) == 0
    assert "total: about" in capsys.readouterr().out


# ---------------------------------------------------------------------- a fixed design


@pytest.mark.slow
def test_a_larger_design_reuses_the_quick_cells_and_writes_its_own_verdict(tmp_path, capsys):
    claim, cells = mini_claim(tmp_path), tmp_path / "cells"
    common = ["--out", str(cells), "--workers", "0", "--quiet"]
    assert main(["reproduce", str(claim), *common]) == 0
    quick = json.loads((cells / "verdict.json").read_text())
    trained = {i: (cells / i / "summary.json").stat().st_mtime_ns for i in cell_ids(cells)}
    assert main(["reproduce", str(claim), "--seeds", "4", *common]) == 0
    assert len(cell_ids(cells)) == 12 and seeds_of(cell_ids(cells), "silu") == [0, 1, 2, 3]
    assert all((cells / i / "summary.json").stat().st_mtime_ns == t for i, t in trained.items())  # not retrained
    four = json.loads((cells / "seeds-4" / "verdict.json").read_text())
    assert four["clauses"][0]["comparisons"][0]["seeds"] == [0, 1, 2, 3]
    assert (cells / "seeds-4" / "report.md").is_file()
    # the quick design still reads its own three seeds, with the fourth on disk beside them
    assert main(["reproduce", str(claim), *common]) == 0
    again = json.loads((cells / "verdict.json").read_text())
    assert again["clauses"][0]["comparisons"][0]["seeds"] == [0, 1, 2] and again == quick


# ----------------------------------------------------------------- --decide, with a double


def _options(**kw):
    from ablate.grid.runner import GridRunOptions

    return GridRunOptions(**{"workers": 0 if kw.get("backend", "local") == "local" else None, "quiet": True, **kw})


def _request(options=None, **kw):
    from ablate.claims.plan import Request

    return Request("cpu", {}, options or _options(), decide=True, **kw)


def _decide(tmp_path, **kw):
    from ablate.claims.looks import run_decide
    from ablate.claims.run import find_claim

    cells = tmp_path / "cells"
    status, decision = run_decide(find_claim(str(mini_claim(tmp_path))), cells, _request(**kw),
                                  decide_fn=decide_double, report_fn=report_double)
    return status, decision, cells


@pytest.mark.slow
def test_decide_adds_seeds_only_to_the_cells_an_undecided_clause_reads_and_stops(tmp_path, capsys):
    # decide_double (tests/helpers/decide_double.py) is a stand-in for analysis.sequential.decide_claim:
    # undecided at the grid's 3 seeds, decided once 6 are in; what is tested is the runner.
    status, decision, cells = _decide(tmp_path)
    assert status == 0 and decision.done
    ids = cell_ids(cells)
    assert seeds_of(ids, "gelu") == seeds_of(ids, "relu") == list(range(DECIDED_AT))
    assert seeds_of(ids, "silu") == [0, 1, 2]  # read by no clause: no look adds to it
    verdict = json.loads((cells / "decide" / "verdict.json").read_text())
    assert verdict["stopped"] == "every clause decided"
    assert [look["seeds"] for look in verdict["clauses"][0]["looks"]] == [3, 6]
    record = json.loads((cells / "decide" / "decide.json").read_text())
    assert len(record["looks"]) == 2 and len(record["looks"][1]) == 2 * DECIDED_AT
    printed = capsys.readouterr().out
    assert "look 1 (9 cells to train), 9 cells in all" in printed  # no best rate: the grid's seeds are look 1
    assert "look 2 (6 cells to train), 12 cells in all" in printed
    assert "mini-decide: agrees (double); stopped: every clause decided" in printed
    assert "(a) gelu below relu: **agrees** (3 seeds: " in printed
    assert not (cells / "verdict.json").exists()  # the quick design's verdict is not the decision's


@pytest.mark.slow
def test_a_look_that_does_not_fit_the_budget_is_not_started(tmp_path, monkeypatch, capsys):
    import ablate.claims.looks as looks

    estimates = []

    def look_seconds(grid, req):  # the one place a look's time is estimated: 1 s a cell of seeds 0-2, else 10 s
        estimates.append(sorted(c.id for c in grid.cells))
        return float(sum(1 if c.id.endswith(("=0", "=1", "=2")) else 10 for c in grid.cells))

    monkeypatch.setattr(looks, "look_seconds", look_seconds)
    with pytest.raises(ConfigError, match=r"^--budget: look 1 \(9 cells to train\), about 9s, does not fit in the "
                                           r"7s left of 7s; nothing was run"):
        _decide(tmp_path, budget=7.4)  # look 1: 9 cells, 9 s: does not fit
    assert not (tmp_path / "cells").exists() and len(estimates) == 1 and len(estimates[0]) == 9
    status, decision, cells = _decide(tmp_path, budget=30.0)  # look 1 fits (9 s); look 2's 6 cells (60 s) do not
    assert status == UNDECIDED and not decision.done and estimates[-1] == sorted(
        i for i in {f"pre.layernorm.{a}.dense.res__seed={s}" for a in ("gelu", "relu") for s in (3, 4, 5)})
    verdict = json.loads((cells / "decide" / "verdict.json").read_text())
    assert verdict["stopped"].startswith("budget: look 2 (6 cells to train), about 1m00s, does not fit in the ")
    assert seeds_of(cell_ids(cells), "gelu") == [0, 1, 2]


def test_a_record_of_another_design_is_set_aside_not_trusted(tmp_path):
    from ablate.claims.looks import LookLog

    key = {"claim": "c", "scale": "cpu", "overrides": {}}
    path = tmp_path / "decide.json"
    LookLog(key, [["a", "b"]], 12.0).write(path)
    log, note = LookLog.load(path, key)
    assert (log.looks, log.seconds, note) == ([["a", "b"]], 12.0, "")
    log, note = LookLog.load(path, {**key, "scale": "gpu"})
    assert (log.looks, log.seconds) == ([], 0.0) and "set aside" in note
    path.write_text('{"version": 1, "key": ')
    assert LookLog.load(path, key)[0].looks == [] and "damaged" in LookLog.load(path, key)[1]


# ------------------------------------------- the real decision, end to end; kill -9 and rerun


def _decide_process(claim: Path, cells: Path, *flags, script: str = "reproduce_process.py") -> subprocess.Popen:
    # `ablate reproduce --decide` (analysis.sequential deciding); --workers 0 unless flags say
    # otherwise: a kill lands on the process that trains, decides and writes alike. `script`: the
    # tests/helpers/ program that runs it (synthetic_reproduce.py: synthetic cells).
    flags = flags or ("--workers", "0")
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "helpers" / script), "reproduce", str(claim), "--decide",
                             "--out", str(cells), "--quiet", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


@pytest.mark.slow
def test_decide_adds_looks_stops_and_killed_9_mid_look_reruns_to_the_same_verdict(tmp_path):
    from ablate.claims.spending import LOOKS

    claim = mini_claim(tmp_path)
    whole = _decide_process(claim, tmp_path / "whole")
    text = whole.communicate(timeout=900)[0]
    assert whole.returncode == 0, text
    verdict = json.loads((tmp_path / "whole" / "decide" / "verdict.json").read_text())
    (clause,) = verdict["clauses"]
    looks = [look["seeds"] for look in clause["looks"]]
    assert len(looks) >= 2 and looks == list(LOOKS[:len(looks)])  # looks were added, in the design's steps
    assert verdict["stopped"] in ("every clause decided", "no look left") and verdict["done"]
    assert seeds_of(cell_ids(tmp_path / "whole"), "gelu") == list(range(looks[-1]))
    assert seeds_of(cell_ids(tmp_path / "whole"), "silu") == [0, 1, 2]  # read by no clause
    assert "look 2 (" in text and f"stopped: {verdict['stopped']}" in text

    cells = tmp_path / "cells"
    proc = _decide_process(claim, cells)
    second = cells / "pre.layernorm.gelu.dense.res__seed=3" / "config.json"  # the second look has begun
    wait_until(lambda: second.exists() or proc.poll() is not None, 600, "the second look to begin", poll=0.05)
    assert proc.poll() is None, proc.communicate()[0]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (cells / "decide" / "verdict.json").exists()
    assert len(json.loads((cells / "decide" / "decide.json").read_text())["looks"]) == 2  # look 2 was started
    rerun = _decide_process(claim, cells)
    text = rerun.communicate(timeout=900)[0]
    assert rerun.returncode == 0, text
    whole_verdict = tmp_path / "whole" / "decide" / "verdict.json"
    assert (cells / "decide" / "verdict.json").read_bytes() == whole_verdict.read_bytes()
    assert cell_ids(cells) == cell_ids(tmp_path / "whole")


# A miniature stability claim (issue 52): pre- vs post-norm's largest stable rate over a ladder of
# three rates, its cells trained by tests/helpers/synthetic_reproduce.py (each seed's edge of
# stability known to it, a fifth of a second a cell) under a plan of two looks, 3 and 6 seeds:
# 36 cells in all (the default plan's third look, 12 seeds, would double the test's time).
LADDER = (1e-3, 3e-3, 1e-2)
STABLE_GRID = f"""
name = "mini-stable"
[base]
model = "tiny"
layers = 1
steps = 8
eval_every = 4
warmup = 0
batch_size = 2
probes = false
threads = 1
device = "cpu"
[axes]
norm = ["pre", "post"]
lr = {list(LADDER)}
seed = [0, 1, 2]
"""
STABLE_CLAIM = """
name = "mini-stable"
statement = "Pre-norm trains at higher learning rates than post-norm."
source = "a test"
grid = "{grid}"
[[clause]]
label = "pre-norm's largest stable rate above post-norm's"
sentence = "Pre-norm trains at higher learning rates than post-norm."
[[clause.compare]]
measure = "largest_stable_lr"
a = {{ norm = "pre" }}
b = {{ norm = "post" }}
expect = "higher"
effect = 0.3
"""
STABLE_FLAGS = ("--looks", "3,6", "--workers", "0")


def stable_claim(tmp_path) -> Path:
    grid, claim = tmp_path / "stable.toml", tmp_path / "stable-claim.toml"
    grid.write_text(STABLE_GRID)
    claim.write_text(STABLE_CLAIM.format(grid=grid))
    return claim


def _largest_stable_lr(norm: str, seed: int) -> float:
    # what the measure must read from the synthetic cells: the ladder's rung under the seed's edge
    return stable_edge(LADDER, [math.log10(lr) < edge(norm, seed) for lr in LADDER])[0]


@pytest.mark.slow
def test_decide_on_the_largest_stable_rate_killed_9_mid_look_reruns_to_the_same_verdict(tmp_path):
    claim = stable_claim(tmp_path)
    # The uninterrupted run goes on beside the one killed and rerun (their cells' sleeps overlap);
    # its output, a few KB, waits in its pipe.
    whole = _decide_process(claim, tmp_path / "whole", *STABLE_FLAGS, script="synthetic_reproduce.py")
    try:
        _kill_mid_look_and_rerun(claim, tmp_path / "cells")
        text = whole.communicate(timeout=300)[0]
    finally:
        if whole.poll() is None:  # a failed check above: no process of this test outlives it
            os.killpg(whole.pid, signal.SIGKILL)
            whole.wait()
    assert whole.returncode == 0, text
    whole_verdict = tmp_path / "whole" / "decide" / "verdict.json"
    (clause,) = json.loads(whole_verdict.read_text())["clauses"]
    assert [look["seeds"] for look in clause["looks"]] == [3, 6]  # the second look was run and read
    (comparison,) = clause["comparisons"]
    values = dict(zip(comparison["seeds"], comparison["per_seed"]))
    expected = {s: _largest_stable_lr("pre", s) - _largest_stable_lr("post", s) for s in range(6)}
    assert values == pytest.approx(expected) and len(set(expected.values())) > 1  # read per seed, and it varies
    assert clause["status"] == "agrees"  # six seeds of six the claimed way
    cells = tmp_path / "cells"
    assert (cells / "decide" / "verdict.json").read_bytes() == whole_verdict.read_bytes()
    assert cell_ids(cells) == cell_ids(tmp_path / "whole")


def _kill_mid_look_and_rerun(claim: Path, cells: Path) -> None:
    proc = _decide_process(claim, cells, *STABLE_FLAGS, script="synthetic_reproduce.py")
    second = cells / "pre.layernorm.gelu.dense.res__lr=0.001__seed=3" / "config.json"  # the second look has begun
    wait_until(lambda: second.exists() or proc.poll() is not None, 120, "the second look to begin", poll=0.02)
    assert proc.poll() is None, proc.communicate()[0]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (cells / "decide" / "verdict.json").exists()
    assert len(json.loads((cells / "decide" / "decide.json").read_text())["looks"]) == 2  # look 2 was started
    rerun = _decide_process(claim, cells, *STABLE_FLAGS, script="synthetic_reproduce.py")
    text = rerun.communicate(timeout=300)[0]
    assert rerun.returncode == 0, text


# ------------------------------------------------------------------- on cluster backends


@pytest.mark.slow
def test_decide_runs_its_looks_on_the_slurm_backend(tmp_path):
    # submitit's in-process executor: the SLURM backend's submission and collection, no cluster
    status, decision, cells = _decide(tmp_path, options=_options(backend="slurm", slurm_cluster="debug"))
    assert status == 0 and decision.done
    ids = cell_ids(cells)
    assert seeds_of(ids, "gelu") == list(range(DECIDED_AT)) and seeds_of(ids, "silu") == [0, 1, 2]
    assert json.loads((cells / "decide" / "verdict.json").read_text())["stopped"] == "every clause decided"


def _ray_cluster_answers() -> bool:
    pytest.importorskip("ray")
    probe = "import ray; ray.init(address='auto', log_to_driver=False)"
    try:
        with one_ray_at_a_time():
            return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@pytest.mark.slow
def test_decide_runs_its_looks_on_a_running_ray_cluster(tmp_path):
    if not _ray_cluster_answers():
        engine_missing("no running Ray cluster (ray.init(address='auto') fails); start one with "
                       "`ray start --head --num-cpus 2`")
    claim = mini_claim(tmp_path)
    # A plan of two looks (3 and 6 seeds): the second look, on seeds the first left, is what shows
    # the looks going on across Ray jobs; a third (12 seeds, the clause undecided at 6) ran the same
    # way again, some 8 s of Ray workers starting and training more.
    with one_ray_at_a_time():
        proc = _decide_process(claim, tmp_path / "cells", "--backend", "ray", "--address", "auto", "--looks", "3,6")
        text = proc.communicate(timeout=900)[0]
    assert proc.returncode == 0, text
    assert text.count("to run on Ray (auto)") == 2, text  # each look's cells went to the cluster
    ids = cell_ids(tmp_path / "cells")
    assert seeds_of(ids, "relu") == seeds_of(ids, "gelu") == list(range(6)) and seeds_of(ids, "silu") == [0, 1, 2]
    (clause,) = json.loads((tmp_path / "cells" / "decide" / "verdict.json").read_text())["clauses"]
    assert [look["seeds"] for look in clause["looks"]] == [3, 6]  # both looks read


def test_a_rerun_that_finds_earlier_looks_on_disk_names_the_look_the_decision_asks_for():
    from types import SimpleNamespace

    from ablate.claims.spending import LOOKS
    from ablate.claims.looks import look_index

    asks = lambda *seeds: SimpleNamespace(clauses=[SimpleNamespace(next_seeds=s) for s in seeds])  # noqa: E731
    assert look_index(asks(tuple(range(LOOKS[2])), None), 1) == 2  # the third look, not the loop's second
    assert look_index(asks(tuple(range(3, 3 + LOOKS[1]))), 5) == 1  # fresh seeds of a best-rate clause
    assert look_index(asks(None, None), 4) == 4  # nothing asked: the loop's count


def test_a_best_rate_claims_first_run_is_named_the_rate_sweep_not_look_1(tmp_path, monkeypatch, capsys):
    # Its grid's own seeds choose the rates and are never tested: the looks start on fresh seeds.
    import ablate.grid.runner as grid_runner
    from ablate.claims.looks import FIRST_RUN, run_decide
    from ablate.claims.run import find_claim

    grid = tmp_path / "mini.toml"
    grid.write_text(textwrap.dedent(MINI_GRID).replace('act = ["gelu", "relu", "silu"]',
                                                       'act = ["gelu", "relu"]\nlr = [1e-3, 3e-3, 1e-2]'))
    claim = tmp_path / "claim.toml"
    claim.write_text(textwrap.dedent(MINI_CLAIM.format(grid=grid)).replace('effect = 0.01', 'effect = 0.01\nbest_lr = true'))
    monkeypatch.setattr(grid_runner, "run_grid", lambda grid, out, options=None: 0)  # trains nothing
    status, decision = run_decide(find_claim(str(claim)), tmp_path / "cells", _request(),
                                  decide_fn=decide_double, report_fn=report_double)
    printed = capsys.readouterr().out
    assert f"mini-decide: {FIRST_RUN} (18 cells to train), 18 cells in all" in printed and "look 1" not in printed
    assert decision is None and status == UNDECIDED  # its cells never finished: said so, nothing decided


# ------------------------------------------------- one writer per claim folder; nothing written early


def _holding_process(claim: Path, cells: Path, *flags) -> tuple[subprocess.Popen, int]:
    """`ablate reproduce CLAIM --decide` whose first cell never ends (tests/helpers/holding_reproduce.py):
    it holds the folder's lock, and says so on the pipe returned (its read end)."""
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "helpers" / "holding_reproduce.py"), str(write),
                             "reproduce", str(claim), "--decide", "--out", str(cells), "--quiet", "--workers", "0",
                             *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, pass_fds=(write,))
    os.close(write)
    return proc, read


def _until_holding(proc: subprocess.Popen, read: int) -> None:
    """Block until the process says it holds the lock (or it dies: the pipe's end, no sleep)."""
    import select

    ready = select.select([read], [], [], 300)[0]
    said = os.read(read, 200) if ready else b""
    os.close(read)
    if not said.startswith(b"holding "):
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the holding run never held the lock: {proc.communicate()[0]}")


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _files(folder: Path) -> dict:
    """Every entry under `folder` (itself included) with what a write would change."""
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
            for p in [folder, *folder.rglob("*")]}


@pytest.mark.slow
def test_a_second_run_on_a_held_claim_folder_is_refused_naming_the_holder_and_a_kill_frees_it(tmp_path, capsys):
    claim, cells = mini_claim(tmp_path), tmp_path / "cells"
    first, read = _holding_process(claim, cells)
    try:
        _until_holding(first, read)
        before = _files(cells)
        for design in (["--decide"], ["--seeds", "4"], []):
            assert main(["reproduce", str(claim), *design, "--workers", "0", "--out", str(cells), "--quiet"]) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
            assert f"{cells} is being written by another `ablate reproduce` (pid {first.pid} on " in err
            assert _files(cells) == before  # nothing the second run would have written
        # the readers read on
        assert main(["reproduce", str(claim), "--decide", "--dry-run", "--out", str(cells)]) == 0
        assert main(["status", str(cells)]) == 0
        assert "9 cells" in capsys.readouterr().out
        assert _files(cells) == before
    finally:
        _kill(first)
    rerun, read = _holding_process(claim, cells)  # kill -9 left no stale lock
    try:
        _until_holding(rerun, read)
    finally:
        _kill(rerun)


def test_a_backend_that_cannot_run_here_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    # E10: without sbatch, --decide used to write decide.json (look 1 started) before the refusal
    import ablate.backends.slurm_backend as slurm

    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)
    cells = tmp_path / "cells"
    for design in (["--decide"], ["--seeds", "4"], []):
        assert main(["reproduce", str(mini_claim(tmp_path)), *design, "--backend", "slurm", "--out", str(cells)]) == 2
        err = capsys.readouterr().err
        assert "--backend slurm: no SLURM here (sbatch not found)" in err and len(err.strip().splitlines()) == 1
        assert not cells.exists()


def test_a_look_recorded_as_started_but_never_taken_asks_the_budget_again(tmp_path, monkeypatch, capsys):
    # E10's second half: a record a refused run left behind (look 1 started, no cell taken) must not
    # let a later `--budget 1s` skip the budget check and train the look.
    from types import SimpleNamespace

    import ablate.claims.run as reproduce
    from ablate.claims.design import design_grid
    from ablate.claims.looks import DECIDE_JSON, LookLog, design_key

    claim, cells = mini_claim(tmp_path), tmp_path / "cells"
    loaded = reproduce.find_claim(str(claim))
    ids = [c.id for c in design_grid(loaded, "cpu", {}).cells]
    key = design_key(loaded, SimpleNamespace(scale="cpu", overrides={}))
    LookLog(key, [sorted(ids)], 0.0).write(cells / "decide" / DECIDE_JSON)
    monkeypatch.setattr("ablate.claims.looks.look_seconds", lambda grid, req: 10.0 * len(grid.cells))
    trained = []
    monkeypatch.setattr("ablate.grid.runner.run_grid", lambda *a, **k: trained.append(a) or 0)
    assert main(["reproduce", str(claim), "--decide", "--budget", "1s", "--workers", "0", "--out", str(cells)]) == 2
    err = capsys.readouterr().err
    assert "--budget: look 1 (9 cells to train), about 1m30s, does not fit in the " in err and not trained


def test_reproduce_takes_trust_imports_as_grid_does(tmp_path, capsys):
    # a claim whose grid imports a plugin was refused with "valid: --trust-imports", which reproduce refused
    (tmp_path / "plug.py").write_text("import torch\nfrom ablate.variants import ACTIVATIONS\n\n"
                                      "@ACTIVATIONS.register('relu_reproduce_test')\ndef relu(x):\n"
                                      "    return torch.relu(x)\n")
    claim = mini_claim(tmp_path)
    grid = tmp_path / "mini.toml"
    grid.write_text(grid.read_text().replace('name = "mini-decide"', 'name = "mini-decide"\nimports = ["plug.py"]')
                    .replace('"silu"]', '"relu_reproduce_test"]'))
    argv = ["reproduce", str(claim), "--dry-run", "--out", str(tmp_path / "cells")]
    assert main(argv) == 2
    assert "valid: --trust-imports" in capsys.readouterr().err
    assert main([*argv, "--trust-imports"]) == 0
    assert "relu_reproduce_test" in capsys.readouterr().out
    assert not (tmp_path / "cells").exists()


def test_a_fixed_design_whose_cells_did_not_finish_exits_3_with_no_verdict(tmp_path, monkeypatch, capsys):
    # cells submitted and not waited for (--no-wait), or busy in another process: not a verdict
    monkeypatch.setattr("ablate.grid.runner.run_grid", lambda *a, **k: 0)  # returns with no cell trained
    cells = tmp_path / "cells"
    assert main(["reproduce", str(mini_claim(tmp_path)), "--seeds", "4", "--workers", "0", "--out", str(cells)]) == (
        UNDECIDED)
    assert "mini-decide: 12 of 12 cells not finished (e.g. " in capsys.readouterr().out
    assert not (cells / "seeds-4" / "verdict.json").exists()


def test_quick_workers_count_the_cores_this_process_may_use(monkeypatch):
    import ablate.claims.plan as plan

    monkeypatch.setattr(plan, "cpu_count", lambda: 1)  # a taskset or SLURM share of one core
    assert plan.quick_workers() == 1


def test_grid_cells_has_a_column_per_declared_variant_axis(monkeypatch):
    import ablate.claims.selectors as selectors
    from ablate.core.variant_axes import AXES
    from ablate.grid.spec import load_grid

    grid = load_grid("claim-prenorm-wins")
    assert list(selectors.grid_cells(grid).columns[2:2 + len(AXES)]) == list(AXES)
    monkeypatch.setattr(selectors, "AXES", ("norm",))  # the columns follow the declaration, not a list of their own
    assert "qk_norm" not in selectors.grid_cells(grid).columns
