"""A test plugin (``ndplan -p nan_memory``): the built-in memory model, except that a
layer's activations come back as NaN bytes under full recompute, so the fault tests can
watch ndplan blame a memory model's bad output on its plugin. Loaded through
PYTHONPATH=tests/plugins."""

from __future__ import annotations

from ndplan.core.memory import NdplanMemoryModel
from ndplan.plugins.hookspecs import hookimpl


class NanMemoryModel(NdplanMemoryModel):
    name = "ndplan"

    def layer_activation_bytes(self, ctx, layout, kind, recompute):
        if recompute is None:  # full recompute
            return float("nan")
        return super().layer_activation_bytes(ctx, layout, kind, recompute)


@hookimpl
def ndplan_register_memory_models(registry):
    registry.add("ndplan", NanMemoryModel, replace=True)
