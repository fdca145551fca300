"""Recompute options per layer kind, and their Pareto fronts (spec/recompute.md).

An option is a set of recomputed ops (``frozenset()`` keeps everything, ``None``
recomputes the whole layer). Its memory comes from the memory model and its time
from the cost model, op by op, so every combination of switches is priced exactly
from one table of tensors and one table of ops per kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations

from .context import PricingContext, chunk_stage, layer_counts
from .frameworks import (
    OFFLOAD,
    STATED_EVERY_NTH,
    STATED_FIRST_IN_CHUNK,
    STATED_PER_STAGE,
    SWITCHES,
    offloads,
)
from .kernels.knapsack import LayerOption, pareto_front
from .layout import Layout
from .model import LatentAttention, LayerKind, MoEFFN
from .ports import CostModel, MemoryModel, Recompute

FULL = "full"
NONE = "none"


OFFLOADED: Recompute = frozenset({OFFLOAD})


def option_name(recompute: Recompute) -> str:
    if recompute is None:
        return FULL
    if offloads(recompute):
        return OFFLOAD
    return "+".join(s for s in SWITCHES if s in recompute) or NONE


def parse_option(name: str) -> Recompute:
    if name == FULL:
        return None
    if name == NONE:
        return frozenset()
    return frozenset(name.split("+"))


def activation_offload_offered(ctx: PricingContext) -> bool:
    """Whether layers may offload their activations: the framework can, the device has a
    host link, and the job asks for it (read last: an assumption only where it could
    apply). Fixed for the context, so decided once."""
    found = ctx.cache.get("activation_offload_offered")
    if found is None:
        found = ctx.cache["activation_offload_offered"] = (
            ctx.framework.activation_offload
            and ctx.device.host_link.bytes_per_s > 0
            and bool(ctx.settings.activation_offload)
        )
    return found


def applicable_switches(ctx: PricingContext, layout: Layout, kind: LayerKind) -> tuple[str, ...]:
    """The switches the framework offers that mean something for this kind."""
    fw = ctx.framework
    dense_ffn = not isinstance(kind.ffn, MoEFFN)
    out = []
    for switch in SWITCHES:
        if switch not in fw.switches or switch in fw.forced_switches:
            continue
        if switch == "sp_gather" and not layout.sequence_parallel:
            continue
        if switch == "mla_up" and not isinstance(kind.attention, LatentAttention):
            continue
        if switch == "moe_ffn" and dense_ffn:
            continue
        if switch == "mlp" and not dense_ffn:
            continue
        if switch == "act" and dense_ffn and not fw.dense_activation_recompute:
            continue  # Megatron's moe_act: a dense FFN's activation is recomputed only whole
        out.append(switch)
    return tuple(out)


def kind_options(
    ctx: PricingContext, layout: Layout, kind: LayerKind, memory: MemoryModel, cost: CostModel
) -> tuple[tuple[LayerOption, Recompute], ...]:
    """Every option of ``kind`` at this candidate's degrees: plain, each combination of
    the applicable switches, full recompute, and activation offload where offered."""
    key = ("options", kind.name, *ctx.time_key(layout))
    found = ctx.cache.get(key)
    if found is not None:
        return found
    switches = applicable_switches(ctx, layout, kind)
    choices: list[Recompute] = [frozenset()]
    for size in range(1, len(switches) + 1):
        choices.extend(frozenset(c) for c in combinations(switches, size))
    choices.append(None)
    if activation_offload_offered(ctx):
        choices.append(OFFLOADED)
    out = []
    for rec in choices:
        secs = cost.layer_seconds(ctx, layout, kind, rec)
        total = sum(secs.values())
        forward = secs["forward"]
        out.append(
            (
                LayerOption(
                    name=option_name(rec),
                    memory_per_micro_batch=memory.layer_activation_bytes(ctx, layout, kind, rec),
                    forward_time=forward,
                    backward_time=total - forward,
                ),
                rec,
            )
        )
    found = ctx.cache[key] = tuple(out)
    return found


def kind_front(
    ctx: PricingContext,
    layout: Layout,
    kind: LayerKind,
    in_flights: Sequence[int],
    memory: MemoryModel,
    cost: CostModel,
    only: tuple[str, ...] | None = None,
) -> tuple[LayerOption, ...]:
    """The options no other option beats at the in-flight counts that occur; with
    ``only``, among the options of those names."""
    key = ("front", kind.name, *ctx.time_key(layout), tuple(sorted(set(in_flights))), only)
    found = ctx.cache.get(key)
    if found is None:
        options = [
            opt
            for opt, _ in kind_options(ctx, layout, kind, memory, cost)
            if only is None or opt.name in only
        ]
        found = ctx.cache[key] = pareto_front(options, tuple(sorted(set(in_flights))))
    return found


def every_nth(chunk_sizes: Sequence[int], chunk_stages: Sequence[int], n: int) -> list[bool]:
    """Which decoder layers (model order) torchtitan's layer-level checkpointing
    (``selective_ac_option = n``) wraps whole: it counts the blocks each rank wraps, over
    its chunks in order, and wraps the n-th, 2n-th, …; so a rank's chunks of fewer than n
    layers share one count."""
    counted = dict.fromkeys(chunk_stages, 0)
    out = []
    for size, stage in zip(chunk_sizes, chunk_stages, strict=True):
        for _ in range(size):
            counted[stage] += 1
            out.append(counted[stage] % n == 0)
    return out


@dataclass(frozen=True, slots=True)
class StatedRecompute:
    """One recompute setting a framework's config states for the whole model: an option
    on every layer, on the first ``first`` layers of each chunk, or on every ``every``-th
    layer each rank holds (``every_nth``); the rest keep everything."""

    option: str
    """The option's name (``full``, ``offload``, switches joined by ``+``, ``none``)."""
    first: int = 0
    every: int = 0

    def per_layer(self, chunk_sizes: Sequence[int], chunk_stages: Sequence[int]) -> tuple[str, ...]:
        """The option each decoder layer runs, in model order, for chunks of these sizes
        held by these pipeline stages."""
        if self.every:
            wrapped = every_nth(chunk_sizes, chunk_stages, self.every)
        else:
            wrapped = [
                not self.first or i < self.first for size in chunk_sizes for i in range(size)
            ]
        return tuple(self.option if runs else NONE for runs in wrapped)


