"""Faults while pricing: which candidate failed, and whose code raised.

An exception while pricing one candidate becomes one line naming the candidate
and the error. It is a plugin error (exit 4) when the innermost frame of the
traceback that belongs either to ndplan or to a plugin belongs to a plugin — a
module the run loaded with ``-p``/``NDPLAN_PLUGINS`` or an ``ndplan`` entry
point, or one of their submodules — and an internal error (exit 5) otherwise.
Frames of other libraries (numpy, the standard library) are skipped, so a
plugin that divides by zero in numpy is still the plugin's fault.

A value a plugin's cost or memory model returns that cannot be priced with (a NaN, a
negative time or size, a string) is checked where the pricer receives it
(``core.pricing.CheckedCostModel``, ``CheckedMemoryModel``) and blamed on the plugin by
the module of the model's class.

The same guard runs in the main process (serial pricing) and in every worker, so
the message and the exit code do not depend on the executor. Every message is one line
(``exception_text``), however many lines the exception's own text spans.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ndplan.core.errors import InternalError, NdplanError, PluginError, exception_text, one_line
from ndplan.core.pricing import CheckedPort, PortOutputError, is_ndplan_module
from ndplan.core.search import Candidate, SearchPricing, candidate_dict, candidate_text

ENTRY_POINT_GROUP = "ndplan"


def describe_candidate(c: Candidate) -> str:
    """``tp=2 pp=4 … schedule=1f1b``: every degree of one candidate, for error lines."""
    return candidate_text(candidate_dict(c))


def entry_point_modules() -> tuple[str, ...]:
    """Modules of the plugins registered under the ``ndplan`` entry-point group."""
    try:
        return tuple(sorted({ep.module for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}))
    except Exception:  # a broken distribution's metadata must not hide the real error
        return ()


def _owner(module: str, plugins: Iterable[str]) -> str | None:
    for name in plugins:
        if module == name or module.startswith(name + "."):
            return name
    return None


@dataclass(frozen=True)
class Blame:
    """Whose fault an exception is: the plugin, and — when ndplan's own code raised while
    holding one of the plugin's objects — that object's class."""

    plugin: str
    via: str | None = None

    def message(self, exc: BaseException) -> str:
        if isinstance(exc, PortOutputError):  # says itself what was wrong, and where
            return f"plugin '{self.plugin}': {one_line(exc)}"
        error = exception_text(exc)
        if self.via is None:
            return f"plugin '{self.plugin}' raised {error}"
        # A cost model returning a string where seconds belong fails in the code that adds
        # them up, which is ndplan's; the object it was handling is the plugin's.
        return (
            f"plugin '{self.plugin}': ndplan failed on what its {self.via} gave it ({error}); "
            "check the types and values it returns"
        )


def blame(exc: BaseException, plugins: Iterable[str]) -> Blame | None:
    """The plugin at fault for ``exc``, or None when it is ndplan's own. The innermost frame
    of a plugin or of ndplan decides: a plugin's frame blames the plugin; an ndplan frame
    blames the plugin whose object (``self``, a cost or memory model in hand) it was
    working on, else no one but ndplan. A :class:`PortOutputError` (a bad value a plugin's
    model returned) names the module of the model's class itself."""
    owners = _owners(plugins)
    if isinstance(exc, PortOutputError) and exc.owner:
        return Blame(_owner(exc.owner, owners) or exc.owner)
    for frame, _ in reversed(list(traceback.walk_tb(exc.__traceback__))):
        module = str(frame.f_globals.get("__name__", ""))
        owner = _owner(module, owners)
        if owner is not None:
            return Blame(owner)
        if is_ndplan_module(module):
            for value in frame.f_locals.values():
                if isinstance(value, CheckedPort):
                    value = value.model  # the check is ndplan's; the model is the plugin's
                kind = type(value)
                owner = _owner(str(kind.__module__), owners)
                if owner is not None:
                    return Blame(owner, kind.__name__)
            return None
    return None


def plugin_origin(exc: BaseException, plugins: Iterable[str]) -> str | None:
    """The plugin module at fault for ``exc`` (:func:`blame`), or None."""
    found = blame(exc, plugins)
    return found.plugin if found is not None else None


