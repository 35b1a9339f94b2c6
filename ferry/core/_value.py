"""Frozen value objects without dataclass code generation (pure).

A frozen dataclass compiles five or six generated methods when its module is imported
(0.5-1 ms per class here, more for a wide one such as ``Task``), and importing
``dataclasses`` itself brings ``inspect`` and with it ``ast``, ``dis`` and ``tokenize``:
every ``ferry`` command would pay for both. The value types on the start-up path of
``run``, ``submit``, ``ls`` and ``show`` derive from :class:`Value` instead and write
their ``__init__`` by hand (keyword construction and defaults as a dataclass's);
equality, hashing and ``repr`` follow ``_FIELDS`` (the fields in declaration order: the
dataclass's ``fields()``), and assigning or deleting an attribute raises
:class:`FrozenInstanceError`, as with ``@dataclass(frozen=True)``. :func:`replace` is
``dataclasses.replace`` for them. A subclass either names ``__slots__`` (small values)
or keeps an instance ``__dict__`` (``Task``: copied whole by ``fold._evolve``).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, ClassVar, TypeVar

__all__ = ["FrozenInstanceError", "Value", "as_dict", "init", "replace"]

init = object.__setattr__  # for the hand-written __init__ of a frozen Value


class FrozenInstanceError(AttributeError):
    """An assignment to (or deletion of) a field of a frozen value. ferry's own (not
    ``dataclasses``', whose import costs start-up), an AttributeError like it."""


def _tuple_of(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if len(names) > 1:
        return attrgetter(*names)  # (a tuple, made in C: equality is on every fold's path)
    return lambda value: tuple(getattr(value, name) for name in names)


class Value:
    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()
    _values: ClassVar[Callable[[Any], tuple[Any, ...]]] = _tuple_of(())  # the fields' values

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls._values = staticmethod(_tuple_of(cls._FIELDS))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        values = self.__class__._values
        return values(self) == values(other)

    def __hash__(self) -> int:
        return hash(self.__class__._values(self))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"{type(self).__name__}({fields})"

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


if TYPE_CHECKING:
    V = TypeVar("V", bound=Value)


def replace(value: V, /, **changes: Any) -> V:
    """A copy of ``value`` with ``changes`` (``dataclasses.replace`` for a Value): made
    through its ``__init__``, so a name that is not a field is a TypeError."""
    fields = {name: getattr(value, name) for name in value._FIELDS}
    fields.update(changes)
    return type(value)(**fields)


def as_dict(value: Value) -> dict[str, Any]:
    """Its fields by name, in order (``dataclasses.asdict``, one level deep)."""
    return {name: getattr(value, name) for name in value._FIELDS}
