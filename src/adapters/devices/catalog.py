"""The device catalog: built-in YAML data files, user device files, plugin devices."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ndplan.adapters.yamlfile import read_yaml_file
from ndplan.core.cluster import DeviceSpec
from ndplan.core.errors import InvalidInputError, field_error

DATA_PACKAGE = "ndplan.adapters.devices.data"
_BUILTIN_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML was built with it: every command reads all the
built-in device files, and the pure-Python loader spent ~50 ms of each start on them."""


LISTING_FIELDS = ("registered_by", "replaced")
"""What ``ndplan devices --json`` adds to each device: who registered it, not what it is.
Read past, so a copied and edited entry (or the whole listing) is a device file."""


def parse_devices(data: Any, origin: str) -> list[DeviceSpec]:
    """One device (a mapping) or several (``devices: [...]`` or a list) from parsed YAML/JSON."""
    if isinstance(data, dict) and "devices" in data:
        data = data["devices"]
    items = data if isinstance(data, list) else [data]
    devices = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidInputError(
                f"{origin}: device {i} is not a mapping; see `ndplan schema DeviceSpec`"
            )
        try:
            fields = {k: v for k, v in item.items() if k not in LISTING_FIELDS}
            devices.append(DeviceSpec.model_validate(fields))
        except ValidationError as exc:
            ident = item.get("id", f"#{i}")
            raise InvalidInputError(f"{origin}: device '{ident}': {field_error(exc)}") from None
    return devices


def load_device_file(path: Path) -> list[DeviceSpec]:
    """A user's YAML or JSON device file."""
    data = read_yaml_file(path, "device", "YAML/JSON")
    devices = parse_devices(data, str(path))
    ids = [d.id for d in devices]
    twice = next((i for i in ids if ids.count(i) > 1), None)
    if twice is not None:  # the second would silently replace the first
        raise InvalidInputError(f"{path}: device '{twice}' is listed twice; keep one")
    return devices


@cache
def builtin_devices() -> tuple[DeviceSpec, ...]:
    """Every device data file shipped in the package, by id."""
    devices: list[DeviceSpec] = []
    for entry in sorted(resources.files(DATA_PACKAGE).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            devices.extend(
                parse_devices(
                    yaml.load(entry.read_text(encoding="utf-8"), Loader=_BUILTIN_LOADER),
                    entry.name,
                )
            )
    return tuple(sorted(devices, key=lambda d: d.id))
