"""Reading a user's YAML (or JSON) file: one line saying why not, never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ndplan.core.errors import InvalidInputError


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key stated twice in one mapping: ``tp: 2`` then
    ``tp: 4`` would otherwise silently mean 4."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            repeated = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: the constructor below says so
            continue
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None, f"'{key}' is stated twice", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)


def parse_yaml(text: str, origin: str, what: str = "YAML") -> Any:
    """``text`` as YAML (JSON is YAML), or one line naming ``origin`` and the problem."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem and exc.problem_mark:
            detail = f"{exc.problem} (line {exc.problem_mark.line + 1})"
        else:
            detail = str(exc).split("\n")[0] or type(exc).__name__
        raise InvalidInputError(f"{origin}: not valid {what}: {detail}") from None


def read_yaml_file(path: Path, what: str, kind: str = "YAML") -> Any:
    """A user's ``what`` file ("job", "sweep", "device", ...) parsed, or one line saying why
    not: unreadable, not UTF-8 text (a UTF-16 file from a Windows editor), or not YAML."""
    return parse_yaml(read_text_file(path, what), str(path), kind)


def read_text_file(path: Path, what: str) -> str:
    """A user's ``what`` file as text, or one line saying why not: unreadable, or not
    UTF-8 text."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read the {what} file ({exc.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidInputError(
            f"{path}: the {what} file is not UTF-8 text; save it as UTF-8"
        ) from None
    return text
