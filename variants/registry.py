"""Name -> implementation tables, one per variant axis.

A variant value is one registered class or function; the engine in `ablate/` only ever
looks values up here, so adding a value never touches the engine.
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

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise VariantError(f"{self.axis} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return add

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
