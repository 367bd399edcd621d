"""Name -> implementation tables, one per variant axis and per training choice.

A value is one registered class or function; the engine in `ablate/` only ever looks values
up here, so adding a value (in this package, or in a plugin file of your own) never touches
the engine.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class VariantError(ValueError):
    """An unknown or contradictory variant value; the message lists what is valid."""


class Registry(Generic[T]):
    def __init__(self, axis: str):
        self.axis = axis
        self._items: dict[str, T] = {}
        self._origin: dict[str, str] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise VariantError(f"{self.axis} {name!r} is registered twice")
            self._items[name] = obj
            self._origin[name] = getattr(obj, "__module__", None) or "?"
            return obj

        return add

    def origin(self, name: str) -> str:
        """The module that registered `name` (a plugin's values show where they came from)."""
        return self._origin.get(name, "?")

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise VariantError(
                f"unknown {self.axis} {name!r}; valid: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)


PLACEMENTS: Registry = Registry("norm")  # where the norms sit: pre, post, ...
NORMS: Registry = Registry("norm_type")  # layernorm, rmsnorm
ACTIVATIONS: Registry = Registry("act")  # elementwise activations (reference math)
MLPS: Registry = Registry("mlp")  # dense and gated feed-forward sublayers
PRESETS: Registry = Registry("preset")  # named variants such as gpt2, post-ln
# What trains the block, registered the same way (a plugin adds its own values to these too).
INITS: Registry = Registry("init")  # weight initialisation schemes: fn(model)
OPTIMIZERS: Registry = Registry("optimizer")  # classes with build(model, cfg) -> torch.optim.Optimizer
SCHEDULES: Registry = Registry("schedule")  # fn(step, cfg) -> learning-rate multiplier after warmup
