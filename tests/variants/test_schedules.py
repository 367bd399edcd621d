"""The learning-rate schedules of variants/schedules.py."""
import pytest

from ablate.engine.config import resolve
from ablate.engine.lr import lr_at


def test_wsd_gives_the_specified_lr_at_chosen_steps():
    cfg = resolve({"schedule": "wsd", "steps": 110, "warmup": 10, "decay_fraction": 0.2, "min_lr_ratio": 0.1,
                   "lr": 1.0})
    assert lr_at(0, cfg) == pytest.approx(0.1)  # warmup: (step + 1) / warmup
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == 1.0 and lr_at(89, cfg) == 1.0 and lr_at(90, cfg) == 1.0  # stable
    assert lr_at(100, cfg) == pytest.approx(1 - 0.9 * 0.5)  # halfway through the decay
    assert lr_at(110, cfg) == pytest.approx(0.1)  # progress 1: min_lr_ratio
    cosine = resolve({"schedule": "cosine", "steps": 100, "lr": 1.0, "min_lr_ratio": 0.0})
    assert lr_at(50, cosine) == pytest.approx(0.5) and lr_at(0, cosine) == 1.0
    assert lr_at(77, resolve({"schedule": "constant", "lr": 0.5})) == 0.5
