"""A test plugin (``ndplan -p search_sink``): a third-party debug sink, ``recorder``, that
keeps every record it receives in memory, so the search tests can compare its stream with
what the built-in CSV and JSON-lines sinks wrote. Loaded through PYTHONPATH=tests/plugins
(or ``bootstrap(extra=[search_sink])``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ndplan.plugins.hookspecs import hookimpl

NAME = "recorder"
SINKS: list[RecordingSink] = []
"""Every sink the factory made, in order (the tests read the last one)."""


class RecordingSink:
    name = NAME

    def __init__(self) -> None:
        self.records: list[tuple[str, dict[str, Any], Any]] = []
        self.directory: Path | None = None
        self.opened = self.closed = False
        SINKS.append(self)

    def open(self, directory: Path | None) -> None:
        self.directory = directory
        self.opened = True

    def memory(self, candidate, parts) -> None:
        self.records.append(("memory", dict(candidate), dict(parts)))

    def time(self, candidate, parts) -> None:
        self.records.append(("time", dict(candidate), dict(parts)))

    def refusal(self, candidate, reason) -> None:
        self.records.append(("refusal", dict(candidate), reason))

    def close(self) -> None:
        self.closed = True


@hookimpl
def ndplan_register_debug_sinks(registry):
    registry.add(NAME, RecordingSink)
