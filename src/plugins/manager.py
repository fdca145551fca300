"""The plugin manager, created per run: built-ins, entry points, importable modules."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata

import pluggy

from ndplan.core.errors import PluginError, did_you_mean_aside, exception_text

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


_reporter: Callable[..., None] | None = None
"""Where plugin-loading diagnostics go (``report_diagnostics_to``); None: stderr."""


def report_diagnostics_to(reporter: Callable[..., None] | None) -> None:
    """Route the diagnostics of plugin loading through ``reporter(message, warning=…)``:
    the CLI passes its ``note``, so ``-q``/``-qq`` drop them as they drop its own."""
    global _reporter
    _reporter = reporter


def diagnose(message: str, *, warning: bool = False) -> None:
    """One diagnostic line: through the reporter the CLI set, else on stderr (a library
    caller). Pool and Ray workers send their stderr nowhere, so a worker that bootstraps
    again does not repeat what the main process said."""
    if _reporter is not None:
        _reporter(message, warning=warning)
    else:
        print(message, file=sys.stderr)


def plugin_modules_from_env() -> tuple[str, ...]:
    """Importable plugin modules named by ``NDPLAN_PLUGINS=pkg.mod,other.mod``."""
    return tuple(n.strip() for n in os.environ.get("NDPLAN_PLUGINS", "").split(",") if n.strip())


@dataclass(frozen=True)
class LoadedPlugins:
    """What :func:`load_plugins` made: the manager, its plugins as listed, and the
    plugins ``NDPLAN_DISABLE_PLUGINS`` (or ``disabled=``) actually kept out."""

    pm: pluggy.PluginManager
    infos: list[PluginInfo]
    disabled: tuple[str, ...]


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
    loaded = load_plugins(
        modules=modules, disabled=disabled, entry_points=entry_points, extra=extra
    )
    return loaded.pm, loaded.infos


def entry_point_module(ep: object) -> str:
    """The module of an entry point: its value before ``:`` (``pkg.mod`` of ``pkg.mod:obj``)."""
    return str(getattr(ep, "value", "")).partition(":")[0].strip()


def _installed_entry_points() -> list:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)


def load_plugins(
    *,
    modules: Iterable[str] = (),
    disabled: Iterable[str] | None = None,
    entry_points: bool = True,
    extra: Iterable[object] = (),
) -> LoadedPlugins:
    """:func:`make_plugin_manager`, also reporting which plugins were disabled.

    A plugin is disabled by its name (an entry point's name, a module's name,
    ``ndplan.builtin``) or, for an entry point, by its module's name. A disabled name
    that matches no plugin is a warning (the variable may be set for other
    environments too); a module named with ``-p`` that an entry point already loads
    is loaded once, as the entry point, with a note.
    """
    from . import builtin

    blocked = disabled_plugins(disabled)
    modules = tuple(modules)
    extra = tuple(extra)
    pm = pluggy.PluginManager("ndplan")
    pm.add_hookspecs(hookspecs)
    sources: dict[str, str] = {}
    kept_out: list[str] = []

    def register(plugin: object, name: str, source: str) -> None:
        if name in blocked:
            kept_out.append(name)
            return
        # pluggy's own "already registered" errors append a dict of every plugin.
        if pm.has_plugin(name):
            raise PluginError(
                f"plugin '{name}' ({source}) could not register: a plugin named '{name}' "
                f"({sources.get(name, '?')}) is already loaded; load one of them"
            )
        if pm.is_registered(plugin):
            other = pm.get_name(plugin)
            raise PluginError(
                f"plugin '{name}' ({source}) could not register: it is already loaded as "
                f"plugin '{other}' ({sources.get(other or '', '?')}); load it once"
            )
        try:
            pm.register(plugin, name=name)
        except Exception as exc:  # pluggy validates hook names and signatures
            # pluggy's message spans lines (plugin, hookimpl, arguments): errors are one line.
            detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
            raise PluginError(f"plugin '{name}' ({source}) could not register: {detail}") from None
        sources[name] = source

    register(builtin, BUILTIN_NAME, "builtin")
    if entry_points:
        installed = _installed_entry_points()
    else:  # not loaded, but a disabled name may still be one of them (the warning below)
        try:
            installed = _installed_entry_points() if blocked else []
        except Exception:
            installed = []
    loaded_eps: dict[str, str] = {}  # module -> entry-point name
    if entry_points:
        for ep in installed:
            module = entry_point_module(ep)
            if ep.name in blocked or module in blocked:
                kept_out.append(ep.name)
                continue
            dist = f"{ep.dist.name} {ep.dist.version} " if ep.dist is not None else ""
            source = f"entry point {dist}({ep.value})"
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin '{ep.name}' ({ep.value}) failed to load: {exception_text(exc)}"
                ) from None
            register(plugin, ep.name, source)
            loaded_eps.setdefault(module, ep.name)
    for module in modules:
        if module in blocked:
            kept_out.append(module)
            continue
        if module in loaded_eps:
            # The same code twice would register every name twice (or trip pluggy's
            # "already registered"): load it once, as the installed entry point.
            diagnose(
                f"note: plugin module '{module}' is already loaded as entry point "
                f"'{loaded_eps[module]}'; loading it once (drop it from -p or NDPLAN_PLUGINS)"
            )
            continue
        try:
            plugin = importlib.import_module(module)
        except Exception as exc:
            raise PluginError(
                f"plugin module '{module}' failed to import: {exception_text(exc)}"
            ) from None
        register(plugin, module, f"module {module}")
    for obj in extra:
        name = getattr(obj, "__name__", type(obj).__name__)
        register(obj, name, "in-process")
    _warn_unknown_disabled(blocked, installed, modules, extra)
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

    infos = []
    for name, plugin in pm.list_name_plugin():
        hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or ()))
        infos.append(PluginInfo(name=name, source=sources.get(name, "?"), hooks=hooks))
    infos.sort(key=lambda i: (i.name != BUILTIN_NAME, i.name))
    return LoadedPlugins(pm, infos, tuple(dict.fromkeys(kept_out)))


def _warn_unknown_disabled(
    blocked: set[str], installed: list, modules: tuple[str, ...], extra: tuple[object, ...]
) -> None:
    """A disabled name that is no plugin is a warning, not an error: the variable may be
    set for several environments at once, but a typo must not pass unnoticed."""
    if not blocked:
        return
    names: dict[str, str] = {BUILTIN_NAME: BUILTIN_NAME}
    for ep in installed:
        module = entry_point_module(ep)
        names[ep.name] = f"{ep.name} (module {module})" if module != ep.name else ep.name
        names.setdefault(module, names[ep.name])
    for module in modules:
        names.setdefault(module, module)
    for obj in extra:
        name = getattr(obj, "__name__", type(obj).__name__)
        names.setdefault(name, name)
    listing = ", ".join(dict.fromkeys(names[n] for n in sorted(names)))
    from_env = disabled_plugins()
    for name in sorted(blocked - set(names)):
        where = "NDPLAN_DISABLE_PLUGINS" if name in from_env else "disabled="
        diagnose(
            f"warning: {where} names '{name}', which is no loaded or installed "
            f"plugin{did_you_mean_aside(name, names)}; plugins: {listing}",
            warning=True,
        )
