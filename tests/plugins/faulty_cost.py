"""A test plugin (``ndplan -p faulty_cost``): the built-in cost model, except that it
raises on candidates with tp 2 and cp 2, so the fault tests can watch a plugin fail
inside a worker. Loaded through PYTHONPATH=tests/plugins."""

from __future__ import annotations

from ndplan.core.performance import NdplanCostModel
from ndplan.plugins.hookspecs import hookimpl


class FaultyCostModel(NdplanCostModel):
    name = "ndplan"

    def step(self, ctx, layout, stages, stage_layer_seconds):
        if layout.tp == 2 and layout.cp == 2:
            raise RuntimeError("faulty_cost refuses tp 2 with cp 2")
        return super().step(ctx, layout, stages, stage_layer_seconds)


@hookimpl
def ndplan_register_cost_models(registry):
    registry.add("ndplan", FaultyCostModel, replace=True)
