"""Frozen value objects without dataclass code generation (pure).

A frozen dataclass compiles five or six generated methods when its module is imported:
0.5-1 ms per class here, paid by every ``ferry`` command for every such class it
imports. The small value types on the ``ferry run`` path derive from :class:`Value`
instead and write their ``__init__`` by hand; equality, hashing and ``repr`` follow
``_FIELDS`` (the fields in declaration order; ``__slots__`` holds the same names,
sorted), and assigning an attribute raises FrozenInstanceError, as with
``@dataclass(frozen=True)``. (Types that ``dataclasses.replace`` or ``asdict`` is used
on stay dataclasses.)
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any, ClassVar

__all__ = ["Value", "init"]

init = object.__setattr__  # for the hand-written __init__ of a frozen Value


class Value:
    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Value)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"{type(self).__name__}({fields})"

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")
