"""The one way to register something: a `Registry` maps names to implementations.

Variant axes and what trains a block (ablate.variants), kernel backends, run backends, CLI
commands, claim measures and plot kinds each keep one. Registration is by name, a name taken
twice is refused in one line, and a plugin (`--import FILE`) registers through the same call as
the built-ins. A registered component may declare its own options (`ComponentOption`: name,
type, default, help, range check); ablate/engine/config.py derives the command line's flags, their
validation and which component an option applies to from these declarations.

Standard library only: analysis/ uses it without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")
_NOT_GIVEN = object()


class RegistryError(ValueError):
    """An unknown or twice-registered name; the message lists what is valid."""


@dataclass(frozen=True)
class ComponentOption:
    """An option a registered component (an optimizer, a schedule, ...) reads from the config."""

    name: str
    kind: type  # int, float, str or bool
    default: Any
    help: str
    check: Callable[[Any], str | None] | None = None  # a range check: what is valid, or None when fine


class Registry(Generic[T]):
    """Names -> implementations of one kind (`what` names the kind in messages)."""

    # Registrations in every registry so far: what is derived from them (the option schema)
    # is cached until this moves.
    changes = 0

    def __init__(self, what: str, error: type[RegistryError] = RegistryError):
        self.axis = what  # the name of the variant axis or option the values are for
        self.error = error
        self._items: dict[str, T] = {}
        self._origin: dict[str, str] = {}
        self._options: dict[str, tuple[ComponentOption, ...]] = {}

    def register(self, name: str, obj: Any = _NOT_GIVEN, *, options: tuple[ComponentOption, ...] = (),
                 origin: str | None = None):
        """`@REG.register("name")` on a class or function, or `REG.register("name", obj)`."""
        if obj is _NOT_GIVEN:
            return lambda target: self.register(name, target, options=options, origin=origin)
        if name in self._items:
            raise self.error(f"{self.axis} {name!r} is registered twice (first by {self._origin[name]})")
        for option in options:
            self._check_agrees(name, option)
        self._items[name] = obj
        self._origin[name] = origin or getattr(obj, "__module__", None) or "?"
        self._options[name] = tuple(options)
        Registry.changes += 1
        return obj

    def _check_agrees(self, name: str, option: ComponentOption) -> None:
        """Two components may share an option (beta1) only with one type: it is one flag."""
        for other, declared in self._options.items():
            for o in declared:
                if o.name == option.name and o.kind is not option.kind:
                    raise self.error(f"{self.axis} {name!r} declares option {option.name} as {option.kind.__name__}, "
                                     f"but {other!r} as {o.kind.__name__}; valid: one type per option name")

    def origin(self, name: str) -> str:
        """The module that registered `name` (a plugin's values show where they came from)."""
        return self._origin.get(name, "?")

    def options(self, name: str) -> tuple[ComponentOption, ...]:
        """The options component `name` declared."""
        self.get(name)
        return self._options[name]

    def declared_options(self) -> dict[str, list[tuple[str, ComponentOption]]]:
        """Every option name declared here -> (component, declaration) for each that declares it."""
        out: dict[str, list[tuple[str, ComponentOption]]] = {}
        for name, declared in self._options.items():
            for option in declared:
                out.setdefault(option.name, []).append((name, option))
        return out

    def settings(self, name: str, config: Any) -> dict[str, Any]:
        """Component `name`'s options as `config` sets them, its own default where unset (None)."""
        out = {}
        for option in self.options(name):
            value = getattr(config, option.name, None)
            out[option.name] = option.default if value is None else value
        return out

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):  # TypeError: an unhashable value read from a file
            raise self.error(f"unknown {self.axis} {name!r}; valid: {', '.join(self.names())}") from None

    __getitem__ = get

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def values(self) -> list[T]:
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._items
        except TypeError:
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