def classify(exc: Exception, what: str, plugins: Iterable[str]) -> NdplanError:
    """One-line error for an exception raised while working on ``what``."""
    found = blame(exc, plugins)
    if found is not None:
        return PluginError(f"{what}: {found.message(exc)}")
    return InternalError(
        f"{what}: internal error: {exception_text(exc)} (rerun with NDPLAN_DEBUG=1 for a traceback)"
    )


def per_item(
    fn: Callable[[Sequence[Any]], list[Any]],
    items: Sequence[Any],
    plugins: Iterable[str],
    describe: Callable[[Any], str] = describe_candidate,
) -> list[Any]:
    """``fn`` over ``items`` one at a time, so a failure names the item that failed.

    ndplan's own errors (invalid input, strict-mode assumptions, plugin errors already
    classified) pass through unchanged; anything else is classified.
    """
    out: list[Any] = []
    for item in items:
        try:
            out.extend(fn([item]))
        except NdplanError:
            raise
        except Exception as exc:
            raise classify(exc, f"candidate {describe(item)}", plugins) from exc
    return out


def guarded_rule(name: str, rule: Callable[..., Any], plugins: Iterable[str]) -> Callable[..., Any]:
    """A refusal rule whose failure names the rule and the layout it was judging, and is
    classified like a pricing failure (a plugin's rule raising is a plugin error, exit 4)."""

    def judge(layout, ctx):
        try:
            reason = rule(layout, ctx)
        except NdplanError:
            raise
        except Exception as exc:
            what = f"refusal rule '{name}' on layout {layout.label}"
            raise classify(exc, what, plugins) from exc
        if reason is not None and not isinstance(reason, str):
            # A rule that answers 42 or True would refuse silently with no reason to show.
            owner = plugin_origin_of(rule, plugins) or name
            raise PluginError(
                f"refusal rule '{name}' (plugin '{owner}') returned a "
                f"{type(reason).__name__} for layout {layout.label}; return a reason string "
                "to refuse, or None"
            )
        return reason

    return judge


def plugin_origin_of(fn: Callable[..., Any], plugins: Iterable[str]) -> str | None:
    """The plugin module that defines ``fn``, if any."""
    return _owner(str(getattr(fn, "__module__", "")), _owners(plugins))


def _owners(plugins: Iterable[str]) -> tuple[str, ...]:
    """The modules whose code is a plugin's: those the run loaded and the entry points."""
    return (*plugins, *entry_point_modules())


class GuardedPricing(SearchPricing):
    """SearchPricing whose every candidate failure names the candidate and its origin."""

    def __init__(self, pricing: SearchPricing, plugins: Iterable[str] = ()) -> None:
        super().__init__(pricing.pricer, debug=pricing.debug)
        self.plugins = tuple(plugins)
        # The enumeration weighs the output layer through the cost model (the balanced
        # split): a failure there is named and classified like a candidate's.
        weigh = self.pricer.head_weight

        def guarded(layout):
            try:
                return weigh(layout)
            except NdplanError:
                raise
            except Exception as exc:
                what = (
                    f"weighing the output layer at tp={layout.tp} pp={layout.pp} "
                    f"cp={layout.cp} mbs={layout.mbs} recompute={layout.recompute}"
                )
                raise classify(exc, what, self.plugins) from exc

        self.pricer.ctx.layer_splits.weigh_head_with(guarded)

    def quick_bounds(self, candidates):
        try:
            return super().quick_bounds(candidates)
        except NdplanError:
            raise
        except Exception:
            pass
        out: list[float] = []
        for c in candidates:  # once more one at a time, to name the candidate that fails
            try:
                out.extend(super().quick_bounds((c,)))
            except NdplanError:
                raise
            except Exception as exc:
                raise classify(exc, f"candidate {describe_candidate(c)}", self.plugins) from exc
        return out

    def floor_bound(self, c: Candidate, quick: float) -> float:
        try:
            return super().floor_bound(c, quick)
        except NdplanError:
            raise
        except Exception as exc:
            raise classify(exc, f"candidate {describe_candidate(c)}", self.plugins) from exc

    def screen(self, candidates):
        return per_item(super().screen, candidates, self.plugins)

    def price(self, candidates):
        return per_item(super().price, candidates, self.plugins)
