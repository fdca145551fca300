"""The pricing context: one search's fixed inputs, and where layers sit on stages."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .assumptions import AssumptionRecorder
from .calibration import Calibration
from .cluster import Cluster, DeviceSpec
from .counting import KindParameters, count_flops, kind_parameters
from .frameworks import FrameworkTraits, traits_for
from .job import Job, JobSettings
from .layout import Layout
from .model import ModelSpec
from .units import GiB


@dataclass(frozen=True, slots=True)
class Chunk:
    """Consecutive decoder layers [start, stop) run as one pipeline chunk."""

    start: int
    stop: int
    in_flight: int
    """Micro-batches whose activations the chunk holds at the stage's peak."""


@dataclass(frozen=True, slots=True)
class StagePlacement:
    """What one pipeline stage holds."""

    index: int
    chunks: tuple[Chunk, ...]
    has_embedding: bool
    has_head: bool
    """The output layer and the loss."""
    has_mtp: bool
    groups: tuple[tuple[int, int, int], ...]
    """(kind index, layer count, in-flight) aggregated over the stage's chunks."""
    head_in_flight: int = 1
    """Micro-batches whose loss activations the last stage holds at once."""
    composition: tuple[tuple[int, int], ...] = ()
    """(kind index, layer count) over the stage's chunks: what its weights and time depend on."""
    role: tuple = ()
    """What distinguishes the stage apart from in-flight counts: composition and the
    embedding/head/MTP it carries (stages with one role share weights and seconds)."""
    units: tuple[tuple[int, int], ...] = ()
    """(kind index, Σ layers × in-flight): activation memory is Σ units × bytes per micro-batch."""

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(i for c in self.chunks for i in range(c.start, c.stop))

    @property
    def num_layers(self) -> int:
        return sum(c.stop - c.start for c in self.chunks)

    @property
    def max_in_flight(self) -> int:
        return max((c.in_flight for c in self.chunks), default=0)


def layer_key(layout: Layout) -> tuple:
    """The degrees one layer's tensors, time and recompute options depend on: tp, cp, sp,
    ep, etp and the micro-batch — not dp, and pp only through in-flight counts (spec/
    search.md). DualPipeV changes how EP traffic is hidden, so it is part of the key."""
    return (
        layout.tp,
        layout.cp,
        layout.sequence_parallel,
        layout.ep,
        layout.expert_tp,
        layout.mbs,
        layout.schedule == "dualpipev",
    )


def placement_key(layout: Layout) -> tuple:
    """What the placement of layers on stages depends on (``PricingContext.placement``)."""
    return (
        layout.pp,
        layout.vpp,
        layout.schedule,
        layout.num_microbatches,
        layout.layers_per_stage,
    )


