"""Turn what a user typed (a config file, a model directory, a preset name) into a ModelSpec.

One place for this so every command that takes a model (``models show``, ``search``,
``estimate`` …) reads it the same way: an existing path goes to the first model
reader that recognises it; anything else is a preset id or alias, and an unknown
name is an invalid-input error with close-match suggestions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.errors import (
    InvalidInputError,
    NdplanError,
    PluginError,
    did_you_mean,
    exception_text,
)
from ndplan.core.model import ModelSpec

from .hf import read_hf_config

BUILTIN_PLUGIN = "ndplan.builtin"
# Suffixes that make a name that is not an existing path read as a mistyped path
# rather than a preset name ("no such file" beats "unknown preset" for these).
PATH_SUFFIXES = (".json", ".yaml", ".yml", ".toml", ".sh", ".txt")


class _Components(Protocol):
    """The two registries this module needs (``bootstrap.Components`` has them).

    A protocol rather than an import: adapters do not depend on the composition root.
    """

    readers: Any
    presets: Any


@contextmanager
def _blamed_on(plugin: str, failed: str) -> Iterator[None]:
    """A third-party plugin's unexpected exception becomes a PluginError saying what
    ``failed``; ndplan's own errors, and the built-in plugin's bugs, pass through."""
    try:
        yield
    except NdplanError:
        raise
    except Exception as exc:
        if plugin == BUILTIN_PLUGIN:
            raise
        raise PluginError(f"{failed}: {exception_text(exc)}") from None


@dataclass(frozen=True)
class ResolvedModel:
    """A model read from a preset or a path, with where it came from."""

    spec: ModelSpec
    preset_id: str | None = None
    """The registered preset id, when the name was a preset (or one of its aliases)."""
    path: Path | None = None
    """The file or directory read, when the name was a path."""
    reader: str | None = None
    """The model reader that read the path."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The preset's ``_ndplan`` metadata (display name, family, aliases, source)."""


def load_model(
    components: _Components, name_or_path: str, recorder: AssumptionRecorder
) -> ModelSpec:
    """The ModelSpec for a config file, a model directory or a preset name."""
    return resolve_model(components, name_or_path, recorder).spec


def resolve_model(
    components: _Components, name_or_path: str, recorder: AssumptionRecorder
) -> ResolvedModel:
    """Like :func:`load_model`, also saying whether a preset or a path was read."""
    if not name_or_path.strip():
        raise InvalidInputError("model: empty name; give a preset name or a config path")
    try:
        path = Path(name_or_path).expanduser()
    except RuntimeError:  # ~nobody/...: no such user, so no such file either (below)
        path = Path(name_or_path)
    is_preset = name_or_path in components.presets
    if path.exists():
        found = _read_path(components, path, recorder)
        if found is not None:
            return found
        # A folder no reader knows but named like a preset: the user meant the preset.
        if not is_preset:
            _no_reader(components, path)
    elif not is_preset and _looks_like_path(name_or_path):
        raise InvalidInputError(
            f"{name_or_path}: no such file or directory; give a config.json, a model "
            "directory holding one, or a preset name (ndplan models lists them)"
        )
    return read_preset(components, name_or_path, recorder)


def read_preset(components: _Components, name: str, recorder: AssumptionRecorder) -> ResolvedModel:
    """A registered preset by id or alias (unknown names get close-match suggestions)."""
    registry = components.presets
    if name not in registry:
        raise InvalidInputError(_unknown_preset_message(name, list(registry)))
    preset_id = registry.resolve(name)
    entry = registry.entry(preset_id)
    with _blamed_on(
        entry.plugin, f"preset '{preset_id}' of plugin '{entry.plugin}' failed to load"
    ):
        loaded = entry.value()
    if isinstance(loaded, ModelSpec):
        return ResolvedModel(spec=loaded, preset_id=preset_id)
    if not isinstance(loaded, Mapping):
        raise PluginError(
            f"preset '{preset_id}' of plugin '{entry.plugin}' returned "
            f"{type(loaded).__name__}; a preset loader returns a config.json-shaped dict"
        )
    meta = loaded.get("_ndplan")
    meta = meta if isinstance(meta, Mapping) else {}
    spec = read_hf_config(loaded, origin=f"preset '{preset_id}'", recorder=recorder)
    return ResolvedModel(spec=spec, preset_id=preset_id, meta=meta)


def _read_path(
    components: _Components, path: Path, recorder: AssumptionRecorder
) -> ResolvedModel | None:
    """The first reader whose ``can_read`` accepts ``path`` reads it; None if none does."""
    registry = components.readers
    for entry in registry.entries():  # name order, as the hook documents
        reader = entry.value
        failed = f"model reader '{entry.name}' of plugin '{entry.plugin}' failed on {path}"
        with _blamed_on(entry.plugin, failed):
            if not reader.can_read(path):
                continue
            spec = reader.read(path, recorder)
        if not isinstance(spec, ModelSpec):
            # Checked here, where ndplan receives it: it failed later, far from the
            # reader, as ndplan's own error (exit 5).
            raise PluginError(
                f"model reader '{entry.name}' of plugin '{entry.plugin}' returned "
                f"{type(spec).__name__} for {path}; a model reader returns a ModelSpec "
                "(ndplan.core.model)"
            )
        return ResolvedModel(spec=spec, path=path, reader=entry.name)
    return None


def _no_reader(components: _Components, path: Path) -> NoReturn:
    registry = components.readers
    known = ", ".join(e.name for e in registry.entries()) or "none"
    what = "directory" if path.is_dir() else "file"
    hint = " holds no config.json" if path.is_dir() else " is not a format any reader knows"
    raise InvalidInputError(
        f"{path}: this {what}{hint} (model readers: {known}); give a HuggingFace config.json "
        "or a directory holding one"
    )


def _looks_like_path(name: str) -> bool:
    return (
        name.lower().endswith(PATH_SUFFIXES)
        or name.startswith((".", "~", "/"))
        or "\\" in name
        or name.count("/") > 1
    )


def _unknown_preset_message(name: str, known: list[str]) -> str:
    """One line: the name, up to three close matches (case-insensitive), where to look."""
    return (
        f"unknown model preset '{name}'{did_you_mean(name, known)} ('ndplan models' lists the {len(known)} presets; "
        "or give a config.json path or a model directory)"
    )
