"""Option types shared by the commands, and the per-run state they build."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from ndplan.bootstrap import Components, bootstrap

from .output import note

Json = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
DeviceFiles = Annotated[
    list[Path] | None,
    typer.Option(
        "--device-file",
        help="A YAML/JSON file of extra device types (repeatable).",
        show_default=False,
    ),
]
Strict = Annotated[
    bool, typer.Option("--strict", help="Refuse to assume defaults for unstated model/job fields.")
]


@dataclass
class State:
    """What the root command parsed; components are assembled on first use."""

    plugins: list[str] = field(default_factory=list)
    verbosity: int = 0
    _components: dict[tuple, Components] = field(default_factory=dict)

    def loaded_plugin_modules(self) -> tuple[str, ...]:
        """The importable plugin modules the components built so far loaded."""
        return tuple(dict.fromkeys(m for c in self._components.values() for m in c.plugin_modules))

    def components(self, device_files: list[Path] | None = None) -> Components:
        key = tuple(str(p) for p in device_files or ())
        if key not in self._components:
            comps = self._components[key] = bootstrap(plugins=self.plugins, device_files=key)
            for entry in comps.devices.entries():
                if entry.plugin.startswith("device-file:") and entry.replaced is not None:
                    # Meant or not, a -d that named the built-in part now means the file's.
                    file = entry.plugin.removeprefix("device-file:")
                    note(
                        f"note: {file}: device '{entry.name}' replaces the one from '{entry.replaced}'"
                    )
        return self._components[key]


def state(ctx: typer.Context) -> State:
    root = ctx.find_root()
    if root.obj is None:
        root.obj = State()
    return root.obj
