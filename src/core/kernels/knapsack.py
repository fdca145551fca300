"""The recompute knapsack: which layers recompute what, within a stage's memory budget.

The public wrapper of ``recompute.md`` ("Layer options and fronts", "The stage
knapsack", and its relatives). It validates the domain objects, turns them into
the arrays both engines take, picks the engine, and turns the answer back into
domain objects:

- ``reference`` -- plain numpy, the oracle, used when ``NDPLAN_ENGINE=python``,
  ``NUMBA_DISABLE_JIT=1``, or numba cannot be imported;
- ``_knapsack_nb`` -- the same DP compiled by numba (the default).

Nothing here imports numba: the kernel module is imported on the first solve
that needs the DP, so ``import ndplan`` compiles nothing, and the common case
(every layer's fastest option fits) neither touches numba nor builds arrays.

Tie rules (deterministic, identical on both engines):

1. Usefulness at a group's in-flight count (step 1): options are sorted by
   (memory at k, time, position in the input); an option is kept only when
   strictly faster than every option before it. So of options with the same
   memory the fastest stays, and of options equal in memory and time the one
   listed first.
2. Of the choices with the least time, the one keeping the fewest buckets
   (``w``) wins; memory is compared in buckets, not bytes.
3. Among choices equal in time and in buckets, the DP decides layer by layer
   from the last: at each ``w`` a layer takes, of its options reaching the
   least time, the lightest (lowest in the order of rule 1). Only float ties
   reach this rule; e.g. 2 layers with options x (3 buckets, 1 s), y (2, 1.5 s),
   z (1, 2 s) in 4 buckets: x+z and y+y both take 3 s; the last layer takes z.

Per-layer DP throughout: identical layers of a group are not merged (a merged
solve would sum times in another order and break bit-for-bit agreement).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

import numpy as np

from ..units import MiB

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DefaultKnapsackSolver",
    "Engine",
    "GroupChoice",
    "LayerGroup",
    "LayerOption",
    "PipelineChoice",
    "StageChoice",
    "choose",
    "engine_name",
    "least_times",
    "pareto_front",
    "pp_lite",
    "suffix_times",
    "warm_engine",
]

DEFAULT_BUCKET_BYTES = MiB
Engine = Literal["auto", "python", "numba"]
_MAX_OPTIONS = 255  # picks are stored as uint8
_MAX_BUCKETS = 2**27  # a DP table this long is a bucket far too fine for the budget


@dataclass(frozen=True, slots=True)
class LayerOption:
    """One way to run a layer (recompute.md 'Layer options')."""

    name: str
    """e.g. "none", "attn", "attn+act", "full"."""
    memory_per_micro_batch: int
    """Bytes kept per micro-batch in flight."""
    forward_time: float
    """Seconds."""
    backward_time: float
    """Seconds, including the recompute."""
    memory_once: int = 0
    """Bytes kept once, whatever the in-flight count."""
    excess: tuple[tuple[int, int], ...] = ()
    """``(in_flight k, bytes)``: corrections where the linear form over-charges."""

    def memory(self, in_flight: int) -> int:
        """Bytes kept with ``in_flight`` micro-batches: ``k·per_mb + once − excess(k)``."""
        m = in_flight * self.memory_per_micro_batch + self.memory_once
        for k, b in self.excess:
            if k == in_flight:
                return m - b
        return m

    @property
    def time(self) -> float:
        """Forward plus backward time, seconds."""
        return self.forward_time + self.backward_time


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """``count`` identical layers of one kind, each with ``in_flight`` micro-batches in flight."""

    kind: str
    options: tuple[LayerOption, ...]
    count: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class GroupChoice:
    """How many layers of a group run each option."""

    kind: str
    in_flight: int
    counts: tuple[tuple[str, int], ...]
    """Option name → layers; slower (more recomputing) options first, zero counts omitted."""


@dataclass(frozen=True, slots=True)
class StageChoice:
    """The recompute choice of one stage."""

    groups: tuple[GroupChoice, ...]
    """Same order as the input groups."""
    memory_bytes: int
    """Exact (un-bucketed) bytes kept by the chosen options."""
    time_s: float
    """Total time (forward + backward) of the chosen options, summed layer by layer in order."""


@dataclass(frozen=True, slots=True)
class PipelineChoice:
    """Every stage solved on its own (``pp_lite``); the pipeline runs at its slowest stage."""

    time_s: float
    """Slowest stage's choice time plus its fixed time; ``inf`` when a stage has no choice."""
    stages: tuple[StageChoice | None, ...]
    slowest_stage: int
    """Index of the slowest stage (the first on ties), or of the first stage with no choice."""


