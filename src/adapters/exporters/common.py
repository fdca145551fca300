"""What every exporter reads off a plan: its chunks of layers and their recompute options.

A plan's recompute is chosen per layer (``Plan.recompute``); frameworks state it per
model, per stage or per chunk. These helpers give each exporter the per-chunk view, so
it can write the plan exactly where its framework can and say where it cannot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ndplan.core.context import PricingContext, chunk_stage, layer_counts
from ndplan.core.frameworks import OFFLOAD
from ndplan.core.layout import Layout
from ndplan.core.plan import Plan
from ndplan.core.ports import PerLayerPricer, StandIn
from ndplan.core.recompute import FULL, NONE, StatedRecompute, stated_settings


@dataclass(frozen=True, slots=True)
class Chunk:
    """One pipeline chunk (a virtual stage on one pipeline rank) in chunk order."""

    index: int
    start: int
    """Its first decoder layer."""
    options: tuple[str, ...]
    """The recompute option of each of its decoder layers, in layer order."""
    stage: int
    """The pipeline stage (rank) that runs it."""

    def count(self, *options: str) -> int:
        return sum(1 for o in self.options if o in options)

    def leads_with(self, option: str, n: int) -> bool:
        """Whether exactly its first ``n`` layers run ``option``."""
        return all((o == option) == (i < n) for i, o in enumerate(self.options))


def chunks(plan: Plan, ctx: PricingContext) -> tuple[Chunk, ...]:
    """The plan's chunks with each layer's recompute option (``none`` where unstated)."""
    layout = plan.layout
    option_of: dict[int, str] = {}
    for r in plan.recompute:
        for layer in range(r.start, r.stop):
            option_of[layer] = r.option
    out, start = [], 0
    for i, n in enumerate(layer_counts(ctx.model, layout)):
        options = tuple(option_of.get(layer, NONE) for layer in range(start, start + n))
        out.append(Chunk(i, start, options, chunk_stage(layout, i)))
        start += n
    return tuple(out)


def per_layer(parts: tuple[Chunk, ...], choose) -> tuple[str, ...]:
    """The option each decoder layer runs, in model order, as ``choose(chunk, index)``
    gives it for the layer at ``index`` within its chunk."""
    return tuple(choose(c, i) for c in parts for i in range(len(c.options)))


def layer_shape(parts: tuple[Chunk, ...]) -> tuple[list[int], list[int]]:
    """The chunks' layer counts and stages, as ``StatedRecompute.per_layer`` takes them."""
    return [len(c.options) for c in parts], [c.stage for c in parts]


def options_used(parts: tuple[Chunk, ...]) -> set[str]:
    return {o for c in parts for o in c.options}


def switches(option: str) -> frozenset[str]:
    """The recomputed ops of a selective option (empty for none, full and offload)."""
    if option in (NONE, FULL, OFFLOAD):
        return frozenset()
    return frozenset(option.split("+"))


