"""The step-time model (spec/performance.md).

Per layer and micro-batch: GEMMs priced at the device's peak times a size-dependent
efficiency (small GEMMs cannot fill the device) with a memory roofline; flash
attention at its own efficiency; norms, activations, rotary embeddings, casts and
permutations as bytes over HBM bandwidth; TP/SP, CP and EP communication exposed
where the framework does not hide it. Stages compose into a pipeline schedule
(1F1B, interleaved, GPipe, DualPipeV), plus exposed data-parallel communication,
the optimizer step and a fixed per-step overhead. The parts sum to the step time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from .calibration import Calibration, DeviceEfficiency, Overlap
from .collectives import (
    DEFAULT_ORDER,
    GroupLink,
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    deduplicated_all_to_all_s,
    group_link,
    reduce_scatter_s,
    ring_latency_s,
    send_recv_s,
)
from .context import PricingContext, StagePlacement
from .counting import core_attention_flops, model_flops_per_step
from .errors import InvalidInputError, did_you_mean
from .frameworks import offloads, per_op_policy_applies
from .layout import Layout
from .memory import (
    ACTIVATION_BYTES,
    NdplanMemoryModel,
    fp8_primary_weights,
    low_precision_copies,
    padded_vocab,
)
from .model import DenseFFN, LatentAttention, LayerKind, LinearAttention, MoEFFN, StandardAttention
from .plan import TimeBreakdown
from .ports import Recompute

TIME_PARTS = (
    "forward",
    "backward",
    "recompute",
    "tp_comm",
    "cp_comm",
    "ep_comm",
    "offload",
    "pp_comm",
    "bubble",
    "dp_comm",
    "optimizer",
    "overhead",
)
LAYER_PARTS = ("forward", "backward", "recompute", "tp_comm", "cp_comm", "ep_comm", "offload")
FLASH_BACKWARD_FACTOR = 2.5
"""Flash attention's backward runs five matmuls against the forward's two."""
ATTENTION_HALF_KEYS = 460
"""Keys per kernel call at which a flash-attention kernel reaches half its long-sequence
rate. From the FlashAttention-3 paper's H100 benchmark (causal forward, head dim 128,
512 to 16k keys): FlashAttention-2, cuDNN and FlashAttention-3 each follow
``L / (L + 460)`` of their own top rate within 12 %. Ring CP runs the kernel on blocks of
seq/cp keys, so a short sequence over many CP ranks runs it far below its peak."""


def attention_length_efficiency(keys: float) -> float:
    """Share of its long-sequence rate a flash-attention call over ``keys`` keys reaches."""
    return keys / (keys + ATTENTION_HALF_KEYS)


@dataclass(frozen=True, slots=True)
class Op:
    """One forward op of a layer: its seconds, and the switches that re-run it in the backward."""

    name: str
    forward_s: float
    backward_s: float
    recomputed_by: frozenset[str]
    kernels: int = 1


@dataclass(frozen=True, slots=True)
class LayerCost:
    """Everything the time of one layer under any recompute option is built from."""

    ops: tuple[Op, ...]
    tp_forward_s: float
    tp_backward_s: float
    sp_regather_s: float
    """Re-gathering the SP inputs in the backward (when the gathered copies are dropped)."""
    cp_forward_s: float
    cp_backward_s: float
    cp_ring_steps: int
    """Ring steps (cp − 1) whose transfers hide behind one block's attention each; 0 for all-to-all."""
    ep_forward_s: float
    ep_backward_s: float
    attention_forward_s: float
    launch_s: float
    flops: float
    """Forward model FLOPs of the layer on one device, one micro-batch."""
    recompute_flops: dict[str, float]
    """Forward FLOPs each switch re-runs (for hardware FLOPs)."""
    mixer_ops: int = 0
    """How many of ``ops``, from the first, are the mixer's (attention and its projections);
    the rest are the FFN's (router, token permutes, experts, shared experts)."""
    ffn_tp_share: float = 0.5
    """Share of ``tp_forward_s`` that is the FFN block's own (re-run when it is recomputed):
    half, or none where routed experts without shared ones leave the FFN no TP collective."""


class StageSeconds(dict):
    """Per micro-batch seconds of one stage by part (the values sum to its time), plus
    the compute that already hides the CP ring's transfers — it cannot hide anything
    else — and one pipeline send across the stage's boundary (the step charges the
    sends on the fill and drain chain from it)."""

    __slots__ = ("cp_hidden_backward", "cp_hidden_forward", "deferred_wgrad", "pipeline_send")

    def __init__(
        self,
        parts: Mapping[str, float],
        hidden_forward: float = 0.0,
        hidden_backward: float = 0.0,
        pipeline_send: float = 0.0,
        deferred_wgrad: float = 0.0,
    ):
        super().__init__(parts)
        self.cp_hidden_forward = hidden_forward
        self.cp_hidden_backward = hidden_backward
        self.pipeline_send = pipeline_send
        self.deferred_wgrad = deferred_wgrad
        """Per step: the output-layer weight gradients this stage defers to the drain."""


@dataclass(frozen=True, slots=True)
class Links:
    tp: GroupLink
    cp: GroupLink
    ep: GroupLink
    etp: GroupLink
    dp: GroupLink
    expert_dp: GroupLink
    pp: GroupLink


def _mixer_degrees(layout: Layout) -> tuple[int, int, bool, int]:
    """The degrees a layer's mixer (and a layer without routed experts) is priced on:
    tp, cp, sp and the micro-batch."""
    return (layout.tp, layout.cp, layout.sequence_parallel, layout.mbs)


class _LayerOps:
    """A layer's forward ops as they are built, with the model FLOPs they run and those
    each recompute switch re-runs; started from another's (the mixer's) to go on."""

    __slots__ = (
        "accumulate_bytes",
        "backward_gemms",
        "cast",
        "ctx",
        "flops",
        "lp",
        "model",
        "ops",
        "rec_flops",
        "sigma",
    )

    def __init__(
        self,
        model: NdplanCostModel,
        ctx: PricingContext,
        sigma: int,
        ops: Sequence[Op] = (),
        flops: float = 0.0,
        rec_flops: Mapping[str, float] | None = None,
    ) -> None:
        job = ctx.settings
        self.model = model
        self.ctx = ctx
        self.sigma = sigma
        self.lp = job.is_low_precision
        # Frozen weights (LoRA) need no weight-gradient GEMM: the backward is dgrad only.
        self.backward_gemms = 1.0 if job.finetune == "lora" else 2.0
        # The gradient buffer a weight gradient is added into: read and written.
        self.accumulate_bytes = 2.0 * job.grad_reduce_bytes
        # Quantise a linear input: read bf16, write its fp8 layouts (one where the
        # tensor cores take per-tensor fp8 in any layout, else rowwise and columnwise).
        self.cast = (
            ACTIVATION_BYTES + low_precision_copies(job.precision, ctx.device) if self.lp else 0.0
        )
        self.ops: list[Op] = list(ops)
        self.flops = flops
        self.rec_flops: dict[str, float] = dict(rec_flops or {})

    def gemm(
        self,
        name: str,
        m: float,
        k: float,
        nn: float,
        switches=(),
        count: float = 1.0,
        low_precision: bool | None = None,
        routed: bool = False,
        gathered: bool = False,
        recomputed_share: tuple[float, str] | None = None,
        fused: bool = False,
    ) -> None:
        """One GEMM op; ``recomputed_share`` (share, switch): that share of it (a fused
        projection's part) is recomputed under one more switch."""
        model, ctx = self.model, self.ctx
        shaped = partial(
            model._gemm_s,
            ctx, m, k, nn, count, low_precision, grouped=count > 1, routed=routed, fused=fused,
        )  # fmt: skip
        fwd = shaped()
        # The backward runs the input gradient (as long as the forward) and, unless the
        # weights are frozen, the weight gradient, which also reads and writes the
        # gradient buffer it accumulates into every micro-batch: past the forward's time
        # where that traffic outweighs its FLOPs (many local experts, few tokens each).
        wgrad_excess = 0.0
        if self.backward_gemms > 1:
            wgrad_excess = max(0.0, shaped(accumulate_bytes=self.accumulate_bytes) - fwd)
        if (low_precision is None and self.lp) or low_precision:
            # A column-parallel input that arrives through the SP all-gather is quantised
            # on the rank's own shard before the gather (Transformer Engine), so the cast
            # is not repeated on every TP rank.
            cast_rows = m / self.sigma if gathered else m
            fwd += model._hbm_s(ctx, self.cast * cast_rows * k * count)
        f = 2.0 * m * k * nn * count
        self.flops += f
        rec_flops = self.rec_flops
        for sw in switches:
            rec_flops[sw] = rec_flops.get(sw, 0.0) + f
        bwd_gemms = self.backward_gemms
        if recomputed_share is None:
            bwd = bwd_gemms * fwd + wgrad_excess
            self.ops.append(Op(name, fwd, bwd, frozenset(switches), kernels=2))
            return
        share, extra = recomputed_share
        kept, part = fwd * (1 - share), fwd * share
        kept_bwd = bwd_gemms * kept + wgrad_excess * (1 - share)
        self.ops.append(Op(name, kept, kept_bwd, frozenset(switches), kernels=1))
        part_bwd = bwd_gemms * part + wgrad_excess * share
        self.ops.append(Op(name + "_part", part, part_bwd, frozenset({*switches, extra}), 1))
        if extra not in switches:
            rec_flops[extra] = rec_flops.get(extra, 0.0) + f * share

    def elementwise(
        self,
        name: str,
        nbytes: float,
        switches=(),
        backward_factor: float = 2.0,
        kernels: int = 1,
    ) -> None:
        fwd = self.model._hbm_s(self.ctx, nbytes)
        self.ops.append(Op(name, fwd, backward_factor * fwd, frozenset(switches), kernels))


