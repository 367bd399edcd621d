"""The registry: ids, parsing, and refusal of unknown or contradictory specs."""
import itertools

import pytest

from ablate.variants import (ACTIVATIONS, AXES, MLPS, NORMS, PLACEMENTS, VariantError, all_variants, make_variant,
                             parse_variant)


def test_every_axis_value_of_the_design_is_registered():
    assert set(PLACEMENTS) >= {"pre", "post", "sandwich", "deepnorm", "none"}
    assert set(NORMS) >= {"layernorm", "rmsnorm"}
    assert set(ACTIVATIONS) >= {"gelu", "gelu_erf", "relu", "silu", "relu2"}
    assert set(MLPS) >= {"dense", "swiglu", "geglu", "reglu"}


def test_default_is_the_andrea_block():
    assert make_variant().id == "pre.layernorm.gelu.dense.res"
    assert parse_variant("gpt2") == make_variant()
    assert parse_variant("post-ln").id == "post.layernorm.gelu.dense.res"


def test_mission_combinations_have_distinct_ids():
    ids = {
        make_variant(norm=n, act=a, mlp=m, residual=r).id
        for n, a, m, r in itertools.product(["pre", "post"], ["gelu"], ["dense"], [True, False])
    }
    # act crossed with a gated MLP collapses, so build the 16 as the mission defines them:
    mission = set()
    for n, a, m, r in itertools.product(["pre", "post"], ["gelu", "relu"], ["dense", "swiglu"], [True, False]):
        mission.add((n, a, m, r, make_variant(strict=False, norm=n, act=a, mlp=m, residual=r).id))
    assert len(mission) == 16
    dense_ids = {i for n, a, m, r, i in mission if m == "dense"}
    assert len(dense_ids) == 8  # pre/post x gelu/relu x res/nores are all distinct
    assert ids <= dense_ids


def test_ids_round_trip_for_every_variant():
    specs = list(all_variants())
    assert len({s.id for s in specs}) == len(specs)
    for spec in specs:
        assert parse_variant(spec.id) == spec


def test_axis_assignments_parse():
    spec = parse_variant("norm=post, act=relu, residual=false")
    assert (spec.norm, spec.act, spec.residual) == ("post", "relu", False)
    assert spec.id == "post.layernorm.relu.dense.nores"


def test_gated_mlp_fixes_its_activation():
    assert make_variant(mlp="swiglu").act is None
    assert make_variant(strict=False, mlp="swiglu", act="relu") == make_variant(mlp="swiglu")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("foo", "valid: a preset"),
        ("norm=middle", "valid: pre, post, sandwich, deepnorm, none"),
        ("act=tanh", "valid: gelu, gelu_erf, relu, silu, relu2"),
        ("mlp=moe", "valid: dense, swiglu, geglu, reglu"),
        ("norm_type=batchnorm", "valid: layernorm, rmsnorm"),
        ("residual=maybe", "valid: true, false"),
        ("depth=3", "valid: " + ", ".join(AXES)),
        ("mlp=swiglu,act=relu", "does not apply to mlp=swiglu"),
        ("norm=deepnorm,residual=false", "cannot run with residual=false"),
        ("norm=none,norm_type=rmsnorm", "does not apply to norm=none"),
        ("pre.layernorm", "not an id"),
        ("norm", "unknown variant"),
    ],
)
def test_bad_specs_raise_one_clear_error(text, fragment):
    with pytest.raises(VariantError) as err:
        parse_variant(text)
    message = str(err.value)
    assert fragment in message and "\n" not in message
