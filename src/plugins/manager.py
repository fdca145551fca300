"""The plugin manager, created per run: built-ins, entry points, importable modules."""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata

import pluggy

from ndplan.core.errors import NdplanError, PluginError

from . import hookspecs

ENTRY_POINT_GROUP = "ndplan"
BUILTIN_NAME = "ndplan.builtin"


@dataclass(frozen=True)
class PluginInfo:
    """One loaded plugin, as ``ndplan plugins`` lists it."""

    name: str
    source: str
    """'builtin', 'entry point <dist> <version> (<module:attr>)' or 'module <name>'."""
    hooks: tuple[str, ...]


def disabled_plugins(explicit: Iterable[str] | None = None) -> set[str]:
    """Names blocked by ``NDPLAN_DISABLE_PLUGINS=a,b`` (and any passed explicitly)."""
    names = {
        n.strip() for n in os.environ.get("NDPLAN_DISABLE_PLUGINS", "").split(",") if n.strip()
    }
    return names | set(explicit or ())


def plugin_modules_from_env() -> tuple[str, ...]:
    """Importable plugin modules named by ``NDPLAN_PLUGINS=pkg.mod,other.mod``."""
    return tuple(n.strip() for n in os.environ.get("NDPLAN_PLUGINS", "").split(",") if n.strip())


def make_plugin_manager(
    *,
    modules: Iterable[str] = (),
    disabled: Iterable[str] | None = None,
    entry_points: bool = True,
    extra: Iterable[object] = (),
) -> tuple[pluggy.PluginManager, list[PluginInfo]]:
    """A fresh manager with the built-ins, the ``ndplan`` entry points and ``modules``.

    A plugin that fails to import or register raises :class:`PluginError` naming it.
    """
    from . import builtin

    blocked = disabled_plugins(disabled)
    pm = pluggy.PluginManager("ndplan")
    pm.add_hookspecs(hookspecs)
    sources: dict[str, str] = {}

    def register(plugin: object, name: str, source: str) -> None:
        if name in blocked:
            return
        try:
            pm.register(plugin, name=name)
        except Exception as exc:  # pluggy validates hook names and signatures
            # pluggy's message spans lines (plugin, hookimpl, arguments): errors are one line.
            detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise PluginError(f"plugin '{name}' ({source}) could not register: {detail}") from None
        sources[name] = source

    register(builtin, BUILTIN_NAME, "builtin")
    if entry_points:
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in blocked:
                continue
            dist = f"{ep.dist.name} {ep.dist.version} " if ep.dist is not None else ""
            source = f"entry point {dist}({ep.value})"
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin '{ep.name}' ({ep.value}) failed to load: {_exception_text(exc)}"
                ) from None
            register(plugin, ep.name, source)
    for module in modules:
        if module in blocked:
            continue
        try:
            plugin = importlib.import_module(module)
        except Exception as exc:
            raise PluginError(
                f"plugin module '{module}' failed to import: {_exception_text(exc)}"
            ) from None
        register(plugin, module, f"module {module}")
    for obj in extra:
        name = getattr(obj, "__name__", type(obj).__name__)
        register(obj, name, "in-process")
    # pluggy accepts an implementation of a hook nobody specified (a typo) and never
    # calls it; a plugin that silently does nothing is a broken plugin.
    for hook_name, caller in vars(pm.hook).items():
        if hook_name.startswith("_") or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if not impl.optionalhook:
                raise PluginError(
                    f"plugin '{impl.plugin_name}' ({sources.get(impl.plugin_name, '?')}) "
                    f"implements unknown hook '{hook_name}'; see docs/hooks.md"
                )
    _guard_hook_impls(pm)

    infos = []
    for name, plugin in pm.list_name_plugin():
        hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or ()))
        infos.append(PluginInfo(name=name, source=sources.get(name, "?"), hooks=hooks))
    infos.sort(key=lambda i: (i.name != BUILTIN_NAME, i.name))
    return pm, infos


def _guard_hook_impls(pm: pluggy.PluginManager) -> None:
    """Each third-party hook implementation reports what it raises as one line naming the
    plugin and the hook (``_guarded``). The built-in's are left as they are."""
    for hook_name, caller in vars(pm.hook).items():
        if hook_name.startswith("_"):
            continue
        for impl in caller.get_hookimpls():
            if impl.plugin_name == BUILTIN_NAME or impl.hookwrapper or impl.wrapper:
                continue
            impl.function = _guarded(impl.function, impl.plugin_name, hook_name)


def _guarded(function: Callable, plugin: str, hook_name: str) -> Callable:
    """``function``, raising a one-line PluginError for anything but ndplan's own errors:
    a message spanning lines (a pydantic dump of a ``DeviceSpec`` built without a field)
    would break the one line an error gets."""

    @functools.wraps(function)
    def call(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except NdplanError:
            raise
        except Exception as exc:
            raise PluginError(
                f"plugin '{plugin}' failed in {hook_name}: {_exception_text(exc)}"
            ) from None

    return call


def _exception_text(exc: BaseException) -> str:
    from ndplan.adapters.executors.faults import exception_text  # only once a plugin fails

    return exception_text(exc)
