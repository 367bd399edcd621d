"""The built CPU kernel libraries in $ABLATE_CACHE/kernels (ablate/kernels/cpu_cache.py): a
library is loaded only when it is the file its build recorded; anything else at its name (cut
short, empty, random bytes, a link, a FIFO, a folder, a planted library) is built again with
one line saying why, and the run repeats the bits of a run on a clean cache. Where nothing can
be built (a read-only folder, no compiler) a run trains on the torch forms, says so in one
line and records them. Each run is a child process, as a user's would be: a damaged library
can kill the process that loads it."""
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ablate.kernels import cpu_attention, cpu_cache, cpu_gelu
from ablate.kernels.cpu_build import builds_here
from tests.helpers.synthetic_runs import write_grid, write_run

needs_a_build = pytest.mark.skipif(not builds_here() or cpu_gelu.library()[0] is None,
                                   reason=f"no C kernel builds here: {cpu_gelu.library()[1]}")

RUN = [sys.executable, "-m", "ablate", "train", "--model", "tiny", "--layers", "2", "--steps", "5", "--batch-size",
       "2", "--seq-len", "16", "--eval-batches", "1", "--final-eval-batches", "1", "--threads", "1", "--device",
       "cpu", "--quiet"]
# Loads both kernels as a run would and prints the forms a new run would take.
LOAD = [sys.executable, "-c", "from ablate.kernels import cpu_attention, cpu_gelu; "
        "print(cpu_gelu.best(), cpu_attention.best())"]
BEST = f"{cpu_gelu.best()} {cpu_attention.best()}"
TIMEOUT = 300  # a FIFO at the library's name used to hang the loader forever


