"""A test plugin (``ndplan -p tracked_sink``): two debug sinks that write their file as
the records arrive, as a third party's might, and log every call the CLI makes on them in
``CALLS``, so the fault tests can check that a run that fails or is interrupted aborts
them. ``tracked`` has the optional ``abort()`` (it removes its file); ``closing`` has only
``close()``. With ``TRACKED_CLOSE=raise`` their ``close()`` raises. Loaded through
PYTHONPATH=tests/plugins."""

from __future__ import annotations

import os
from pathlib import Path

from ndplan.plugins.hookspecs import hookimpl

CALLS: list[tuple[str, str]] = []
"""(sink name, method) for every open, close and abort, in order."""


class ClosingSink:
    name = "closing"
    files = ("closing.tsv",)

    def open(self, directory: Path | None) -> None:
        CALLS.append((self.name, "open"))
        self.path = Path(directory or ".") / self.files[0]
        self.fh = self.path.open("w")

    def memory(self, candidate, parts) -> None:
        self.fh.write(f"memory\t{dict(candidate)}\n")

    def time(self, candidate, parts) -> None:
        self.fh.write(f"time\t{dict(candidate)}\n")

    def refusal(self, candidate, reason) -> None:
        self.fh.write(f"refusal\t{reason}\n")

    def close(self) -> None:
        CALLS.append((self.name, "close"))
        self.fh.close()
        if os.environ.get("TRACKED_CLOSE") == "raise":
            raise RuntimeError(f"{self.name} could not close")


class TrackedSink(ClosingSink):
    name = "tracked"
    files = ("tracked.tsv",)

    def abort(self) -> None:
        CALLS.append((self.name, "abort"))
        self.fh.close()
        self.path.unlink()


@hookimpl
def ndplan_register_debug_sinks(registry):
    registry.add("closing", ClosingSink)
    registry.add("tracked", TrackedSink)
