"""A test plugin (``ndplan -p search_rules``): a third-party refusal rule that refuses
every candidate with context parallelism, counted as ``search_rules_no_cp``. Loaded
through PYTHONPATH=tests/plugins (or ``bootstrap(extra=[search_rules])``)."""

from __future__ import annotations

from ndplan.plugins.hookspecs import hookimpl

NAME = "search_rules_no_cp"
CALLS: list[tuple[type, type]] = []
"""(type(layout), type(context)) of the first call per run, to check the rule's signature."""


def no_context_parallel(layout, context):
    if not CALLS:
        CALLS.append((type(layout), type(context)))
    return "context parallelism is off limits here" if layout.cp > 1 else None


@hookimpl
def ndplan_register_refusal_rules(registry):
    registry.add(NAME, no_context_parallel)
