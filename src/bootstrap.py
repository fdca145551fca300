"""The composition root: the one place that wires plugins into a Planner.

A fresh plugin manager per call, no module-level globals; tests call it with
fakes (``extra=``) instead of patching.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ndplan.core.cluster import DeviceSpec
from ndplan.core.errors import InvalidInputError, NdplanError, PluginError, exception_text
from ndplan.core.ports import Exporter, ModelReader, missing_members
from ndplan.plugins.manager import PluginInfo, diagnose, load_plugins, plugin_modules_from_env
from ndplan.plugins.registry import Registry, RuleList


def _instance_of(cls: type, what: str) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if isinstance(value, cls):
            return None
        return f"is a {type(value).__name__}, not {what}"

    return check


def _port(port: type) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        missing = missing_members(value, port)
        if not missing:
            return None
        return f"lacks {', '.join(missing)} of the {port.__name__} port"

    return check


def _factory(makes: str) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        if callable(value):
            return None
        return (
            f"is a {type(value).__name__}, not a factory: register a callable that returns {makes}"
        )

    return check


# attribute → (kind, hook, what a registered value must be)
REGISTRIES = {
    "devices": (
        "device",
        "ndplan_register_devices",
        _instance_of(DeviceSpec, "a DeviceSpec (ndplan.core.cluster)"),
    ),
    "presets": (
        "model preset",
        "ndplan_register_presets",
        _factory("the preset's config.json-shaped dict"),
    ),
    "readers": ("model reader", "ndplan_register_model_readers", _port(ModelReader)),
    "memory_models": ("memory model", "ndplan_register_memory_models", _factory("a MemoryModel")),
    "cost_models": ("cost model", "ndplan_register_cost_models", _factory("a CostModel")),
    "knapsack_solvers": (
        "knapsack solver",
        "ndplan_register_knapsack_solvers",
        _factory("a KnapsackSolver"),
    ),
    "executors": ("executor", "ndplan_register_executors", _factory("an Executor")),
    "debug_sinks": ("debug sink", "ndplan_register_debug_sinks", _factory("a DebugSink")),
    "exporters": ("export format", "ndplan_register_exporters", _port(Exporter)),
}

KEYS = {"devices": "id"}
"""attribute → the attribute of a value its name must equal: ``ndplan devices`` lists a
device by its ``id``, so a device registered under another name could not be found."""


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
    in_process: tuple[str, ...] = ()
    """Plugins passed as objects (``extra=``): no worker process can load them."""


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
                f"plugin '{impl.plugin_name}' failed in {hook_name}: {exception_text(exc)}"
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
    loaded = load_plugins(
        modules=modules, disabled=disabled, entry_points=entry_points, extra=extra
    )
    pm, infos = loaded.pm, loaded.infos
    regs = {
        attr: Registry(kind, check, key=KEYS.get(attr))
        for attr, (kind, _, check) in REGISTRIES.items()
    }
    for attr, (_, hook_name, _) in REGISTRIES.items():
        _call(pm, hook_name, regs[attr])
    rules = RuleList()
    _call(pm, "ndplan_register_refusal_rules", rules)
    _check_replacements(regs.values(), loaded.disabled)
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
        in_process=tuple(i.name for i in infos if i.source == "in-process"),
    )


def _check_replacements(registries: Iterable[Registry], disabled: tuple[str, ...]) -> None:
    """A ``replace=True`` that replaced nothing, judged once every plugin registered: a
    plugin error (a typo leaves the entry it meant to replace running). With a plugin
    disabled it may be that plugin's entry it replaces, so then only a warning."""
    for registry in registries:
        for entry in registry.unreplaced():
            if not disabled:
                raise PluginError(registry.unreplaced_text(entry))
            diagnose(f"warning: {registry.unreplaced_text(entry, disabled)}", warning=True)


def create(registry: Registry, name: str, port: type, *args: object) -> Any:
    """Make the component ``name`` with its registered factory: a factory that raises, or
    makes something without the port's members, is a plugin error naming the plugin."""
    factory = registry.get(name)
    plugin = registry.entry(name).plugin
    try:
        made = factory(*args)
    except NdplanError:
        raise
    except Exception as exc:
        raise PluginError(
            f"{registry.kind} '{name}' (from '{plugin}') could not be created: "
            f"{exception_text(exc)}"
        ) from None
    missing = missing_members(made, port)
    if missing:
        raise PluginError(
            f"{registry.kind} '{name}' (from '{plugin}') made a {type(made).__name__} that "
            f"lacks {', '.join(missing)} of the {port.__name__} port"
        )
    return made
