"""Named registries that plugins fill through the ``ndplan_register_*`` hooks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from ndplan.core.errors import InvalidInputError, PluginError, did_you_mean, did_you_mean_aside

from .manager import BUILTIN_NAME

T = TypeVar("T")


@dataclass
class Entry(Generic[T]):
    name: str
    value: T
    plugin: str
    replace: bool = False
    replaced: str | None = None
    """The plugin whose registration of the same name this entry replaced."""


def normalise(name: str) -> str:
    """Case-, space- and punctuation-insensitive key for names and aliases."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


class Registry(Generic[T]):
    """Components of one kind by name.

    A name is registered once; a second registration is refused with a message
    naming both plugins, unless one of them passed ``replace=True`` — then the
    replacing one wins whatever the order the hooks ran in, and the listing shows
    whom it replaced. A ``replace=True`` that met no other registration of its name is
    left to :meth:`unreplaced`, asked once every plugin has registered.
    """

    def __init__(
        self,
        kind: str,
        check: Callable[[object], str | None] | None = None,
        *,
        key: str | None = None,
    ) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._aliases: dict[str, str] = {}
        self.current_plugin = "?"
        self._check = check
        """What is wrong with a value of this registry's kind, or None: a wrong value
        is refused where it is registered, naming the plugin, not where it is first used."""
        self._key = key
        """The attribute a value must be registered under (a device's ``id``): the listing
        shows the value's own name, so any other key would list a name nothing finds."""

    def add(
        self, name: str, value: T, *, replace: bool = False, aliases: tuple[str, ...] = ()
    ) -> None:
        plugin = self.current_plugin
        problem = self._check(value) if self._check is not None else None
        if problem is not None:
            raise PluginError(f"{self.kind} '{name}' from '{plugin}' {problem}")
        if self._key is not None:
            own = getattr(value, self._key, name)
            if own != name:
                raise PluginError(
                    f"{self.kind} '{name}' from '{plugin}' has {self._key} '{own}', so it would be "
                    f"listed as '{own}' but found only as '{name}'; register it as its "
                    f"{self._key}: registry.add(spec.{self._key}, spec)"
                )
        old = self._entries.get(name)
        if old is not None:
            if old.replace and not replace:
                # The replacement ran first; this is the original it replaces. A second
                # original is still a duplicate, whatever the order the hooks ran in.
                if old.replaced is not None:
                    raise PluginError(
                        f"{self.kind} '{name}' is registered by both '{old.replaced}' and "
                        f"'{plugin}'; {_which_replaces(old.replaced, plugin)}"
                    )
                old.replaced = plugin
            elif not replace:
                raise PluginError(
                    f"{self.kind} '{name}' is registered by both '{old.plugin}' and '{plugin}'; "
                    f"{_which_replaces(old.plugin, plugin)}"
                )
            elif old.replace:
                raise PluginError(
                    f"{self.kind} '{name}' is replaced by both '{old.plugin}' and '{plugin}'; disable one "
                    "(NDPLAN_DISABLE_PLUGINS)"
                )
            else:
                self._entries[name] = Entry(name, value, plugin, True, old.plugin)
        else:
            self._entries[name] = Entry(name, value, plugin, replace)
        for alias in (name, *aliases):
            key = normalise(alias)
            taken = self._aliases.get(key)
            if taken is not None and taken != name:
                owner = self._entries[taken].plugin
                if owner != plugin:
                    # An alias another plugin's entry answers to would be silently taken
                    # over (or kept) depending on hook order: `-d H100` meant a lab device.
                    fix = owner if plugin == BUILTIN_NAME else plugin
                    raise PluginError(
                        f"{self.kind} alias '{alias}' is claimed by '{taken}' ('{owner}') and "
                        f"'{name}' ('{plugin}'); drop it from '{fix}'"
                    )
            self._aliases.setdefault(key, name)

    def unreplaced(self) -> list[Entry[T]]:
        """Entries registered with ``replace=True`` that replaced nothing. Judged only
        once every plugin has registered (a third party's hooks run before the
        built-in's): then a name no other plugin registers is a typo (``h100-sxn``),
        and the entry it meant to replace silently keeps running."""
        return [e for e in self.entries() if e.replace and e.replaced is None]

    def unreplaced_text(self, entry: Entry[T], disabled: tuple[str, ...] = ()) -> str:
        """One line: which plugin replaced a name nobody registers, and the two fixes."""
        others = [n for n in self._entries if n != entry.name]
        unless = f" (unless disabled {', '.join(disabled)} does)" if disabled else ""
        return (
            f"{self.kind} '{entry.name}' from '{entry.plugin}' is registered with replace=True, "
            f"but no other plugin registers '{entry.name}'{unless}: fix the name to replace "
            f"one{did_you_mean_aside(entry.name, others)}, or drop replace=True to add it as "
            "a new one"
        )

    def resolve(self, name: str) -> str:
        """The registered name for ``name`` or one of its aliases."""
        if name in self._entries:
            return name
        key = self._aliases.get(normalise(name))
        if key is not None:
            return key
        known = sorted(self._entries)
        raise InvalidInputError(
            f"unknown {self.kind} '{name}'{did_you_mean(name, known)} (known: {', '.join(known)})"
        )

    def get(self, name: str) -> T:
        return self._entries[self.resolve(name)].value

    def entry(self, name: str) -> Entry[T]:
        return self._entries[self.resolve(name)]

    def __contains__(self, name: str) -> bool:
        return name in self._entries or normalise(name) in self._aliases

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self._entries[n] for n in sorted(self._entries)]


class RuleList:
    """Extra refusal rules, collected once: ``(name, rule)`` in registration order."""

    def __init__(self) -> None:
        self.rules: list[tuple[str, object]] = []
        self.current_plugin = "?"

    def add(self, name: str, rule: object) -> None:
        if any(n == name for n, _ in self.rules):
            raise PluginError(
                f"refusal rule '{name}' is registered twice (by '{self.current_plugin}')"
            )
        self.rules.append((name, rule))


def _which_replaces(first: str, second: str) -> str:
    """The fix for two plugins registering one name. Hooks run in plugin order, not in the
    order of intent: the third-party plugin is the one that means to replace ndplan's own
    entry, whichever registered first."""
    if BUILTIN_NAME in (first, second):
        other = second if first == BUILTIN_NAME else first
        return f"pass replace=True in '{other}' to replace the built-in one"
    return (
        "pass replace=True in the plugin that should win, or disable one (NDPLAN_DISABLE_PLUGINS)"
    )
