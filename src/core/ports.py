"""Ports: the seams where the outside world, or a user's own model, plugs in.

Each is a small ``typing.Protocol``. The search depends only on these; the
adapters that implement them register through the plugin hooks
(``ndplan.plugins.hookspecs``), the built-in ones exactly as a third party would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .cluster import DeviceSpec
    from .context import PricingContext, StagePlacement
    from .kernels.knapsack import LayerGroup, LayerOption, PipelineChoice, StageChoice
    from .layout import Layout
    from .model import LayerKind, ModelSpec
    from .plan import Plan, TimeBreakdown

Recompute = frozenset[str] | None
"""Which recomputable ops of a layer are recomputed: an empty set keeps everything,
``None`` recomputes the whole layer (full recompute); ``{"offload"}`` recomputes nothing
and moves the layer's saved activations to host memory between its forward and its
backward (activation offload)."""

REFETCH_PART = "refetch_working_set"
"""The static part a stage needs only while one of its layers is re-run or brought back
from the host in the backward: the pricer drops it on stages whose layers all keep their
activations (option ``none``)."""


@runtime_checkable
class MemoryModel(Protocol):
    """Per-device memory of one candidate, per pipeline stage.

    Why a seam: frameworks keep different tensors (fp32 vs bf16 gradients, fused
    losses, FSDP's sharded fp32 parameters), and users who measured their own
    stack want to substitute their numbers. Pure: no I/O. It does not decide
    feasibility; the search compares the result with the budget.
    """

    name: str

    def stage_static_bytes(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> dict[str, int]:
        """Everything on the stage's busiest device that the recompute choice does not
        change (weights, gradients, optimizer state, buffers, the backward working set,
        the reserve, embedding and loss activations), by part. Name the working set of
        re-running or fetching back a layer ``REFETCH_PART``: the pricer drops it on
        stages that recompute and offload nothing."""
        ...

    def layer_activation_bytes(
        self, ctx: PricingContext, layout: Layout, kind: LayerKind, recompute: Recompute
    ) -> int:
        """Bytes one layer of ``kind`` keeps per micro-batch in flight under ``recompute``."""
        ...


@runtime_checkable
class CostModel(Protocol):
    """Seconds: per layer and micro-batch, per stage, and the composition into one step.

    Why a seam: efficiency and overlap differ by device, kernel library and
    framework; a user's calibrated or profiled model replaces the analytic one
    without touching the search. Pure: no I/O.

    Optional: ``step_floor_seconds(ctx, layout, stages, layers_s) -> float``, a lower
    bound on ``step`` when one micro-batch through every decoder layer, each at its
    fastest option, takes ``layers_s`` (the built-in model: its pipeline of stages that
    balanced, the traffic they cannot hide, the optimizer step and its fixed overhead).
    The search takes it where it is above its own quick bound, so it skips more layouts
    unpriced; without it the bounds leave all that out. A model that prices stages or
    the step its own way must not inherit the analytic model's floor (0.0 is always safe).
    ``stage_seconds`` must sum this model's own ``layer_seconds`` (the knapsack and the
    bounds read those): override ``NdplanCostModel`` by subclassing, not by wrapping it.

    The balanced layer split weighs the output layer by this model too: the last
    stage's ``forward + backward + recompute`` from ``stage_seconds`` with no layers,
    with and without the head, against ``layer_seconds`` (``Pricer.head_weight``).
    """

    name: str

    def layer_seconds(
        self, ctx: PricingContext, layout: Layout, kind: LayerKind, recompute: Recompute
    ) -> Mapping[str, float]:
        """One layer, one micro-batch, by part (``forward``, ``backward``, ``recompute``,
        ``tp_comm``, ``cp_comm``, ``ep_comm``: exposed seconds); the values sum to its time.
        The recompute solver builds each option's time from this."""
        ...

    def stage_seconds(
        self,
        ctx: PricingContext,
        layout: Layout,
        stage: StagePlacement,
        assignment: Sequence[tuple[int, int, int, Recompute]],
    ) -> dict[str, float]:
        """One micro-batch on one stage by part, for (kind index, in-flight, layer count,
        recompute) groups, including the stage's embedding, head, loss and pipeline sends."""
        ...

    def step(
        self,
        ctx: PricingContext,
        layout: Layout,
        stages: Sequence[StagePlacement],
        stage_layer_seconds: Sequence[Mapping[str, float]],
    ) -> TimeBreakdown:
        """Compose per-stage, per-micro-batch seconds into one step (pipeline schedule,
        bubble, data-parallel communication, optimizer); the parts sum to the step time."""
        ...


@runtime_checkable
class KnapsackSolver(Protocol):
    """Chooses per-layer recompute options within a stage's memory budget.

    Why a seam: the default is an exact DP; users may trade exactness for speed
    (a coarser bucket, a greedy heuristic) or plug an ILP. Pure.
    """

    def choose(self, groups: Sequence[LayerGroup], budget_bytes: int) -> StageChoice | None:
        """Least total time within the budget, least memory among the fastest; None if nothing fits."""
        ...

    def least_times(self, groups: Sequence[LayerGroup], budgets: Sequence[int]) -> Any:
        """Least time for every budget, in one pass."""
        ...

    def suffix_times(
        self, layers: Sequence[tuple[Sequence[LayerOption], int]], budgets: Sequence[int]
    ) -> Any:
        """Least time of every suffix of ``layers`` within its budget, in one pass."""
        ...

    def pp_lite(self, stages: Sequence[tuple[Sequence[LayerGroup], int, float]]) -> PipelineChoice:
        """Every stage of an even split solved independently; the pipeline runs at the slowest."""
        ...


