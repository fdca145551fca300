"""A test plugin (``ndplan -p slow_tp_cost``): a second cost model, 'slow-tp', beside the
built-in one (TP traffic three times as slow), chosen with ``--cost-model slow-tp``.
Loaded through PYTHONPATH=tests/plugins."""

from __future__ import annotations

from ndplan.core.performance import NdplanCostModel
from ndplan.plugins.hookspecs import hookimpl


class SlowTensorParallel(NdplanCostModel):
    def layer_seconds(self, ctx, layout, kind, recompute):
        parts = dict(super().layer_seconds(ctx, layout, kind, recompute))
        parts["tp_comm"] *= 3.0
        return parts


@hookimpl
def ndplan_register_cost_models(registry):
    registry.add("slow-tp", SlowTensorParallel)