def child(args, cache: Path, timeout=TIMEOUT, **env):
    environment = {**os.environ, "ABLATE_CACHE": str(cache), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(args, capture_output=True, text=True, env=environment, timeout=timeout)


def rows(out: Path) -> list[dict]:
    (metrics,) = out.glob("*/metrics.jsonl")
    return [{k: v for k, v in json.loads(line).items() if k not in ("time_s", "tokens_per_s")}
            for line in metrics.read_text().splitlines()]


def forms(out: Path) -> tuple[str, str]:
    (config,) = out.glob("*/config.json")
    config = json.loads(config.read_text())
    return config["gelu_cpu"], config["attention_cpu"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A cache the kernels and the tokens were built in, and the rows of a run made on it."""
    root = tmp_path_factory.mktemp("clean")
    done = child([*RUN, "--out", str(root / "run")], root / "cache")
    assert done.returncode == 0, done.stderr
    return root / "cache", rows(root / "run")


@pytest.fixture
def cache(clean, tmp_path):
    """A copy of the clean cache for one test to damage."""
    return Path(shutil.copytree(clean[0], tmp_path / "cache", symlinks=True))


def gelu_library(cache: Path) -> Path:
    (library,) = (cache / "kernels").glob("gelu_tanh-*.so")
    return library


def one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr


def assert_verifies(library: Path) -> None:
    opened, why = cpu_cache.open_verified(library)
    assert opened is not None, why
    opened.close()


def _truncated(library):
    library.write_bytes(library.read_bytes()[:16000])  # as a crash or a full disk mid-write could leave it


def _empty(library):
    library.write_bytes(b"")


def _random_bytes(library):
    library.write_bytes(random.Random(0).randbytes(library.stat().st_size))


def _link_to_another_library(library):
    library.unlink()
    (other,) = library.parent.glob("attention-*.so")
    library.symlink_to(other)


def _link_to_dev_zero(library):
    library.unlink()
    library.symlink_to("/dev/zero")


def _folder(library):
    library.unlink()
    library.mkdir()
    (library / "inside").write_text("x")


DAMAGE = {"truncated": (_truncated, "truncated?"), "empty": (_empty, "truncated?"),
          "random-bytes": (_random_bytes, "other bytes"), "link-to-another-library": (_link_to_another_library, "link"),
          "link-to-dev-zero": (_link_to_dev_zero, "/dev/zero"), "folder": (_folder, "a folder")}


@needs_a_build
@pytest.mark.parametrize("damage", ["truncated", "empty", "random-bytes", "link-to-another-library"])
def test_a_damaged_library_is_rebuilt_and_the_run_repeats_its_bits(damage, clean, cache, tmp_path):
    library = gelu_library(cache)
    spoil, why = DAMAGE[damage]
    spoil(library)
    done = child([*RUN, "--out", str(tmp_path / "run")], cache)
    assert done.returncode == 0, done.stderr
    line = one_line(done.stderr)
    assert f"cached kernel library {library}" in line and why in line and "rebuilding" in line
    assert rows(tmp_path / "run") == clean[1]
    assert forms(tmp_path / "run") == tuple(BEST.split())
    assert not library.is_symlink() and library.is_file()
    assert_verifies(library)


@needs_a_build
@pytest.mark.parametrize("damage", ["link-to-dev-zero", "folder"])
def test_anything_else_at_the_librarys_name_is_replaced(damage, cache):
    library = gelu_library(cache)
    spoil, why = DAMAGE[damage]
    spoil(library)
    done = child(LOAD, cache)
    assert done.returncode == 0, done.stderr
    assert why in one_line(done.stderr) and done.stdout.split() == BEST.split()
    assert_verifies(library)


@needs_a_build
def test_a_fifo_at_the_librarys_name_does_not_hang_the_loader(cache):
    library = gelu_library(cache)
    library.unlink()
    os.mkfifo(library)
    done = child(LOAD, cache)
    assert done.returncode == 0, done.stderr
    assert "is a FIFO" in one_line(done.stderr) and done.stdout.split() == BEST.split()
    assert_verifies(library)


@needs_a_build
def test_a_build_record_nested_thousands_deep_has_its_library_rebuilt(cache):
    """E4: a record nested 2000 deep ended every run that loaded the kernel in RecursionError,
    and the library was never rebuilt."""
    library = gelu_library(cache)
    cpu_cache.record_path(library).write_text("[" * 2000 + "]" * 2000)
    done = child(LOAD, cache)
    assert done.returncode == 0, done.stderr
    assert "damaged build record" in one_line(done.stderr) and done.stdout.split() == BEST.split()
    assert_verifies(library)


PLANTED = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen(getenv("PLANTED_MARK"), "w");
    if (f) { fputs("ran\n", f); fclose(f); }
}
"""


@needs_a_build
@pytest.mark.parametrize("record", ["none", "another librarys"])
def test_a_planted_library_is_not_loaded(record, cache, tmp_path):
    """A library at the cached name that the build did not write never runs its constructor."""
    library = gelu_library(cache)
    source = tmp_path / "planted.c"
    source.write_text(PLANTED)
    subprocess.run([os.environ.get("CC") or shutil.which("cc") or "gcc", "-shared", "-fPIC", str(source), "-o",
                    str(library)], check=True, capture_output=True)
    if record == "none":
        cpu_cache.record_path(library).unlink()
    mark = tmp_path / "constructor-ran"
    done = child(LOAD, cache, PLANTED_MARK=str(mark))
    assert done.returncode == 0, done.stderr
    assert not mark.exists()
    assert str(library) in one_line(done.stderr) and done.stdout.split() == BEST.split()
    assert_verifies(library)


@needs_a_build
def test_two_processes_building_at_once_both_load_it_and_leave_no_build_folders(cache):
    """And a build killed mid-compile (its tmp* folder of objects left behind) is cleaned up."""
    kernels = cache / "kernels"
    for built in [*kernels.glob("*.so"), *kernels.glob("*.so.build.json")]:
        built.unlink()
    (kernels / "tmpkilled").mkdir()
    (kernels / "tmpkilled" / "poly_avx2.o").write_bytes(b"half")
    environment = {**os.environ, "ABLATE_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    children = [subprocess.Popen(LOAD, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
                for _ in range(2)]
    outputs = [c.communicate(timeout=TIMEOUT) for c in children]
    for c, (out, err) in zip(children, outputs):
        assert c.returncode == 0 and err == "", err
        assert out.split() == BEST.split()
    assert not list(kernels.glob("tmp*")) and not list(kernels.glob(".*.tmp"))
    for library in kernels.glob("*.so"):
        assert_verifies(library)


READ_ONLY_MOUNT = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


def read_only(folder: Path, command: list[str]) -> list[str]:
    """`command` with `folder` read-only: chmod for a user; root writes in any folder, so for
    root the folder is mounted read-only in a namespace of the child's own (unshare)."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return command
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", READ_ONLY_MOUNT, str(folder), "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"root here, and no read-only mount in a namespace: {probe.stderr.decode().strip()}")
    return ["unshare", "-rm", "sh", "-c", READ_ONLY_MOUNT, str(folder), *command]


@needs_a_build
def test_a_damaged_library_in_a_read_only_folder_trains_on_the_torch_forms_and_says_so(cache, tmp_path):
    _truncated(gelu_library(cache))
    kernels = cache / "kernels"
    try:
        done = child(read_only(kernels, [*RUN, "--out", str(tmp_path / "run")]), cache)
    finally:
        kernels.chmod(0o755)
    assert done.returncode == 0, done.stderr
    line = one_line(done.stderr)
    assert "truncated?" in line and "cannot be rebuilt" in line and "GELU as 'passes'" in line
    assert forms(tmp_path / "run") == (cpu_gelu.PASSES, cpu_attention.best())  # the attention library verified
    assert gelu_library(cache).stat().st_size == 16000  # nothing written


@needs_a_build
@pytest.mark.parametrize("compiler", ["CC=/bin/false", "no cc on PATH"])
def test_without_a_compiler_a_run_trains_on_the_torch_forms_and_says_so(compiler, cache, tmp_path):
    env = {"CC": "/bin/false"} if compiler.startswith("CC") else {"PATH": str(tmp_path / "empty")}
    done = child([*RUN, "--out", str(tmp_path / "run")], cache, **env)
    assert done.returncode == 0, done.stderr
    line = one_line(done.stderr)
    assert "GELU as 'passes' and attention as 'sdpa'" in line and "config.json" in line
    assert forms(tmp_path / "run") == (cpu_gelu.PASSES, cpu_attention.SDPA)


@needs_a_build
def test_kernels_check_verifies_the_cached_library_first(cache):
    library = gelu_library(cache)
    _truncated(library)
    done = child([sys.executable, "-m", "ablate", "kernels", "check", "--quick", "--backends", "cuda"], cache)
    assert "truncated?" in done.stderr and "rebuilding" in done.stderr
    assert f"GELU {cpu_gelu.best()}" in done.stdout
    assert_verifies(library)
    assert stat.S_ISREG(library.lstat().st_mode)


WRONG_CC = """#!{python}
# A C compiler that builds GELU with one wrong constant (0.044715 -> 0.045 in its cubic term),
# and says it is another compiler (so it builds anew, beside the clean library).
import os, pathlib, sys
args = sys.argv[1:]
if args == ["--version"]:
    os.write(1, b"wrong-constant cc\\n")
built = []
for arg in args:
    if arg.endswith("gelu_tanh_poly.c"):
        source = pathlib.Path(arg)
        wrong = pathlib.Path(os.environ["WRONG_DIR"]) / source.name
        wrong.write_text(source.read_text().replace("0.044715f", "0.045f"))
        arg = ["-I", str(source.parent), str(wrong)]
    built += arg if isinstance(arg, list) else [arg]
os.execv({cc!r}, [{cc!r}, *built])
"""


@pytest.fixture
def wrong_cc(tmp_path) -> dict:
    """The environment of a child whose C compiler builds a GELU with one wrong constant."""
    compiler = tmp_path / "wrong-cc"
    compiler.write_text(WRONG_CC.format(python=sys.executable, cc=os.environ.get("CC") or shutil.which("cc") or "gcc"))
    compiler.chmod(0o755)
    return {"CC": str(compiler), "WRONG_DIR": str(tmp_path)}


@needs_a_build
@pytest.mark.slow  # two children and a build of the wrong library
def test_kernels_cpu_refuses_a_library_built_wrong_and_auto_trains_reference(cache, tmp_path, wrong_cc):
    """E9: `--kernels cpu` runs the parity check `auto` runs before the first step: a GELU one
    constant off is refused in one line, exit 2, nothing written; `auto` trains `reference`."""
    refused = child([*RUN, "--kernels", "cpu", "--out", str(tmp_path / "cpu")], cache, **wrong_cc)
    assert refused.returncode == 2, refused.stderr
    line = one_line(refused.stderr)
    assert "kernels 'cpu' failed its parity check" in line and "act:gelu" in line and "--kernels reference" in line
    assert not (tmp_path / "cpu").exists()
    done = child([*RUN, "--out", str(tmp_path / "auto")], cache, **wrong_cc)
    assert done.returncode == 0, done.stderr
    assert "not used by auto" in one_line(done.stderr)
    (config,) = (tmp_path / "auto").glob("*/config.json")
    assert json.loads(config.read_text())["kernels"] == "reference"


@needs_a_build
def test_kernels_cpu_trains_on_a_library_built_right(cache, tmp_path):
    done = child([*RUN, "--kernels", "cpu", "--out", str(tmp_path / "run")], cache)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert forms(tmp_path / "run") == tuple(BEST.split())


@pytest.mark.skipif(not builds_here(), reason="the C kernels build on Linux x86-64 only")
@pytest.mark.parametrize("shared", ["kernels folder", "cache folder"])
def test_a_cache_others_can_write_is_not_loaded_from_and_a_run_says_so_in_one_line(shared, tmp_path, monkeypatch,
                                                                                     capsys):
    """A build record is a checksum, not an authentication: a folder another user can write
    could hold a planted library with a matching record, so nothing there is loaded or built."""
    from ablate.kernels.cpu_build import CpuKernel, say_fallbacks

    cache = tmp_path / "cache"
    (cache / "kernels").mkdir(parents=True)
    monkeypatch.setenv("ABLATE_CACHE", str(cache))
    kernel = CpuKernel("gelu_tanh", cpu_gelu.KERNEL.forms, cpu_gelu.KERNEL.fallback, cpu_gelu.KERNEL.symbols,
                       cpu_gelu.KERNEL.headers)
    monkeypatch.setattr(kernel, "_load", lambda cc: pytest.fail("loaded from a folder others can write"))
    monkeypatch.setenv("CC", "/bin/true")
    folder = cache / "kernels" if shared == "kernels folder" else cache
    assert cpu_cache.not_private(cache / "kernels") is None
    folder.chmod(0o777)
    lib, why = kernel.library()
    assert lib is None and f"{folder} is writable by other users (mode 777)" in why and "chmod go-w" in why
    if builds_here():
        say_fallbacks({"gelu_cpu": (kernel, "GELU")}, {"gelu_cpu": kernel.fallback})
        assert "must be private" in one_line(capsys.readouterr().err)


# ------------------------------------------------------- cells on mixed forms say so


def _cells_on_two_forms(root):
    runs = [write_run(root, variant, seed, losses=[4.0, 3.5, 3.0 + 0.1 * seed + (variant[:4] == "post") * 0.2],
                      val_loss=3.0 + 0.1 * seed, gelu_cpu="passes" if seed == 2 else "poly-bias",
                      attention_cpu="blocked")
            for variant in ("pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res") for seed in range(3)]
    write_grid(root, runs)


def test_a_report_and_a_verdict_name_the_mixed_forms_of_their_cells(tmp_path, capsys):
    from ablate.claims.claim_file import parse_claim
    from ablate.claims.verdict import evaluate
    from ablate.cli import main

    _cells_on_two_forms(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "CPU kernel forms: GELU passes (2 cells), poly-bias (4 cells); attention blocked" in text
    assert "different forms (GELU: passes in 2, poly-bias in 4 cells)" in text
    claim = parse_claim({"name": "t", "statement": "s", "source": "test", "grid": "g",
                         "clause": [{"sentence": "s", "label": "c", "compare": [
                             {"measure": "final_val_loss", "a": {"norm": "post"}, "b": {"norm": "pre"},
                              "expect": "higher", "effect": 0.01}]}]})
    verdict = evaluate(claim, tmp_path)
    assert len(verdict.notes) == 1 and "GELU: passes in 2" in verdict.notes[0]


def test_cells_on_one_form_carry_no_note(tmp_path):
    from ablate.analysis.cpu_forms import mix_note
    from ablate.analysis.load import load_runs

    _cells_on_two_forms(tmp_path)
    for config in tmp_path.glob("*/config.json"):
        data = json.loads(config.read_text())
        data["gelu_cpu"] = "poly-bias"
        config.write_text(json.dumps(data))
    assert mix_note(load_runs(tmp_path).cells) is None
