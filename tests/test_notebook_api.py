"""The notebook example of docs/results.md runs as written, on a synthetic prenorm-wins folder."""
import re

import pytest

import ablate.analysis
from tests.helpers.repo import REPO
from tests.helpers.synthetic_runs import write_grid, write_run

PAGE = REPO / "docs" / "results.md"


def notebook_example() -> str:
    text = PAGE.read_text()
    section = text[text.index("## In a notebook"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "docs/results.md: no python block under 'In a notebook'"
    return match.group(1)


def test_the_notebook_example_runs_and_rebuilds_the_report_numbers(tmp_path, monkeypatch, capsys):
    root = tmp_path / "runs" / "prenorm-wins"
    cells = []
    for norm, offset in (("pre", 0.0), ("post", 0.4)):
        for seed in (0, 1, 2):
            shift = offset * (1 + 0.1 * seed)  # post is worse by 0.4 to 0.48 on the last two steps
            losses = [4.0, 3.5, 3.2 + shift, 3.0 + shift]
            cells.append(write_run(root, f"{norm}.layernorm.gelu.dense.res", seed, losses,
                                   options={"lr": 0.003, "warmup": 0}))
    write_grid(root, cells, name="prenorm-wins")
    monkeypatch.chdir(tmp_path)

    namespace: dict = {}
    exec(compile(notebook_example(), "docs/results.md", "exec"), namespace)

    printed = capsys.readouterr().out
    assert "`post.layernorm.gelu.dense.res__lr=0.003__warmup=0` has a higher final loss" in printed
    table = namespace["table"].set_index("group")
    assert table.loc["post.layernorm.gelu.dense.res__lr=0.003__warmup=0", "n_values"] == 3
    cells = namespace["cells"]
    for group, row in table.iterrows():  # the table is the mean over each group's seeds of cell_metrics
        assert row["final_loss_mean"] == pytest.approx(cells[cells["group"] == group]["final_loss"].mean())
    assert sorted(namespace["summary"]["group"]) == sorted(table.index)  # summary.csv: a row per group
    assert namespace["curves"].shape == (4, 2)  # steps x groups
    # final loss = mean of all 4 logged steps: post - pre = 2 x 0.4 x (1 + 0.1 seed) / 4, over seeds 0-2
    assert namespace["c"].mean_diff == pytest.approx(0.2 * 1.1)


def test_every_name_the_package_exports_is_what_it_names_even_after_its_modules_are_imported():
    import types

    import ablate.analysis.analyse  # noqa: F401  (submodules become package attributes on import)
    import ablate.analysis.metrics  # noqa: F401
    import ablate.analysis.stats  # noqa: F401

    for name in ablate.analysis.__all__:
        assert not isinstance(getattr(ablate.analysis, name), types.ModuleType), name
    with pytest.raises(AttributeError):
        ablate.analysis.no_such_function  # noqa: B018