def stated_stage_options(ctx: PricingContext) -> tuple[str, ...]:
    """The options a per-stage config states (``STATED_PER_STAGE``): keep, the
    framework's selective recompute, the whole layer."""
    selective = ctx.framework.selective
    return (NONE, *((option_name(selective),) if selective else ()), FULL)


def stated_settings(ctx: PricingContext, layout: Layout) -> tuple[StatedRecompute, ...]:
    """Every recompute setting the framework's config states for the whole model at this
    layout (``STATED_FIRST_IN_CHUNK``, ``STATED_EVERY_NTH``), in a fixed order: none;
    each combination of the switches it offers for any of the model's layer kinds on
    every layer; every layer whole; then the first N of each chunk whole (and offloaded,
    where offered), or one in every N whole."""
    fw = ctx.framework
    if fw.stated_recompute == STATED_PER_STAGE:
        raise ValueError(f"{fw.name} states recompute per stage, not per model")
    offered = {s for kind in ctx.model.kinds for s in applicable_switches(ctx, layout, kind)}
    pool = [s for s in SWITCHES if s in offered]
    out = [StatedRecompute(NONE)]
    for size in range(1, len(pool) + 1):
        out.extend(StatedRecompute("+".join(c)) for c in combinations(pool, size))
    out.append(StatedRecompute(FULL))
    longest = max(layer_counts(ctx.model, layout))
    if fw.stated_recompute == STATED_FIRST_IN_CHUNK:
        out.extend(StatedRecompute(FULL, first=n) for n in range(1, longest))
        if activation_offload_offered(ctx) and layout.pp == 1:
            # Megatron-Core offloads the first --cpu-offloading-num-layers layers, fewer
            # than all of them, and refuses it under pipeline parallelism.
            out.extend(StatedRecompute(OFFLOAD, first=n) for n in range(1, longest))
    elif fw.stated_recompute == STATED_EVERY_NTH:
        most = most_per_stage(layer_counts(ctx.model, layout), chunk_stages(layout))
        out.extend(StatedRecompute(FULL, every=n) for n in range(2, most + 1))
    return tuple(out)


def most_per_stage(chunk_sizes: Sequence[int], chunk_stages: Sequence[int]) -> int:
    """The most decoder layers one pipeline stage holds over its chunks."""
    held: dict[int, int] = {}
    for size, stage in zip(chunk_sizes, chunk_stages, strict=True):
        held[stage] = held.get(stage, 0) + size
    return max(held.values())


def chunk_stages(layout: Layout) -> tuple[int, ...]:
    """The pipeline stage that runs each chunk, in chunk order."""
    return tuple(chunk_stage(layout, c) for c in range(layout.chunks))
