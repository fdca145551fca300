"""ndplan: analytic planning of N-dimensional parallelism for LLM training.

The public surface is what ``__all__`` lists; everything else may change. The names are
imported on first use, so ``import ndplan`` (and the CLI's start) stays cheap. Plugins
use ``ndplan.plugins.hookspecs.hookimpl`` and the ports they implement
(``ndplan.core.ports``), as docs/architecture.md shows.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_PUBLIC = {
    "Planner": "ndplan.planner",
    "PricingOptions": "ndplan.planner",
    "Job": "ndplan.core.job",
    "Layout": "ndplan.core.layout",
    "SearchSpace": "ndplan.core.layout",
    "Plan": "ndplan.core.plan",
    "NdplanError": "ndplan.core.errors",
    "InvalidInputError": "ndplan.core.errors",
    "InfeasibleError": "ndplan.core.errors",
    "PluginError": "ndplan.core.errors",
}

__all__ = [
    "InfeasibleError",
    "InvalidInputError",
    "Job",
    "Layout",
    "NdplanError",
    "Plan",
    "Planner",
    "PluginError",
    "PricingOptions",
    "SearchSpace",
    "__version__",
]

if TYPE_CHECKING:
    from ndplan.core.errors import InfeasibleError, InvalidInputError, NdplanError, PluginError
    from ndplan.core.job import Job
    from ndplan.core.layout import Layout, SearchSpace
    from ndplan.core.plan import Plan
    from ndplan.planner import Planner, PricingOptions


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'ndplan' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
