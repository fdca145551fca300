"""What a pricing worker runs: rebuild the pricing state from a plain recipe, once.

The recipe holds only validated, picklable inputs (model spec, cluster, job,
options, calibration) and the plugins the main process loaded, so each worker
loads the same ones. Expensive one-off analyses the main process already ran are
handed over in ``analyses`` and seeded into the worker's caches.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ndplan.core.assumptions import Assumption, AssumptionRecorder
from ndplan.core.calibration import Calibration
from ndplan.core.cluster import Cluster
from ndplan.core.context import PricingContext
from ndplan.core.job import Job
from ndplan.core.model import ModelSpec
from ndplan.core.search import SearchPricing, collector_paused

from .faults import describe_candidate, per_item

ANALYSES = ("options", "front", "quick", "layer_cost", "layer_s")
"""Cache entries worth handing over: per-kind recompute options and fronts, the cheap
bounds, and per-layer costs — computed once in the main process, read by every worker."""


class SharedAnalyses(Mapping):
    """The main process's one-off analyses, read live from its pricing cache.

    Pickles as a plain dict of the entries present at that moment (the pool and Ray
    pickle a recipe once, when they first send it: after the main process's bound
    pass). An entry that does not pickle (a plugin may cache anything) is left out;
    the worker then computes it itself.
    """

    def __init__(self, cache: dict[Any, Any], prefixes: tuple[str, ...] = ANALYSES) -> None:
        self._cache = cache
        self._prefixes = prefixes

    def _keys(self) -> list[Any]:
        return [
            k for k in list(self._cache) if isinstance(k, tuple) and k and k[0] in self._prefixes
        ]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __getitem__(self, key: Any) -> Any:
        if not (isinstance(key, tuple) and key and key[0] in self._prefixes):
            raise KeyError(key)
        return self._cache[key]

    def snapshot(self) -> dict[Any, Any]:
        out = {}
        for key in self._keys():
            value = self._cache[key]
            try:
                pickle.dumps((key, value), pickle.HIGHEST_PROTOCOL)
            except Exception:
                continue
            out[key] = value
        return out

    def __reduce__(self):
        return (dict, (self.snapshot(),))


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
    analyses: Mapping[Any, Any] = field(default_factory=dict)
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
    """Price one chunk of candidates in this process; returns (values, assumptions).

    Candidates are priced one at a time, so a failure names the candidate and says
    whether a plugin's code or ndplan's raised (see ``faults``)."""
    recipe, phase = recipe_phase
    state = _STATE.get(recipe.token)
    if state is None:
        _STATE.clear()
        state = _STATE[recipe.token] = build_pricing(recipe)
    pricing, recorder = state
    with collector_paused():
        values = per_item(getattr(pricing, phase), chunk, recipe.plugins)
    return values, list(recorder.items)


run_task.describe = describe_candidate  # type: ignore[attr-defined]
"""How an executor names an item in an error line (e.g. when a worker dies)."""
