"""A debug sink that prints one line per priced candidate on stderr as it is priced:
what ``-vv`` adds to a search (and ``--debug-sink stderr`` names), for watching a
search work without opening files afterwards."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ndplan.core.search import candidate_text
from ndplan.core.units import GiB


class StderrLinesSink:
    """``priced tp=2 pp=1 … : peak 58.06 GiB (stage 0), step 0.4718 s``. The memory record
    arrives just before its candidate's time record; the line is written on the second."""

    name = "stderr"

    def __init__(self) -> None:
        self._peak: tuple[float, Any] | None = None

    def open(self, directory: Path | None) -> None:
        pass

    def memory(self, candidate: Mapping[str, Any], parts: Mapping[str, float]) -> None:
        self._peak = (parts["total"], parts.get("stage"))

    def time(self, candidate: Mapping[str, Any], parts: Mapping[str, float]) -> None:
        peak = ""
        if self._peak is not None:
            total, stage = self._peak
            where = f" (stage {stage})" if stage is not None else ""
            peak = f"peak {total / GiB:.2f} GiB{where}, "
            self._peak = None
        sys.stderr.write(f"priced {candidate_text(candidate)}: {peak}step {parts['step']:.4f} s\n")

    def refusal(self, candidate: Mapping[str, Any], reason: str) -> None:
        pass  # refusals outnumber priced candidates by far; --debug-dir records them

    def close(self) -> None:
        sys.stderr.flush()
