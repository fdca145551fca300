"""Calibration files: the shipped fit, or a user's from ``ndplan compare --fit``."""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import NoReturn, Protocol

from pydantic import ValidationError

from ndplan.core.calibration import Calibration
from ndplan.core.errors import InvalidInputError, field_error

SHIPPED = "calibration.json"


@cache
def shipped_calibration() -> Calibration:
    """The parameters fitted on the even-``row_id`` measured runs, shipped in the package."""
    entry = resources.files("ndplan.adapters.devices.data") / SHIPPED
    if not entry.is_file():
        return Calibration()
    return Calibration.model_validate_json(entry.read_text(encoding="utf-8"))


def load_calibration(path: Path | None) -> Calibration:
    """A calibration file, or the shipped one when ``path`` is None."""
    if path is None:
        return shipped_calibration()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(
            f"{path}: cannot read the calibration file ({exc.strerror})"
        ) from None
    except UnicodeDecodeError:  # Fix: a binary file is bad input (exit 3), not an internal error
        raise InvalidInputError(f"{path}: not a UTF-8 JSON calibration file") from None
    try:
        return Calibration.model_validate(json.loads(text))
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})"
        ) from None
    except ValidationError as exc:
        raise InvalidInputError(
            f"{path}: {field_error(exc)}; see `ndplan schema Calibration`"
        ) from None


def check_calibration_names(
    calibration: Calibration, path: Path, devices: DeviceNames, frameworks: Collection[str]
) -> None:
    """Refuse names a calibration file keys its fits by that nothing would look up.

    Parameters are read by exact device id, by the family ``families`` maps that id to,
    and by framework name: a misspelt key (or a device alias) would silently leave its
    fit unused and price with the defaults instead.
    """
    ids = list(devices)
    families = sorted(set(calibration.families.values()))
    for device_id in calibration.families:
        if device_id not in ids:
            _refuse(path, f"families.{device_id}", "device id", ids, devices, "ndplan devices")
    for key in calibration.devices:
        if key not in ids and key not in families:
            fix = (
                f"a device id (ndplan devices) or a family named in families ({', '.join(families)})"
                if families
                else "a device id (ndplan devices), or map device ids to this family in families"
            )
            _refuse(path, f"devices.{key}", "device id or family", [*ids, *families], devices, fix)
    overlap_names = (*frameworks, "default")
    for key in calibration.overlap:
        if key not in overlap_names:
            _refuse(
                path, f"overlap.{key}", "framework", overlap_names, None, ", ".join(overlap_names)
            )
    for key in calibration.attention_scale:
        if key not in frameworks:
            _refuse(
                path, f"attention_scale.{key}", "framework", frameworks, None, ", ".join(frameworks)
            )


class DeviceNames(Protocol):
    """The device registry as this check reads it: ids, and aliases resolved to ids."""

    def __iter__(self) -> Iterator[str]: ...
    def __contains__(self, name: str) -> bool: ...
    def resolve(self, name: str) -> str: ...


def _refuse(
    path: Path,
    where: str,
    what: str,
    known: Collection[str],
    devices: DeviceNames | None,
    fix: str,
) -> NoReturn:
    name = where.split(".", 1)[1]
    if devices is not None and name in devices:  # an alias: lookups use the id
        hint = f"'{name}' is an alias of '{devices.resolve(name)}'; key it by that device id"
    else:
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = (f"did you mean '{close[0]}'? " if close else "") + f"use {fix}"
    raise InvalidInputError(
        f"{path}: {where}: no {what} '{name}', so nothing would read it; {hint}"
    )
