"""Built-in debug sinks: CSV files, JSON lines, and a null sink.

Records arrive in the search's order; they are buffered and written when the sink
closes: every file of a sink to a temporary file beside it first, then all renamed into
place, so a sink whose writing fails leaves none of its files. A run that fails or is
interrupted aborts its sinks instead of closing them (``abort``): no file at all.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ndplan.adapters.files import stage
from ndplan.core.errors import InvalidInputError


def csv_text(
    rows: list[dict[str, Any]],
    leading: list[str],
    trailing: tuple[str, ...] = (),
    missing: Any = "",
) -> str:
    """The rows under one header: ``leading`` first, then every other key in the order
    rows bring them, ``trailing`` last; a row without a key writes ``missing`` there (0
    for a part a plan lacks: a blank reads as unknown). Floats keep every digit."""
    keys: list[str] = list(leading)
    for row in rows:
        for key in row:
            if key not in keys and key not in trailing:
                keys.append(key)
    keys += [key for key in trailing if key not in leading]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(row.get(k, missing)) for k in keys})
    return buf.getvalue()


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value)
    return value


def _row(candidate: Mapping[str, Any], parts: Mapping[str, float], kind: str) -> dict[str, Any]:
    """One CSV row: the candidate's fields, then its parts. Fix: a part named like a field
    (the time part ``recompute``, in seconds) overwrote the field (the recompute policy)
    in ``debug_perf.csv``; such a part is now ``time.recompute`` (as in --ranking-csv)."""
    row = dict(candidate)
    for name, value in parts.items():
        row[f"{kind}.{name}" if name in candidate else name] = value
    return row


class _Buffered:
    name = "buffered"

    def __init__(self) -> None:
        self.directory: Path | None = None
        self.memory_rows: list[dict[str, Any]] = []
        self.time_rows: list[dict[str, Any]] = []
        self.refusal_rows: list[dict[str, Any]] = []
        self.leading: list[str] = []
        self.refused_fields: list[str] = []
        self.written: list[Path] = []
        """The files ``close`` wrote (``abort`` removes them)."""

    def open(self, directory: Path | None) -> None:
        if directory is None:
            raise InvalidInputError(f"the {self.name} debug sink needs --debug-dir")
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory

    def memory(self, candidate: Mapping[str, Any], parts: Mapping[str, float]) -> None:
        self.leading = self.leading or list(candidate)
        self.memory_rows.append(_row(candidate, parts, "memory"))

    def time(self, candidate: Mapping[str, Any], parts: Mapping[str, float]) -> None:
        self.leading = self.leading or list(candidate)
        self.time_rows.append(_row(candidate, parts, "time"))

    def refusal(self, candidate: Mapping[str, Any], reason: str) -> None:
        self.refusal_rows.append({**candidate, "reason": reason})
        if len(candidate) > len(self.refused_fields):
            self.refused_fields = list(candidate)

    def abort(self) -> None:
        """The run failed or was interrupted: keep nothing. The records are dropped, and
        the files this sink wrote are removed (it closed before another sink failed to)."""
        self.memory_rows.clear()
        self.time_rows.clear()
        self.refusal_rows.clear()
        for path in self.written:
            path.unlink(missing_ok=True)
        self.written.clear()

    def write(self, texts: Mapping[str, str]) -> None:
        """Write each ``name: text`` into the folder: all to temporary files beside their
        targets first, then all renamed over them. A failure removes the temporary files
        and any file this call already renamed, so it leaves none of them (an earlier
        run's that a rename replaced is gone, as a completed write would leave it)."""
        assert self.directory is not None
        staged: list[tuple[Path, Path]] = []
        renamed: list[Path] = []
        try:
            for name, text in texts.items():
                staged.append(stage(self.directory / name, text))
            for tmp, path in staged:
                os.replace(tmp, path)
                renamed.append(path)
        except BaseException:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
            for path in renamed:
                path.unlink(missing_ok=True)
            raise
        self.written.extend(renamed)

    @property
    def candidate_fields(self) -> list[str]:
        """The leading columns of the parts files: a priced candidate's fields or, where
        nothing was priced (nothing fits), the fullest refused one's, so even an empty
        file has its header."""
        return self.leading or self.refused_fields


class CsvSink(_Buffered):
    """``debug_mem.csv``, ``debug_perf.csv`` and ``debug_refusals.csv`` in the debug folder."""

    name = "csv"
    files = ("debug_mem.csv", "debug_perf.csv", "debug_refusals.csv")

    def close(self) -> None:
        mem, perf, refusals = self.files
        leading = self.candidate_fields
        # Stages hold different parts (the first the embedding's activations, the last the
        # loss's): a part a stage lacks is 0 bytes there, not a blank; the peak stage and
        # the totals close each row.
        self.write(
            {
                mem: csv_text(self.memory_rows, leading, ("stage", "total"), missing=0),
                perf: csv_text(self.time_rows, leading, ("step",), missing=0),
                refusals: csv_text(self.refusal_rows, ["reason"]),
            }
        )


class JsonLinesSink(_Buffered):
    """``debug.jsonl``: one record per line, ``{"record": memory|time|refusal, ...}``."""

    name = "jsonl"
    files = ("debug.jsonl",)

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def memory(self, candidate, parts) -> None:
        self.lines.append(
            json.dumps({"record": "memory", "candidate": dict(candidate), "parts": dict(parts)})
        )

    def time(self, candidate, parts) -> None:
        self.lines.append(
            json.dumps({"record": "time", "candidate": dict(candidate), "parts": dict(parts)})
        )

    def refusal(self, candidate, reason) -> None:
        self.lines.append(
            json.dumps({"record": "refusal", "candidate": dict(candidate), "reason": reason})
        )

    def abort(self) -> None:
        self.lines.clear()
        super().abort()

    def close(self) -> None:
        (name,) = self.files
        self.write({name: "".join(line + "\n" for line in self.lines)})


class NullSink:
    """Receives everything and keeps nothing."""

    name = "null"

    def open(self, directory: Path | None) -> None:
        pass

    def memory(self, candidate, parts) -> None:
        pass

    def time(self, candidate, parts) -> None:
        pass

    def refusal(self, candidate, reason) -> None:
        pass

    def close(self) -> None:
        pass
