"""The registry of transformer block variants.

Importing this package registers every built-in axis value. To add your own, register a
class or function in a module of this package and import it below (see README).
"""
from ablate.variants import activations, mlps, norms, placements  # noqa: F401  (they register)
from ablate.variants.registry import ACTIVATIONS, MLPS, NORMS, PLACEMENTS, PRESETS, VariantError
from ablate.variants.spec import AXES, DEFAULTS, VariantSpec, all_variants, make_variant, parse_variant, variant_from_axes
from ablate.variants import presets  # noqa: F401,E402  (presets use the registered values)

__all__ = [
    "ACTIVATIONS", "AXES", "DEFAULTS", "MLPS", "NORMS", "PLACEMENTS", "PRESETS",
    "VariantError", "VariantSpec", "all_variants", "make_variant", "parse_variant", "variant_from_axes",
]
