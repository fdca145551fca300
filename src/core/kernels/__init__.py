"""Numeric kernels: a readable reference, a numba kernel and a wrapper per algorithm.

Importing this package imports neither numba nor any kernel module: the
wrappers load the compiled engine on the first call that needs it.
"""

from ndplan.core.kernels import knapsack
from ndplan.core.kernels.knapsack import (
    DefaultKnapsackSolver,
    GroupChoice,
    LayerGroup,
    LayerOption,
    PipelineChoice,
    StageChoice,
    choose,
    least_times,
    pareto_front,
    pp_lite,
    suffix_times,
)

__all__ = [
    "DefaultKnapsackSolver",
    "GroupChoice",
    "LayerGroup",
    "LayerOption",
    "PipelineChoice",
    "StageChoice",
    "choose",
    "knapsack",
    "least_times",
    "pareto_front",
    "pp_lite",
    "suffix_times",
]
