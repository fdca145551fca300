"""Built-in model presets: ``config.json``-shaped files shipped in the package."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

PRESET_PACKAGE = "ndplan.adapters.readers.presets"


@cache
def builtin_presets() -> dict[str, dict[str, Any]]:
    """Preset id → its parsed config (with the ``_ndplan`` metadata key)."""
    presets: dict[str, dict[str, Any]] = {}
    for entry in sorted(resources.files(PRESET_PACKAGE).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text(encoding="utf-8"))
            meta = data.get("_ndplan", {})
            presets[meta.get("id", entry.name.removesuffix(".json"))] = data
    return presets


def preset_loader(preset_id: str):
    """A zero-argument loader for one built-in preset (registries hold loaders, not dicts)."""

    def load() -> dict[str, Any]:
        return builtin_presets()[preset_id]

    load.__name__ = f"preset:{preset_id}"
    return load
