"""Pricing one layout: memory per stage, the recompute choice, the step time.

The search and ``ndplan estimate`` share this path; it depends only on the ports
(MemoryModel, CostModel, KnapsackSolver).
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from numbers import Real

from .context import PricingContext, StagePlacement, layer_counts, layer_key, placement_key
from .counting import count_flops, model_flops_per_step
from .frameworks import STATED_PER_STAGE
from .kernels.knapsack import LayerGroup, StageChoice
from .layout import Layout
from .memory import charged_static, keeps_all, stage_memory
from .plan import MemoryBreakdown, Plan, RecomputeRange, TimeBreakdown
from .ports import REFETCH_PART, CostModel, KnapsackSolver, MemoryModel, Recompute
from .recompute import (
    OFFLOADED,
    activation_offload_offered,
    chunk_stages,
    kind_front,
    kind_options,
    option_name,
    parse_option,
    stated_settings,
    stated_stage_options,
)

Assignment = tuple[tuple[int, int, int, Recompute], ...]
"""Per stage: (kind index, in-flight, layer count, recompute) groups."""

KEPT = option_name(frozenset())
"""The option that keeps every activation: nothing re-run or fetched back."""

NONE_OR_OFFLOAD = (KEPT, option_name(OFFLOADED))
"""The options of the ``none`` policy where activation offload is offered."""

_UNSOLVED = object()
"""Marks a stage knapsack not yet in the cache (None is a cached "nothing fits")."""

_INF = math.inf


class PortOutputError(ValueError):
    """What a plugin's port implementation returned cannot be priced with (a NaN, a
    negative time or size, a string where seconds or bytes belong), raised where ndplan
    receives it, with the method, the part and the value. ``owner`` is the module of the
    implementation's class: the fault classifier (``adapters/executors/faults.py``) blames
    its plugin."""

    def __init__(self, message: str, owner: str = "") -> None:
        super().__init__(message)
        self.owner = owner


def bad_part(parts: object) -> tuple[str | None, object] | None:
    """The first ``(part, value)`` of ``parts`` that is no finite number ≥ 0 (seconds, bytes),
    ``(None, parts)`` when ``parts`` is no mapping, None when every part is good. One pass
    over the parts, the common case (a float in range) first."""
    if not isinstance(parts, Mapping):
        return None, parts
    for name, value in parts.items():
        if value.__class__ is float:
            if 0.0 <= value < _INF:  # False for NaN
                continue
        elif isinstance(value, Real) and not isinstance(value, bool) and 0 <= value < _INF:
            continue
        return name, value
    return None


class CheckedPort:
    """A plugin's port implementation behind ndplan's checks of what it returns: the
    subclass checks its port's methods; everything else reads through to the model."""

    def __init__(self, model: object) -> None:
        self.model = model

    def __getattr__(self, name: str):
        try:
            model = self.__dict__["model"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(model, name)


def is_ndplan_module(module: str) -> bool:
    """Whether ``module`` (a dotted name) is ndplan's own code."""
    return module == "ndplan" or module.startswith("ndplan.")


def _ndplans_own(component: object) -> bool:
    """Whether ``component`` is one of ndplan's own (tested) implementations."""
    return is_ndplan_module(type(component).__module__)


class CheckedCostModel(CheckedPort):
    """A cost model that is not ndplan's own, as the pricer calls it.

    What its ``layer_seconds`` and ``stage_seconds`` return is checked where ndplan
    receives it — every part a finite number of seconds ≥ 0 — and so is ``step``'s
    ``step_s``. A bad value is a :class:`PortOutputError` naming the method, the part and
    the value: a NaN compares false with everything (a candidate silently dropped out of
    the ranking), a negative part printed a negative step, and a string failed later in
    ndplan's own arithmetic, far from the plugin. Each check is one pass over the parts,
    on calls the pricer and the search memoise (a stage's seconds, a layer's options).
    Everything else reads through to the model."""

    def layer_seconds(self, ctx, layout, kind, recompute):
        model = self.model
        parts = model.layer_seconds(ctx, layout, kind, recompute)
        bad = bad_part(parts)
        if bad is None and parts.keys() >= REQUIRED_PARTS_SET:
            return parts
        # Only a bad result builds its message.
        where = f"layer kind '{kind.name}' under recompute {option_name(recompute)}"
        if bad is not None:
            raise _bad_output(model, "layer_seconds", bad, where)
        raise _missing_part(model, "layer_seconds", parts, where)

    def stage_seconds(self, ctx, layout, stage, assignment):
        model = self.model
        try:
            parts = model.stage_seconds(ctx, layout, stage, assignment)
        except Exception:
            # A model that sums its own layer_seconds (NdplanCostModel's subclasses) calls
            # it past this wrapper: a string there fails in the sum. Name the layer part.
            fault = self._layer_fault(ctx, layout, assignment)
            if fault is not None:
                raise fault from None
            raise
        bad = bad_part(parts)
        if bad is not None:
            raise self._layer_fault(ctx, layout, assignment) or _bad_output(
                model, "stage_seconds", bad, f"stage {stage.index}"
            )
        if not parts.keys() >= REQUIRED_PARTS_SET:
            raise _missing_part(model, "stage_seconds", parts, f"stage {stage.index}")
        return parts

    def _layer_fault(self, ctx, layout, assignment) -> PortOutputError | None:
        """The error of the first layer of ``assignment`` whose ``layer_seconds`` are bad,
        if one's are: where a stage's seconds went wrong, the layer part that made them
        (only asked once they did, so the checks cost nothing on the way)."""
        try:
            for kind_index, _, _, recompute in assignment:
                self.layer_seconds(ctx, layout, ctx.model.kinds[kind_index], recompute)
        except PortOutputError as exc:
            return exc
        except Exception:  # the model's own error: the stage's stands
            return None
        return None

    def step(self, ctx, layout, stages, stage_layer_seconds):
        model = self.model
        time = model.step(ctx, layout, stages, stage_layer_seconds)
        step_s = getattr(time, "step_s", None)
        if not (step_s.__class__ is float and 0.0 <= step_s < _INF):
            if not isinstance(time, TimeBreakdown):
                raise _bad_output(model, "step", (None, time), expected="a TimeBreakdown")
            if bad_part({"step_s": step_s}) is not None:  # an int in range is good
                raise _bad_output(model, "step", ("step_s", step_s))
        return time


REQUIRED_PARTS = ("forward", "backward", "recompute")
"""Parts ndplan's step adds up by name: a model's layer and stage seconds hold them."""
REQUIRED_PARTS_SET = frozenset(REQUIRED_PARTS)


def _missing_part(model: object, method: str, parts: Mapping, where: str) -> PortOutputError:
    """The error for ``parts`` lacking a part ndplan reads by name (the first missing)."""
    name = next(n for n in REQUIRED_PARTS if n not in parts)
    kind = type(model)
    return PortOutputError(
        f"cost model {kind.__name__}: {method} returned no '{name}' part for {where}; "
        f"it returns seconds by part, {', '.join(REQUIRED_PARTS)} among them",
        owner=kind.__module__,
    )


def compute_s(parts: Mapping[str, float]) -> float:
    """The compute seconds of a layer's or stage's parts: forward, backward, recompute."""
    return parts["forward"] + parts["backward"] + parts["recompute"]


def checked_cost_model(cost: CostModel) -> CostModel:
    """``cost`` as the pricer calls it: ndplan's own models as they are (their outputs are
    tested, and cost nothing to check), any other behind :class:`CheckedCostModel`."""
    return cost if _ndplans_own(cost) else CheckedCostModel(cost)


def _bad_output(
    model: object,
    method: str,
    bad: tuple[str | None, object],
    where: str = "",
    expected: str = "seconds by part",
    port: str = "cost model",
    unit: str = "seconds",
) -> PortOutputError:
    """The error for ``model``'s ``method`` returning ``bad`` (``bad_part``); a part
    named ``""`` is the whole return value."""
    part, value = bad
    kind = type(model)
    at = f" for {where}" if where else ""
    if part is None:
        problem = f"returned a {type(value).__name__}{at}; it returns {expected}"
    else:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        if not isinstance(value, Real):
            shown += f" (a {type(value).__name__})"
        if part:
            problem = (
                f"returned {part}={shown}{at}; every part must be a finite number of {unit} ≥ 0"
            )
        else:
            problem = f"returned {shown}{at}; it must be a finite number of {unit} ≥ 0"
    return PortOutputError(f"{port} {kind.__name__}: {method} {problem}", owner=kind.__module__)


def checked_memory_model(memory: MemoryModel) -> MemoryModel:
    """``memory`` as the pricer calls it: ndplan's own model as it is, any other behind
    :class:`CheckedMemoryModel` (as ``checked_cost_model``)."""
    return memory if _ndplans_own(memory) else CheckedMemoryModel(memory)


def _whole_bytes(value: Real) -> int:
    """A checked byte count as the int the pricer sums: rounded up, so a fractional byte
    errs towards not fitting."""
    return value if value.__class__ is int else math.ceil(value)


class CheckedMemoryModel(CheckedPort):
    """A memory model that is not ndplan's own, as the pricer calls it.

    What its ``stage_static_bytes`` and ``layer_activation_bytes`` return is checked where
    ndplan receives it — every part a finite number of bytes ≥ 0 — and made whole bytes.
    Unchecked, a NaN or a negative activation size failed deep in the recompute knapsack
    and a string in ndplan's sums, each reported as ndplan's internal error rather than
    the plugin's, and a float reached the output as fractional bytes. A bad value is a
    :class:`PortOutputError` naming the method, the part and the value. Everything else
    reads through to the model."""

    def stage_static_bytes(self, ctx, layout, stage):
        model = self.model
        parts = model.stage_static_bytes(ctx, layout, stage)
        bad = bad_part(parts)
        if bad is not None:
            raise _bad_output(
                model,
                "stage_static_bytes",
                bad,
                f"stage {stage.index}",
                expected="bytes by part",
                port="memory model",
                unit="bytes",
            )
        if all(value.__class__ is int for value in parts.values()):
            return parts
        return {name: _whole_bytes(value) for name, value in parts.items()}

    def layer_activation_bytes(self, ctx, layout, kind, recompute):
        model = self.model
        value = model.layer_activation_bytes(ctx, layout, kind, recompute)
        if value.__class__ is int and value >= 0:
            return value
        bad = bad_part({"": value})
        if bad is not None:
            where = f"layer kind '{kind.name}' under recompute {option_name(recompute)}"
            raise _bad_output(
                model, "layer_activation_bytes", bad, where, port="memory model", unit="bytes"
            )
        return _whole_bytes(value)


@dataclass(slots=True)
class PricedLayout:
    """A layout with its memory and time, before it becomes a (pydantic) Plan."""

    layout: Layout
    stages: tuple[StagePlacement, ...]
    static: tuple[dict[str, int], ...] | None
    """Per stage static parts (filled on demand by the breakdown)."""
    activations: tuple[int, ...]
    assignment: tuple[Assignment, ...]
    stage_seconds: tuple[dict[str, float], ...]
    time: TimeBreakdown | None
    peak_bytes: int
    peak_stage: int
    fits: bool
    static_totals: tuple[int, ...] = ()
    layer_options: tuple[Recompute, ...] | None = None
    """Each decoder layer's option where it was given per layer (a stated setting, an
    exported config's): the assignment counts options per group, not which layer runs
    which, and a config states positions (the first N layers of each chunk)."""

    @property
    def totals(self) -> tuple[int, ...]:
        return tuple(s + a for s, a in zip(self.static_totals, self.activations, strict=True))


@dataclass(frozen=True, slots=True)
class MemoryMiss:
    """Why a layout does not fit even fully recomputed: the stage and by how much."""

    stage: int
    over_bytes: int


class Pricer:
    """Prices layouts for one pricing context with the given port implementations."""

    def __init__(
        self, ctx: PricingContext, memory: MemoryModel, cost: CostModel, solver: KnapsackSolver
    ) -> None:
        self.ctx = ctx
        # A plugin's outputs are checked as they come.
        self.memory = checked_memory_model(memory)
        self.cost = checked_cost_model(cost)
        self.solver = solver
        # The balanced split weighs the head as this cost model will price it.
        ctx.layer_splits.weigh_head_with(self.head_weight)

    def head_weight(self, layout: Layout) -> float | None:
        """One micro-batch's output layer and loss on the last stage, in mean decoder
        layers of compute (forward, backward and recompute), as the cost model prices
        them at ``layout``'s degrees: the last stage's seconds beyond those of the same
        stage without the head. Layers count under ``layout``'s recompute policy; under
        ``auto`` as kept, since the stages near the end, which balancing loads, hold the
        fewest micro-batches in flight. None where there is no pipeline or no compute."""
        ctx = self.ctx
        if layout.pp < 2:
            return None
        last = ctx.placement(layout)[-1]
        plain = replace(last, has_head=False, has_mtp=False)
        recompute = self.policy_recompute(layout)
        # A plugin model's parts are checked where they arrive (CheckedCostModel): the
        # sums below meet only numbers, under the names they need.
        head = compute_s(self.cost.stage_seconds(ctx, layout, last, ())) - compute_s(
            self.cost.stage_seconds(ctx, layout, plain, ())
        )
        layers = sum(
            count * compute_s(self.cost.layer_seconds(ctx, layout, kind, recompute))
            for kind, count in ctx.model.kind_counts()
        )
        if layers <= 0 or head <= 0:
            return None
        return head / (layers / ctx.model.num_layers)

    # ------------------------------------------------------------------ assignments

    def policy_recompute(self, layout: Layout) -> Recompute:
        policy = layout.recompute
        if policy == "full":
            return None
        if policy == "selective":
            return self.ctx.framework.selective
        return frozenset()

    def static(
        self, layout: Layout
    ) -> tuple[tuple[StagePlacement, ...], tuple[dict[str, int], ...]]:
        stages = self.ctx.placement(layout)
        return stages, tuple(self.memory.stage_static_bytes(self.ctx, layout, s) for s in stages)

    def _static_totals(self, layout: Layout, stages: tuple[StagePlacement, ...]) -> list[int]:
        """Per stage, the total of its static parts, ``REFETCH_PART`` included."""
        return self._statics(layout, stages)[0]

    def _refetch_bytes(self, layout: Layout, stages: tuple[StagePlacement, ...]) -> list[int]:
        """Per stage, its ``REFETCH_PART``: charged only where a layer recomputes or offloads."""
        return self._statics(layout, stages)[1]

    def _statics(
        self, layout: Layout, stages: tuple[StagePlacement, ...]
    ) -> tuple[list[int], list[int]]:
        """Per stage, (the total of its static parts, its ``REFETCH_PART``); stages with
        one role share them.

        Memoised per layout too (on the shard degrees and the placement), because the
        search asks twice per candidate — the memory check, then the bound."""
        shard = (
            layout.tp,
            layout.cp,
            layout.dp,
            layout.ep,
            layout.expert_tp,
            layout.mbs,
            layout.zero,
            layout.sp,
            layout.offload_optimizer,
            layout.recompute != "none",
        )
        cache = self.ctx.cache
        layout_key = ("statics", shard, *placement_key(layout))
        out = cache.get(layout_key)
        if out is not None:
            return out
        totals, refetches = [], []
        for stage in stages:
            key = ("static_total", stage.role, shard)
            found = cache.get(key)
            if found is None:
                parts = self.memory.stage_static_bytes(self.ctx, layout, stage)
                found = cache[key] = (sum(parts.values()), parts.get(REFETCH_PART, 0))
            totals.append(found[0])
            refetches.append(found[1])
        out = cache[layout_key] = (totals, refetches)
        return out

    def _kind_bytes(self, layout: Layout, recompute: Recompute) -> list[int]:
        """Activation bytes per micro-batch of one layer of each kind under ``recompute``."""
        key = ("kind_bytes", *layer_key(layout), recompute)
        found = self.ctx.cache.get(key)
        if found is None:
            found = self.ctx.cache[key] = [
                self.memory.layer_activation_bytes(self.ctx, layout, kind, recompute)
                for kind in self.ctx.model.kinds
            ]
        return found

    def activation_bytes(self, layout: Layout, assignment: Assignment) -> int:
        kinds = self.ctx.model.kinds
        return sum(
            count * k * self.memory.layer_activation_bytes(self.ctx, layout, kinds[kind], rec)
            for kind, k, count, rec in assignment
        )

    def _lightest_kind_bytes(self, layout: Layout) -> list[int]:
        """Per kind, the bytes per micro-batch of its lightest option: full recompute, or
        activation offload where offered."""
        if not activation_offload_offered(self.ctx):
            return self._kind_bytes(layout, None)
        key = ("lightest_kind_bytes", *layer_key(layout))
        found = self.ctx.cache.get(key)
        if found is None:
            full, offloaded = self._kind_bytes(layout, None), self._kind_bytes(layout, OFFLOADED)
            found = self.ctx.cache[key] = [min(a, b) for a, b in zip(full, offloaded, strict=True)]
        return found

    def lightest_miss(self, layout: Layout) -> MemoryMiss | None:
        """None when every stage fits with its lightest option (full recompute, or
        activation offload where offered) or with every layer kept and no refetch working
        set; else the worst stage's overflow."""
        stages = self.ctx.placement(layout)
        per_kind = self._lightest_kind_bytes(layout)
        budget = self.ctx.budget_bytes
        static_totals, refetches = self._statics(layout, stages)
        worst: MemoryMiss | None = None
        for stage, static, refetch in zip(stages, static_totals, refetches, strict=True):
            over = static + sum(units * per_kind[kind] for kind, units in stage.units) - budget
            if over > 0 and refetch:
                kept = self._kind_bytes(layout, frozenset())
                over = min(
                    over,
                    static
                    - refetch
                    + sum(units * kept[kind] for kind, units in stage.units)
                    - budget,
                )
            if over > 0 and (worst is None or over > worst.over_bytes):
                worst = MemoryMiss(stage.index, over)
        return worst

    def stage_groups(
        self, layout: Layout, stage: StagePlacement, only: tuple[str, ...] | None = None
    ) -> list[LayerGroup]:
        kinds = self.ctx.model.kinds
        in_flights = [k for _, _, k in stage.groups]
        groups = []
        for kind_index, count, k in stage.groups:
            kind = kinds[kind_index]
            front = kind_front(self.ctx, layout, kind, in_flights, self.memory, self.cost, only)
            groups.append(LayerGroup(kind=kind.name, options=front, count=count, in_flight=k))
        return groups

    def choice_to_assignment(
        self, layout: Layout, stage: StagePlacement, choice: StageChoice
    ) -> Assignment:
        kinds = self.ctx.model.kinds
        out = []
        for (kind_index, _, k), group in zip(stage.groups, choice.groups, strict=True):
            by_name = {
                opt.name: rec
                for opt, rec in kind_options(
                    self.ctx, layout, kinds[kind_index], self.memory, self.cost
                )
            }
            for name, count in group.counts:
                out.append((kind_index, k, count, by_name.get(name, parse_option(name))))
        return tuple(out)

    def auto_assignment(
        self, layout: Layout, static_totals: list[int], only: tuple[str, ...] | None = None
    ) -> tuple[Assignment, ...] | None:
        """Per stage, the exact knapsack within what the static memory leaves (``only``:
        among the options of those names); or every layer kept, where that fits without
        the stage's ``REFETCH_PART`` and is at least as fast (then as light).

        Memoised on its true key (spec/search.md): the layer degrees and the combined
        1F1B schedule's unpaired share (which fix every front), the stage's (kind, layers,
        in-flight) groups, and the budget. Layouts that differ only in what moves the
        budget by nothing — the schedule of a one-stage
        pipeline, the ZeRO stage or DP degree where they leave the static bytes equal,
        the candidate re-priced for the final plans — share one solve."""
        out = []
        cache = self.ctx.cache
        degrees = self.ctx.time_key(layout)
        stages = self.ctx.placement(layout)
        refetches = self._refetch_bytes(layout, stages)
        for stage, static, refetch in zip(stages, static_totals, refetches, strict=True):
            budget = self.ctx.budget_bytes - static
            key = ("stage_choice", degrees, stage.groups, budget, refetch, only)
            assignment = cache.get(key, _UNSOLVED)
            if assignment is _UNSOLVED:
                groups = self.stage_groups(layout, stage, only)
                choice = self.solver.choose(groups, budget)
                assignment = None
                if choice is not None:
                    assignment = self.choice_to_assignment(layout, stage, choice)
                if (
                    refetch
                    and (assignment is None or not keeps_all(assignment))
                    and self._keeping_all_wins(layout, stage, groups, choice, budget, refetch)
                ):
                    assignment = tuple(
                        (kind, k, count, frozenset()) for kind, count, k in stage.groups
                    )
                cache[key] = assignment
            if assignment is None:
                return None
            out.append(assignment)
        return tuple(out)

    def _keeping_all_wins(
        self,
        layout: Layout,
        stage: StagePlacement,
        groups: list[LayerGroup],
        choice: StageChoice | None,
        budget: int,
        refetch: int,
    ) -> bool:
        """Whether every layer kept — which frees the stage's ``refetch`` bytes — fits
        ``budget + refetch`` and beats the knapsack's ``choice`` (solved with ``refetch``
        charged) on its own terms: less time, or as little and no more memory."""
        kinds = self.ctx.model.kinds
        memory = 0
        seconds = 0.0
        for (kind_index, count, k), group in zip(stage.groups, groups, strict=True):
            # On the front unless an option as fast and as light beats it (then it is
            # read from the kind's options).
            kept = next((o for o in group.options if o.name == KEPT), None) or next(
                opt
                for opt, rec in kind_options(
                    self.ctx, layout, kinds[kind_index], self.memory, self.cost
                )
                if rec == frozenset()
            )
            memory += count * kept.memory(k)
            if memory > budget + refetch:
                return False
            seconds += count * kept.time
        if choice is None:
            return True
        tolerance = 1e-12 * choice.time_s
        if seconds < choice.time_s - tolerance:
            return True
        return seconds <= choice.time_s + tolerance and memory <= choice.memory_bytes + refetch

    # ------------------------------------------------------------------ pricing

    def price(self, layout: Layout, *, with_time: bool = True) -> PricedLayout:
        ctx = self.ctx
        stages = ctx.placement(layout)
        static_totals = self._static_totals(layout, stages)
        if layout.recompute == "stated" and ctx.framework.stated_recompute != STATED_PER_STAGE:
            return self._price_stated(layout, stages, static_totals)
        if layout.recompute == "auto":
            assignment = self.auto_assignment(layout, static_totals)
            lightest: Recompute = None  # nothing fits: priced fully recomputed
        elif layout.recompute == "stated":
            # Counts per stage: the knapsack among the options such a config names.
            assignment = self.auto_assignment(layout, static_totals, stated_stage_options(ctx))
            lightest = None
            chosen = {group[3] for stage in assignment or () for group in stage}
            if len(chosen) == 1:  # one option everywhere: priced as that fixed policy is
                return self._price_fixed(layout, stages, static_totals, chosen.pop(), with_time)
        elif layout.recompute == "none" and activation_offload_offered(ctx):
            # Megatron offloads layers beside a recompute setting (--cpu-offloading-num-
            # layers): with none, the layers that do not fit are offloaded, the rest kept.
            assignment = self.auto_assignment(layout, static_totals, NONE_OR_OFFLOAD)
            lightest = OFFLOADED
        else:
            return self._price_fixed(
                layout, stages, static_totals, self.policy_recompute(layout), with_time
            )
        if assignment is None:
            return self._price_fixed(layout, stages, static_totals, lightest, with_time)
        activations = tuple(self.activation_bytes(layout, a) for a in assignment)
        return self._finish(layout, stages, static_totals, assignment, activations, with_time)

    def price_layer_checkpointing(self, layout: Layout, every: int) -> PricedLayout:
        """Every ``every``-th layer recomputed whole and the rest kept: torchtitan's
        layer-level selective AC (``selective_ac_option = "2"`` wraps every second layer
        in a checkpoint), for pricing runs that used it. Counted within each of a stage's
        layer groups, so a group of ``n`` layers recomputes ``n // every``."""
        stages = self.ctx.placement(layout)
        static_totals = self._static_totals(layout, stages)
        assignment = tuple(
            tuple(
                (kind, in_flight, n, option)
                for kind, count, in_flight in stage.groups
                for option, n in ((None, count // every), (frozenset(), count - count // every))
                if n
            )
            for stage in stages
        )
        activations = tuple(self.activation_bytes(layout, a) for a in assignment)
        return self._finish(layout, stages, static_totals, assignment, activations, True)

    def price_per_layer(self, layout: Layout, options: Sequence[Recompute]) -> PricedLayout:
        """``layout`` with a given option for each decoder layer (model order): what a
        framework runs when it cannot state a plan's per-layer choice and its config
        recomputes another way (an exported config's uniform or first-N recompute)."""
        model = self.ctx.model
        if len(options) != model.num_layers:
            raise ValueError(f"{len(options)} options for {model.num_layers} layers")
        stages = self.ctx.placement(layout)
        static_totals = self._static_totals(layout, stages)
        assignment = self._layer_assignment(stages, options)
        activations = tuple(self.activation_bytes(layout, a) for a in assignment)
        priced = self._finish(layout, stages, static_totals, assignment, activations, True)
        priced.layer_options = tuple(options)
        return priced

    def _layer_assignment(
        self, stages: tuple[StagePlacement, ...], options: Sequence[Recompute]
    ) -> tuple[Assignment, ...]:
        """Per stage, the (kind, in-flight, count, option) groups of per-layer options."""
        layers = self.ctx.model.layers
        out = []
        for stage in stages:
            groups: dict[tuple[int, int, Recompute], int] = {}
            for chunk in stage.chunks:
                for layer in range(chunk.start, chunk.stop):
                    key = (layers[layer], chunk.in_flight, options[layer])
                    groups[key] = groups.get(key, 0) + 1
            out.append(tuple((kind, k, n, rec) for (kind, k, rec), n in groups.items()))
        return tuple(out)

    def _price_stated(
        self, layout: Layout, stages: tuple[StagePlacement, ...], static_totals: list[int]
    ) -> PricedLayout:
        """The fastest setting the framework's config states that fits (the first of
        equals, in ``stated_settings`` order); where none fits, full recompute, priced as
        such. Each setting's memory is checked before its time is priced."""
        ctx = self.ctx
        budget = ctx.budget_bytes
        refetches = self._refetch_bytes(layout, stages)
        sizes, held_by = layer_counts(ctx.model, layout), chunk_stages(layout)
        best: PricedLayout | None = None
        for setting in stated_settings(ctx, layout):
            if not (setting.first or setting.every):
                # One option on every layer: priced as the fixed policy is, to the last bit,
                # so a config that states it reads back at the same step.
                priced = self._price_fixed(
                    layout, stages, static_totals, parse_option(setting.option)
                )
                if priced.fits and (best is None or priced.time.step_s < best.time.step_s):
                    best = priced
                continue
            options = [parse_option(name) for name in setting.per_layer(sizes, held_by)]
            assignment = self._layer_assignment(stages, options)
            activations = tuple(self.activation_bytes(layout, a) for a in assignment)
            if any(
                static - (refetch if keeps_all(a) else 0) + act > budget
                for static, refetch, a, act in zip(
                    static_totals, refetches, assignment, activations, strict=True
                )
            ):
                continue
            priced = self._finish(layout, stages, static_totals, assignment, activations, True)
            if best is None or priced.time.step_s < best.time.step_s:
                priced.layer_options = tuple(options)
                best = priced
        if best is None:
            # Full recompute on every layer: the lightest setting a config states (one that
            # offloads every layer is none: Megatron offloads fewer than all of them).
            return self._price_fixed(layout, stages, static_totals, None)
        return best

    def _price_fixed(
        self,
        layout: Layout,
        stages: tuple[StagePlacement, ...],
        static_totals: list[int],
        recompute: Recompute,
        with_time: bool = True,
    ) -> PricedLayout:
        """Every layer under one option."""
        per_kind = self._kind_bytes(layout, recompute)
        activations = tuple(sum(units * per_kind[kind] for kind, units in s.units) for s in stages)
        assignment = tuple(self._role_assignment(s, recompute) for s in stages)
        return self._finish(layout, stages, static_totals, assignment, activations, with_time)

    def _finish(
        self,
        layout: Layout,
        stages: tuple[StagePlacement, ...],
        static_totals: list[int],
        assignment: tuple[Assignment, ...],
        activations: tuple[int, ...],
        with_time: bool,
    ) -> PricedLayout:
        ctx = self.ctx
        # A stage that keeps every layer re-runs and fetches back nothing.
        static_totals = [
            static - (refetch if keeps_all(a) else 0)
            for static, refetch, a in zip(
                static_totals, self._refetch_bytes(layout, stages), assignment, strict=True
            )
        ]
        totals = [st + a for st, a in zip(static_totals, activations, strict=True)]
        peak_stage = max(range(len(totals)), key=lambda i: (totals[i], -i))
        shared = self._stage_seconds_key(layout)
        seconds = tuple(
            self._stage_seconds(layout, s, a, shared)
            for s, a in zip(stages, assignment, strict=True)
        )
        time = self.cost.step(ctx, layout, stages, seconds) if with_time else None
        return PricedLayout(
            layout=layout,
            stages=stages,
            static=None,
            activations=activations,
            assignment=assignment,
            stage_seconds=seconds,
            time=time,
            peak_bytes=totals[peak_stage],
            peak_stage=peak_stage,
            fits=totals[peak_stage] <= ctx.budget_bytes,
            static_totals=tuple(static_totals),
        )

    def auto_lower_bound(self, layout: Layout) -> float:
        """A lower bound on the step time of a per-layer ``auto`` layout, for the search.

        Every layer at its fastest option bounds it from below. Where that overflows a
        stage, the stage must save the excess, and it gains at least the least time of
        saving it with options taken fractionally (the knapsack's linear relaxation,
        ``_least_saving_time``; bucket rounding only saves more). The step is monotone
        in the stages' recompute time. Under ZeRO-3 the extra backward hides more of the
        FSDP traffic, so there the plain bound stands."""
        # Every layer kept, not the none policy's own offload choice: auto may recompute
        # instead, for less.
        kept = layout.model_copy(update={"recompute": "none"})
        stages = self.ctx.placement(kept)
        totals = self._static_totals(kept, stages)
        # Timed below: the step of the fastest stages is needed only when it is the bound.
        fastest = self._price_fixed(kept, stages, totals, frozenset(), with_time=False)
        if fastest.fits or layout.zero >= 3:
            return self.cost.step(self.ctx, kept, stages, fastest.stage_seconds).step_s
        budget = self.ctx.budget_bytes
        seconds = []
        for stage, static, act, secs in zip(
            fastest.stages,
            fastest.static_totals,
            fastest.activations,
            fastest.stage_seconds,
            strict=True,
        ):
            excess = static + act - budget
            if excess > 0:
                secs = copy.copy(secs)  # keeps the cost model's per-stage annotations
                secs["recompute"] = secs.get("recompute", 0.0) + self._least_saving_time(
                    layout, stage, excess
                )
            seconds.append(secs)
        # Shaded by a part in 10⁹: the relaxation can equal the knapsack's optimum, and
        # summed in another order it must not round above the price it bounds.
        return self.cost.step(self.ctx, layout, fastest.stages, seconds).step_s * (1 - 1e-9)

    def _least_saving_time(self, layout: Layout, stage: StagePlacement, excess: float) -> float:
        """The least time in which the stage's layers save ``excess`` bytes against keeping
        everything, each layer free to take a fraction of an option: the cheapest savings
        first (``_saving_segments``). Past what every layer's lightest option saves, the
        stage cannot fit; what was claimed stands."""
        extra = 0.0
        for rate, capacity in self._saving_segments(layout, stage):
            take = min(capacity, excess)
            extra += rate * take
            excess -= take
            if excess <= 0:
                break
        return extra

    def _saving_segments(
        self, layout: Layout, stage: StagePlacement
    ) -> tuple[tuple[float, float], ...]:
        """(seconds per byte, bytes) segments of the stage's savings, cheapest first: each
        group's (``_saving_hull``), as many times as it has layers. A single cheapest rate
        for every byte (the bound this replaced) assumed the cheap switches (the norms)
        could save what only dearer ones (a whole FFN, full recompute) can, and left the
        search pricing layouts it could have bounded."""
        key = ("saving_segments", self.ctx.time_key(layout), stage.groups)
        found = self.ctx.cache.get(key)
        if found is None:
            found = self.ctx.cache[key] = tuple(
                sorted(
                    (rate, saved * count)
                    for kind_index, count, in_flight in stage.groups
                    for rate, saved in self._saving_hull(layout, kind_index, in_flight)
                )
            )
        return found

    def _saving_hull(
        self, layout: Layout, kind_index: int, in_flight: int
    ) -> tuple[tuple[float, float], ...]:
        """One layer's (seconds per byte, bytes) savings against keeping everything, at
        ``in_flight`` micro-batches: the lower convex hull of its options' (bytes saved,
        time added), in rising rate. Every option counts, not only the stage's front: a
        dominated one is never below the hull, and the hull then depends on the layer's
        own count alone."""
        key = ("saving_hull", kind_index, in_flight, self.ctx.time_key(layout))
        found = self.ctx.cache.get(key)
        if found is None:
            kind = self.ctx.model.kinds[kind_index]
            options = [o for o, _ in kind_options(self.ctx, layout, kind, self.memory, self.cost)]
            kept = next(o for o in options if o.name == KEPT)
            kept_bytes = kept.memory(in_flight)
            points = sorted(
                (kept_bytes - o.memory(in_flight), max(0.0, o.time - kept.time))
                for o in options
                if kept_bytes - o.memory(in_flight) > 0
            )
            hull = [(0, 0.0)]
            for point in points:
                while len(hull) >= 2 and _not_below(hull[-2], hull[-1], point):
                    hull.pop()
                hull.append(point)
            found = self.ctx.cache[key] = tuple(
                ((t1 - t0) / (s1 - s0), s1 - s0)
                for (s0, t0), (s1, t1) in itertools.pairwise(hull)
                if s1 > s0
            )
        return found

    def _role_assignment(self, stage: StagePlacement, recompute: Recompute) -> Assignment:
        """A fixed policy's assignment; in-flight counts do not change time, so stages with
        one role share one assignment (and one cached seconds entry)."""
        return tuple((kind, 0, count, recompute) for kind, count in stage.composition)

    def _stage_seconds_key(self, layout: Layout) -> tuple:
        """What a stage's seconds depend on besides its role and assignment: the degrees
        that shard a layer (and the combined 1F1B schedule's unpaired share), the pipeline
        shape, and the data-parallel group where it carries per-micro-batch traffic (one
        tuple per layout, shared by its stages)."""
        return (
            *self.ctx.time_key(layout),
            layout.pp > 1,
            layout.vpp,
            layout.schedule,
            layout.dp if layout.pp > 1 else 0,
            # ZeRO-3/FSDP gathers and scatters per micro-batch: their exposed time depends
            # on the data-parallel group and the micro-batch count too.
            (layout.dp, layout.pp, layout.num_microbatches) if layout.zero >= 3 else None,
        )

    def _stage_seconds(
        self, layout: Layout, stage: StagePlacement, assignment: Assignment, shared: tuple
    ) -> dict[str, float]:
        """Per micro-batch seconds of one stage, memoised on what they depend on: the
        stage's layers and role, the assignment, and ``shared`` (``_stage_seconds_key``)."""
        key = ("stage_s", stage.role[:4], assignment, shared)
        cache = self.ctx.cache
        found = cache.get(key)
        if found is None:
            found = cache[key] = self.cost.stage_seconds(self.ctx, layout, stage, assignment)
        return found

    # ------------------------------------------------------------------ results

    def charged_static_parts(self, priced: PricedLayout, index: int) -> dict[str, int]:
        """Stage ``index``'s static memory by part, as its recompute choice is charged."""
        parts = (
            priced.static[index]
            if priced.static
            else self.memory.stage_static_bytes(self.ctx, priced.layout, priced.stages[index])
        )
        return charged_static(parts, priced.assignment[index])

    def memory_breakdown(self, priced: PricedLayout) -> MemoryBreakdown:
        ctx = self.ctx
        stages = [
            stage_memory(
                stage,
                {"activations": priced.activations[i], **self.charged_static_parts(priced, i)},
            )
            for i, stage in enumerate(priced.stages)
        ]
        return MemoryBreakdown(
            mode="ndplan",
            stages=tuple(stages),
            peak_bytes=priced.peak_bytes,
            peak_stage=priced.peak_stage,
            capacity_bytes=ctx.device_capacity_bytes,
            budget_bytes=ctx.budget_bytes,
            fits=priced.fits,
        )

    def recompute_ranges(self, priced: PricedLayout) -> tuple[RecomputeRange, ...]:
        """Per-layer options as ranges; within a group the more-recomputing options come first."""
        model = self.ctx.model
        ranges: list[RecomputeRange] = []
        given = priced.layer_options
        for stage, assignment in zip(priced.stages, priced.assignment, strict=True):
            queues: dict[tuple[int, int], list[str]] = {}
            for kind, k, count, rec in assignment:
                # k == 0: a fixed policy, the same for the kind whatever the in-flight count
                queues.setdefault((kind, k), []).extend([option_name(rec)] * count)
            for chunk in stage.chunks:
                for layer in range(chunk.start, chunk.stop):
                    kind = model.layers[layer]
                    if given is not None:
                        option = option_name(given[layer])
                    else:
                        queue = queues.get((kind, chunk.in_flight)) or queues[(kind, 0)]
                        option = queue.pop(0)
                    last = ranges[-1] if ranges else None
                    if (
                        last
                        and last.stage == stage.index
                        and last.stop == layer
                        and last.option == option
                    ):
                        ranges[-1] = last.model_copy(update={"stop": layer + 1})
                    else:
                        ranges.append(
                            RecomputeRange(
                                stage=stage.index, start=layer, stop=layer + 1, option=option
                            )
                        )
        return tuple(ranges)

    def hardware_flops_per_step(self, priced: PricedLayout) -> float:
        """Model FLOPs plus what recompute re-runs, over all devices."""
        ctx = self.ctx
        layout = priced.layout
        extra = 0.0
        devices_per_stage = layout.dp * layout.tp * layout.cp
        recompute_flops = getattr(self.cost, "recompute_flops", None)
        if recompute_flops is not None:
            for assignment in priced.assignment:
                for kind, _, count, rec in assignment:
                    extra += count * recompute_flops(ctx, layout, ctx.model.kinds[kind], rec)
        total = self.model_flops_per_step() + extra * layout.num_microbatches * devices_per_stage
        if ctx.settings.finetune == "lora":
            total -= self._weight_gradient_flops_per_step()
        return total

    def _weight_gradient_flops_per_step(self) -> float:
        """The weight-gradient GEMMs' model FLOPs, which LoRA's frozen weights never run:
        a third of every weight GEMM's (attention's core, with no weights, runs its full
        backward). Memoised with the context: it depends on the model and job alone."""
        ctx = self.ctx
        found = ctx.cache.get("weight_gradient_flops_per_step")
        if found is None:
            f = count_flops(ctx.model, ctx.settings.attention_span)
            per_token = f.forward_flops_per_token - f.forward_parts["core_attention"]
            tokens = ctx.job.global_batch_size * ctx.job.seq_length
            found = ctx.cache["weight_gradient_flops_per_step"] = per_token * tokens
        return found

    def model_flops_per_step(self) -> float:
        model_flops = getattr(self.cost, "model_flops_per_step", None)
        if model_flops is not None:
            return model_flops(self.ctx)
        tokens = self.ctx.job.global_batch_size * self.ctx.job.seq_length
        return model_flops_per_step(self.ctx.model, tokens, self.ctx.settings.attention_span)

    def plan(self, priced: PricedLayout, rank: int | None = None) -> Plan:
        ctx = self.ctx
        memory = self.memory_breakdown(priced)
        time = priced.time
        tokens = mfu = hfu = tflops = None
        if time is not None and time.step_s > 0:
            n = ctx.cluster.num_devices
            tokens = ctx.job.global_batch_size * ctx.job.seq_length / time.step_s / n
            peak = ctx.device.peak_flops(ctx.settings.gemm_precision)
            model_flops = self.model_flops_per_step()
            tflops = model_flops / time.step_s / n / 1e12
            mfu = model_flops / (time.step_s * n * peak)
            hfu = self.hardware_flops_per_step(priced) / (time.step_s * n * peak)
        return Plan(
            rank=rank,
            layout=priced.layout,
            memory=memory,
            time=time,
            tokens_per_s_per_device=tokens,
            model_tflops_per_device=tflops,
            mfu=mfu,
            hfu=hfu,
            recompute=self.recompute_ranges(priced),
        )


def _not_below(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> bool:
    """Whether ``b`` lies on or above the line from ``a`` to ``c`` (``a``, ``b``, ``c`` in
    ascending first coordinate): then ``b`` is off the lower convex hull."""
    return (b[1] - a[1]) * (c[0] - a[0]) >= (c[1] - a[1]) * (b[0] - a[0])
