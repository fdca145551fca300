"""Calibration files: the shipped fit, or a user's from ``ndplan compare --fit``."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from ndplan.core.calibration import Calibration
from ndplan.core.errors import InvalidInputError

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
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ()))
        raise InvalidInputError(
            f"{path}: {where}: {err.get('msg')}; see `ndplan schema Calibration`"
        ) from None