@runtime_checkable
class Executor(Protocol):
    """Prices items with a task and returns results in the order given.

    Why a seam: the search knows nothing of processes; an executor knows nothing
    of parallelism planning. Serial, a process pool and Ray implement it.
    """

    name: str

    def map(
        self, task: Callable[[Any, Sequence[Any]], list[Any]], recipe: Any, items: Sequence[Any]
    ) -> list[Any]:
        """``task(recipe, chunk)`` over contiguous chunks of ``items``; results by position."""
        ...

    def close(self) -> None:
        """Release workers (join on success)."""
        ...

    def terminate(self) -> None:
        """Stop at once (on error or Ctrl-C), leaving no orphan processes."""
        ...


@runtime_checkable
class ModelReader(Protocol):
    """Reads a model (and possibly degrees, batch, recompute) from a framework's config.

    Why a seam: every framework states models its own way; a reader maps one onto
    the ModelSpec so the search never sees a framework's names.
    """

    name: str

    def can_read(self, path: Path) -> bool:
        """Whether this reader recognises the file or directory."""
        ...

    def read(self, path: Path, recorder: Any) -> ModelSpec: ...


PerLayerPricer = Callable[[Sequence[str]], "Plan"]
"""Prices the plan's layout with a recompute option named for each decoder layer, in model
order (``none``, ``full``, ``offload`` or switches such as ``norm+mlp``):
``Planner.estimate_per_layer`` bound to the plan's context and layout."""


@dataclass(frozen=True, slots=True)
class StandIn:
    """What a config runs in place of a per-layer recompute its framework cannot state."""

    description: str
    """The setting written, in words (``full recompute of the first 2 layers of each chunk``)."""
    plan: Plan | None
    """The plan's layout priced with that setting; None where the exporter was given no
    pricer (the header then says the setting is not priced)."""


@dataclass(frozen=True, slots=True)
class Exported:
    """A plan written in a framework's terms."""

    text: str
    """The config; the caller writes it atomically."""
    caveats: tuple[str, ...] = ()
    """One line each: where the framework cannot run the plan exactly as it was priced
    (a per-layer recompute choice it has no switch for, a degree it takes from the model
    code) and what the text does instead. The caller shows them to the user."""
    stand_in: StandIn | None = None
    """Where the framework cannot state the plan's per-layer recompute and the setting
    written was priced: that setting and its price."""


@runtime_checkable
class Exporter(Protocol):
    """Writes a plan as a framework's config (Megatron arguments, torchtitan TOML, ...).

    Why a seam: the plan is only useful in the user's tool; each framework names
    the same layout differently.
    """

    name: str
    suffix: str
    """The file name ending the format uses (``.sh``, ``.toml``)."""
    framework: str | None
    """The framework whose plans it writes (a plan searched for another framework may
    use options this one lacks); None writes a plan of any."""

    def render(
        self, plan: Plan, ctx: PricingContext, price: PerLayerPricer | None = None
    ) -> Exported:
        """The config of ``plan``, priced in ``ctx`` (the model, cluster and job). Where
        the framework cannot state the plan's per-layer recompute, ``price`` prices the
        layout with another option per layer, so the exporter can write the fastest
        setting the framework states that fits, and say what it costs."""
        ...


@runtime_checkable
class DebugSink(Protocol):
    """Receives every priced candidate's memory and time parts, and every refusal.

    Why a seam: users debugging a surprising ranking want every number, in the
    format their tools read (CSV, JSON lines, a database). Records arrive in the
    search's order, whatever the executor.

    A sink that writes files into the debug folder may list their names in a ``files``
    attribute; the CLI then refuses to overwrite an earlier run's without ``--force``.

    Ending: the caller that opened the sink (the CLI) calls ``close()`` once the run has
    succeeded (or found that nothing fits: the records say why), and ``close()`` is where
    a sink commits its records. A run that fails or is interrupted after the sink was
    opened calls its optional ``abort()`` instead — drop the records, leave no files —
    or, where the sink has none, ``close()``. What ``abort()`` raises is ignored (the
    run reports its own error); a ``close()`` that raised is followed by neither.
    Plugins' sinks are closed before the built-in ones, which write only in ``close()``
    and leave no file behind a failed run. What ``open()`` raises is the plugin's error.
    """

    name: str

    def open(self, directory: Path | None) -> None: ...

    def memory(self, candidate: Mapping[str, Any], parts: Mapping[str, float]) -> None: ...

    def time(self, candidate: Mapping[str, Any], parts: Mapping[str, float]) -> None: ...

    def refusal(self, candidate: Mapping[str, Any], reason: str) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class DeviceCatalog(Protocol):
    """Device types by id and alias.

    Why a seam: clusters differ (new parts, derated clocks, custom fabrics); a
    plugin or a user file adds a device without code changes in the search.
    """

    def get(self, name: str) -> DeviceSpec:
        """The device for an id or alias; an unknown name raises with close matches."""
        ...

    def __iter__(self) -> Iterator[DeviceSpec]: ...


RefusalRule = Callable[["Layout", "PricingContext"], "str | None"]
"""An extra refusal rule: returns a reason to refuse the candidate, or None."""


def missing_members(obj: object, port: type) -> list[str]:
    """The attributes and methods of ``port`` that ``obj`` lacks (a plugin's component is
    checked where it is made, so a wrong one is named there, not deep inside a search)."""
    declared = (*getattr(port, "__annotations__", {}), *vars(port))
    return sorted({n for n in declared if not n.startswith("_") and not hasattr(obj, n)})