# --------------------------------------------------------------------------- fronts


def pareto_front(
    options: Iterable[LayerOption], in_flight_counts: Iterable[int] = ()
) -> tuple[LayerOption, ...]:
    """The options no other option beats (recompute.md 'Layer options and fronts').

    A beats B when A needs no more memory per micro-batch, no more memory once,
    no more memory at every count in ``in_flight_counts``, and no more **total**
    time (forward + backward: what the knapsack minimises; with the forward
    shared by all options of a kind this is the spec's backward-time rule), and
    is strictly better in one. Options equal in all of these keep the one
    listed first. The fastest option (the plain layer) and the lightest (full
    recompute) cannot be beaten, so they are always kept. Order: ascending
    time, then memory.
    """
    counts = tuple(in_flight_counts)
    keyed = []
    for index, o in enumerate(options):
        memory = (o.memory_per_micro_batch, o.memory_once, *(o.memory(k) for k in counts))
        keyed.append((o.time, memory, index, o))
    keyed.sort(key=lambda item: item[:3])
    front: list[tuple[float, tuple[int, ...], int, LayerOption]] = []
    for item in keyed:
        time, memory = item[0], item[1]
        # Sorted by time, so only an option already kept can beat or equal this one.
        beaten = any(
            t <= time and all(a <= b for a, b in zip(m, memory, strict=True))
            for t, m, _, _ in front
        )
        if not beaten:
            front.append(item)
    return tuple(item[3] for item in front)


# --------------------------------------------------------------------------- engines

_numba_engine: ModuleType | None = None
_numba_tried = False


def _load_numba() -> ModuleType | None:
    """The numba engine, imported (and its cache configured) on first use; None without numba."""
    global _numba_engine, _numba_tried
    if not _numba_tried:
        _numba_tried = True
        try:
            from ndplan.core.kernels import _knapsack_nb
        except ImportError:
            _numba_engine = None
        else:
            _numba_engine = _knapsack_nb
    return _numba_engine


def _engine(engine: str) -> ModuleType:
    if engine == "auto":
        wanted = os.environ.get("NDPLAN_ENGINE", "").strip().lower() or "auto"
        if wanted == "python":
            from ndplan.core.kernels import reference

            return reference
        if wanted not in ("auto", "numba"):
            raise ValueError(f"NDPLAN_ENGINE={wanted!r}: expected 'auto', 'python' or 'numba'")
        if wanted == "auto":
            if os.environ.get("NUMBA_DISABLE_JIT", "0").strip() not in ("", "0"):
                from ndplan.core.kernels import reference

                return reference
            kernel = _load_numba()
            if kernel is None:
                from ndplan.core.kernels import reference

                return reference
            return kernel
        engine = "numba"
    if engine == "python":
        from ndplan.core.kernels import reference

        return reference
    if engine == "numba":
        kernel = _load_numba()
        if kernel is None:
            raise RuntimeError("engine='numba' asked for, but numba cannot be imported")
        return kernel
    raise ValueError(f"engine={engine!r}: expected 'auto', 'python' or 'numba'")


def engine_name(engine: str = "auto") -> str:
    """Which engine ``engine`` resolves to now: ``"python"`` or ``"numba"``."""
    return "numba" if _engine(engine).__name__.endswith("_knapsack_nb") else "python"


# --------------------------------------------------------------------------- preparation

# One group's useful options at its in-flight count: (option, exact memory, time),
# ascending memory and strictly descending time.
_Useful = list[tuple[LayerOption, int, float]]


def _useful(options: Sequence[LayerOption], in_flight: int, what: str) -> _Useful:
    """Step 1: sort by (memory at k, time); keep those faster than every lighter one."""
    items = []
    for index, o in enumerate(options):
        m = o.memory(in_flight)
        t = o.forward_time + o.backward_time
        if m < 0:
            raise ValueError(f"{what}: option {o.name!r} keeps {m} bytes at in_flight={in_flight}")
        if not 0.0 <= t < math.inf:
            raise ValueError(f"{what}: option {o.name!r} has time {t!r}; expected finite ≥ 0")
        items.append((m, t, index, o))
    items.sort(key=lambda item: item[:3])
    useful: _Useful = []
    fastest = math.inf
    for m, t, _, o in items:
        if t < fastest:
            useful.append((o, m, t))
            fastest = t
    return useful


