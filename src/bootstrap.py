"""The composition root: the one place that wires plugins into a Planner.

A fresh plugin manager per call, no module-level globals; tests call it with
fakes (``extra=``) instead of patching.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ndplan.core.errors import InvalidInputError, PluginError
from ndplan.plugins.manager import PluginInfo, make_plugin_manager, plugin_modules_from_env
from ndplan.plugins.registry import Registry, RuleList

REGISTRIES = {
    "devices": ("device", "ndplan_register_devices"),
    "presets": ("model preset", "ndplan_register_presets"),
    "readers": ("model reader", "ndplan_register_model_readers"),
    "memory_models": ("memory model", "ndplan_register_memory_models"),
    "cost_models": ("cost model", "ndplan_register_cost_models"),
    "knapsack_solvers": ("knapsack solver", "ndplan_register_knapsack_solvers"),
    "executors": ("executor", "ndplan_register_executors"),
    "debug_sinks": ("debug sink", "ndplan_register_debug_sinks"),
    "exporters": ("export format", "ndplan_register_exporters"),
}


@dataclass
class Components:
    """Everything the plugins contributed, assembled once per run."""

    devices: Registry
    presets: Registry
    readers: Registry
    memory_models: Registry
    cost_models: Registry
    knapsack_solvers: Registry
    executors: Registry
    debug_sinks: Registry
    exporters: Registry
    refusal_rules: RuleList
    plugins: tuple[PluginInfo, ...]
    plugin_modules: tuple[str, ...] = ()
    """Importable plugin modules this run loaded (workers load the same ones)."""
    disabled: tuple[str, ...] = ()
    device_files: tuple[str, ...] = field(default_factory=tuple)


def _call(pm, hook_name: str, registry) -> None:
    """Call one registration hook plugin by plugin, so errors and entries name the plugin."""
    hook = getattr(pm.hook, hook_name)
    for impl in reversed(hook.get_hookimpls()):  # pluggy calls the last registered first
        registry.current_plugin = impl.plugin_name
        try:
            impl.function(registry)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin '{impl.plugin_name}' failed in {hook_name}: {type(exc).__name__}: {exc}"
            ) from None


def bootstrap(
    *,
    plugins: Iterable[str] = (),
    disabled: Iterable[str] | None = None,
    device_files: Iterable[str | Path] = (),
    entry_points: bool = True,
    extra: Iterable[object] = (),
) -> Components:
    """Load plugins and assemble every registry."""
    modules = tuple(dict.fromkeys((*plugin_modules_from_env(), *plugins)))
    pm, infos = make_plugin_manager(
        modules=modules, disabled=disabled, entry_points=entry_points, extra=extra
    )
    regs = {attr: Registry(kind) for attr, (kind, _) in REGISTRIES.items()}
    for attr, (_, hook_name) in REGISTRIES.items():
        _call(pm, hook_name, regs[attr])
    rules = RuleList()
    _call(pm, "ndplan_register_refusal_rules", rules)
    files = tuple(str(p) for p in device_files)
    if files:
        from ndplan.adapters.devices.catalog import load_device_file

        for path in files:
            regs["devices"].current_plugin = f"device-file:{path}"
            for device in load_device_file(Path(path)):
                try:
                    regs["devices"].add(
                        device.id,
                        device,
                        aliases=device.aliases,
                        replace=device.id in regs["devices"],
                    )
                except PluginError as exc:  # the user's file, not a plugin: invalid input
                    raise InvalidInputError(str(exc)) from None
    return Components(
        **regs,
        refusal_rules=rules,
        plugins=tuple(infos),
        plugin_modules=modules,
        disabled=tuple(sorted(disabled or ())),
        device_files=files,
    )