class _NoCache(dict):
    """A cache that forgets: every lookup misses, so everything is recomputed."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def update(self, *args: Any, **kwargs: Any) -> None:
        pass


def even_split(num_layers: int, parts: int) -> tuple[int, ...]:
    """Layers per chunk, as even as possible; the earlier chunks take the remainder last
    (first and last stages also carry the embedding and the head)."""
    base, extra = divmod(num_layers, parts)
    # Spread the remainder over the middle chunks first: the ends hold embedding/head.
    order = sorted(range(parts), key=lambda i: (min(i, parts - 1 - i) == 0, i))
    counts = [base] * parts
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


MTP_LAYER_SLOTS = 2
"""Decoder layers' worth of work one MTP block brings to the last chunk (its transformer
layer plus its projection, head and loss); the main loss brings one more."""


def mtp_room(mtp_layers: int) -> int:
    """Layer slots an MTP model's last chunk keeps for its MTP blocks and the loss (0
    without MTP, where the even split applies)."""
    return 1 + MTP_LAYER_SLOTS * mtp_layers if mtp_layers else 0


def mtp_room_splits_evenly(num_layers: int, chunks: int, mtp_layers: int) -> bool:
    """Whether an MTP model's layers plus its last-chunk room fill ``chunks`` chunks
    equally, the last keeping at least that room (False without MTP)."""
    held = mtp_room(mtp_layers)
    slots = num_layers + held
    return bool(held) and slots % chunks == 0 and slots // chunks >= held


def default_split(num_layers: int, chunks: int, mtp_layers: int = 0) -> tuple[int, ...]:
    """Layers per chunk when the layout gives none: the even split, except that with MTP
    the last chunk keeps room for the MTP blocks and the loss. An even split would put
    them on top of a full chunk of layers, which makes the last stage the whole pipeline's
    bottleneck (DeepSeek-V3 at pp 16: twice the others); Megatron-Bridge's DeepSeek-V3
    recipes split 61 layers as 16/16/16/13 over 4 chunks, 8×7 + 5 over 8, 4×15 + 1 over
    16, which is this rule."""
    held = mtp_room(mtp_layers)
    if held:
        slots = even_split(num_layers + held, chunks)
        if slots[-1] >= held:
            return (*slots[:-1], slots[-1] - held)
    return even_split(num_layers, chunks)


def head_counted_split(
    num_layers: int, pp: int, chunks: int, mtp_layers: int = 0
) -> tuple[int, ...] | None:
    """Layers per chunk with the embedding, the loss and each MTP block counted as one
    layer each, every chunk holding the same number of those slots or one fewer, no
    stage more than one short (None where that cannot be: as many short slots as stages,
    or a last chunk too small for the MTP blocks and the loss).

    Where ``chunks`` divides the layers plus those slots, this is the even split of them
    (NVIDIA's Llama 3.1 405B recipe: 126 layers as pp 16 × vpp 8, the first and last
    chunks holding only the embedding and the loss; its DeepSeek-V3 recipe on H100:
    61 layers and one MTP block as pp 8 × vpp 4, ``Et|(tt|)*30mL``). Otherwise the short
    slots go one per stage, the last stage first, then the first, then the stages before
    the last (the ends hold the embedding and the loss): fewer short slots than stages,
    so no stage is more than one layer lighter than the fullest. Megatron runs such
    layouts (``--pipeline-model-parallel-layout``); Megatron-Bridge's published Kimi K2
    and DeepSeek-V3 (without MTP) runs interleave 61 layers, which no even split allows,
    as pp 4 × vpp 4 and pp 2 × vpp 4."""
    tail = 1 + mtp_layers  # the loss and the MTP blocks, on the last chunk
    slots = num_layers + 1 + tail
    if chunks > slots:
        return None
    per_chunk = -(-slots // chunks)
    empty = per_chunk * chunks - slots
    if empty >= pp:
        return None
    counts = [per_chunk] * chunks
    # The last chunk of each stage is its last virtual chunk; the chunks are in order
    # (virtual stage by virtual stage), so the last ``pp`` are one per stage.
    order = [chunks - 1, chunks - pp, *range(chunks - 2, chunks - pp, -1)]
    for chunk in order[:empty]:
        counts[chunk] -= 1
    counts[0] -= 1
    counts[-1] -= tail
    # A chunk is short only where chunks hold 2 slots or more (chunks ≤ slots), so only
    # the last can come out below zero, and only with MTP blocks beside the loss.
    return tuple(counts) if counts[-1] >= 0 else None


MIN_BALANCE_GAIN = 0.01
"""How much lighter (a fraction) the balanced split must make the slowest stage than the
default split does to be a layout of its own. Less is within the step-time model's
resolution, and each balanced split doubles the pipelined candidates the search screens
(Llama 3 70B at pp 4: 21 against 21.1 layers, 0.5 %, is not offered; at pp 16: 6 against
6.1, 1.6 %, is)."""


def flop_head_weight(model: ModelSpec, attention_span: int) -> float | None:
    """The output layer's forward FLOPs in mean decoder layers (None if layers do none)."""
    flops = count_flops(model, attention_span)
    logits = flops.forward_parts["logits"]
    per_layer = (flops.forward_flops_per_token - logits) / model.num_layers
    return logits / per_layer if per_layer > 0 else None