def pipeline_seconds(layout: Layout, slowest_s: float, total_s: float) -> float:
    """A step's micro-batches through the pipeline, from the slowest stage's time per
    micro-batch and the stages' sum: 1F1B and GPipe run every stage once and the slowest
    m − 1 times more; interleaved the slowest m times and the others' 1/vpp share of one;
    DualPipeV the slowest m times (``step`` adds its fill). It grows with both, which
    keeps the step floor below the step."""
    m = layout.num_microbatches
    if layout.schedule == "interleaved":
        return m * slowest_s + (total_s - slowest_s) / layout.vpp
    if layout.schedule == "dualpipev":
        return m * slowest_s
    return total_s + (m - 1) * slowest_s  # 1f1b, gpipe


class NdplanCostModel:
    """ndplan's analytic step-time model (the default CostModel)."""

    name = "ndplan"

    def __init__(
        self, calibration: Calibration | None = None, order: tuple[str, ...] = DEFAULT_ORDER
    ) -> None:
        if tuple(order[:2]) != ("tp", "cp") or sorted(order) != sorted(DEFAULT_ORDER):
            # Per-layer costs are memoised on the degrees that shard a layer (layer_key),
            # which leave out dp and pp: the TP and CP groups' links must not depend on them.
            raise ValueError(
                f"order {order!r}: place tp innermost, then cp, then dp and pp in either order"
            )
        self.calibration = calibration
        self.order = order
        self._memory = NdplanMemoryModel()

    # ------------------------------------------------------------------ helpers

    def _calibration(self, ctx: PricingContext) -> Calibration:
        return self.calibration if self.calibration is not None else ctx.calibration

    def efficiency(self, ctx: PricingContext) -> DeviceEfficiency:
        found = ctx.cache.get("efficiency")
        if found is None:
            calibration = self._calibration(ctx)
            family = ctx.device.calibration_family
            fits = calibration.fits_device(ctx.device)
            if family and not fits:
                # A device that names its generation means that fit: a misspelt name
                # would otherwise price it with the default fit, said only as assumed.
                raise InvalidInputError(
                    f"device '{ctx.device.id}': calibration_family '{family}' has no fit in "
                    f"the calibration (known: {', '.join(sorted(calibration.devices))})"
                    f"{did_you_mean(family, calibration.devices)}"
                )
            if not fits:
                # A device no fit names (a device file, a plugin, a part with no measured
                # runs) is priced with the cross-device fit: say so, as for any default.
                ctx.recorder.default(
                    f"calibration.devices.{ctx.device.id}",
                    "default",
                    "pricing: no fit for it or its family",
                    fix="give --calibration a file with a fit for it (ndplan compare --fit)",
                )
            found = ctx.cache["efficiency"] = calibration.for_device(ctx.device)
        return found

    def overlap(self, ctx: PricingContext) -> Overlap:
        found = ctx.cache.get("overlap")
        if found is None:
            calibration = self._calibration(ctx)
            framework = ctx.settings.framework
            found = ctx.cache["overlap"] = calibration.overlap_for(framework)
            if framework not in calibration.overlap:
                # A framework no measured run fitted (DeepSpeed, MindFormers) hides what the
                # engineering defaults say: say how much, as for any default.
                shares = ", ".join(f"{dim} {share:g}" for dim, share in found)
                ctx.recorder.default(
                    f"calibration.overlap.{framework}",
                    "default",
                    f"pricing: no fit for this framework; hidden shares {shares}",
                    fix="give --calibration a file with an overlap fit for it "
                    "(ndplan compare --fit)",
                )
        return found

    def tp_overlap(self, ctx: PricingContext, layout: Layout) -> float:
        """Share of the TP collectives hidden under the GEMMs around them: the framework's
        fitted overlap, or none where the job turns TP overlap off. The setting is read
        only where TP communicates, so tp 1 layouts assume nothing about it.

        Without sequence parallelism nothing is hidden: the overlap splits the all-gather
        and reduce-scatter that SP puts around each GEMM (Megatron refuses
        --tp-comm-overlap without --sequence-parallel; an all-reduce has no GEMM to hide
        behind)."""
        if layout.tp > 1 and not layout.sequence_parallel:
            return 0.0
        if layout.tp > 1 and not ctx.settings.tp_comm_overlap:
            return 0.0
        return self.overlap(ctx).tp

    def links(self, ctx: PricingContext, layout: Layout) -> Links:
        key = ("links", layout.tp, layout.cp, layout.dp, layout.pp, layout.ep, layout.expert_tp)
        found = ctx.cache.get(key)
        if found is not None:
            return found
        eff = self.efficiency(ctx)
        sizes = {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp}
        strides = {}
        stride = 1
        for dim in self.order:
            strides[dim] = stride
            stride *= sizes[dim]
        cl = ctx.cluster
        # Experts are carved out of DP×CP×TP as Megatron's expert rank order does: expert
        # TP innermost (adjacent ranks), EP next (starting at the expert-TP stride).
        ep_span_stride = layout.expert_tp
        found = Links(
            tp=group_link(cl, eff, layout.tp, strides["tp"]),
            cp=group_link(cl, eff, layout.cp, strides["cp"]),
            ep=group_link(cl, eff, layout.ep, ep_span_stride),
            etp=group_link(cl, eff, layout.expert_tp, 1),
            dp=group_link(cl, eff, layout.dp * layout.cp, min(strides["dp"], strides["cp"])),
            expert_dp=group_link(cl, eff, layout.expert_data_parallel, ep_span_stride * layout.ep),
            pp=group_link(cl, eff, 2 if layout.pp > 1 else 1, strides["pp"]),
        )
        ctx.cache[key] = found
        return found

    def _gemm_s(
        self,
        ctx: PricingContext,
        m: float,
        k: float,
        n: float,
        count: float = 1.0,
        low_precision: bool | None = None,
        grouped: bool = False,
        routed: bool = False,
        fused: bool = False,
        accumulate_bytes: float = 0.0,
    ) -> float:
        """``count`` GEMMs of m×k by k×n: compute at a size-dependent efficiency, or the
        memory roofline, whichever is slower. ``accumulate_bytes``: the same GEMM's weight
        gradient instead (its k×n result added into the gradient buffer, read and written
        at that many bytes an element; its m×k and m×n operands read). ``fused``: the
        count run as one persistent kernel (the fused grouped MLP), which runs as one
        dense GEMM of their whole size does: the dense knee and the dense fraction of
        peak. (What holds unfused grouped GEMMs below the dense fraction, each expert's
        own tail wave and the host-split launches, the persistent kernel does not have.)

        Unfused grouped GEMMs ramp with each expert's own size (``grouped``: the knee is
        per expert GEMM, not per launch) and one local expert is one plain GEMM (the dense
        knee). The measured MoE runs support this over the alternatives, each refitted on
        the even rows: a knee on the whole launch gave a test-row median |error| of 11.2 %,
        a knee on each expert's token count 10.7 %, against 7.7 % per expert GEMM; the
        grouped knee on a single local expert too left the fit unchanged and Mixtral (one
        expert a rank) worse. An expert's GEMM stops gaining rate past
        ``grouped_gemm_saturation_tokens`` (its tiles fill the device; its weight's shape
        sets the rate from there): without that cap the knee rewarded tokens per expert
        without limit, and the measured MoE runs at larger micro-batches ran slower than it
        priced them. Refitting the MoE stage with the cap held at 2,048, 4,096, 6,144,
        8,192, 12,288 and 16,384 tokens, or none, gave objectives 0.0343, 0.0295, 0.0269,
        0.0263, 0.0265, 0.0268 and 0.0272: the rows place it near 8 k; fitted, test-row
        MoE median |error| 7.4 → 6.8 %."""
        if m <= 0 or k <= 0 or n <= 0 or count <= 0:
            return 0.0
        if fused:
            grouped = routed = False  # one dense GEMM of the whole work (size below)
        eff = self.efficiency(ctx)
        job = ctx.settings
        lp = job.is_low_precision if low_precision is None else low_precision
        flops = 2.0 * m * k * n
        peak = ctx.device.peak_flops(job.gemm_precision if lp else "bf16")
        top = eff.gemm_fraction(job.precision if lp else "bf16", routed)
        half = (eff.grouped_gemm_half_gflop if grouped else eff.gemm_half_gflop) * 1e9
        if grouped:
            # Past the saturation count an expert's tiles already fill the device.
            size = 2.0 * min(m, eff.grouped_gemm_saturation_tokens) * k * n
        else:
            size = flops * count if fused else flops
        efficiency = top * size / (size + half) if half > 0 else top
        compute = flops / (peak * efficiency)
        element = 1.0 if lp else 2.0
        if accumulate_bytes:
            memory = (m * k + m * n) * element + k * n * accumulate_bytes
        else:
            memory = (m * k + k * n) * element + m * n * ACTIVATION_BYTES
        bound = memory / (ctx.device.hbm_bytes_per_s * eff.hbm)
        return count * max(compute, bound)

    def _hbm_s(self, ctx: PricingContext, nbytes: float) -> float:
        return nbytes / (ctx.device.hbm_bytes_per_s * self.efficiency(ctx).hbm)

    # ------------------------------------------------------------------ per layer

    def layer_cost(self, ctx: PricingContext, layout: Layout, kind: LayerKind) -> LayerCost:
        # A layer's cost depends on the degrees that shard it, not on dp or pp; EP and
        # expert TP shard only routed experts, so a layer without them (DeepSeek-V3's
        # first three) is priced once for every EP and expert TP the search pairs it with.
        # The schedule leaves the cost alone (DualPipeV changes what is hidden: layer_s).
        key = ("layer_cost", kind.name, *_mixer_degrees(layout))
        if isinstance(kind.ffn, MoEFFN):
            key += (layout.ep, layout.expert_tp)
        found = ctx.cache.get(key)
        if found is None:
            found = ctx.cache[key] = self._layer_cost(ctx, layout, kind)
        return found

    def _layer_cost(self, ctx: PricingContext, layout: Layout, kind: LayerKind) -> LayerCost:
        """The mixer's cost (shared by every EP and expert TP) and the FFN's after it."""
        mixer = self._mixer_cost(ctx, layout, kind)
        job = ctx.settings
        h = ctx.model.hidden_size
        t = layout.tp
        sigma = t if layout.sequence_parallel else 1
        n = layout.mbs * ctx.job.seq_length / layout.cp
        ab = ACTIVATION_BYTES
        eff = self.efficiency(ctx)
        # Continue the mixer's ops and sums, so they add up in the same order as one pass.
        built = _LayerOps(self, ctx, sigma, mixer.ops, mixer.flops, mixer.recompute_flops)
        gemm, elementwise = built.gemm, built.elementwise
        per_op = per_op_policy_applies(ctx.framework, isinstance(kind.attention, StandardAttention))

        ffn = kind.ffn
        ep_fwd = 0.0
        ffn_tp_share = 0.5  # of the mixer's TP traffic, attention's is the other half
        if isinstance(ffn, DenseFFN):
            width = ffn.intermediate_size
            gemm(
                "fc1",
                n,
                h,
                (2 if ffn.gated else 1) * width / t,
                ("mlp",),
                gathered=True,
                recomputed_share=(0.5, "op") if ffn.gated and per_op else None,
            )
            elementwise(
                "activation",
                (3 if ffn.gated else 2) * ab * n * width / t,
                ("act", "op", "mlp"),
            )
            gemm("fc2", n, width / t, h, ("mlp",))
        else:
            moe: MoEFFN = ffn
            fused = job.moe_fused_grouped_mlp
            if not fused:
                # The fused path sizes the expert buffers statically: no host sync.
                sync = eff.moe_layer_overhead_us * 1e-6
                built.ops.append(Op("moe_sync", sync, sync, frozenset(("moe_ffn",))))
            gemm("router", n / sigma, h, moe.num_experts, low_precision=False)
            elementwise("routing", 4 * 2 * n / sigma * moe.num_experts)
            copies = n / sigma * moe.top_k * job.moe_capacity_factor * layout.expert_tp
            local_experts = moe.num_experts / layout.ep
            per_expert = copies / local_experts
            width = moe.expert_intermediate_size / layout.expert_tp
            elementwise("permute", 2 * 2 * ab * copies * h, ("moe_ffn",))
            gemm(
                "expert_fc1",
                per_expert,
                h,
                (2 if moe.gated else 1) * width,
                ("moe_ffn",),
                count=local_experts,
                routed=True,
                fused=fused,
            )
            elementwise(
                "expert_activation",
                (3 if moe.gated else 2) * ab * copies * width,
                ("act", "moe_ffn", "op"),
            )
            gemm(
                "expert_fc2",
                per_expert,
                width,
                h,
                ("moe_ffn",),
                count=local_experts,
                routed=True,
                fused=fused,
            )
            if moe.shared_intermediate_size:
                gemm(
                    "shared_fc1",
                    n,
                    h,
                    (2 if moe.gated else 1) * moe.shared_intermediate_size / t,
                    gathered=True,
                )
                elementwise(
                    "shared_activation",
                    (3 if moe.gated else 2) * ab * n * moe.shared_intermediate_size / t,
                    ctx.framework.dense_activation_switches,
                )
                gemm("shared_fc2", n, moe.shared_intermediate_size / t, h)
            if layout.ep > 1:
                # Dispatch and combine: the tokens' hidden vectors cross the EP group, one
                # per chosen expert (all-to-all), or one per rank and remote domain reached
                # (DeepEP, HybridEP), which group-limited routing keeps to fewer nodes.
                link = self.links(ctx, layout).ep
                if job.moe_dispatcher == "deepep":
                    tokens = n / sigma * job.moe_capacity_factor  # one copy of each
                    ep_fwd = 2 * deduplicated_all_to_all_s(
                        link, tokens * h * ab, moe.num_experts, moe.top_k, *moe.routing_group_limit
                    )
                else:
                    ep_fwd = 2 * all_to_all_s(link, copies / layout.expert_tp * h * ab)
            if layout.expert_tp > 1:
                # Expert TP shards each expert's width, so every rank of the group needs
                # the copies all of them received: the dispatcher gathers them over the
                # expert-TP group before the experts and reduce-scatters the outputs after
                # (the backward mirrors it). One copy per chosen expert, not one per token
                # as the dense FFN's sequence-parallel gather moves.
                gathered = copies * h * ab
                link = self.links(ctx, layout).etp
                ep_fwd += all_gather_s(link, gathered) + reduce_scatter_s(link, gathered)
            if t > 1 and not moe.shared_intermediate_size:
                # The routed experts take the layer's sequence-parallel tokens as they are
                # (the dispatcher moves them): of the mixer's two TP gather/scatter pairs
                # (attention and FFN) only attention's runs. Shared experts keep the other.
                ffn_tp_share = 0.0

        kernels = sum(op.kernels for op in built.ops) + (4 if t > 1 else 0) + (4 if ep_fwd else 0)
        tp_share = 0.5 + ffn_tp_share  # attention's half, and the FFN's where it has one
        return LayerCost(
            ops=tuple(built.ops),
            tp_forward_s=mixer.tp_forward_s * tp_share,
            tp_backward_s=mixer.tp_backward_s * tp_share,
            sp_regather_s=mixer.sp_regather_s * tp_share,
            cp_forward_s=mixer.cp_forward_s,
            cp_backward_s=mixer.cp_backward_s,
            cp_ring_steps=mixer.cp_ring_steps,
            ep_forward_s=ep_fwd,
            ep_backward_s=ep_fwd,
            attention_forward_s=mixer.attention_forward_s,
            launch_s=kernels * eff.kernel_launch_us * 1e-6,
            flops=built.flops,
            recompute_flops=built.rec_flops,
            mixer_ops=len(mixer.ops),
            ffn_tp_share=ffn_tp_share,
        )

    def _mixer_cost(self, ctx: PricingContext, layout: Layout, kind: LayerKind) -> LayerCost:
        """The layer up to its FFN — norms, residual adds, the attention (or linear mixer)
        with its TP and CP traffic — as a LayerCost without FFN, EP or launches: it
        depends on tp, cp, sp and the micro-batch only, so the EP and expert-TP variants
        of a MoE layer share it (memoised on those)."""
        key = ("layer_mixer", kind.name, *_mixer_degrees(layout))
        found = ctx.cache.get(key)
        if found is not None:
            return found
        job = ctx.settings
        h = ctx.model.hidden_size
        t = layout.tp
        sp = layout.sequence_parallel
        sigma = t if sp else 1
        n = layout.mbs * ctx.job.seq_length / layout.cp
        seq = ctx.job.seq_length
        span = job.attention_span  # packed documents attend only within themselves
        # Ring CP passes K/V blocks between ranks; all-to-all (Ulysses) CP exchanges heads.
        ring_cp = layout.cp > 1 and job.cp_kind != "all_to_all"
        ab = ACTIVATION_BYTES
        lp = job.is_low_precision
        links = self.links(ctx, layout)
        built = _LayerOps(self, ctx, sigma)
        gemm, elementwise, ops = built.gemm, built.elementwise, built.ops
        att = kind.attention
        # torchtitan's per-op policy ("op") on a standard layer: its matmuls in call order
        # are q, k, v, out, gate, up, down; the even ones (k, out, up) are recomputed with
        # the norms, RoPE, the first residual add and the activation (see SWITCHES).
        per_op = per_op_policy_applies(ctx.framework, isinstance(att, StandardAttention))
        recomputed = ("op",) if per_op else ()
        # Norms: read input, write output (two per layer, plus q/k norms).
        elementwise("norms", kind.norms_per_layer / 2 * 2 * 2 * ab * n * h / sigma, ("norm", "op"))
        if per_op:  # the first add is recomputed: the same kernel count, split in two
            elementwise("attn_residual_add", 3 * ab * n * h / sigma, recomputed)
            elementwise("ffn_residual_add", 3 * ab * n * h / sigma, kernels=0)
        else:
            elementwise("residual_adds", 2 * 3 * ab * n * h / sigma)
        if job.dropout > 0:
            elementwise("dropout", 2 * (2 * ab + 1) * n * h / sigma)

        if isinstance(att, StandardAttention):
            q_w = att.num_heads * att.head_dim * (2 if att.output_gate else 1)
            kv_w = max(att.num_kv_heads, t) * att.head_dim
            gemm(
                "qkv_proj",
                n,
                h,
                (q_w + 2 * kv_w) / t,
                gathered=True,
                recomputed_share=(kv_w / (q_w + 2 * kv_w), "op") if per_op else None,
            )
            if att.qk_norm:
                elementwise("qk_norm", 2 * ab * n * (q_w + kv_w) / t, ("norm", "op"))
            elementwise("rope", 2 * ab * n * (att.num_heads * att.head_dim + kv_w) / t, recomputed)
            att_flops = n * core_attention_flops(att, span, "causal") / t
            gemm("out_proj", n, att.num_heads * att.head_dim / t, h, recomputed)
            kv_bytes_per_token = 2 * kv_w / t * ab
            heads_local = att.num_heads / t
        elif isinstance(att, LatentAttention):
            a = att.num_heads
            d_qk = att.qk_nope_head_dim + att.qk_rope_head_dim
            if att.q_lora_rank:
                gemm("q_down", n, h, att.q_lora_rank)
                gemm("q_up", n, att.q_lora_rank, a * d_qk / t, ("mla_up",))
            else:
                gemm("q_proj", n, h, a * d_qk / t)
            gemm("kv_down", n, h, att.kv_lora_rank + att.qk_rope_head_dim)
            gemm(
                "kv_up",
                n,
                att.kv_lora_rank,
                a * (att.qk_nope_head_dim + att.v_head_dim) / t,
                ("mla_up",),
            )
            elementwise("rope", 2 * ab * n * 2 * a * att.qk_rope_head_dim / t)
            att_flops = n * core_attention_flops(att, span, "causal") / t
            gemm("out_proj", n, a * att.v_head_dim / t, h)
            kv_bytes_per_token = a * (d_qk + att.v_head_dim) / t * ab
            heads_local = a / t
        else:
            lin: LinearAttention = att
            key_w = lin.num_key_heads * lin.key_head_dim
            val_w = lin.num_value_heads * lin.value_head_dim
            gemm(
                "in_proj",
                n,
                h,
                (2 * key_w + 2 * val_w + 2 * lin.num_value_heads) / t,
                gathered=True,
            )
            elementwise("conv_gates", 4 * ab * n * (2 * key_w + val_w) / t, ("core_attn",))
            att_flops = n * core_attention_flops(lin, seq, "causal") / t
            gemm("out_proj", n, val_w / t, h)
            kv_bytes_per_token = 0.0
            heads_local = lin.num_value_heads / t
        eff = self.efficiency(ctx)
        kernel_scale = self._calibration(ctx).attention_scale.get(job.framework, 1.0)
        rate = min(1.0, eff.attention * kernel_scale)
        if not isinstance(att, LinearAttention):
            # Ring CP calls the kernel once per K/V block of seq/cp keys; all-to-all CP
            # and no CP call it on the whole sequence (or its window); packed documents
            # give it document-length keys.
            keys = min(span, seq / layout.cp) if ring_cp else span
            window = getattr(att, "sliding_window", None)
            rate *= attention_length_efficiency(min(keys, window) if window else keys)
        attention_s = att_flops / (ctx.device.peak_flops("bf16") * rate)
        if job.attention_kernel == "eager" and not isinstance(att, LinearAttention):
            attention_s += self._hbm_s(ctx, 5 * ab * heads_local * n * span)
        ops.append(
            Op(
                "core_attention",
                attention_s,
                FLASH_BACKWARD_FACTOR * attention_s,
                frozenset({"core_attn"}),
                kernels=2,
            )
        )
        built.flops += att_flops
        built.rec_flops["core_attn"] = built.rec_flops.get("core_attn", 0.0) + att_flops
        if ring_cp and kv_bytes_per_token > 0:
            self._ring_merges(elementwise, layout.cp, n, att, heads_local, kv_bytes_per_token)

        # TP: SP gathers/scatters (or all-reduces) of the hidden state, twice per layer
        # each way (attention and FFN blocks). In low precision the gathered linear inputs
        # travel quantised (one byte an element); gradients travel in bf16.
        tp_bytes = n * h * ab
        if t > 1:
            if sp:
                gather_bytes = n * h * (1.0 if lp else ab)
                scatter = reduce_scatter_s(links.tp, tp_bytes)
                tp_fwd = 2 * (all_gather_s(links.tp, gather_bytes) + scatter)
                tp_bwd = 2 * (all_gather_s(links.tp, tp_bytes) + scatter)
                regather = 2 * all_gather_s(links.tp, gather_bytes)
            else:
                tp_fwd = tp_bwd = 2 * all_reduce_s(links.tp, tp_bytes)
                regather = 0.0
        else:
            tp_fwd = tp_bwd = regather = 0.0

        # CP: ring passes K/V blocks around (cp − 1 steps), hidden behind the previous
        # block's attention; the backward moves K/V and their gradients. All-to-all
        # (Ulysses) exchanges heads: q, k, v in and the output back.
        cp_fwd = cp_bwd = 0.0
        cp_steps = 0
        if layout.cp > 1 and kv_bytes_per_token > 0:
            if ring_cp:
                step = send_recv_s(links.cp, n * kv_bytes_per_token)
                cp_fwd = (layout.cp - 1) * step
                cp_bwd = 2 * cp_fwd
                cp_steps = layout.cp - 1
            else:
                width = (2 * heads_local * self._head_dim(att) * ab) + kv_bytes_per_token
                cp_fwd = all_to_all_s(links.cp, n * width)
                cp_bwd = cp_fwd
        found = ctx.cache[key] = LayerCost(
            ops=tuple(ops),
            tp_forward_s=tp_fwd,
            tp_backward_s=tp_bwd,
            sp_regather_s=regather,
            cp_forward_s=cp_fwd,
            cp_backward_s=cp_bwd,
            cp_ring_steps=cp_steps,
            ep_forward_s=0.0,
            ep_backward_s=0.0,
            attention_forward_s=attention_s,
            launch_s=0.0,
            flops=built.flops,
            recompute_flops=built.rec_flops,
        )
        return found

    @staticmethod
    def _cp_exposed(cost: LayerCost, ov: Overlap, cp: int) -> tuple[float, float]:
        """Ring CP: each step's K/V transfer hides behind the previous block's attention
        (the forward, then the backward with twice the bytes and 2.5× the compute);
        all-to-all CP blocks attention, so it is exposed."""
        if not cost.cp_ring_steps:
            return cost.cp_forward_s, cost.cp_backward_s
        steps = cost.cp_ring_steps
        block = cost.attention_forward_s / cp
        fwd = steps * max(0.0, cost.cp_forward_s / steps - ov.cp * block)
        bwd = steps * max(0.0, cost.cp_backward_s / steps - ov.cp * FLASH_BACKWARD_FACTOR * block)
        return fwd, bwd

    @staticmethod
    def _ring_merges(
        elementwise: Callable[..., None],
        cp: int,
        n: float,
        att: StandardAttention | LatentAttention,
        heads_local: float,
        kv_bytes_per_token: float,
    ) -> None:
        """Ring CP's merges, outside the attention kernel: each of the cp blocks' partial
        outputs is rescaled and added into the running output (Transformer Engine's
        ``flash_attn_fwd_out_correction``: read the block's output, read and write the
        sum), and the backward adds each block's dq and dK/dV into their sums the same
        way. Memory-bound passes over the output, q and K/V widths, once per block; the
        synchronised ring steps wait for the rank whose blocks are all whole."""
        ab = ACTIVATION_BYTES
        v_dim = att.v_head_dim if isinstance(att, LatentAttention) else att.head_dim
        out_bytes = 3 * cp * ab * n * heads_local * v_dim
        grad_bytes = 3 * cp * n * (ab * heads_local * NdplanCostModel._head_dim(att))
        grad_bytes += 3 * cp * n * kv_bytes_per_token
        elementwise(
            "cp_merge",
            out_bytes,
            ("core_attn",),
            backward_factor=grad_bytes / out_bytes,
            kernels=cp,
        )

    @staticmethod
    def _head_dim(att) -> int:
        if isinstance(att, StandardAttention):
            return att.head_dim
        if isinstance(att, LatentAttention):
            return att.qk_nope_head_dim + att.qk_rope_head_dim
        return att.key_head_dim

    def layer_seconds(
        self, ctx: PricingContext, layout: Layout, kind: LayerKind, recompute: Recompute
    ) -> dict[str, float]:
        """One layer, one micro-batch, under ``recompute``; values sum to its time."""
        key = ("layer_s", kind.name, *ctx.time_key(layout), recompute)
        found = ctx.cache.get(key)
        if found is not None:
            return found
        if offloads(recompute):
            found = ctx.cache[key] = self._offloaded_layer_seconds(ctx, layout, kind)
            return found
        cost = self.layer_cost(ctx, layout, kind)
        ov = self.overlap(ctx)
        forced = ctx.framework.forced_switches
        fwd = sum(op.forward_s for op in cost.ops) + cost.launch_s / 3
        bwd = sum(op.backward_s for op in cost.ops) + 2 * cost.launch_s / 3
        # Hidden communication still costs some compute (SM and HBM contention): a share
        # `interference` of the hidden time (TP's own share for TP) is charged to the
        # communication part.
        cal = self._calibration(ctx)
        slow = cal.interference
        tp_hidden = self.tp_overlap(ctx, layout)
        tp_exposed = 1 - tp_hidden
        tp_raw = cost.tp_forward_s + cost.tp_backward_s
        tp = tp_raw * (tp_exposed + cal.tp_slowdown * tp_hidden)
        ep_exposed = (1 - ov.ep) * (0.1 if layout.schedule == "dualpipev" else 1.0)
        ep_raw = cost.ep_forward_s + cost.ep_backward_s
        ep = ep_raw * (ep_exposed + slow * (1 - ep_exposed))
        unpaired = ctx.unpaired_a2a_share(layout)
        if unpaired is not None and recompute is not None and ep_raw > 0:
            ep = unpaired * ep + (1 - unpaired) * self._paired_a2a_exposed(cost, slow)
        cp_fwd, cp_bwd = self._cp_exposed(cost, ov, layout.cp)
        cp_hidden = cost.cp_forward_s + cost.cp_backward_s - cp_fwd - cp_bwd
        cp = cp_fwd + cp_bwd + slow * cp_hidden
        if recompute is None:
            rec = fwd + cost.tp_forward_s * tp_exposed + cost.ep_forward_s * ep_exposed + cp_fwd
        else:
            active = recompute | forced
            rec = sum(op.forward_s for op in cost.ops if op.recomputed_by & active)
            # Inputs not kept gathered are gathered again (torchtitan's per-op policy
            # saves reduce-scatters, not all-gathers).
            regathers = "sp_gather" in recompute or "op" in recompute
            if regathers and "sp_gather" not in forced:
                tp += cost.sp_regather_s * tp_exposed
            if "mlp" in recompute:
                # Re-running the FFN block re-runs its own collectives (the attention
                # block has the rest).
                tp += cost.tp_forward_s * cost.ffn_tp_share * tp_exposed
        found = {
            "forward": fwd,
            "backward": bwd,
            "recompute": rec,
            "tp_comm": tp,
            "cp_comm": cp,
            "ep_comm": ep,
            "offload": 0.0,
        }
        ctx.cache[key] = found
        return found

    @staticmethod
    def _paired_a2a_exposed(cost: LayerCost, slow: float) -> float:
        """A layer's EP all-to-alls under the combined 1F1B schedule, one micro-batch's
        forward beside another's backward of the layer: each transfer runs under the
        other pass's compute phase that Megatron pairs it with — the forward's dispatch
        under the backward's experts, its combine under the backward's attention, the
        backward's combine under the forward's attention and its dispatch under the
        forward's experts — and what outlasts that phase shows. The hidden rest is charged
        ``interference``, as any hidden traffic."""
        mixer = cost.ops[: cost.mixer_ops]
        ffn = cost.ops[cost.mixer_ops :]
        attention_fwd = sum(op.forward_s for op in mixer)
        attention_bwd = sum(op.backward_s for op in mixer)
        experts_fwd = sum(op.forward_s for op in ffn)
        experts_bwd = sum(op.backward_s for op in ffn)
        dispatch_fwd = combine_fwd = cost.ep_forward_s / 2
        dispatch_bwd = combine_bwd = cost.ep_backward_s / 2
        exposed = (
            max(0.0, dispatch_fwd - experts_bwd)
            + max(0.0, combine_fwd - attention_bwd)
            + max(0.0, combine_bwd - attention_fwd)
            + max(0.0, dispatch_bwd - experts_fwd)
        )
        raw = cost.ep_forward_s + cost.ep_backward_s
        return exposed + slow * (raw - exposed)

    def _offloaded_layer_seconds(
        self, ctx: PricingContext, layout: Layout, kind: LayerKind
    ) -> dict[str, float]:
        """The plain layer, with its saved activations copied to the host after its forward
        and back before its backward. The copy engines move them while the next layer
        computes (its forward, then its backward, the same as this one's); what outlasts
        that compute is exposed. Copy engines hold no SMs, so nothing is charged for the
        hidden part."""
        plain = dict(self.layer_seconds(ctx, layout, kind, frozenset()))
        saved = self._memory.layer_activation_bytes(ctx, layout, kind, frozenset())
        copy = saved / ctx.device.host_link.bytes_per_s
        plain["offload"] = max(0.0, copy - plain["forward"]) + max(0.0, copy - plain["backward"])
        return plain

    def recompute_flops(
        self, ctx: PricingContext, layout: Layout, kind: LayerKind, recompute: Recompute
    ) -> float:
        cost = self.layer_cost(ctx, layout, kind)
        if recompute is None:
            return cost.flops
        active = recompute | ctx.framework.forced_switches
        return sum(f for sw, f in cost.recompute_flops.items() if sw in active)

    # ------------------------------------------------------------------ per stage and step

    def stage_fixed_seconds(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> dict[str, float]:
        """Per micro-batch on one stage, outside the decoder layers: embedding, head and
        loss, MTP, pipeline sends."""
        # The head stage's deferred weight gradients wait for the drain (``step``).
        deferred_share = self._deferred_share(ctx, layout) if stage.has_head else 0.0
        key = (
            "stage_fixed",
            stage.index,
            stage.has_embedding,
            stage.has_head,
            layout.tp,
            layout.cp,
            layout.sequence_parallel,
            layout.mbs,
            layout.pp,
            layout.dp,
            layout.vpp,
            layout.schedule,
            layout.ep,
            layout.expert_tp,
            deferred_share,
        )
        found = ctx.cache.get(key)
        if found is not None:
            return found
        model = ctx.model
        h, t = model.hidden_size, layout.tp
        n = layout.mbs * ctx.job.seq_length / layout.cp
        ab = ACTIVATION_BYTES
        links = self.links(ctx, layout)
        ov = self.overlap(ctx)
        tp_exposed = 1 - self.tp_overlap(ctx, layout)
        parts = dict.fromkeys(LAYER_PARTS, 0.0)
        parts["pp_comm"] = 0.0
        if stage.has_embedding:
            emb = self._hbm_s(ctx, 2 * ab * n * h)
            parts["forward"] += emb
            parts["backward"] += 2 * emb
            if t > 1:
                comm = (
                    reduce_scatter_s(links.tp, n * h * ab)
                    if layout.sequence_parallel
                    else all_reduce_s(links.tp, n * h * ab)
                )
                parts["tp_comm"] += comm * tp_exposed
        if stage.has_head:
            vocab = padded_vocab(model.vocab_size, t) / t
            logits = self.head_logits_s(ctx, layout)
            loss = self._hbm_s(ctx, n * vocab * (2 + 4 + 4))
            parts["forward"] += logits + loss
            parts["backward"] += (2 - deferred_share) * logits + loss
            if t > 1 and layout.sequence_parallel:
                parts["tp_comm"] += 2 * all_gather_s(links.tp, n * h * ab) * tp_exposed
            if stage.has_mtp and model.mtp_kind is not None:
                mtp = self.layer_seconds(ctx, layout, model.mtp_kind, frozenset())
                for name in LAYER_PARTS:
                    parts[name] += model.num_mtp_layers * mtp[name]
                extra = self._gemm_s(ctx, n, 2 * h, h / t) + logits + loss
                parts["forward"] += model.num_mtp_layers * extra
                parts["backward"] += model.num_mtp_layers * 2 * extra
        if layout.pp > 1:
            sends_per_chunk = 2 if layout.schedule == "dualpipev" else layout.vpp
            # Forward activation and backward gradient per chunk boundary crossed.
            parts["pp_comm"] = 2 * sends_per_chunk * self.pipeline_send_s(ctx, layout) * (1 - ov.pp)
        ctx.cache[key] = parts
        return parts

    def head_logits_s(self, ctx: PricingContext, layout: Layout) -> float:
        """The output layer's logits GEMM for one micro-batch (bf16: it is not quantised);
        its input gradient and its weight gradient each take as long."""
        key = ("head_logits", layout.mbs, layout.cp, layout.tp)
        found = ctx.cache.get(key)
        if found is None:
            n = layout.mbs * ctx.job.seq_length / layout.cp
            vocab = padded_vocab(ctx.model.vocab_size, layout.tp) / layout.tp
            found = ctx.cache[key] = self._gemm_s(
                ctx, n, ctx.model.hidden_size, vocab, low_precision=False
            )
        return found

    @staticmethod
    def _deferred_share(ctx: PricingContext, layout: Layout) -> float:
        """The share of micro-batches whose output-layer weight gradient waits for the drain."""
        return ctx.deferred_head_wgrads(layout) / layout.num_microbatches

    def deferred_head_wgrad_s(self, ctx: PricingContext, layout: Layout) -> float:
        """The output-layer weight gradients the last stage runs in the pipeline drain,
        per step (Megatron's --defer-embedding-wgrad-compute)."""
        deferred = ctx.deferred_head_wgrads(layout)
        return deferred * self.head_logits_s(ctx, layout) if deferred else 0.0

    def pipeline_send_s(self, ctx: PricingContext, layout: Layout) -> float:
        """One activation (or its gradient) sent across a pipeline boundary (none without
        a pipeline). Memoised: every stage of every candidate asks for it."""
        key = (
            "pipeline_send",
            layout.mbs,
            layout.tp,
            layout.sequence_parallel,
            layout.cp,
            layout.dp,
            layout.pp,
            layout.ep,
            layout.expert_tp,
        )
        found = ctx.cache.get(key)
        if found is None:
            n = layout.mbs * ctx.job.seq_length / layout.cp
            sigma = layout.tp if layout.sequence_parallel else 1
            boundary = n * ctx.model.hidden_size * ACTIVATION_BYTES / sigma
            found = ctx.cache[key] = send_recv_s(self.links(ctx, layout).pp, boundary)
        return found

    def fill_drain_sends_s(self, ctx: PricingContext, layout: Layout, send_s: float) -> float:
        """Pipeline sends on the fill and drain chain that the bubble formula leaves out.

        The first micro-batch's forward and the last one's backward cross every chunk
        boundary in turn; each send waits for the chunk before it and the chunk after it
        waits for the send, so none of them overlaps: ``2·hops`` sends, with
        ``pp·vpp − 1`` hops interleaved (the chain wraps from the last stage to the
        first once per chunk), ``2·pp − 2`` for DualPipeV (its turn is local) and
        ``pp − 1`` otherwise, as in the bubble of Narayanan et al. 2021. The bubble
        formula already holds ``pp − 1`` of each direction's sends at the steady state's
        exposed share; this is the rest. Deeper interleaving shrinks the compute bubble
        and lengthens this chain."""
        if layout.pp == 1 or send_s <= 0.0:
            return 0.0
        pp = layout.pp
        if layout.schedule == "interleaved":
            hops = pp * layout.vpp - 1
        elif layout.schedule == "dualpipev":
            hops = 2 * pp - 2
        else:
            hops = pp - 1
        exposed = 1 - self.overlap(ctx).pp
        return 2 * (hops - (pp - 1) * exposed) * send_s

    def stage_seconds(
        self,
        ctx: PricingContext,
        layout: Layout,
        stage: StagePlacement,
        assignment: Sequence[tuple[int, int, int, Recompute]],
    ) -> dict[str, float]:
        """Per micro-batch time of one stage by part, for (kind, in-flight, count, recompute)
        groups; with ZeRO-3/FSDP the per-micro-batch parameter gathers and gradient
        scatters that the stage's compute does not hide are part of it."""
        parts = dict(self.stage_fixed_seconds(ctx, layout, stage))
        hidden_fwd = hidden_bwd = 0.0
        ov = self.overlap(ctx)
        for kind_index, _, count, recompute in assignment:
            kind = ctx.model.kinds[kind_index]
            layer = self.layer_seconds(ctx, layout, kind, recompute)
            for name in LAYER_PARTS:
                parts[name] += count * layer[name]
            if layout.cp > 1:
                cost = self.layer_cost(ctx, layout, kind)
                exposed_fwd, exposed_bwd = self._cp_exposed(cost, ov, layout.cp)
                hidden_fwd += count * (cost.cp_forward_s - exposed_fwd)
                hidden_bwd += count * (cost.cp_backward_s - exposed_bwd)
        deferred = self.deferred_head_wgrad_s(ctx, layout) if stage.has_head else 0.0
        out = StageSeconds(
            parts, hidden_fwd, hidden_bwd, self.pipeline_send_s(ctx, layout), deferred
        )
        out["dp_comm"] = self._fsdp_exposed(ctx, layout, stage, out)
        return out

    def _fsdp_exposed(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement, parts: Mapping[str, float]
    ) -> float:
        """ZeRO-3/FSDP per micro-batch: gather parameters for the forward and again for the
        backward, reduce-scatter the gradients, each hidden behind the compute it precedes.
        Sharded gradients are reduced after every backward in every framework: a rank keeps
        only its shard, so it cannot wait for the last micro-batch (Megatron-FSDP
        accumulates the reduce-scatter outputs, DeepSpeed ZeRO-2/3 and FSDP2 likewise)."""
        if layout.zero < 3 or ctx.settings.finetune == "lora":
            return 0.0
        ov = self.overlap(ctx)
        gather, scatter = self._fsdp_volumes(ctx, layout, stage)
        # Compute already hiding the CP ring cannot hide the gathers as well.
        fwd = parts["forward"] - getattr(parts, "cp_hidden_forward", 0.0)
        bwd = parts["backward"] + parts["recompute"] - getattr(parts, "cp_hidden_backward", 0.0)
        raw = 2 * gather + scatter
        exposed = max(0.0, gather - ov.fsdp * fwd) + max(0.0, gather + scatter - ov.fsdp * bwd)
        return self._charged(ctx, raw, exposed)

    def _fsdp_volumes(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> tuple[float, float]:
        """``_dp_volumes`` as ZeRO-3/FSDP moves them each micro-batch: a collective per
        sharded unit (each decoder layer; the embedding, output layer and MTP block one
        more; the routed experts of each MoE layer over their own group), each paying
        the ring's per-hop latency — ``_dp_volumes`` prices one per group."""
        key = ("fsdp_volumes", *self._dp_volumes_key(layout, stage))
        found = ctx.cache.get(key)
        if found is None:
            gather, scatter = self._dp_volumes(ctx, layout, stage)
            extras = stage.has_embedding or stage.has_head or stage.has_mtp
            units = stage.num_layers + (1 if extras else 0)
            moe_layers = sum(
                count for kind, count in stage.composition if ctx.model.kinds[kind].is_moe
            )
            links = self.links(ctx, layout)
            dense_hops = max(0, units - 1) * ring_latency_s(links.dp)
            expert_hops = max(0, moe_layers - 1) * ring_latency_s(links.expert_dp)
            extra = dense_hops + expert_hops
            found = ctx.cache[key] = (gather + extra, scatter + extra)
        return found

    def _charged(self, ctx: PricingContext, raw: float, exposed: float) -> float:
        """What traffic of ``raw`` seconds, ``exposed`` of them not hidden, adds to the step:
        the exposed part, and ``interference`` of the hidden part (the collectives' kernels
        take SMs and HBM bandwidth from the compute they hide behind)."""
        return exposed + self._calibration(ctx).interference * (raw - exposed)

    @staticmethod
    def _dp_volumes_key(layout: Layout, stage: StagePlacement) -> tuple:
        """What a stage's data-parallel volumes depend on: its role, the degrees that
        shard it and place its groups, and whether fp8 parameters apply."""
        return (
            stage.role[:4],
            layout.tp,
            layout.cp,
            layout.dp,
            layout.ep,
            layout.expert_tp,
            layout.pp,
            layout.zero >= 1,  # all that fp8 parameters depend on in the layout
        )

    def _dp_volumes(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> tuple[float, float]:
        """(parameter all-gather, gradient reduce-scatter) seconds of one stage's state
        over its data-parallel (and expert-data-parallel) groups."""
        key = ("dp_volumes", *self._dp_volumes_key(layout, stage))
        found = ctx.cache.get(key)
        if found is None:
            # Per-tensor fp8 parameters gather as they are stored, a byte each; MXFP8 ones
            # gather in bf16 through the gradient buffer and are quantised after.
            fp8_gather = fp8_primary_weights(ctx, layout) and ctx.settings.precision == "fp8"
            links = self.links(ctx, layout)
            dense, expert, linear = self._memory.stage_parameters(ctx, layout, stage)
            grad_bytes = ctx.settings.grad_reduce_bytes
            dense_bytes = 2 * dense - (linear - expert if fp8_gather else 0.0)
            expert_bytes = (1 if fp8_gather else 2) * expert
            gather = all_gather_s(links.dp, dense_bytes) + all_gather_s(
                links.expert_dp, expert_bytes
            )
            scatter = reduce_scatter_s(links.dp, dense * grad_bytes) + reduce_scatter_s(
                links.expert_dp, expert * grad_bytes
            )
            found = ctx.cache[key] = (gather, scatter)
        return found

    def step(
        self,
        ctx: PricingContext,
        layout: Layout,
        stages: Sequence[StagePlacement],
        stage_layer_seconds: Sequence[Mapping[str, float]],
    ) -> TimeBreakdown:
        """Compose per-stage, per-micro-batch seconds into one optimizer step.

        The pipeline time is monotone in every stage's time; the per-step data-parallel
        communication hides under the shortest of the stages' last backward (and first
        forward), with interleaved and DualPipeV stretched by the waits the pipeline does
        not charge a faster stage — the window every stage's reduction is sure to have —
        and the optimizer
        step waits for the slowest stage's update. No recompute choice can make the step
        faster (which keeps the search's bounds valid).
        """
        m = layout.num_microbatches
        totals = [sum(s.values()) for s in stage_layer_seconds]
        slowest = max(range(len(totals)), key=lambda i: (totals[i], -i))
        t_max = totals[slowest]
        pp = layout.pp
        pipeline = pipeline_seconds(layout, t_max, sum(totals))
        if layout.schedule == "dualpipev":
            # Two chunks per device; paired micro-batches overlap forward and backward, and
            # the weight-gradient half of each backward (with the FSDP traffic it carries)
            # fills the bubble, zero-bubble style: (pp − 1) steps of the mean chunk time
            # less that work.
            unit = (
                sum(
                    max(0.0, t - 0.5 * (sec.get("backward", 0.0) + sec.get("dp_comm", 0.0))) / 2
                    for t, sec in zip(totals, stage_layer_seconds, strict=True)
                )
                / pp
            )
            pipeline += (pp - 1) * unit
        crit = stage_layer_seconds[slowest]
        parts = dict.fromkeys(TIME_PARTS, 0.0)
        for name, value in crit.items():
            parts[name] += m * value
        send = max(getattr(s, "pipeline_send", 0.0) for s in stage_layer_seconds)
        parts["bubble"] = (
            max(0.0, pipeline - m * t_max)
            + self.fill_drain_sends_s(ctx, layout, send)
            + self._deferred_wgrad_exposed(layout, stage_layer_seconds)
        )

        # Gradients reduce while the last micro-batch's backward runs (chunk by chunk,
        # through the drain, for interleaved and V schedules). The window leaves out
        # recompute, so no recompute choice can shorten the step through it: the search's
        # bound (every layer at its fastest option) stays a lower bound. A stage faster
        # than the critical one waits (t_max − t_s) per slot for it; the share of that wait
        # the pipeline does not charge the stage (1 − its weight in the pipeline: 1/vpp
        # interleaved, nothing in DualPipeV's bubble) is wall time its reduction runs in.
        # Without it a faster off-critical stage would shrink the window by more than it
        # shortens the pipeline, and the step would get slower.
        def slack(i: int) -> float:
            if i == slowest or layout.schedule not in ("interleaved", "dualpipev"):
                return 0.0
            weight = 1.0 / layout.vpp if layout.schedule == "interleaved" else 0.0
            return (1.0 - weight) * (t_max - totals[i])

        window_bwd = min(
            s.get("backward", 0.0) - getattr(s, "cp_hidden_backward", 0.0) + slack(i)
            for i, s in enumerate(stage_layer_seconds)
        )
        window_fwd = min(
            s.get("forward", 0.0) - getattr(s, "cp_hidden_forward", 0.0) + slack(i)
            for i, s in enumerate(stage_layer_seconds)
        )
        dp, optimizer = self.data_parallel_and_optimizer(
            ctx, layout, stages, window_fwd, window_bwd
        )
        parts["dp_comm"] += dp
        parts["optimizer"] = optimizer
        parts["overhead"] = self._calibration(ctx).step_overhead_s
        step = sum(parts.values())
        return TimeBreakdown(
            step_s=step,
            parts=parts,
            stage_forward_s=tuple(s["forward"] for s in stage_layer_seconds),
            stage_backward_s=tuple(s["backward"] + s["recompute"] for s in stage_layer_seconds),
        )

    @staticmethod
    def _deferred_wgrad_exposed(
        layout: Layout, stage_layer_seconds: Sequence[Mapping[str, float]]
    ) -> float:
        """The deferred output-layer weight gradients that outlast the drain. The last
        stage runs them once its last backward is done, while the stages before it finish
        theirs: the backward phase of every other stage (one chunk's, interleaved) is the
        idle time they fill — a stage's time per micro-batch less its forward compute
        (its backward, recompute and the communication they expose). The window grows
        exactly as the bubble does, so no recompute choice makes the step faster through
        it (recompute that hides Megatron-FSDP's gathers leaves a stage's time, and so
        the window, unchanged)."""
        deferred = [getattr(s, "deferred_wgrad", 0.0) for s in stage_layer_seconds]
        total = max(deferred, default=0.0)
        if total <= 0.0:
            return 0.0
        head = deferred.index(total)
        weight = 1.0 / layout.vpp if layout.schedule == "interleaved" else 1.0
        window = weight * sum(
            sum(s.values()) - s.get("forward", 0.0)
            for i, s in enumerate(stage_layer_seconds)
            if i != head
        )
        return max(0.0, total - window)

    def data_parallel_and_optimizer(
        self,
        ctx: PricingContext,
        layout: Layout,
        stages: Sequence[StagePlacement],
        window_fwd: float,
        window_bwd: float,
    ) -> tuple[float, float]:
        """Per-step exposed data-parallel communication and the optimizer step.

        Gradients reduce (ZeRO-0: all-reduce; ZeRO-1/2: reduce-scatter, every micro-batch
        for ZeRO-2, whose sharded gradients cannot wait) under the last backward of the pipeline,
        and ZeRO-1/2 parameters gather under the first forward; the busiest stage's
        volume decides. ZeRO-3 gathers per micro-batch and is part of the stage time.
        The optimizer step is the slowest stage's update.
        """
        roles = self._distinct_roles(stages)
        opt = self._optimizer_step_s(ctx, layout, roles)
        if ctx.settings.finetune == "lora":
            return 0.0, opt  # frozen base weights: nothing to reduce
        scatter, gather = self._dp_step_volumes(ctx, layout, roles)
        return self._dp_exposure(ctx, scatter, gather, window_fwd, window_bwd), opt

    def _dp_exposure(
        self,
        ctx: PricingContext,
        scatter: float,
        gather: float,
        window_fwd: float,
        window_bwd: float,
    ) -> float:
        """The per-step reduction under the backward window and the gather under the
        forward one, each hidden up to ``overlap.dp`` of its window; what is hidden still
        slows the compute by ``interference``."""
        dp = self.overlap(ctx).dp
        exposed = max(0.0, scatter - dp * window_bwd) + max(0.0, gather - dp * window_fwd)
        return self._charged(ctx, scatter + gather, exposed)

    def _dp_step_volumes(
        self, ctx: PricingContext, layout: Layout, roles: Sequence[StagePlacement]
    ) -> tuple[float, float]:
        """Seconds of the per-step gradient reduction and parameter gather outside the
        stages (ZeRO-3 moves both per micro-batch, inside them): the busiest stage's.
        Memoised (every screened layout asks twice: its floor, then its bound)."""
        m = layout.num_microbatches
        key = (
            "dp_step_volumes",
            *self._state_key(layout, roles),
            layout.pp,
            layout.zero,
            m if layout.zero == 2 else 0,
        )
        found = ctx.cache.get(key)
        if found is not None:
            return found
        scatter_max = gather_max = 0.0
        for stage in roles:
            gather, scatter = self._dp_volumes(ctx, layout, stage)
            if layout.zero == 0:
                scatter = 2 * scatter  # an all-reduce moves twice a reduce-scatter's bytes
                gather = 0.0
            elif layout.zero == 2:
                scatter *= m
            elif layout.zero >= 3:
                gather = scatter = 0.0
            scatter_max = max(scatter_max, scatter)
            gather_max = max(gather_max, gather)
        found = ctx.cache[key] = (scatter_max, gather_max)
        return found

    @staticmethod
    def _state_key(layout: Layout, roles: Sequence[StagePlacement]) -> tuple:
        """What the stages' state and its sharding depend on: their roles, and the degrees
        that split the parameters (TP, EP, expert TP) and replicate them (DP, CP)."""
        return (
            tuple(stage.role[:4] for stage in roles),
            layout.tp,
            layout.cp,
            layout.dp,
            layout.ep,
            layout.expert_tp,
        )

    @staticmethod
    def _distinct_roles(stages: Sequence[StagePlacement]) -> list[StagePlacement]:
        """One stage per role: stages with one role hold the same parameters and volumes."""
        roles: dict[tuple, StagePlacement] = {}
        for stage in stages:
            roles.setdefault(stage.role[:4], stage)
        return list(roles.values())

    def _optimizer_step_s(
        self, ctx: PricingContext, layout: Layout, roles: Sequence[StagePlacement]
    ) -> float:
        """The optimizer step: the slowest stage's update (memoised on the stages' roles
        and what shards their state)."""
        if ctx.settings.finetune == "lora":
            return 0.0  # frozen base weights; the adapters' update is negligible (as memory)
        key = (
            "optimizer_step",
            *self._state_key(layout, roles),
            layout.zero >= 1,
            layout.offload_optimizer,
        )
        opt = ctx.cache.get(key)
        if opt is None:
            opt = 0.0
            for stage in roles:
                dense, expert, _ = self._memory.stage_parameters(ctx, layout, stage)
                opt = max(opt, self._optimizer_s(ctx, layout, dense, expert))
            ctx.cache[key] = opt
        return opt

    def step_floor_seconds(
        self,
        ctx: PricingContext,
        layout: Layout,
        stages: Sequence[StagePlacement],
        layers_s: float,
    ) -> float:
        """A lower bound on ``step`` when one micro-batch through every decoder layer, each
        at its fastest option, takes ``layers_s``: the pipeline of stages at least that
        balanced, the traffic no such stage can hide, the optimizer step and the fixed
        overhead. Only the layouts this cannot rule out reach the memory check.

        Why it holds, part by part:

        - The busiest stage computes at least ``layers_s``/pp per micro-batch, and a
          stage's time grows with its compute even as the compute hides more ZeRO-3
          traffic (by at most ``overlap.fsdp`` per second), so t_max is at least that
          compute plus the least-traffic stage's exposure at it (``_fsdp_floor``). The
          stages sum to at least ``layers_s``; each schedule's pipeline grows with both.
        - The per-step reduction hides under the slowest stage's last backward and the
          gather under its first forward, so the two windows sum to at most t_max, and
          every schedule's pipeline is at least m·t_max. The exposed traffic falls by at
          most ``overlap.dp`` per second of window, so the step, as a function of the
          pipeline time, still grows with it (by at least 1 − 1/m): it is least at the
          pipeline's floor, with t_max that floor over m."""
        calibration = self._calibration(ctx)
        roles = self._distinct_roles(stages)
        m, pp = layout.num_microbatches, layout.pp
        stage_s = layers_s / pp
        slowest = stage_s + self._fsdp_floor(ctx, layout, roles, stage_s)
        pipeline = pipeline_seconds(layout, slowest, max(layers_s, slowest))
        fixed = self._optimizer_step_s(ctx, layout, roles) + calibration.step_overhead_s
        if ctx.settings.finetune == "lora":
            return pipeline + fixed
        # The least exposure over the two windows: all the traffic under one of length t_max.
        volume = sum(self._dp_step_volumes(ctx, layout, roles))
        exposed = max(0.0, volume - self.overlap(ctx).dp * pipeline / m)
        return pipeline + self._charged(ctx, volume, exposed) + fixed

    def _fsdp_floor(
        self,
        ctx: PricingContext,
        layout: Layout,
        roles: Sequence[StagePlacement],
        compute_s: float,
    ) -> float:
        """The least ZeRO-3 traffic a stage computing ``compute_s`` per micro-batch leaves
        exposed (``_fsdp_exposed`` with both its windows summing to that compute), over
        the stages' roles."""
        if layout.zero < 3 or ctx.settings.finetune == "lora":
            return 0.0
        fsdp = self.overlap(ctx).fsdp

        def exposure(stage: StagePlacement) -> float:
            gather, scatter = self._fsdp_volumes(ctx, layout, stage)
            raw = 2 * gather + scatter
            return self._charged(ctx, raw, max(0.0, raw - fsdp * compute_s))

        return min(exposure(stage) for stage in roles)

    def _optimizer_s(
        self, ctx: PricingContext, layout: Layout, dense: float, expert: float
    ) -> float:
        shard_dense = layout.dp * layout.cp if layout.zero >= 1 else 1
        shard_expert = layout.expert_data_parallel if layout.zero >= 1 else 1
        params = dense / shard_dense + expert / shard_expert
        state = {"adam": 12, "sgd": 8, "muon": 8}[ctx.settings.optimizer]
        if layout.offload_optimizer:
            # Gradients down and parameters up over the host link, and the update on the
            # device's share of the host CPU.
            host = ctx.device.host_link.bytes_per_s
            cpu = self.efficiency(ctx).host_optimizer_params_per_s
            return params * (4 + 2) / host + params / cpu
        # Read master, grad and moments; write master, moments and the bf16 copy.
        return self._hbm_s(ctx, params * (state + 4 + state + 2))

    # ------------------------------------------------------------------ FLOPs

    def model_flops_per_step(self, ctx: PricingContext) -> float:
        key = "model_flops_per_step"
        found = ctx.cache.get(key)
        if found is None:
            tokens = ctx.job.global_batch_size * ctx.job.seq_length
            found = ctx.cache[key] = model_flops_per_step(
                ctx.model, tokens, ctx.settings.attention_span
            )
        return found
