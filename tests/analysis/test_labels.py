"""analysis.labels: a group is named by the axes that vary, `post, lr 1e-2, warmup 50`."""
import numpy as np
import pandas as pd
import pytest

from ablate.analysis.labels import format_value, label_of, short_labels

PRE, POST = "pre.layernorm.gelu.dense.res", "post.layernorm.gelu.dense.res"


def grid(**axes):
    """Every combination of the axes as a cells frame with engine-style long group ids."""
    frame = pd.MultiIndex.from_product(list(axes.values()), names=list(axes)).to_frame(index=False)
    frame["group"] = ["__".join(f"{k}={v}" for k, v in row.items() if k != "seed") for row in
                      frame.to_dict("records")]
    return frame


def test_only_the_varying_axes_appear_formatted_like_the_issue():
    cells = grid(norm=["pre", "post"], lr=[1e-3, 1e-2, 3e-2], warmup=[0, 50], init=["gpt2"], seed=[0, 1])
    labels = short_labels(cells, ["norm", "lr", "warmup", "init", "seed"])
    assert len(labels) == 12 and len(set(labels.values())) == 12  # one label per group, all different
    assert labels["norm=post__lr=0.01__warmup=50__init=gpt2"] == "post, lr 1e-2, warmup 50"
    assert labels["norm=pre__lr=0.001__warmup=0__init=gpt2"] == "pre, lr 1e-3, warmup 0"
    assert not any("gpt2" in label or "seed" in label for label in labels.values())  # constant / averaged


def test_labels_follow_the_rows_given_not_the_whole_grid():
    cells = grid(norm=["pre", "post"], lr=[1e-3, 1e-2])
    one_lr = cells[cells["lr"] == 1e-2]
    assert set(short_labels(one_lr, ["norm", "lr"]).values()) == {"pre", "post"}
    assert set(short_labels(one_lr[one_lr["norm"] == "pre"], ["norm", "lr"]).values()) == {"all cells"}


def test_values_that_do_not_name_themselves_carry_their_axis():
    cells = grid(residual=[True, False], qk_norm=["none", "layernorm"], norm_type=["layernorm", "rmsnorm"])
    labels = set(short_labels(cells, ["residual", "qk_norm", "norm_type"]).values())
    # true/false and none say nothing alone; layernorm is a value of two axes here
    assert "residual true, qk_norm none, norm_type layernorm" in labels
    assert "residual false, qk_norm layernorm, rmsnorm" in labels  # rmsnorm is norm_type's alone


def test_an_axis_spells_all_its_numbers_alike():
    cells = grid(lr=[1e-1, 1e-2, 3e-2])
    assert sorted(short_labels(cells, ["lr"]).values()) == ["lr 1e-1", "lr 1e-2", "lr 3e-2"]
    assert format_value(0.5) == "0.5" and format_value(2.5e-3) == "2.5e-3" and format_value(50.0) == "50"
    assert format_value(np.bool_(False)) == "false" and format_value(None) == "none"
    assert label_of({"norm": "post", "planned_steps": 200}) == "post, steps 200"


def test_labels_by_another_column():
    cells = grid(norm=["pre", "post"], lr=[1e-3, 1e-2])
    cells["variant_id"] = cells["norm"].map({"pre": PRE, "post": POST})
    assert short_labels(cells, ["norm"], by="variant_id") == {PRE: "pre", POST: "post"}
    with pytest.raises(KeyError):
        short_labels(cells, ["norm"], by="no_such_column")


def test_constant_axes_are_named_when_asked():
    cells = grid(norm=["pre", "post"], lr=[1e-2])
    assert set(short_labels(cells, ["lr"], constant=True).values()) == {"lr 1e-2"}
    assert set(short_labels(cells, ["lr"]).values()) == {"all cells"}
