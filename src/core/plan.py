"""Results: memory and time breakdowns, a priced plan, a search result."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .base import Frozen
from .layout import Layout

MemoryMode = Literal["ndplan", "megatron"]


class StageMemory(Frozen):
    """The busiest device of one pipeline stage, at its peak."""

    stage: int
    layers: tuple[tuple[int, int], ...]
    """Decoder layers [start, stop) of each chunk the stage holds."""
    in_flight: tuple[int, ...]
    """Micro-batches in flight per chunk of the stage."""
    parts: dict[str, int]
    """Component → bytes; sums exactly to ``total_bytes``."""
    total_bytes: int


class MemoryBreakdown(Frozen):
    """Per-stage memory of a plan and whether it fits."""

    mode: MemoryMode = "ndplan"
    stages: tuple[StageMemory, ...]
    peak_bytes: int
    peak_stage: int
    capacity_bytes: int
    """The device's memory (or --max-mem)."""
    budget_bytes: int
    """What a stage may use: capacity less the balancing reserve."""
    fits: bool
    weights_and_optimizer_bytes: int | None = None
    """megatron mode: Megatron-LM's weight-and-optimizer estimate (most loaded shard)."""
    activation_bytes: int | None = None
    """megatron mode: Megatron-LM's activation estimate (first stage)."""


class TimeBreakdown(Frozen):
    """Where one optimizer step's time goes; ``parts`` sum to ``step_s``."""

    step_s: float
    parts: dict[str, float]
    """forward, backward, recompute, tp_comm, cp_comm, ep_comm, offload, pp_comm, bubble, dp_comm,
    optimizer (seconds)."""
    stage_forward_s: tuple[float, ...] = ()
    """Per stage, one micro-batch's forward (compute and exposed communication)."""
    stage_backward_s: tuple[float, ...] = ()
    """Per stage, one micro-batch's backward incl. recompute."""


class RecomputeRange(Frozen):
    """Layers [start, stop) of a stage running one recompute option."""

    stage: int
    start: int
    stop: int
    option: str


class Plan(Frozen):
    """A priced candidate."""

    rank: int | None = None
    layout: Layout
    memory: MemoryBreakdown
    time: TimeBreakdown | None = None
    tokens_per_s_per_device: float | None = None
    model_tflops_per_device: float | None = None
    mfu: float | None = None
    """Model FLOPs (no recompute) over the device's dense peak at the training precision."""
    hfu: float | None = None
    """Hardware FLOPs (with recompute) over the same peak."""
    recompute: tuple[RecomputeRange, ...] = ()
    """Per-layer recompute assignment as layer ranges."""

    def chunk_layers(self) -> tuple[int, ...]:
        """Decoder layers per pipeline chunk as priced, in model order: the layout's own
        counts, or the default split when it gives none (``memory.stages[].layers``)."""
        chunks = sorted(chunk for stage in self.memory.stages for chunk in stage.layers)
        return tuple(stop - start for start, stop in chunks)

    def uneven_split(self) -> bool:
        """Whether the chunks hold different numbers of decoder layers (a remainder, the
        embedding and loss counted as layers, the output layer's work, an MTP model's
        last chunk): Megatron then needs the layout spelled out."""
        return len(set(self.chunk_layers())) > 1

    def recompute_summary(self) -> str:
        """``none``, ``full``, or ``none 60, norm 19, norm+act 1``: layers per recompute
        option, most first (ties by name, so equal plans read the same)."""
        counts: dict[str, int] = {}
        for r in self.recompute:
            counts[r.option] = counts.get(r.option, 0) + (r.stop - r.start)
        if len(counts) == 1:
            return next(iter(counts))
        by_layers = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return ", ".join(f"{option} {n}" for option, n in by_layers)


class PhaseTimes(Frozen):
    """Wall time of the search's phases, seconds."""

    enumerate: float = 0.0
    memory: float = 0.0
    bound: float = 0.0
    price: float = 0.0
    total: float = 0.0


class SearchSummary(Frozen):
    generated: int
    refused: dict[str, int]
    """Reason → count."""
    over_memory: int
    bounded: int
    """Skipped: their lower bound could not enter the top K."""
    priced: int
    never_tried: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    """Listed values no layout of the problem can take (e.g. tp 3 on 8 devices), by
    dimension: never generated, so neither refused nor priced."""
    seconds: PhaseTimes = Field(default_factory=PhaseTimes)
    distinct: bool | None = None
    """True when asked to list one layout per shape (tp·pp·cp·dp·ep·etp): each plan is
    the fastest of its shape, so rank K is the K-th best shape; None otherwise."""
    priced_for_baseline: int | None = None
    """With a baseline: how many of the priced layouts were priced only to place it (the
    top K was settled without them); None otherwise."""
    rebalanced: int | None = None
    """With re-balancing asked for: how many of the top plans the pipeline balancer
    made faster (their layers moved between stages) before they were re-ranked."""


class Baseline(Frozen):
    """A layout the user runs today, placed in the search's ranking (``search --baseline``)."""

    stated: dict[str, int | bool | str]
    """The degrees the user gave; the others were searched as in the main search."""
    plan: Plan | None = None
    """The fastest layout with the stated degrees; None when none of them fits."""
    rank: int | None = None
    """Its place among every layout the search ranks (1 = the best). Exact: the search
    prices every layout that could be faster, whatever the top K."""
    grids_ahead: int | None = None
    """Device grids (tp·pp·cp·dp·ep·etp) other than its own with a faster layout."""
    gap: float | None = None
    """Its step time over the best plan's, minus 1."""
    miss: str | None = None
    """Why no layout with the stated degrees fits (the closest miss), when none does."""


class SearchResult(Frozen):
    summary: SearchSummary
    plans: tuple[Plan, ...]
    assumptions: tuple[str, ...] = ()
    baseline: Baseline | None = None
    """With a baseline asked for: where that layout ranks."""


def largest_difference(own: Plan, best: Plan) -> tuple[str, float]:
    """The step-time part that differs most between two plans, and by how much (seconds,
    ``own`` minus ``best``); forward, backward and recompute count as one, compute."""

    def parts(plan: Plan) -> dict[str, float]:
        p = dict(plan.time.parts) if plan.time is not None else {}
        p["compute"] = sum(p.pop(name, 0.0) for name in ("forward", "backward", "recompute"))
        return p

    mine, theirs = parts(own), parts(best)
    names = set(mine) | set(theirs)
    name = max(names, key=lambda k: (abs(mine.get(k, 0.0) - theirs.get(k, 0.0)), k))
    return name, mine.get(name, 0.0) - theirs.get(name, 0.0)


class BalanceResult(Frozen):
    """The pipeline balancer on one layout: the layout as given and as balanced."""

    start: Plan
    """The layout with its own split (the given counts, or the default split)."""
    balanced: Plan
    """The per-chunk layer counts the balancer chose (``layout.layers_per_stage``)."""
    moved: int
    """Layers on another stage than in the starting split."""
    priced: int
    """Placements priced on the way."""
