"""The registries of what the harness ablates: block variants (placements, norms, activations,
MLPs, presets) and what trains them (inits, optimizers, schedules).

Importing this package registers every built-in value. To add your own, register a class or
function from a file of your own and pass it with `--import FILE` (docs/variants.md,
"Plugins"); nothing in the engine changes. An optimizer or schedule declares the options it
reads (`options=(ComponentOption(...),)`, see optimizers.py); the axes themselves are declared in
ablate/core/variant_axes.py.
"""
from ablate.variants import activations, mlps, norms, placements  # noqa: F401  (they register)
from ablate.variants import inits, optimizers, presets, schedules  # noqa: F401,E402  (they register)
from ablate.variants.spec import AXES, DEFAULTS, VariantSpec, all_variants, make_variant, parse_variant, variant_from_axes
from ablate.variants.tables import (ACTIVATIONS, INITS, MLPS, NORMS, OPTIMIZERS, PLACEMENTS, PRESETS, SCHEDULES,
                                    Registry, VariantError)

__all__ = [
    "ACTIVATIONS", "AXES", "DEFAULTS", "INITS", "MLPS", "NORMS", "OPTIMIZERS", "PLACEMENTS", "PRESETS", "SCHEDULES",
    "Registry", "VariantError", "VariantSpec", "all_variants", "make_variant", "parse_variant", "variant_from_axes",
]
