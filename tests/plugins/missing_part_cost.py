"""A test plugin (``ndplan -p missing_part_cost``): the built-in cost model, except that
its stage seconds leave out the backward part, which ndplan's own code then misses."""

from __future__ import annotations

from ndplan.core.performance import NdplanCostModel
from ndplan.plugins.hookspecs import hookimpl


class MissingBackward(NdplanCostModel):
    def stage_seconds(self, ctx, layout, stage, assignment):
        parts = dict(super().stage_seconds(ctx, layout, stage, assignment))
        del parts["backward"]
        return parts


@hookimpl
def ndplan_register_cost_models(registry):
    registry.add("ndplan", MissingBackward, replace=True)
