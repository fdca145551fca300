"""The serial executor: every chunk in this process, in order (no start-up cost)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class SerialExecutor:
    name = "serial"
    workers = 1

    def map(
        self, task: Callable[[Any, Sequence[Any]], Any], recipe: Any, items: Sequence[Any]
    ) -> list[Any]:
        return [task(recipe, list(items))] if items else []

    def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass
