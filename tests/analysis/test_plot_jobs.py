"""analysis/plot_jobs.py: plot kinds drawn side by side in forked children write what they
would have written in this process, and a job that fails there fails here as itself."""
import os

import pytest

from ablate.analysis.analyse import analyse
from ablate.analysis.plot_jobs import run_plot_jobs, start_order
from ablate.analysis.plots import Plot
from ablate.analysis.report import make_plots
from tests.helpers.synthetic_runs import write_run

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    for variant in (PRE, POST):
        for lr in (1e-3, 1e-2):  # 8 cells: every plot kind, small
            for seed in (0, 1):
                write_run(root, variant, seed, [5.0 - 0.3 * i - 20 * lr for i in range(6)], options={"lr": lr},
                          n_layer=2, probe_every=2)
    return analyse(root)


def test_plots_drawn_in_children_are_the_files_drawn_here(analysis, tmp_path):
    here = make_plots(analysis, tmp_path / "here", dpi=20, processes=1)
    forked = make_plots(analysis, tmp_path / "forked", dpi=20, processes=2)
    assert [p.name for p in forked] == [p.name for p in here] and len(here) >= 5
    assert all(p.figure is None for p in forked) and all(p.figure is not None for p in here)
    assert [p.caption for p in forked] == [p.caption for p in here]
    for a, b in zip(here, forked):
        assert [p.name for p in a.paths] == [p.name for p in b.paths]
        png_here, png_forked = (p for p in (a.paths[0], b.paths[0]))
        assert png_here.read_bytes() == png_forked.read_bytes(), a.name  # the same pixels, byte for byte
        assert b.paths[1].stat().st_size > 1000


def test_a_job_that_fails_in_a_child_raises_its_own_error_here():
    pid = os.getpid()

    def fails():
        raise ValueError(f"bad params (raised in {'a child' if os.getpid() != pid else 'the parent'})")

    def none():
        return None

    with pytest.raises(ValueError, match="raised in the parent"):
        run_plot_jobs([none, fails, none], processes=2)
    assert run_plot_jobs([none, lambda: Plot("p", None, [], "c")], processes=2)[1] == Plot("p", None, [], "c")


def test_the_costliest_jobs_start_first_and_results_keep_the_jobs_order():
    assert start_order(4, [5, 37, 11, 37]) == [1, 3, 2, 0]  # ties as given
    assert start_order(3, None) == [0, 1, 2]
    with pytest.raises(ValueError, match="2 costs for 3 plot jobs"):
        start_order(3, [1, 2])
    jobs = [lambda i=i: Plot(f"p{i}", None, [], "") for i in range(5)]
    done = run_plot_jobs(jobs, processes=2, costs=[1, 9, 3, 7, 5])
    assert [p.name for p in done] == ["p0", "p1", "p2", "p3", "p4"]
