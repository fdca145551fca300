"""The assumptions recorder: which unset fields were read, what default was used, by whom.

Absent is not zero: a field the user did not state stays unset, and reading it
either uses a stated default (recorded here and printed as one "assumed:" line)
or, in strict mode, is an invalid-input error naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidInputError

SEPARATOR = "; "
"""Between described assumptions, on the ``assumed:`` line and in a sweep row's field."""


def assumed_line(described: Iterable[str]) -> str:
    """One ``assumed:`` line of described assumptions (each ``field=value (reader)``);
    empty when there are none."""
    text = SEPARATOR.join(described)
    return f"assumed: {text}" if text else ""


@dataclass(frozen=True, slots=True)
class Assumption:
    """One default used for an unstated field."""

    field: str
    value: Any
    reader: str

    def describe(self) -> str:
        return f"{self.field}={self.value} ({self.reader})"


@dataclass
class AssumptionRecorder:
    """Collects unset reads; raises instead when ``strict``."""

    strict: bool = False
    _seen: dict[str, Assumption] = field(default_factory=dict)

    def default(
        self, field_name: str, value: Any, reader: str, fix: str = "state it explicitly"
    ) -> Any:
        """Record that ``field_name`` was unset and ``value`` was used; return ``value``."""
        if self.strict:
            raise InvalidInputError(
                f"{field_name}: not stated, and --strict forbids assuming {value!r} "
                f"(read by {reader}); {fix}"
            )
        if field_name not in self._seen:
            self._seen[field_name] = Assumption(field_name, value, reader)
        return value

    def merge(self, assumptions: list[Assumption] | tuple[Assumption, ...]) -> None:
        """Fold in assumptions recorded elsewhere (e.g. in a worker process)."""
        for item in assumptions:
            self._seen.setdefault(item.field, item)

    @property
    def items(self) -> tuple[Assumption, ...]:
        """Sorted by field so reports are deterministic whatever the read order."""
        return tuple(sorted(self._seen.values(), key=lambda a: a.field))

    def text(self) -> str:
        """Every assumption described, in field order, as one field."""
        return SEPARATOR.join(a.describe() for a in self.items)

    def line(self) -> str:
        return assumed_line(a.describe() for a in self.items)