def assignment_text(parts: tuple[Chunk, ...]) -> str:
    """The per-layer choice in a few words: ``norm 38, none 36, norm+mlp 6 layers`` (most
    first, ties by name), and how many chunks differ from the first."""
    counts: dict[str, int] = {}
    for c in parts:
        for o in c.options:
            counts[o] = counts.get(o, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{o} {n}" for o, n in ranked) + " layers"


def summary_lines(
    plan: Plan, ctx: PricingContext, fmt: str, written: StandIn | None = None
) -> list[str]:
    """What the file is, for its comment header: the inputs and the prediction — for the
    settings the file states: where it writes a stand-in for a per-layer recompute its
    framework cannot state (``written``), the stand-in's, with the plan's beside it."""
    job, lay = ctx.job, plan.layout
    lines = [
        f"ndplan plan as {fmt}: {ctx.model.name} on {ctx.cluster.num_devices} x "
        f"{ctx.device.id}, global batch {job.global_batch_size}, sequence {job.seq_length}, "
        f"{ctx.settings.precision}",
        f"layout: dp {lay.dp} tp {lay.tp} pp {lay.pp} vpp {lay.vpp} cp {lay.cp} ep {lay.ep} "
        f"mbs {lay.mbs} x {lay.num_microbatches} zero {lay.zero}",
    ]
    if written is not None and written.plan is None and plan.time is not None:
        lines.append(
            f"predicted: not priced as written ({written.description}: the exporter had no "
            f"pricer); the plan's own per-layer recompute: {_figures(plan)}"
        )
    elif (
        written is not None
        and written.plan is not None
        and written.plan.time is not None
        and plan.time is not None
    ):
        lines.append(
            f"predicted: {_figures(written.plan)} as written ({written.description}); "
            f"the plan's own per-layer recompute: {_figures(plan)}"
        )
    elif plan.time is not None:
        lines.append(f"predicted: {_figures(plan)}")
    return lines


def _figures(plan: Plan) -> str:
    peak = plan.memory.peak_bytes / 2**30
    return f"step {plan.time.step_s:.3f} s, peak {peak:.1f} GiB on stage {plan.memory.peak_stage}"


@dataclass(frozen=True, slots=True)
class Setting:
    """One recompute setting a framework's config states: its settings (arguments, a
    table), in words, and the option it runs on each decoder layer (model order)."""

    settings: object
    description: str
    options: tuple[str, ...]


def fastest_fitting(
    candidates: list[Setting], price: PerLayerPricer
) -> tuple[Setting, Plan] | None:
    """The fastest setting that fits in memory, priced as written (the first of equals:
    candidates come in a fixed order); None when none fits."""
    best: tuple[Setting, Plan] | None = None
    for setting in candidates:
        priced = price(setting.options)
        if not priced.memory.fits or priced.time is None:
            continue
        if best is None or priced.time.step_s < best[1].time.step_s:
            best = (setting, priced)
    return best


def stand_in(
    framework: str,
    what: str,
    parts: tuple[Chunk, ...],
    plan: Plan,
    candidates: list[Setting],
    safe: Setting,
    price: PerLayerPricer | None,
) -> tuple[Setting, str, StandIn | None]:
    """The setting to write for a per-layer choice the framework cannot state, the caveat
    saying so, and the setting priced. With ``price``, the fastest of ``candidates`` that
    fits, and what it costs; else (or when none fits) ``safe``, which saves at least the
    planned memory on every layer."""
    head = (
        f"{framework}: the plan recomputes per layer ({assignment_text(parts)}), which "
        f"{what} cannot state"
    )
    tail = f"; search with --recompute stated to rank only plans {framework} states exactly"
    found = fastest_fitting(candidates, price) if price is not None else None
    if found is None:
        if price is None:
            return safe, f"{head}; written as {safe.description}: no more memory than planned on any layer{tail}", StandIn(safe.description, None)  # fmt: skip
        priced = price(safe.options)
        return (
            safe,
            (
                f"{head}; written as {safe.description}: no more memory than planned on any "
                f"layer, {_cost(plan, priced)} (no setting it states fits){tail}"
            ),
            StandIn(safe.description, priced),
        )
    setting, priced = found
    return (
        setting,
        (
            f"{head}; written as {setting.description}, the fastest setting it states that fits "
            f"by ndplan's estimate: {_cost(plan, priced)}{tail}"
        ),
        StandIn(setting.description, priced),
    )


def stated_candidates(
    parts: tuple[Chunk, ...],
    ctx: PricingContext,
    layout: Layout,
    describe: Callable[[StatedRecompute], tuple[object, str]],
) -> list[Setting]:
    """Every recompute setting the framework states at the plan's layout, as ``--recompute
    stated`` weighs them (core.recompute.stated_settings), in its order; ``describe``
    gives a setting's config entries and words."""
    sizes, stages = layer_shape(parts)
    return [Setting(*describe(s), s.per_layer(sizes, stages)) for s in stated_settings(ctx, layout)]


def written_recompute(
    framework: str,
    what: str,
    parts: tuple[Chunk, ...],
    plan: Plan,
    exact: object | None,
    candidates: Callable[[], list[Setting]],
    safe: Callable[[tuple[Chunk, ...]], Setting],
    price: PerLayerPricer | None,
) -> tuple[object, list[str], StandIn | None]:
    """A framework's recompute entries for the plan: ``exact`` where its config states the
    plan's choice; else the stand-in (``stand_in``), its caveat and its price. The
    candidates are listed only with a pricer to weigh them."""
    if exact is not None:
        return exact, [], None
    weighed = candidates() if price is not None else []
    setting, caveat, priced = stand_in(framework, what, parts, plan, weighed, safe(parts), price)
    return setting.settings, [caveat], priced


def _cost(plan: Plan, priced: Plan) -> str:
    step, planned = priced.time.step_s, plan.time.step_s
    mem = priced.memory
    return (
        f"{step:.3f} s per step ({100 * (step / planned - 1):+.1f} % against the plan's "
        f"{planned:.3f} s), peak {mem.peak_bytes / 2**30:.1f} GiB on stage {mem.peak_stage}"
    )
