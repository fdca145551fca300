"""What a pricing worker runs: rebuild the pricing state from a plain recipe, once.

The recipe holds only validated, picklable inputs (model spec, cluster, job,
options, calibration) and the plugins the main process loaded, so each worker
loads the same ones. Expensive one-off analyses the main process already ran are
handed over in ``analyses`` and seeded into the worker's caches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ndplan.core.assumptions import Assumption, AssumptionRecorder
from ndplan.core.calibration import Calibration
from ndplan.core.cluster import Cluster
from ndplan.core.context import PricingContext
from ndplan.core.job import Job
from ndplan.core.model import ModelSpec
from ndplan.core.search import SearchPricing


@dataclass(frozen=True)
class SearchRecipe:
    """The plain inputs a worker rebuilds its pricing context from."""

    model: ModelSpec
    cluster: Cluster
    job: Job
    calibration: Calibration
    memory_model: str
    cost_model: str
    knapsack_solver: str
    bucket_bytes: int
    capacity_bytes: int | None
    balance_reserve_bytes: int
    reserve_bytes: int | None
    plugins: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    device_files: tuple[str, ...] = ()
    debug: bool = False
    strict: bool = False
    analyses: dict[Any, Any] = field(default_factory=dict)
    token: str = ""
    """Identifies one search, so a long-lived worker rebuilds for a new one."""


_STATE: dict[str, tuple[SearchPricing, AssumptionRecorder]] = {}
"""Per worker process: the pricing state of the current recipe (rebuilt only when it changes)."""


def build_pricing(recipe: SearchRecipe) -> tuple[SearchPricing, AssumptionRecorder]:
    from ndplan.bootstrap import bootstrap
    from ndplan.planner import Planner, PricingOptions

    components = bootstrap(
        plugins=recipe.plugins, disabled=recipe.disabled, device_files=recipe.device_files
    )
    recorder = AssumptionRecorder(strict=recipe.strict)
    ctx = PricingContext(
        model=recipe.model,
        cluster=recipe.cluster,
        job=recipe.job,
        recorder=recorder,
        calibration=recipe.calibration,
        capacity_bytes=recipe.capacity_bytes,
        balance_reserve_bytes=recipe.balance_reserve_bytes,
        reserve_bytes=recipe.reserve_bytes,
    )
    ctx.cache.update(recipe.analyses)
    options = PricingOptions(
        memory_model=recipe.memory_model,
        cost_model=recipe.cost_model,
        knapsack_solver=recipe.knapsack_solver,
        bucket_bytes=recipe.bucket_bytes,
    )
    pricer = Planner(components).pricer(ctx, options)
    return SearchPricing(pricer, debug=recipe.debug), recorder


def run_task(
    recipe_phase: tuple[SearchRecipe, str], chunk: Sequence[Any]
) -> tuple[list[Any], list[Assumption]]:
    """Price one chunk of candidates in this process; returns (values, assumptions)."""
    recipe, phase = recipe_phase
    state = _STATE.get(recipe.token)
    if state is None:
        _STATE.clear()
        state = _STATE[recipe.token] = build_pricing(recipe)
    pricing, recorder = state
    values = getattr(pricing, phase)(chunk)
    return values, list(recorder.items)
