"""The variant spec: one frozen value per axis, a stable readable id, and the rules that
refuse unknown or contradictory combinations up front."""
from __future__ import annotations

import itertools
from dataclasses import asdict, field, make_dataclass
from typing import Any, Iterator, Mapping

from ablate.core.variant_axes import AXES, Axis, DECLARED_AXES, DEFAULTS
from ablate.variants.tables import AXIS_VALUES, MLPS, PLACEMENTS, PRESETS, VariantError

QK_NONE = DEFAULTS["qk_norm"]  # no norm on queries and keys; any other qk_norm value is a registered norm type
_TRUE, _FALSE = ("true", "1", "yes", "res", "on"), ("false", "0", "no", "nores", "off")


class _SpecMethods:
    @property
    def id(self) -> str:
        """Readable and stable, e.g. `post.layernorm.relu.dense.res`; used as a directory name.
        An axis added later appears only away from its default (`...res.qk-layernorm`), so the
        ids of run directories made before it existed still name the same blocks."""
        parts = [self.norm, self.norm_type, self.act, self.mlp, "res" if self.residual else "nores"]
        for axis in _LATER_AXES:
            value = getattr(self, axis.name)
            if value != axis.default:
                parts.append(f"{axis.id_prefix}{value}")
        return ".".join(p for p in parts if p is not None)

    def axes(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return self.id


_LATER_AXES = tuple(a for a in DECLARED_AXES if a.id_prefix)
_TYPES = {str: "str | None", bool: "bool"}  # a str axis is None where the block has no such part
VariantSpec = make_dataclass("VariantSpec", [(a.name, _TYPES[a.kind], field(default=a.default)) for a in DECLARED_AXES],
                             bases=(_SpecMethods,), frozen=True)
VariantSpec.__module__ = __name__  # pickled by name, as a class written here would be
VariantSpec.__doc__ = """One block design, a value per axis (ablate/core/variant_axes.py). `act` is None for gated
MLPs (they fix their own gate activation) and `norm_type` is None when there are no norms, so
that equal blocks have equal specs."""


def axis_values(axis: Axis) -> list:
    """What `axis` takes: its registry's names (and any extra value), or both booleans."""
    if axis.registry is None:
        return [True, False]
    return [*axis.extra_values, *AXIS_VALUES[axis.registry]]


def _checked_value(axis: Axis, value: Any) -> Any:
    if axis.kind is bool:
        return parse_bool(value)
    if not axis.extra_values:
        AXIS_VALUES[axis.registry].get(value)  # unknown: one line naming what is valid
        return value
    value = str(value)
    if value not in axis_values(axis):
        raise VariantError(f"unknown {axis.name} {value!r}; valid: {', '.join(axis_values(axis))}")
    return value


def parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise VariantError(f"residual {value!r} is not a boolean; valid: true, false")


def make_variant(strict: bool = True, implied: Mapping[str, Any] | None = None, **axes: Any) -> VariantSpec:
    """Build a spec from axis values, `implied` values for the axes not given (None = the
    default), and defaults for the rest.

    `strict` refuses values that the other axes make meaningless (an `act` given with a
    gated MLP, a `norm_type` with `norm=none`); a grid expands with strict=False so that
    such crossings collapse into one cell instead of failing. Strictness holds the caller
    to `axes` only: `implied` is where they start from (a preset's values), so overriding a
    preset's `mlp` may drop the preset's `act`, but an `act` given in `axes` may not be dropped.
    """
    unknown = sorted(set(axes) - set(AXES))
    if unknown:
        raise VariantError(f"unknown variant axis {unknown[0]!r}; valid: {', '.join(AXES)}")
    values = {**DEFAULTS, **{k: v for k, v in (implied or {}).items() if v is not None}, **axes}
    values = {axis.name: _checked_value(axis, values[axis.name]) for axis in DECLARED_AXES}
    placement, mlp, residual = PLACEMENTS.get(values["norm"]), MLPS.get(values["mlp"]), values["residual"]

    if placement.requires_residual and not residual:
        raise VariantError(
            f"norm={values['norm']} is defined by its scaled residual and cannot run with "
            f"residual=false; valid norms without residual: "
            + ", ".join(n for n in PLACEMENTS if not PLACEMENTS.get(n).requires_residual)
        )
    if mlp.gated:
        if strict and "act" in axes and axes["act"] != mlp.gate_act:
            raise VariantError(
                f"act={axes['act']} does not apply to mlp={values['mlp']}, whose gate is "
                f"{mlp.gate_act}; valid: leave act out, or use mlp=dense"
            )
        values["act"] = None
    if not placement.needs_norms:
        if strict and "norm_type" in axes and axes["norm_type"] != DEFAULTS["norm_type"]:
            raise VariantError(
                f"norm_type={axes['norm_type']} does not apply to norm={values['norm']}; "
                f"valid: leave norm_type out, or use norm={', '.join(n for n in PLACEMENTS if PLACEMENTS.get(n).needs_norms)}"
            )
        values["norm_type"] = None
    return VariantSpec(**values)


def _from_id(text: str) -> VariantSpec:
    parts = text.split(".")
    axes: dict[str, Any] = {"norm": parts.pop(0)}
    for axis in reversed(_LATER_AXES):  # their suffixes, in declaration order at the end
        if len(parts) > 1 and parts[-1].startswith(axis.id_prefix):
            axes[axis.name] = parts.pop()[len(axis.id_prefix):]
    if axes["norm"] in PLACEMENTS and PLACEMENTS.get(axes["norm"]).needs_norms and parts:
        axes["norm_type"] = parts.pop(0)
    if parts and parts[0] not in MLPS:
        axes["act"] = parts.pop(0)
    if len(parts) != 2:
        raise VariantError(
            f"variant {text!r} is not an id of the form norm.norm_type.act.mlp.res|nores"
            + "".join(f"[.{a.id_prefix}{a.name.upper()}]" for a in _LATER_AXES)
        )
    axes["mlp"], axes["residual"] = parts
    spec = make_variant(**axes)
    if spec.id != text:
        raise VariantError(f"variant {text!r} is not a canonical id; did you mean {spec.id!r}?")
    return spec


def parse_variant(text: str) -> VariantSpec:
    """Parse a preset name (`gpt2`), an id (`post.layernorm.relu.dense.res`) or axis
    assignments (`norm=post,act=relu`)."""
    return parse_variant_given(text)[0]


def parse_variant_given(text: str) -> tuple[VariantSpec, dict[str, str]]:
    """parse_variant, and the axes that `text` writes out as axis=value (none for a preset
    or an id): those are asked for explicitly, a preset's or an id's values only implied."""
    text = text.strip()
    if not text:
        raise VariantError("empty variant; valid: a preset (" + ", ".join(PRESETS) + "), an id, or axis=value,...")
    if "=" in text:
        axes: dict[str, str] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise VariantError(f"variant item {item!r} is not axis=value; valid axes: {', '.join(AXES)}")
            if key in axes:  # the last one silently winning would hide a typo
                raise VariantError(f"variant {text!r} gives {key} twice; valid: each axis at most once")
            axes[key] = value.strip()
        return make_variant(**axes), axes
    if text in PRESETS:
        return PRESETS.get(text), {}
    if "." in text:
        return _from_id(text), {}
    raise VariantError(
        f"unknown variant {text!r}; valid: a preset ({', '.join(PRESETS)}), an id such as "
        f"{VariantSpec().id!r}, or axis=value,... with axes {', '.join(AXES)}"
    )


def all_variants() -> Iterator[VariantSpec]:
    """Every distinct registered combination of the axes, in registry order."""
    seen = set()
    for combination in itertools.product(*(axis_values(axis) for axis in DECLARED_AXES)):
        try:
            spec = make_variant(strict=False, **dict(zip(AXES, combination)))
        except VariantError:
            continue  # a contradictory combination, e.g. deepnorm without residual
        if spec not in seen:
            seen.add(spec)
            yield spec


def variant_from_axes(values: Mapping[str, Any]) -> VariantSpec:
    """The spec for the variant axes found in a flat config mapping (grids use this)."""
    return make_variant(strict=False, **{k: values[k] for k in AXES if k in values})
