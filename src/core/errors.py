"""Errors the domain raises, each carrying the process exit code the CLI maps it to.

Infeasibility *inside* a search is a counted result, not an exception; these are
for inputs that cannot be planned at all and for broken plugins.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from enum import IntEnum


class ExitCode(IntEnum):
    """Documented process exit codes (spec/interfaces.md)."""

    OK = 0
    NO_FEASIBLE_PLAN = 1
    USAGE = 2  # click's own, for malformed flags
    INVALID_INPUT = 3
    PLUGIN_ERROR = 4
    INTERNAL_ERROR = 5
    INTERRUPTED = 130


class NdplanError(Exception):
    """Base of every error ndplan reports as one line."""

    exit_code: ExitCode = ExitCode.INTERNAL_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidInputError(NdplanError, ValueError):
    """A value that parses but makes no sense: a config field, degrees that do not multiply out."""

    exit_code = ExitCode.INVALID_INPUT


class BaselineError(InvalidInputError):
    """A stated baseline that is no layout of this search. ``detail`` is the reason, so
    a caller names the baseline as its user gave it (the CLI's ``--baseline``)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"baseline: {detail}")
        self.detail = detail


class InfeasibleError(NdplanError):
    """No candidate fits: the message names the closest miss."""

    exit_code = ExitCode.NO_FEASIBLE_PLAN


class PluginError(NdplanError):
    """A plugin failed to load, registered something invalid, or raised while pricing."""

    exit_code = ExitCode.PLUGIN_ERROR


class InternalError(NdplanError):
    """A bug in ndplan itself."""

    exit_code = ExitCode.INTERNAL_ERROR


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean a, b?"`` with up to three of ``known`` close to ``name`` (case
    aside), or ``""`` when none is: the hint of an unknown-name error."""
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=3, cutoff=0.5)
    return f"; did you mean {', '.join(by_lower[c] for c in close)}?" if close else ""


def did_you_mean_aside(name: str, known: Iterable[str]) -> str:
    """``did_you_mean`` in brackets, ``" (did you mean a?)"``, for a hint inside a
    sentence that goes on; ``""`` when none is close."""
    hint = did_you_mean(name, known)
    return f" ({hint.removeprefix('; ')})" if hint else ""


def error_field(exc: Exception) -> str:
    """The dotted path of the field a pydantic error's first complaint is about ("" for a
    whole-model check or any other error)."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return ""
    return ".".join(str(p) for p in errors()[0].get("loc", ()))


def field_error(exc: Exception, where: str | None = None) -> str:
    """A pydantic validation error as one line: the field (or ``where``, when the caller
    knows the flag or file the field came from), the message, and the value given when
    it is a plain value (a whole mapping would swamp the line); any other error as it
    reads. The one wording every reader, flag parser and file loader uses."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    err = errors()[0]
    field = error_field(exc)
    where = field if where is None else where
    message = str(err.get("msg", exc)).removeprefix("Value error, ")
    text = f"{where}: {message}" if where else message  # a model-level check names no field
    given = err.get("input")
    if field and (given is None or isinstance(given, str | int | float)):
        text += f" (got {given!r})"
    return text


NOUNS = {"DeviceSpec": "device", "ModelSpec": "model"}
"""What a user calls the spec a validation error names (its ``title``)."""


def one_line(text: object) -> str:
    """``text``'s non-blank lines, stripped and joined with ``; ``."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def exception_text(exc: BaseException) -> str:
    """``Type: message`` on one line, whatever the message spans. A pydantic validation
    error (a plugin building a ``DeviceSpec`` without a field) reads as its first
    complaint, worded as ndplan's own file readers word it (``field_error``):
    ``device 'x2000': hbm_bandwidth_gb_per_s: Field required``."""
    if callable(getattr(exc, "errors", None)) and hasattr(exc, "title"):  # pydantic's
        errors = exc.errors()
        if errors:
            given = errors[0].get("input")
            ident = given.get("id") if isinstance(given, Mapping) else None
            noun = NOUNS.get(exc.title, exc.title)
            subject = f"{noun} '{ident}'" if isinstance(ident, str) else noun
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            return one_line(f"{subject}: {field_error(exc)}{more}")
    message = one_line(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