def balanced_split(
    model: ModelSpec, attention_span: int, pp: int, vpp: int, head: float | None = None
) -> tuple[int, ...] | None:
    """Layers per chunk that even out the stages' work when the output layer is heavy.

    An even split puts the output layer and the loss on top of a full share of layers, so
    the last stage sets the pace of the whole pipeline (a 256k-word vocabulary at hidden
    6,144 is 3.5 layers of GEMM). Counting the output layer and the loss as ``head`` mean
    decoder layers (without it, as the output layer's forward FLOPs), the last stage keeps
    the layer count that minimises the slowest stage; the others share the rest, the
    surplus on the stages nearest the end, which hold the fewest micro-batches in flight.
    Within a stage the layers spread over its virtual chunks, the surplus on the later
    ones (fewer in flight); on the last stage on the earlier ones, away from the head.
    None where it makes the slowest stage less than ``MIN_BALANCE_GAIN`` lighter than the
    default split does, or does not apply: one stage, MTP models (their default split
    already leaves the last chunk room) and vision models (the encoder sits on the first
    stage).
    """
    if pp < 2 or model.num_mtp_layers or model.vision is not None:
        return None
    layers = model.num_layers
    if head is None:
        head = flop_head_weight(model, attention_span)
    if head is None or head <= 0:
        return None

    def slowest(last: int) -> tuple[float, int]:
        return (max(last + head, -(-(layers - last) // (pp - 1))), -last)

    # Past an even share the last stage only gets slower (head > 0): no need to look.
    last = min(range(-(-layers // pp) + 1), key=slowest)  # ties: the split nearest even
    base, extra = divmod(layers - last, pp - 1)
    per_stage = [base + (1 if s >= pp - 1 - extra else 0) for s in range(pp - 1)] + [last]
    counts = [0] * (pp * vpp)
    for s, total in enumerate(per_stage):
        chunk_base, chunk_extra = divmod(total, vpp)
        for j in range(vpp):
            later = j >= vpp - chunk_extra if s < pp - 1 else j < chunk_extra
            counts[s + j * pp] = chunk_base + (1 if later else 0)
    default_stages = [0.0] * pp
    for chunk, n in enumerate(default_split(layers, pp * vpp)):
        default_stages[chunk % pp] += n
    default_stages[-1] += head
    lighter = 1 - slowest(last)[0] / max(default_stages)
    return tuple(counts) if lighter >= MIN_BALANCE_GAIN else None


def interleaved_in_flight(pp: int, vpp: int, m: int, stage: int) -> tuple[int, ...]:
    """Per chunk of ``stage``: forwards done before its first backward (Megatron's
    interleaved 1F1B). Warm-up is ``2·(pp − stage − 1) + (vpp − 1)·pp`` forwards plus
    the first steady-state one; forwards cycle through the chunks in blocks of ``pp``
    micro-batches. Totals ``pp·vpp + pp − 1`` on stage 0, i.e. Megatron's factor
    ``1 + (pp − 1)/(pp·vpp)`` on top of ``pp`` micro-batches."""
    total_forwards = min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp)
    # Walk Megatron's schedule table (get_schedule_table): micro-batch groups of pp, each
    # run through every chunk; the last group may be smaller when pp does not divide m.
    # (Fix: blocks of exactly pp per chunk undercounted stage 0 for pp < m < 2·pp − 1.)
    counts = [0] * vpp
    left = total_forwards
    for first in range(0, m, pp):
        if not left:  # the rest of the table adds nothing: stop, or a step of a million
            break  # micro-batches walks all of them for each stage it places
        size = min(pp, m - first)
        for chunk in range(vpp):
            take = min(size, left)
            counts[chunk] += take
            left -= take
    return tuple(counts)


def layer_counts(model: ModelSpec, layout: Layout) -> tuple[int, ...]:
    """Decoder layers per chunk: the layout's own counts, else the default split."""
    return layout.layers_per_stage or default_split(
        model.num_layers, layout.chunks, model.num_mtp_layers
    )


def chunk_stage(layout: Layout, chunk: int) -> int:
    """The stage that runs ``chunk`` (DualPipeV folds the chunks into a V)."""
    pp = layout.pp
    if layout.schedule == "dualpipev":
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def place_layers(model: ModelSpec, layout: Layout) -> tuple[StagePlacement, ...]:
    """Stages, their chunks, in-flight counts, and where embedding/head/MTP sit.

    1F1B: stage ``i`` holds ``min(pp − i, m)``; GPipe: ``m``; interleaved: per chunk
    (see :func:`interleaved_in_flight`); DualPipeV: chunk 0 of stage ``i`` holds
    ``2·pp − 1 − i``, chunk 1 holds ``i + 1`` (capped at ``m``), and both ends of the
    model (embedding and head) sit on stage 0.
    """
    pp, m = layout.pp, layout.num_microbatches
    chunks_n = layout.chunks
    counts = layer_counts(model, layout)
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    stage_chunks: list[list[tuple[int, int, int]]] = [
        [] for _ in range(pp)
    ]  # (chunk id, start, stop)
    for chunk_id in range(chunks_n):
        stage_chunks[chunk_stage(layout, chunk_id)].append(
            (chunk_id, bounds[chunk_id], bounds[chunk_id + 1])
        )

    stages = []
    for s in range(pp):
        entries = stage_chunks[s]
        if layout.schedule == "gpipe":
            in_flight = [m] * len(entries)
        elif layout.schedule == "interleaved":
            in_flight = list(interleaved_in_flight(pp, layout.vpp, m, s))
        elif layout.schedule == "dualpipev":
            in_flight = [min(m, 2 * pp - 1 - s), min(m, s + 1)]
        else:
            in_flight = [min(pp - s, m)] * len(entries)
        chunks = tuple(
            Chunk(start, stop, k) for (_, start, stop), k in zip(entries, in_flight, strict=True)
        )
        group_counts: Counter[tuple[int, int]] = Counter()
        for chunk in chunks:
            for layer in range(chunk.start, chunk.stop):
                group_counts[(model.layers[layer], chunk.in_flight)] += 1
        groups = tuple(sorted((kind, n, k) for (kind, k), n in group_counts.items()))
        composition_counts: Counter[int] = Counter()
        unit_counts: Counter[int] = Counter()
        for kind, n, k in groups:
            composition_counts[kind] += n
            unit_counts[kind] += n * k
        composition = tuple(sorted(composition_counts.items()))
        first_chunk = entries[0][0] == 0 if entries else False
        last_chunk_id = chunks_n - 1
        has_head = any(cid == last_chunk_id for cid, _, _ in entries)
        has_embedding = first_chunk or (s == 0)
        has_mtp = has_head and model.num_mtp_layers > 0
        head_in_flight = m if layout.schedule == "gpipe" else 1
        stages.append(
            StagePlacement(
                index=s,
                chunks=chunks,
                has_embedding=has_embedding,
                has_head=has_head,
                has_mtp=has_mtp,
                groups=groups,
                head_in_flight=head_in_flight,
                composition=composition,
                role=(
                    composition,
                    has_embedding,
                    has_head,
                    has_mtp,
                    chunks[0].in_flight if has_embedding and chunks else 0,
                    head_in_flight if has_head else 0,
                ),
                units=tuple(sorted(unit_counts.items())),
            )
        )
    return tuple(stages)


HeadWeigher = Callable[[Layout], "float | None"]
"""The output layer and the loss of one micro-batch, in mean decoder layers, for a layout."""

HEAD_WEIGHT_STEP = 0.01
"""Head weights are kept to this many decoder layers: a split moves whole layers, and
candidates whose weights differ by less share one split."""


class LayerSplits:
    """Layers per chunk for each split code (``search.SPLITS``), computed once per
    pipeline shape (the balanced one per head weight too). Kept on the context beside,
    not in, its ``cache``: a property of the model, not reuse that ``memoize=False``
    should turn off.

    The balanced split weighs the output layer and the loss by the seconds of the cost
    model a Pricer installs (``weigh_head_with``), so the search, its workers and the
    balancer weigh them alike and as they will be priced: the logits GEMM stays in bf16
    while the layers run in FP8, the loss reads the logits from memory, deferred weight
    gradients leave the critical path. Without one, by FLOPs."""

    def __init__(
        self,
        model: ModelSpec,
        attention_span: int,
        deferred_wgrads: Callable[[int, str, int], int] = lambda pp, schedule, m: 0,
    ) -> None:
        self._model = model
        self._span = attention_span
        self._deferred_wgrads = deferred_wgrads
        # Where no balanced split applies (``balanced_split``), nothing is weighed.
        self._balances = not model.num_mtp_layers and model.vision is None
        self._found: dict[tuple, tuple[int, ...] | None] = {}
        self._weigher: HeadWeigher | None = None
        self._weights: dict[tuple, float | None] = {}

    def weigh_head_with(self, weigher: HeadWeigher | None) -> None:
        """Weigh the head with ``weigher`` from now on (None: by FLOPs)."""
        self._weigher = weigher
        self._weights.clear()

    def head_weight(
        self,
        tp: int,
        cp: int,
        ep: int,
        etp: int | None,
        mbs: int,
        pp: int,
        m: int,
        vpp: int,
        schedule: str,
        recompute: str = "auto",
    ) -> float | None:
        """The head in mean decoder layers for a pipeline of these degrees and recompute
        policy, rounded to ``HEAD_WEIGHT_STEP`` (None without a weigher:
        ``balanced_split`` counts FLOPs).

        Weighed once per (tp, cp, ep, etp, micro-batch size, recompute, deferred share):
        a layer's compute depends on those (a fine-grained MoE layer's experts run far
        faster spread over EP ranks), and on the pipeline (its depth, VPP, schedule and
        micro-batch count) only through the share of output-layer weight gradients
        deferred to the drain; a search meets tens of thousands of pipelines for a few
        hundred of these (354 for Llama 3 70B on 1,024 H100). Data parallelism and ZeRO
        leave both alike; sequence parallelism, which shards only the norms, is taken as
        on wherever tp > 1."""
        if self._weigher is None or not self._balances:
            return None
        key = (tp, cp, ep, etp, mbs, recompute, self._deferred_wgrads(pp, schedule, m) / m)
        if key not in self._weights:
            even = Layout.trusted(
                tp=tp,
                pp=pp,
                cp=cp,
                vpp=vpp,
                mbs=mbs,
                num_microbatches=m,
                schedule=schedule,
                sp=tp > 1,
                dp=1,
                ep=ep,
                etp=etp,
                zero=0,
                recompute=recompute,
                offload_optimizer=False,
                layers_per_stage=None,
            )
            weight = self._weigher(even)
            self._weights[key] = (
                round(weight / HEAD_WEIGHT_STEP) * HEAD_WEIGHT_STEP if weight else None
            )
        return self._weights[key]

    def counts(
        self, pp: int, chunks: int, split: int, head: float | None = None
    ) -> tuple[int, ...] | None:
        """Layers per chunk for a split code (None: the default split); the balanced one
        (code 2) with the head as ``head`` decoder layers (None: its FLOPs)."""
        if split == 0:
            return None
        key = (pp, chunks, split, head if split == 2 else None)
        if key not in self._found:
            num_layers = self._model.num_layers
            if split == 1:
                self._found[key] = head_counted_split(
                    num_layers, pp, chunks, self._model.num_mtp_layers
                )
            else:
                self._found[key] = balanced_split(self._model, self._span, pp, chunks // pp, head)
        return self._found[key]

    def balanced(
        self,
        tp: int,
        cp: int,
        ep: int,
        etp: int | None,
        mbs: int,
        pp: int,
        m: int,
        vpp: int,
        schedule: str,
        recompute: str,
    ) -> tuple[int, ...] | None:
        """The balanced split (code 2) of a pipeline of these degrees, its head weighed
        at them (``head_weight``)."""
        head = self.head_weight(tp, cp, ep, etp, mbs, pp, m, vpp, schedule, recompute)
        chunks = 2 * pp if schedule == "dualpipev" else pp * vpp
        return self.counts(pp, chunks, 2, head)

    def for_layout(self, layout: Layout, split: int) -> tuple[int, ...] | None:
        """``counts`` for a layout's pipeline shape, its head weighed at its degrees."""
        if split != 2:
            return self.counts(layout.pp, layout.chunks, split)
        return self.balanced(
            layout.tp,
            layout.cp,
            layout.ep,
            layout.expert_tp,
            layout.mbs,
            layout.pp,
            layout.num_microbatches,
            layout.vpp,
            layout.schedule,
            layout.recompute,
        )


@dataclass
class PricingContext:
    """Everything fixed during one search: the model, the hardware, the job, the fit.

    Caches live here (not in module globals) so two searches never share state.
    """

    model: ModelSpec
    cluster: Cluster
    job: Job
    recorder: AssumptionRecorder = field(default_factory=AssumptionRecorder)
    calibration: Calibration = field(default_factory=Calibration)
    capacity_bytes: int | None = None
    """Usable device memory (--max-mem); the device capacity when None."""
    balance_reserve_bytes: int = 0
    """Held back for later balancing (--reserve)."""
    reserve_bytes: int | None = None
    """The fixed runtime reserve; the device's (or the calibration's) when None."""
    cache: dict[Any, Any] = field(default_factory=dict)
    memoize: bool = True
    """Reuse priced parts across candidates (off only to measure what reuse buys)."""
    options: Any = None
    """The pricing options the facade made it with (``ndplan.planner.PricingOptions``);
    None for a context made directly."""

    def __post_init__(self) -> None:
        if not self.memoize:
            self.cache = _NoCache()
        self._pricing_choice: Any = None
        self._twins: dict[Any, PricingContext] = {}
        self.settings = JobSettings(self.job, self.recorder)
        self._pairs_a2a: bool | None = None
        """Whether the combined 1F1B schedule runs (``unpaired_share``); None until read."""
        self.layer_splits = LayerSplits(
            self.model, self.settings.attention_span, self.deferred_wgrads
        )
        self.kind_params: tuple[KindParameters, ...] = tuple(
            kind_parameters(k, self.model.hidden_size) for k in self.model.kinds
        )
        self.mtp_params: KindParameters | None = (
            kind_parameters(self.model.mtp_kind, self.model.hidden_size)
            if self.model.mtp_kind
            else None
        )

    def for_pricing(self, choice: Any, options: Any = None) -> PricingContext:
        """This context for the ports ``choice`` names (memory model, cost model, solver,
        …): itself for the first choice that prices on it, else a twin with the same
        inputs and recorder, ``options`` (else its own) and a cache of its own, kept for
        that choice. Priced parts are the ports', so one choice never reads what another
        cached."""
        if self._pricing_choice is None:
            self._pricing_choice = choice
        if choice == self._pricing_choice:
            return self
        twin = self._twins.get(choice)
        if twin is None:
            options = self.options if options is None else options
            twin = self._twins[choice] = dataclasses.replace(self, cache={}, options=options)
            twin._pricing_choice = choice
        return twin

    @property
    def device(self) -> DeviceSpec:
        return self.cluster.device

    @property
    def framework(self) -> FrameworkTraits:
        traits = self.cache.get("framework")
        if traits is None:
            traits = self.cache["framework"] = traits_for(self.settings.framework)
        return traits

    @property
    def device_capacity_bytes(self) -> int:
        return self.capacity_bytes if self.capacity_bytes is not None else self.device.memory_bytes

    @property
    def budget_bytes(self) -> int:
        return self.device_capacity_bytes - self.balance_reserve_bytes

    @property
    def fixed_reserve_bytes(self) -> int:
        if self.reserve_bytes is not None:
            return self.reserve_bytes
        gib = self.calibration.reserve_gib(self.device)
        return int(gib * GiB)

    def deferred_head_wgrads(self, layout: Layout) -> int:
        """Micro-batches per step whose output-layer weight gradient the last stage defers
        to the pipeline drain (0 where the option does not apply). The settings are read,
        and so assumed, only where it applies."""
        return self.deferred_wgrads(layout.pp, layout.schedule, layout.num_microbatches)

    def deferred_wgrads(self, pp: int, schedule: str, m: int) -> int:
        """``deferred_head_wgrads`` from the degrees it depends on."""
        if (
            pp == 1
            or schedule not in ("1f1b", "interleaved")
            or not self.framework.deferred_embedding_wgrad
            or self.settings.finetune != "full"
            or not self.settings.defer_embedding_wgrad
        ):
            return 0
        limit = self.settings.wgrad_deferral_limit
        return m if limit == 0 else min(m, limit)

    def unpaired_a2a_share(self, layout: Layout) -> float | None:
        """Under the combined 1F1B schedule (``moe_a2a_overlap``), the share of a layer's
        micro-batch passes that run with no other micro-batch's pass beside them to hide
        their EP all-to-alls: the first forward and the last backward of a one-stage step,
        the first stage's warm-up forwards and cool-down backwards of an interleaved one
        (2·(pp − 1) + (vpp − 1)·pp of its m·vpp chunk passes each way, Narayanan et al.
        2021). None where the overlap does not run: no EP, the switch off, DualPipeV (which
        pairs its own micro-batches), or a pipeline that does not interleave (Megatron asks
        for virtual stages then)."""
        return self.unpaired_share(
            layout.ep, layout.pp, layout.vpp, layout.schedule, layout.num_microbatches
        )

    def unpaired_share(self, ep: int, pp: int, vpp: int, schedule: str, m: int) -> float | None:
        """``unpaired_a2a_share`` from the degrees it depends on (the search's bounds ask
        with a candidate's raw degrees). The switch is read, and so assumed, only where
        it could apply."""
        if ep == 1 or schedule == "dualpipev" or (pp > 1 and schedule != "interleaved"):
            return None
        if self._pairs_a2a is None:  # read once: every layer-time lookup asks
            self._pairs_a2a = bool(
                self.framework.paired_a2a_overlap and self.settings.moe_a2a_overlap
            )
        if not self._pairs_a2a:
            return None
        passes = m * vpp
        warmup = 1 if pp == 1 else 2 * (pp - 1) + (vpp - 1) * pp
        return min(passes, warmup) / passes

    def time_key(self, layout: Layout) -> tuple:
        """``layer_key`` and what else a layer's time depends on: the share of its passes
        the combined 1F1B schedule leaves unpaired, where it runs."""
        share = self.unpaired_a2a_share(layout)
        return layer_key(layout) if share is None else (*layer_key(layout), share)

    def placement(self, layout: Layout) -> tuple[StagePlacement, ...]:
        key = ("placement", *placement_key(layout))
        found = self.cache.get(key)
        if found is None:
            found = self.cache[key] = place_layers(self.model, layout)
        return found
