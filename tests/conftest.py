"""Shared pytest setup."""
import os

import torch

from ablate.core.cores import cpu_count

MAX_TEST_PROCESSES = 8  # beyond this the suite is bound by its longest tests, not by cores


# Under pytest-xdist each test process gets its share of the cores for torch's threads, and so
# do its children (OMP_NUM_THREADS): two processes each running 2 OpenMP threads on 2 cores
# spin-wait on each other's descheduled threads (the optimizer tests took 105 s so, 3.5 s alone).
# Tests that are about thread counts set them explicitly.
_processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _processes > 1:
    _share = str(max(1, cpu_count() // _processes))
    os.environ["OMP_NUM_THREADS"] = _share
    torch.set_num_threads(int(_share))

# Triton kernels run on a CPU only in Triton's interpreter, which Triton chooses when its
# decorators run: set it before any test imports a Triton kernel. On a GPU they run natively.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Child processes (the CLI run as a user would) estimate from the fixed yardstick too: no
# seconds of calibration in each, whenever the suite's own load makes the cached one stale.
os.environ.setdefault("ABLATE_SPEED", "reference")

import pytest  # noqa: E402


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml): one test process per core this process may use (its CPU
    affinity, as a container or `taskset` sets it; xdist's own count is the machine's physical
    cores whenever psutil is installed), and one more: a fair share of the suite waits rather
    than computes (the SLURM tests' paced cells sleep through a one-minute time limit and a
    requeue, children start, clusters answer), and the extra process computes meanwhile."""
    cores = cpu_count()
    return max(1, min(cores + 1, MAX_TEST_PROCESSES))


@pytest.fixture(autouse=True)
def reference_speed(monkeypatch):
    """Time estimates in tests use ablate.bench.estimate.reference, a fixed yardstick: a
    calibration would take seconds (minutes on a loaded machine) and make sizes depend on the
    day's load, and its cached figures would land in the user's cache.
    tests/ablate/bench/test_estimate.py measures."""
    import ablate.bench.estimate as estimate

    monkeypatch.setattr(estimate, "machine_speed", lambda threads=1, quiet=False: estimate.reference(threads))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A token cache of the test's own, so no test reads or fills the user's."""
    monkeypatch.setenv("ABLATE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def text_file(tmp_path):
    """A small text corpus, long enough for a tiny model's context windows."""
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 60)
    return path


# The costliest modules first, longest first (each over 40 s of tests in CI on 2 cores; the
# SLURM module, mostly waiting, leads): with whole modules per test process, a long one picked up
# last would leave the others idle at the end. pyproject.toml keeps xdist from reordering them by
# their count of tests. Paths as in the test ids, from the repository root.
COSTLY_FIRST = ("tests/ablate/backends/test_slurm_backend.py", "tests/ablate/commands/test_reproduce.py",
                "tests/test_hardening_files.py", "tests/ablate/commands/test_grid.py",
                "tests/ablate/kernels/test_parity.py", "tests/ablate/kernels/test_cpu_cache.py",
                "tests/ablate/commands/test_ladder.py", "tests/ablate/backends/test_slurm_job.py",
                "tests/ablate/kernels/test_triton_aot.py", "tests/ablate/claims/test_sequential.py",
                "tests/ablate/backends/test_ray_backend.py", "tests/ablate/engine/test_plugins.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {path: i for i, path in enumerate(COSTLY_FIRST)}
    # A stable sort: the rest stay as collected.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(COSTLY_FIRST)))
