"""The axes of a block variant, each declared once: its name, default, help, valid values and
how it shows in a variant id. Everything else derives from this tuple: the VariantSpec's
fields and the defaults (variants/spec.py), the registries of values
(variants/tables.py), the per-axis options (ablate/engine/config.py) and the columns analysis
reads from config.json (analysis/load.py).

Standard library only: analysis reads it without importing torch.

Adding an axis: declare it here with an `id_prefix` (so that the ids of run folders made before
it existed, which trained with its default, still name the same blocks), register its values in
`AXIS_VALUES[name]`, and make the block read `spec.<name>`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Axis:
    name: str
    default: Any
    help: str
    kind: type = str  # str: a registered name; bool: residual
    values_of: str | None = None  # the axis whose registry holds the valid values (default: its own)
    extra_values: tuple = ()  # valid besides the registered ones (qk_norm's "none")
    id_prefix: str | None = None  # an axis added later: `.{prefix}{value}` at the end of the id, away from its default

    @property
    def registry(self) -> str | None:
        """The axis whose registry holds this one's values; None for a boolean."""
        return None if self.kind is bool else (self.values_of or self.name)


DECLARED_AXES: tuple[Axis, ...] = (
    Axis("norm", "pre", "norm placement"),
    Axis("norm_type", "layernorm", "norm type"),
    Axis("act", "gelu", "dense MLP activation"),
    Axis("mlp", "dense", "MLP type"),
    Axis("residual", True, "residual connections (true/false)", kind=bool),
    Axis("qk_norm", "none", "norm on queries and keys per head", values_of="norm_type", extra_values=("none",),
         id_prefix="qk-"),  # Dehghani et al. 2023
)
AXES = tuple(a.name for a in DECLARED_AXES)
DEFAULTS: dict[str, Any] = {a.name: a.default for a in DECLARED_AXES}
# Run folders made before an axis existed trained with what is now its default.
VALUE_BEFORE_IT_EXISTED: dict[str, Any] = {a.name: a.default for a in DECLARED_AXES if a.id_prefix}
