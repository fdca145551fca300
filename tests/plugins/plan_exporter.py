"""A test plugin (``ndplan -p plan_exporter``): a third-party exporter, ``degrees``, that
writes a plan's degrees one per line and keeps every plan it was given, and ``broken``,
whose render raises. Loaded through PYTHONPATH=tests/plugins."""

from __future__ import annotations

from ndplan.core.ports import Exported
from ndplan.plugins.hookspecs import hookimpl

RENDERED: list = []
"""Every plan the ``degrees`` exporter rendered, in order."""


class DegreesExporter:
    name = "degrees"
    suffix = ".txt"
    framework = None

    def render(self, plan, ctx, price=None) -> Exported:
        RENDERED.append(plan)
        lay = plan.layout
        text = "".join(f"{k} {getattr(lay, k)}\n" for k in ("tp", "pp", "cp", "dp", "mbs"))
        return Exported(text=text, caveats=("degrees: only the degrees are written",))


class BrokenExporter:
    name = "broken"
    suffix = ".txt"
    framework = None

    def render(self, plan, ctx, price=None) -> Exported:
        raise KeyError("layout")


@hookimpl
def ndplan_register_exporters(registry):
    registry.add("degrees", DegreesExporter())
    registry.add("broken", BrokenExporter())
