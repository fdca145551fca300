"""Hook specifications: how a plugin contributes components to ndplan.

Every hook is called when a process assembles the components: in the run's own
process, and again in each worker process of a parallel executor (so a hook only
registers; side effects would repeat). Nothing calls a hook per candidate. Every
``registry`` argument has ``registry.add(name, value, *, replace=False, aliases=())``
(the last two by keyword): a name is registered once, and a plugin that means to
replace a built-in says so with ``replace=True``.
Built-in implementations are marked ``trylast``, so a user's plugin is asked
first. All hooks return None; their effect is what they add to the registry.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("ndplan")
hookimpl = pluggy.HookimplMarker("ndplan")


# --------------------------------------------------------------- inputs


@hookspec
def ndplan_register_devices(registry):
    """Contribute device types.

    :param registry: a registry of :class:`ndplan.core.cluster.DeviceSpec` by id;
        add each device with its aliases, e.g.
        ``registry.add(spec.id, spec, aliases=spec.aliases)``.
    """


@hookspec
def ndplan_register_presets(registry):
    """Contribute built-in model presets.

    :param registry: a registry of preset loaders by id: each value is a callable
        returning the preset's ``config.json``-shaped dict.
    """


@hookspec
def ndplan_register_model_readers(registry):
    """Contribute readers of framework configs (the ModelReader port).

    :param registry: a registry of :class:`ndplan.core.ports.ModelReader` by name.
        Readers are tried in name order; the first whose ``can_read`` is true reads.
    """


# --------------------------------------------------------------- pricing


@hookspec
def ndplan_register_memory_models(registry):
    """Contribute memory models (the MemoryModel port).

    :param registry: a registry of factories by name; ``factory()`` returns a
        MemoryModel. The built-in names are ``ndplan`` and ``megatron``.
    """


@hookspec
def ndplan_register_cost_models(registry):
    """Contribute step-time models (the CostModel port).

    :param registry: a registry of factories by name; ``factory(calibration)``
        returns a CostModel. The built-in name is ``ndplan``.
    """


@hookspec
def ndplan_register_knapsack_solvers(registry):
    """Contribute recompute solvers (the KnapsackSolver port).

    :param registry: a registry of factories by name; ``factory(bucket_bytes)``
        returns a KnapsackSolver. The built-in name is ``dp``.
    """


@hookspec
def ndplan_register_refusal_rules(registry):
    """Contribute extra refusal rules, checked after the built-in ones.

    :param registry: ``registry.add(name, rule)`` where ``rule(layout, context)``
        returns a reason string to refuse the candidate, or None (anything else is a
        plugin error). The name is the refusal reason counted in the summary; the debug
        sinks record ``name: reason``.
    """


# --------------------------------------------------------------- running and output


@hookspec
def ndplan_register_executors(registry):
    """Contribute executors (the Executor port).

    :param registry: a registry of factories by name; ``factory(jobs, options)``
        returns an Executor. Built in: ``serial``, ``pool``, ``ray``.
    """


@hookspec
def ndplan_register_debug_sinks(registry):
    """Contribute debug sinks (the DebugSink port).

    :param registry: a registry of factories by name; ``factory()`` returns a
        DebugSink. Built in: ``csv``, ``jsonl``, ``stderr``, ``null``.
    """


@hookspec
def ndplan_register_exporters(registry):
    """Contribute exporters of plans to framework configs (the Exporter port).

    :param registry: a registry of :class:`ndplan.core.ports.Exporter` by format name
        (``--export NAME``). Built in: ``megatron``, ``torchtitan``, ``mindformers``,
        ``deepspeed``, ``ndplan``.
    """
