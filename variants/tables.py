"""Name -> implementation tables, one per variant axis and per training choice (the Registry
itself is ablate/core/registry.py, shared with every other kind of registered thing).

A value is one registered class or function; the engine in `ablate/` only ever looks values
up here, so adding a value (in this package, or in a plugin file of your own) never touches
the engine.
"""
from __future__ import annotations

from ablate.core.registry import ComponentOption, Registry, RegistryError
from ablate.core.variant_axes import DECLARED_AXES

__all__ = ["AXIS_VALUES", "ComponentOption", "Registry", "RegistryError", "VariantError", "PLACEMENTS", "NORMS", "ACTIVATIONS", "MLPS",
           "PRESETS", "INITS", "OPTIMIZERS", "SCHEDULES"]


class VariantError(RegistryError):
    """An unknown or contradictory variant value; the message lists what is valid."""


# One registry per variant axis whose values are registered (ablate/core/variant_axes.py declares the axes).
AXIS_VALUES: dict[str, Registry] = {a.name: Registry(a.name, VariantError) for a in DECLARED_AXES if a.registry == a.name}
PLACEMENTS: Registry = AXIS_VALUES["norm"]  # where the norms sit: pre, post, ...
NORMS: Registry = AXIS_VALUES["norm_type"]  # layernorm, rmsnorm
ACTIVATIONS: Registry = AXIS_VALUES["act"]  # elementwise activations (reference math)
MLPS: Registry = AXIS_VALUES["mlp"]  # dense and gated feed-forward sublayers
PRESETS: Registry = Registry("preset", VariantError)  # named variants such as gpt2, post-ln
# What trains the block, registered the same way (a plugin adds its own values to these too).
INITS: Registry = Registry("init", VariantError)  # weight initialisation schemes: fn(model)
OPTIMIZERS: Registry = Registry("optimizer", VariantError)  # classes with build(model, cfg); declare their options
SCHEDULES: Registry = Registry("schedule", VariantError)  # fn(t, cfg) -> lr multiplier after warmup; declare their options