def _check_group(g: LayerGroup, index: int) -> None:
    if g.count < 0 or g.in_flight < 0:
        raise ValueError(
            f"group {index} ({g.kind}): count={g.count}, in_flight={g.in_flight}; expected ≥ 0"
        )
    if g.count and not g.options:
        raise ValueError(f"group {index} ({g.kind}): {g.count} layers but no options")


def _prepare(groups: Sequence[LayerGroup]) -> list[_Useful]:
    prepared = []
    for index, g in enumerate(groups):
        _check_group(g, index)
        prepared.append(_useful(g.options, g.in_flight, f"group {index} ({g.kind})"))
    return prepared


def _check_bucket(bucket_bytes: int) -> int:
    if isinstance(bucket_bytes, bool) or int(bucket_bytes) != bucket_bytes or bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes!r}: expected a whole number of bytes ≥ 1")
    return int(bucket_bytes)


_ENGINES = ("auto", "python", "numba")


def _check_engine(engine: str) -> None:
    if engine not in _ENGINES:
        raise ValueError(f"engine={engine!r}: expected 'auto', 'python' or 'numba'")


def _check_budget(budget: float) -> None:
    if budget != budget:  # NaN
        raise ValueError("budget is NaN")


def _arrays(
    useful: Sequence[_Useful], counts: Sequence[int], bucket: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The engines' input: bucket weights (rounded up), times, group pointers, counts."""
    weights: list[int] = []
    times: list[float] = []
    ptr = [0]
    for u, count in zip(useful, counts, strict=True):
        if count:
            if len(u) > _MAX_OPTIONS:
                raise ValueError(f"{len(u)} useful options in a group; at most {_MAX_OPTIONS}")
            for _, m, t in u:
                weights.append(_buckets(m, bucket))
                times.append(t)
        ptr.append(len(weights))
    return (
        np.array(weights, dtype=np.int64),
        np.array(times, dtype=np.float64),
        np.array(ptr, dtype=np.int64),
        np.array(counts, dtype=np.int64),
    )


def _buckets(memory: float, bucket: int) -> int:
    """Whole buckets, rounded up (exact for ints; also right for fractional bytes)."""
    return int(-(-memory // bucket))


def _check_cap(cap: int, bucket: int) -> None:
    if cap > _MAX_BUCKETS:
        raise ValueError(
            f"the DP would need {cap:,} buckets of {bucket} bytes (at most {_MAX_BUCKETS:,}); "
            "use a coarser bucket_bytes"
        )


def _fastest_time(useful: Sequence[_Useful], counts: Sequence[int]) -> float:
    """All layers at their fastest, summed layer by layer like the DP does."""
    total = 0.0
    for u, count in zip(useful, counts, strict=True):
        if count:
            t = u[-1][2]
            for _ in range(count):
                total += t
    return total


# --------------------------------------------------------------------------- choose


def choose(
    groups: Sequence[LayerGroup],
    budget_bytes: float,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    engine: Engine = "auto",
) -> StageChoice | None:
    """The fastest recompute choice of a stage within ``budget_bytes`` (recompute.md steps 1–5).

    If every layer's fastest useful option fits (exact bytes), that is the
    answer, without a DP. Otherwise memory is rounded up to whole buckets of
    ``bucket_bytes`` and the DP finds the least time within
    ``budget_bytes // bucket_bytes`` buckets; of the choices with the least
    time, the one keeping the fewest buckets (ties: see the module docstring).
    The result reports, per group, the layers on each option (slower options
    first), the exact bytes kept, and the time summed layer by layer in group
    order. ``None`` when nothing fits (budget < 0, or the lightest options
    overflow once rounded up to whole buckets).
    """
    bucket = _check_bucket(bucket_bytes)
    _check_engine(engine)
    _check_budget(budget_bytes)
    useful = _prepare(groups)
    if budget_bytes < 0:
        return None
    counts = [g.count for g in groups]

    # Step 2: every layer at its fastest fits → nothing to choose.
    fastest_memory = 0
    for u, count in zip(useful, counts, strict=True):
        if count:
            fastest_memory += count * u[-1][1]
    if fastest_memory <= budget_bytes:
        return StageChoice(
            groups=tuple(
                GroupChoice(g.kind, g.in_flight, ((u[-1][0].name, g.count),) if g.count else ())
                for g, u in zip(groups, useful, strict=True)
            ),
            memory_bytes=fastest_memory,
            time_s=_fastest_time(useful, counts),
        )

    # Steps 3–5: bucket the memory, run the DP.
    cap = int(budget_bytes // bucket)
    lightest = 0
    for u, count in zip(useful, counts, strict=True):
        if count:
            lightest += count * _buckets(u[0][1], bucket)
    if lightest > cap:
        return None
    _check_cap(cap, bucket)
    weights, times, ptr, count_array = _arrays(useful, counts, bucket)
    time, _w, picks = _engine(engine).dp_choose(weights, times, ptr, count_array, cap)
    if time == math.inf:  # pragma: no cover - excluded by the lightest check above
        return None

    chosen = []
    memory = 0
    layer = 0
    picks_list = picks.tolist()
    for g, u in zip(groups, useful, strict=True):
        per_option = [0] * len(u)
        for j in picks_list[layer : layer + g.count]:
            per_option[j] += 1
        layer += g.count
        for (_, m, _), n in zip(u, per_option, strict=True):
            memory += n * m
        chosen.append(
            GroupChoice(
                g.kind,
                g.in_flight,
                tuple((o.name, n) for (o, _, _), n in zip(u, per_option, strict=True) if n),
            )
        )
    return StageChoice(groups=tuple(chosen), memory_bytes=memory, time_s=float(time))


# --------------------------------------------------------------------------- many budgets


def least_times(
    groups: Sequence[LayerGroup],
    budgets: Iterable[float] | np.ndarray,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    engine: Engine = "auto",
) -> np.ndarray:
    """Least stage time for every budget, from one DP pass.

    ``out[i]`` equals ``choose(groups, budgets[i]).time_s`` (``inf`` where
    ``choose`` gives None). The DP table stops at the smaller of the largest
    budget and the memory of all-fastest options.
    """
    bucket = _check_bucket(bucket_bytes)
    _check_engine(engine)
    b = _budget_array(budgets)
    useful = _prepare(groups)
    counts = [g.count for g in groups]
    fastest_memory = 0
    fastest_weight = 0
    for u, count in zip(useful, counts, strict=True):
        if count:
            fastest_memory += count * u[-1][1]
            fastest_weight += count * _buckets(u[-1][1], bucket)
    out = np.full(b.shape, np.inf)
    out[b >= fastest_memory] = _fastest_time(useful, counts)
    asked = (b >= 0) & (b < fastest_memory)
    if asked.any():
        caps = (b[asked] // bucket).astype(np.int64)
        cap = min(int(caps.max()), fastest_weight)
        _check_cap(cap, bucket)
        weights, times, ptr, count_array = _arrays(useful, counts, bucket)
        table = _engine(engine).dp_least(weights, times, ptr, count_array, cap)
        out[asked] = table[np.minimum(caps, cap)]
    return out


def suffix_times(
    layers: Sequence[tuple[Sequence[LayerOption], int]],
    budgets: Iterable[float] | np.ndarray,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    engine: Engine = "auto",
) -> np.ndarray:
    """Least time of every suffix of layers, each within its own budget, from one DP pass.

    ``layers`` are ``(options, in_flight)`` in model order; ``out[i]`` is the
    least time of layers ``i..end`` within ``budgets[i]`` (``inf`` if nothing
    fits). The DP adds layers from the last to the first, so times are summed
    in that order (``choose`` on the same suffix sums first to last: equal up
    to float rounding).
    """
    bucket = _check_bucket(bucket_bytes)
    _check_engine(engine)
    b = _budget_array(budgets)
    n = len(layers)
    if b.shape != (n,):
        raise ValueError(f"budgets of shape {b.shape} for {n} layers; expected ({n},)")
    useful = []
    for i, (options, in_flight) in enumerate(layers):
        if in_flight < 0 or not options:
            raise ValueError(f"layer {i}: in_flight={in_flight}, {len(options)} options")
        useful.append(_useful(options, in_flight, f"layer {i}"))
    out = np.full(n, np.inf)
    caps = np.full(n, -1, dtype=np.int64)
    memory = 0
    time = 0.0
    for i in range(n - 1, -1, -1):  # all fastest from layer i on, summed like the DP
        memory += useful[i][-1][1]
        time += useful[i][-1][2]
        if b[i] >= memory:
            out[i] = time
        elif b[i] >= 0:
            caps[i] = int(b[i] // bucket)
    asked = caps >= 0
    if asked.any():
        _check_cap(int(caps.max()), bucket)
        weights, times, ptr, _ = _arrays(useful, [1] * n, bucket)
        dp = _engine(engine).dp_suffix(weights, times, ptr, caps)
        out[asked] = dp[asked]
    return out


def _budget_array(budgets: Iterable[float] | np.ndarray) -> np.ndarray:
    """Budgets as int64 when all are whole numbers of bytes, else float64; NaN refused."""
    b = np.asarray(budgets if isinstance(budgets, np.ndarray) else list(budgets))
    if b.dtype.kind not in "iu":
        b = b.astype(np.float64)
        if np.isnan(b).any():
            raise ValueError("a budget is NaN")
    elif b.dtype.kind == "u":
        b = b.astype(np.int64)
    return b


# --------------------------------------------------------------------------- pipeline


def pp_lite(
    stages: Sequence[tuple[Sequence[LayerGroup], float, float]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    engine: Engine = "auto",
) -> PipelineChoice:
    """Solve every stage on its own (recompute.md 'whole pipeline, even split').

    ``stages`` are ``(groups, budget_bytes, fixed_time_s)``. Stages share no
    memory, so this also makes the slowest stage as fast as it can be.
    """
    if not stages:
        raise ValueError("pp_lite needs at least one stage")
    choices: list[StageChoice | None] = []
    slowest = -1
    slowest_time = -math.inf
    failed = -1
    for index, (groups, budget, fixed) in enumerate(stages):
        c = choose(groups, budget, bucket_bytes, engine)
        choices.append(c)
        if c is None:
            if failed < 0:
                failed = index
            continue
        t = c.time_s + fixed
        if t > slowest_time:
            slowest_time = t
            slowest = index
    if failed >= 0:
        return PipelineChoice(math.inf, tuple(choices), failed)
    return PipelineChoice(slowest_time, tuple(choices), slowest)


def warm_engine() -> None:
    """Run each DP kernel once on a two-layer problem, so the numba engine's cached
    machine code (and numba's type registries, half a second the first time) is
    loaded before the first real stage; a process that forks workers does it once."""
    options = (LayerOption("full", MiB, 1.0, 2.0), LayerOption("none", 4 * MiB, 1.0, 1.0))
    group = LayerGroup("warm", options, 2, 1)
    budget = 5 * MiB  # under the all-fastest 8 MiB: the DP runs
    choose((group,), budget)
    least_times((group,), [budget])
    suffix_times([(options, 1), (options, 1)], [budget, budget])


# --------------------------------------------------------------------------- the port


class DefaultKnapsackSolver:
    """The default ``KnapsackSolver``: the exact bucketed DP, numba-jitted (reference fallback)."""

    __slots__ = ("bucket_bytes", "engine")

    def __init__(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, engine: Engine = "auto") -> None:
        self.bucket_bytes = _check_bucket(bucket_bytes)
        _check_engine(engine)
        self.engine: Engine = engine

    def __repr__(self) -> str:
        return f"DefaultKnapsackSolver(bucket_bytes={self.bucket_bytes}, engine={self.engine!r})"

    def pareto_front(
        self, options: Iterable[LayerOption], in_flight_counts: Iterable[int] = ()
    ) -> tuple[LayerOption, ...]:
        return pareto_front(options, in_flight_counts)

    def choose(self, groups: Sequence[LayerGroup], budget_bytes: float) -> StageChoice | None:
        return choose(groups, budget_bytes, self.bucket_bytes, self.engine)

    def least_times(
        self, groups: Sequence[LayerGroup], budgets: Iterable[float] | np.ndarray
    ) -> np.ndarray:
        return least_times(groups, budgets, self.bucket_bytes, self.engine)

    def suffix_times(
        self,
        layers: Sequence[tuple[Sequence[LayerOption], int]],
        budgets: Iterable[float] | np.ndarray,
    ) -> np.ndarray:
        return suffix_times(layers, budgets, self.bucket_bytes, self.engine)

    def pp_lite(
        self, stages: Sequence[tuple[Sequence[LayerGroup], float, float]]
    ) -> PipelineChoice:
        return pp_lite(stages, self.bucket_bytes, self.engine)
