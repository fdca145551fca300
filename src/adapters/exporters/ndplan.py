"""ndplan's own JSON for a plan: the plan as ``ndplan estimate --json`` prints it, with
the inputs it was priced for. ``ndplan search --baseline FILE`` reads it back."""

from __future__ import annotations

import json

from ndplan.core.context import PricingContext
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported, PerLayerPricer


class NdplanExporter:
    """``--export ndplan``: every field of the plan, whatever its framework."""

    name = "ndplan"
    suffix = ".json"
    framework = None

    def render(
        self, plan: Plan, ctx: PricingContext, price: PerLayerPricer | None = None
    ) -> Exported:
        document = {
            "inputs": {
                "model": ctx.model.name,
                "device": ctx.device.id,
                "devices": ctx.cluster.num_devices,
                # As stated: what the user left unset stays unset (the defaults are
                # the assumptions the search reported).
                "job": ctx.job.model_dump(mode="json", exclude_none=True),
            },
            **plan.model_dump(mode="json"),
        }
        return Exported(text=json.dumps(document, indent=2, ensure_ascii=False) + "\n")
