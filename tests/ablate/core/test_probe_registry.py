"""The probe registry (ablate/core/probe_registry.py, functions in ablate/engine/probes.py): every declared
probe has one function, names come from the declarations in order, a duplicate or undeclared
probe is refused, and the report's per-layer heatmaps are the probes that declare one."""
from types import SimpleNamespace

import pytest
import torch

from ablate.core import probe_registry
from ablate.core.probe_registry import FUNCTIONS, Heatmap, PROBES, Probe, probe
from ablate.core.registry import RegistryError
from ablate.engine.probes import KINDS, measured, metric_names


def test_every_declared_probe_has_exactly_one_function():
    assert set(FUNCTIONS) == set(PROBES)


def test_metric_names_expand_per_layer_and_parts_in_declaration_order():
    assert Probe("cos_sim", True, "stability").metric_names(2) == ["cos_sim/layer_0", "cos_sim/layer_1"]
    assert Probe("logit_max", False, "stability").metric_names(3) == ["logit_max"]
    assert Probe("g", True, "logged", ("a", "b")).metric_names(2) == ["g/layer_0/a", "g/layer_0/b", "g/layer_1/a",
                                                                       "g/layer_1/b"]
    assert metric_names("logged", 1) == ["grad_norm", "grad_norm/embed", "grad_norm/layer_0",
                                         *(f"grad_norm/layer_0/{k}" for k in KINDS), "act_norm/layer_0"]
    assert metric_names("update", 2) == ["update_ratio/layer_0", "update_ratio/layer_1"]


def test_the_scalar_and_per_layer_probes_of_one_name_are_two_keys():
    assert {"grad_norm", "grad_norm/layer_*", "grad_norm/layer_*/{attn,mlp,norm}"} <= set(PROBES)


def test_a_probe_declared_twice_is_refused():
    with pytest.raises(RegistryError, match="registered twice"):
        probe_registry.declare("cos_sim", per_layer=True, when="stability")


def test_a_function_for_an_undeclared_probe_or_a_second_function_is_refused():
    with pytest.raises(RegistryError, match="unknown probe 'no_such_probe'"):
        probe(Probe("no_such_probe", False, "logged"))
    with pytest.raises(RegistryError, match="unknown probe 'cos_sim'"):  # declared per layer, not as one value
        probe(Probe("cos_sim", False, "stability"))
    with pytest.raises(RegistryError, match="'cos_sim/layer_\\*' is declared otherwise"):  # measured on other steps
        probe(Probe("cos_sim", True, "logged"))
    with pytest.raises(RegistryError, match="two functions"):
        probe(probe_registry.COS_SIM)(lambda s: s)


def test_each_value_lands_under_its_own_name():
    """The logged probes on known inputs: total, embed, per layer, per kind, RMS, by name."""
    kinds_sq = torch.tensor([[1.0, 4.0, 9.0], [16.0, 25.0, 36.0]])
    bucket_sq = torch.cat([torch.tensor([49.0]), kinds_sq.flatten(), torch.tensor([0.0])])
    inputs = SimpleNamespace(grad_sq=torch.tensor([100.0, 44.0]), bucket_sq=bucket_sq, kinds_sq=kinds_sq,
                             act_rms=torch.tensor([0.5, 0.25]))
    got = dict(zip(metric_names("logged", 2), torch.cat(measured("logged", inputs)).tolist()))
    assert got["grad_norm"] == 12.0 and got["grad_norm/embed"] == 7.0
    assert got["grad_norm/layer_0"] == pytest.approx(14**0.5) and got["grad_norm/layer_1/mlp"] == 5.0
    assert got["act_norm/layer_1"] == 0.25


def test_a_probe_value_without_a_dimension_is_refused(monkeypatch):
    key = "logit_max"
    monkeypatch.setitem(FUNCTIONS, key, lambda s: s.logits.amax())  # 0-d: would shift every later name
    inputs = SimpleNamespace(logit_max=torch.zeros(1), entropy=torch.zeros(1), logits=torch.ones(2, 3, 5),
                             block_out=torch.ones(1, 2, 3, 4), stream_in=torch.ones(1, 2, 3, 4))
    with pytest.raises(ValueError, match="'logit_max' returned shape \\(\\)"):
        measured("stability", inputs)


def test_report_heatmaps_are_the_per_layer_probes_that_declare_one():
    from ablate.analysis.plots import LAYER_HEATMAPS

    assert list(LAYER_HEATMAPS) == ["grad_norm", "attn_logit_max", "cos_sim"]
    assert LAYER_HEATMAPS["grad_norm"] == ("gradient norm", "gradient norm (L2)", True)
    assert all(PROBES.get(f"{name}/layer_*").per_layer for name in LAYER_HEATMAPS)
    assert isinstance(PROBES.get("cos_sim/layer_*").heatmap, Heatmap)
