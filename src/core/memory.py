"""The per-device memory model (spec/memory.md).

Per stage, the busiest device holds: weights, gradients, optimizer state (ZeRO /
FSDP sharded), activations per layer and recompute option times the micro-batches
in flight, the embedding and loss activations, communication buffers, the
backward working set and a fixed reserve. Every part is an integer number of
bytes and the parts sum exactly to the total.

Activations are derived tensor by tensor from the shapes (:func:`layer_tensors`),
so Korthikanti et al.'s anchors (GPT, 4h GELU MLP, MHA, eager attention with
dropout) come out as special cases: ``s·b·h·(34/t + 5as/(ht))`` with TP+SP,
``34·s·b·h/t`` with core attention recomputed, ``2·s·b·h/t`` under full recompute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .cluster import DeviceSpec
from .context import PricingContext, StagePlacement, layer_key
from .counting import KindParameters
from .frameworks import offloads, per_op_policy_applies
from .layout import Layout
from .model import DenseFFN, LatentAttention, LayerKind, LinearAttention, MoEFFN, StandardAttention
from .plan import MemoryBreakdown, StageMemory
from .ports import REFETCH_PART, Recompute
from .recompute import activation_offload_offered

# Bytes per element of a saved linear-layer input under each recipe: fp8 recipes save
# the quantised copy (plus block scales); bf16 saves bf16.
LINEAR_INPUT_BYTES = {
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "fp8-blockwise": 1.0 + 4 / 128,
    "mxfp8": 1.0 + 1 / 32,
    "fp4": 0.5 + 1 / 16,
}
# Extra bytes per linear weight kept as a low-precision copy across micro-batches
# (both orientations: rowwise for fprop, columnwise for dgrad/wgrad; see
# low_precision_copies for devices that need only one).
LOW_PRECISION_WEIGHT_BYTES = {
    "bf16": 0.0,
    "fp16": 0.0,
    "fp8": 2.0,
    "fp8-blockwise": 2.0 * (1 + 4 / 128 / 128),
    "mxfp8": 2.0 * (1 + 1 / 32),
    "fp4": 2.0 * (0.5 + 1 / 16),
}
ACTIVATION_BYTES = 2  # bf16/fp16 activations, also under fp8 recipes


def low_precision_copies(precision: str, device: DeviceSpec) -> int:
    """Orientations a quantised tensor is kept in: per-tensor-scaled fp8 needs only the
    rowwise one where the tensor cores take fp8 in any layout (Transformer Engine then
    skips the columnwise copy); elsewhere, and for block scales, both."""
    return 1 if precision == "fp8" and device.fp8_any_layout else 2


def fp8_primary_weights(ctx: PricingContext, layout: Layout) -> bool:
    """Whether the quantised linear weights are the parameters themselves (Megatron's
    --fp8-param-gather): the distributed optimizer (or Megatron-FSDP) holds the fp32
    master, and it exists for the tensor-wise fp8 and MXFP8 recipes (not block-wise fp8
    or NVFP4). The job setting is read last: an assumption only where it applies."""
    job = ctx.settings
    return (
        ctx.framework.fp8_primary_weights
        and layout.zero >= 1
        and job.precision in ("fp8", "mxfp8")
        and job.finetune == "full"
        and job.fp8_param_gather
    )


@dataclass(frozen=True, slots=True)
class Tensor:
    """One saved tensor of a layer's forward, per micro-batch, on one device."""

    name: str
    nbytes: float
    dropped_by: frozenset[str]
    """Recompute switches any of which drops it (and recomputes its producer)."""
    kept_by: frozenset[str] = frozenset()
    """When set, it exists only under one of these switches: an output a selective policy
    saves although the plain backward does not need it (torchtitan's per-op policy keeps
    the down projection's output and the reduce-scatters' outputs)."""


def _tokens(ctx: PricingContext, layout: Layout) -> float:
    """Tokens of one micro-batch on one device's CP shard."""
    return layout.mbs * ctx.job.seq_length / layout.cp


def layer_tensors(ctx: PricingContext, layout: Layout, kind: LayerKind) -> tuple[Tensor, ...]:
    """Every tensor one layer of ``kind`` saves for its backward (plain option)."""
    key = ("tensors", kind.name, *layer_key(layout))
    found = ctx.cache.get(key)
    if found is not None:
        return found
    job = ctx.settings
    h = ctx.model.hidden_size
    n = _tokens(ctx, layout)
    t = layout.tp
    sp = layout.sequence_parallel
    sigma = t if sp else 1
    ab = ACTIVATION_BYTES
    lb = LINEAR_INPUT_BYTES[job.precision]
    dropout = job.dropout > 0
    eager = job.attention_kernel == "eager"
    seq = ctx.job.seq_length
    out: list[Tensor] = []

    def add(name: str, nbytes: float, *switches: str, kept_by: tuple[str, ...] = ()) -> None:
        if nbytes > 0:
            out.append(Tensor(name, nbytes, frozenset(switches), frozenset(kept_by)))

    def norm_output(name: str, width: float) -> None:
        """A norm's output feeding a (possibly SP-gathered) linear layer."""
        add(name, lb * n * width / sigma, "norm", "op")
        if sp:  # the gathered full-sequence copy, kept unless re-gathered in the backward
            add(name + "_gathered", lb * n * width * (1 - 1 / sigma), "norm", "sp_gather", "op")

    add("layer_input", ab * n * h / sigma)
    att = kind.attention
    # torchtitan's per-op policy (the "op" switch) counts a standard layer's matmuls in
    # call order (q, k, v, out; gate, up, down) and saves the odd ones' outputs.
    per_op = per_op_policy_applies(ctx.framework, isinstance(att, StandardAttention))
    recomputed = ("op",) if per_op else ()
    norm_output("attn_norm_out", h)
    if isinstance(att, StandardAttention):
        q_width = att.num_heads * att.head_dim
        kv_width = max(att.num_kv_heads, t) * att.head_dim  # kv heads replicate when fewer than tp
        if att.qk_norm:
            add("qk_norm_in", ab * n * (q_width + kv_width) / t, "norm", "op")
        add("q", ab * n * q_width / t)
        add("k", ab * n * kv_width / t, *recomputed)
        add("v", ab * n * kv_width / t)
        if att.output_gate:
            add("output_gate", ab * n * q_width / t)
        _core_attention(add, n, seq, att.num_heads, t, eager, dropout, ab)
        add("attn_out", ab * n * q_width / t)
    elif isinstance(att, LatentAttention):
        a = att.num_heads
        d_qk = att.qk_nope_head_dim + att.qk_rope_head_dim
        if att.q_lora_rank:
            add("q_latent", ab * n * att.q_lora_rank / sigma)
            add("q_latent_norm_out", lb * n * att.q_lora_rank / sigma, "norm", "op")
        add("kv_latent", ab * n * (att.kv_lora_rank + att.qk_rope_head_dim) / sigma)
        add("kv_latent_norm_out", lb * n * att.kv_lora_rank / sigma, "norm", "op")
        add("q", ab * n * a * d_qk / t, "mla_up")
        add("k", ab * n * a * d_qk / t, "mla_up")
        add("v", ab * n * a * att.v_head_dim / t, "mla_up")
        _core_attention(add, n, seq, a, t, eager, dropout, ab)
        add("attn_out", ab * n * a * att.v_head_dim / t)
    else:
        lin: LinearAttention = att
        key_w = lin.num_key_heads * lin.key_head_dim
        val_w = lin.num_value_heads * lin.value_head_dim
        add("qkvz", ab * n * (2 * key_w + 2 * val_w) / t)
        add("gates", ab * n * 2 * lin.num_value_heads / t)
        add("conv_out", ab * n * (2 * key_w + val_w) / t, "core_attn")
        chunks = math.ceil(n / layout.mbs / lin.chunk_size) * layout.mbs
        add(
            "chunk_states",
            4 * chunks * lin.num_value_heads * lin.key_head_dim * lin.value_head_dim / t,
            "core_attn",
        )
        add("core_out", ab * n * val_w / t)
        add("gated_norm_out", lb * n * val_w / t, "norm", "op")
    if dropout:
        add("attn_dropout_mask", 1 * n * h / sigma)
    add("mid_residual", ab * n * h / sigma, *recomputed)
    if per_op and t > 1 and sp:  # the output projection's reduce-scatter, saved
        add("attn_scattered", ab * n * h / sigma, kept_by=("op",))
    norm_output("ffn_norm_out", h)
    ffn = kind.ffn
    if isinstance(ffn, DenseFFN):
        width = ffn.intermediate_size
        if ffn.gated and per_op:
            # The gate (5th matmul) saved, the up projection (6th) recomputed, and the
            # down projection's (7th) output saved, before its reduce.
            add("fc1_out", ab * n * 2 * width / t, "op", "mlp")
            add("fc1_gate_out", ab * n * width / t, kept_by=("op",))
            add("fc2_out", ab * n * h, kept_by=("op",))
        else:
            add("fc1_out", ab * n * (2 if ffn.gated else 1) * width / t, "mlp")
        if per_op and t > 1 and sp:
            add("ffn_scattered", ab * n * h / sigma, kept_by=("op",))
        add("act_out", lb * n * width / t, "act", "op", "mlp")
    else:
        moe: MoEFFN = ffn
        add("router_probs", 2 * 4 * n * moe.num_experts / sigma)
        copies = (n / sigma) * moe.top_k * job.moe_capacity_factor * layout.expert_tp
        width = moe.expert_intermediate_size / layout.expert_tp
        add("expert_in", lb * copies * h)
        add("expert_fc1_out", ab * copies * (2 if moe.gated else 1) * width, "moe_ffn")
        add("expert_act_out", lb * copies * width, "act", "moe_ffn", "op")
        add("expert_out", ab * copies * h, "moe_ffn")
        add("routing_map", 8 * (n / sigma) * moe.top_k)
        if moe.shared_intermediate_size:
            add(
                "shared_fc1_out",
                ab * n * (2 if moe.gated else 1) * moe.shared_intermediate_size / t,
            )
            add(
                "shared_act_out",
                lb * n * moe.shared_intermediate_size / t,
                *ctx.framework.dense_activation_switches,
            )
    if dropout:
        add("ffn_dropout_mask", 1 * n * h / sigma)
    result = tuple(out)
    ctx.cache[key] = result
    return result


def _core_attention(
    add, n: float, seq: int, heads: int, t: int, eager: bool, dropout: bool, ab: int
) -> None:
    """Scores/softmax (eager) or the flash kernel's softmax statistics."""
    if eager:
        add("softmax_out", ab * heads * n * seq / t, "core_attn")
        if dropout:
            add("softmax_dropout_mask", 1 * heads * n * seq / t, "core_attn")
            add("softmax_dropout_out", ab * heads * n * seq / t, "core_attn")
    else:
        add("softmax_stats", 4 * heads * n / t, "core_attn")


def activation_bytes(
    tensors: tuple[Tensor, ...], recompute: Recompute, forced: frozenset[str]
) -> int:
    """Bytes kept per micro-batch under ``recompute`` (None: only the layer input)."""
    if recompute is None:
        return math.ceil(tensors[0].nbytes)
    active = recompute | forced
    return math.ceil(
        sum(
            t.nbytes
            for t in tensors
            if not (t.dropped_by & active) and (not t.kept_by or t.kept_by & active)
        )
    )


class NdplanMemoryModel:
    """ndplan's own, complete memory model (the default)."""

    name = "ndplan"

    # ------------------------------------------------------------------ port

    def layer_activation_bytes(
        self, ctx: PricingContext, layout: Layout, kind: LayerKind, recompute: Recompute
    ) -> int:
        if offloads(recompute):
            return 0  # on the host between its forward and its backward
        forced = ctx.framework.forced_switches
        return activation_bytes(layer_tensors(ctx, layout, kind), recompute, forced)

    def stage_static_bytes(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> dict[str, int]:
        # Two halves cached on their own (true) keys: the model state depends on what the
        # stage holds and how it is sharded; the buffers on the micro-batch's shape.
        deferred = ctx.deferred_head_wgrads(layout) if stage.has_head else 0
        state_key, buffer_key = _state_key(layout, stage), _buffer_key(layout, stage, deferred)
        key = ("static", state_key, buffer_key)
        found = ctx.cache.get(key)
        if found is None:
            state = self._cached(ctx, "state", state_key, self._state_parts, layout, stage)
            buffers = self._cached(ctx, "buffers", buffer_key, self._buffer_parts, layout, stage)
            merged = {**state, **buffers, "reserve": ctx.fixed_reserve_bytes}
            found = ctx.cache[key] = {
                k: math.ceil(v) for k, v in merged.items() if v > 0 or k in ("weights", "reserve")
            }
        return found

    @staticmethod
    def _cached(
        ctx: PricingContext, name: str, key: tuple, fn, layout: Layout, stage: StagePlacement
    ):
        full = (name, *key)
        found = ctx.cache.get(full)
        if found is None:
            found = ctx.cache[full] = fn(ctx, layout, stage)
        return found

    # ------------------------------------------------------------------ parts

    def stage_parameters(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> tuple[float, float, float]:
        """(dense parameters, routed-expert parameters, quantisable linear-weight parameters:
        the decoder's, not the embedding or the output layer) on one device."""
        key = ("stage_params", stage.role[:4], layout.tp, layout.ep, layout.expert_tp)
        found = ctx.cache.get(key)
        if found is None:
            found = ctx.cache[key] = self._stage_parameters(ctx, layout, stage)
        return found

    def _stage_parameters(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> tuple[float, float, float]:
        model = ctx.model
        h, t = model.hidden_size, layout.tp
        dense = expert = linear = 0.0
        for kind_index, count, _ in stage.groups:
            p = ctx.kind_params[kind_index]
            split, replicated = split_parameters(model.kinds[kind_index], p, h)
            dense += count * (split / t + replicated)
            expert += count * p.experts / (layout.ep * layout.expert_tp)
            linear += count * (split / t + p.router + p.experts / (layout.ep * layout.expert_tp))
        vocab = padded_vocab(model.vocab_size, t)
        embedding = vocab * h / t
        if stage.has_embedding:
            dense += embedding
            if model.position_embedding == "learned":
                dense += (model.max_position_embeddings or 0) * h
            if model.vision is not None:
                dense += model.vision.parameters / t
                linear += model.vision.parameters / t
        if stage.has_head:
            # A tied head shares the embedding only when both sit on one stage.
            # The output layer runs in bf16 (Megatron's is not a Transformer Engine module,
            # and the time model prices its GEMM so): it is not a quantised weight.
            if not (model.tie_word_embeddings and stage.has_embedding):
                dense += embedding
            dense += h * (2 if model.final_norm_bias else 1)
            if stage.has_mtp and ctx.mtp_params is not None:
                p = ctx.mtp_params
                split, replicated = split_parameters(model.mtp_kind, p, h)
                dense += model.num_mtp_layers * (split / t + replicated)
                expert += model.num_mtp_layers * p.experts / (layout.ep * layout.expert_tp)
                linear += model.num_mtp_layers * (
                    split / t + p.experts / (layout.ep * layout.expert_tp)
                )
                if not stage.has_embedding:
                    dense += embedding  # MTP embeds the shifted tokens on the last stage
        return dense, expert, linear

    def _state_parts(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> dict[str, float]:
        """Weights, gradients, optimizer state, gathered and low-precision copies."""
        job = ctx.settings
        fw = ctx.framework
        dense, expert, linear = self.stage_parameters(ctx, layout, stage)
        params = dense + expert
        dense_shard = layout.dp * layout.cp
        expert_shard = layout.expert_data_parallel
        optimizer_bytes = {"adam": 12, "sgd": 8, "muon": 8}[job.optimizer]
        parts: dict[str, float] = {}
        param_bytes = 2.0
        if fw.fsdp_fp32_params and layout.zero >= 2:
            # FSDP (torchtitan, llm-foundry): sharded fp32 parameters are the master copy:
            # 4 (param) + 4 (grad) + the optimizer's moments (Adam: 8) per parameter.
            sharded = dense / dense_shard + expert / expert_shard
            parts["weights"] = 4 * sharded
            parts["gradients"] = 4 * sharded
            parts["optimizer"] = (optimizer_bytes - 4) * sharded
            if layout.zero == 2:  # SHARD_GRAD_OP keeps the unsharded bf16 parameters after forward
                parts["gathered_parameters"] = params * param_bytes
            else:  # bf16 working copies of the current and prefetched layer, one layer's fp32 grads
                parts["gathered_parameters"] = self._largest_layer_params(ctx, layout, stage) * (
                    2 * param_bytes + 4
                )
        else:
            grad_bytes = ctx.settings.grad_reduce_bytes
            if fw.fsdp_fp32_params:  # DDP under autocast: fp32 parameters are the master copy
                param_bytes, optimizer_bytes = 4.0, optimizer_bytes - 4
            weight_shard = (dense_shard, expert_shard) if layout.zero >= 3 else (1, 1)
            grad_shard = (dense_shard, expert_shard) if layout.zero >= 2 else (1, 1)
            opt_shard = (dense_shard, expert_shard) if layout.zero >= 1 else (1, 1)
            parts["weights"] = param_bytes * (dense / weight_shard[0] + expert / weight_shard[1])
            parts["gradients"] = grad_bytes * (dense / grad_shard[0] + expert / grad_shard[1])
            parts["optimizer"] = optimizer_bytes * (dense / opt_shard[0] + expert / opt_shard[1])
            if layout.zero >= 3:
                parts["gathered_parameters"] = (
                    self._largest_layer_params(ctx, layout, stage) * param_bytes * 2
                )
        if layout.offload_optimizer:
            parts["optimizer"] = 0.0
        if job.finetune == "lora":
            # Frozen base weights: no gradients or optimizer state (adapters are negligible).
            parts["gradients"] = 0.0
            parts["optimizer"] = 0.0
            if fw.fsdp_fp32_params and layout.zero >= 2:
                parts["weights"] = 2.0 * (dense / dense_shard + expert / expert_shard)
        if job.is_low_precision:
            shard = dense_shard if layout.zero >= 3 else 1
            per_weight = LOW_PRECISION_WEIGHT_BYTES[job.precision] / 2
            copies = low_precision_copies(job.precision, ctx.device)
            parts["low_precision_weights"] = per_weight * copies * linear / shard
            if fp8_primary_weights(ctx, layout):
                # No bf16 copy of the quantised weights beside them (MXFP8 gathers in bf16
                # through the gradient buffer, then quantises in place).
                dense_linear = (linear - expert) / shard
                expert_linear = expert / (expert_shard if layout.zero >= 3 else 1)
                parts["weights"] = max(
                    0.0, parts["weights"] - param_bytes * (dense_linear + expert_linear)
                )
        return parts

    def _buffer_parts(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> dict[str, float]:
        """Activations outside the layers, communication buffers, the backward working set."""
        parts = dict(self._stage_activations(ctx, layout, stage))
        parts["comm_buffers"] = (
            self._comm_buffers(ctx, layout, stage) + ctx.framework.dp_bucket_bytes
        )
        gradients, refetch = self._working_set(ctx, layout, stage)
        parts["working_set"] = gradients
        parts[REFETCH_PART] = refetch
        return parts

    def _largest_layer_params(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> float:
        h = ctx.model.hidden_size
        best = 0.0
        for kind_index, _, _ in stage.groups:
            p = ctx.kind_params[kind_index]
            split, replicated = split_parameters(ctx.model.kinds[kind_index], p, h)
            best = max(
                best, split / layout.tp + replicated + p.experts / (layout.ep * layout.expert_tp)
            )
        if stage.has_embedding or stage.has_head:
            best = max(best, padded_vocab(ctx.model.vocab_size, layout.tp) * h / layout.tp)
        return best

    def _stage_activations(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> dict[str, float]:
        """Activations outside the decoder layers: token ids, the loss, MTP."""
        job = ctx.settings
        model = ctx.model
        n = _tokens(ctx, layout)
        sigma = layout.tp if layout.sequence_parallel else 1
        h, t = model.hidden_size, layout.tp
        parts: dict[str, float] = {}
        if stage.has_embedding:
            k = stage.chunks[0].in_flight if stage.chunks else 1
            parts["embedding_activations"] = k * (8 * n + (n * h / sigma if job.dropout > 0 else 0))
        if stage.has_head:
            vocab = padded_vocab(model.vocab_size, t) / t
            k = stage.head_in_flight
            head = ACTIVATION_BYTES * n * h / sigma * 2  # final norm input and output
            # Logits for the loss: bf16 logits, plus the fp32 softmax a non-fused
            # cross-entropy keeps for its backward (and its fp32 working copy at peak).
            logits = n * vocab * (2 if job.fused_loss else 2 + 4 + 4)  # noqa: RUF100
            parts["loss_activations"] = (
                k * head + logits + (k - 1) * n * vocab * (2 if job.fused_loss else 6)
            )
            # A deferred output-layer weight gradient keeps its input (the SP shard) and
            # its bf16 logit gradient until the drain.
            deferred = ctx.deferred_head_wgrads(layout)
            if deferred:
                parts["deferred_wgrad_buffers"] = (
                    deferred * ACTIVATION_BYTES * (n * h / sigma + n * vocab)
                )
            if stage.has_mtp and model.mtp_kind is not None:
                per_layer = self.layer_activation_bytes(ctx, layout, model.mtp_kind, frozenset())
                parts["mtp_activations"] = (
                    k
                    * model.num_mtp_layers
                    * (per_layer + n * vocab * (2 if job.fused_loss else 6))
                )
        return parts

    def _comm_buffers(self, ctx: PricingContext, layout: Layout, stage: StagePlacement) -> float:
        """The largest transient communication buffer of one layer (they are not live at once)."""
        n = _tokens(ctx, layout)
        h = ctx.model.hidden_size
        lb = LINEAR_INPUT_BYTES[ctx.settings.precision]
        largest = 0.0
        if layout.sequence_parallel:
            largest = max(largest, lb * n * h)  # an all-gathered linear input
        if layout.cp > 1:
            largest = max(
                largest, 2 * 2 * ACTIVATION_BYTES * n * h / layout.tp
            )  # K/V send + receive blocks
        for kind_index, _, _ in stage.groups:
            kind = ctx.model.kinds[kind_index]
            if isinstance(kind.ffn, MoEFFN) and layout.ep > 1:
                sigma = layout.tp if layout.sequence_parallel else 1
                copies = (
                    n / sigma * kind.ffn.top_k * ctx.settings.moe_capacity_factor * layout.expert_tp
                )
                largest = max(largest, 2 * ACTIVATION_BYTES * copies * h)  # dispatch + combine
        return largest

    def _working_set(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> tuple[float, float]:
        """The first backward at the end of warm-up: one layer's gradient tensors; and,
        apart (``REFETCH_PART``), what re-running its forward or bringing its tensors back
        from the host adds — the plain option's tensors either way — when layers may
        recompute or offload. The largest layer kind sets both, as one sum."""
        refetch = layout.recompute != "none" or activation_offload_offered(ctx)
        gradients = with_refetch = 0.0
        for kind_index, _, _ in stage.groups:
            kind = ctx.model.kinds[kind_index]
            tensors = [tt for tt in layer_tensors(ctx, layout, kind) if not tt.kept_by]
            plain = sum(tt.nbytes for tt in tensors)
            biggest = max(tt.nbytes for tt in tensors)
            grads = (
                tensors[0].nbytes * 2 + biggest
            )  # input/output gradients + the widest intermediate
            gradients = max(gradients, grads)
            with_refetch = max(with_refetch, grads + (plain if refetch else 0.0))
        return gradients, with_refetch - gradients


def keeps_all(assignment: Sequence[tuple[int, int, int, Recompute]]) -> bool:
    """Whether every layer of a stage keeps its activations: nothing is re-run or fetched
    back in its backward, so it needs no ``REFETCH_PART``."""
    return all(recompute == frozenset() for *_, recompute in assignment)


def charged_static(
    parts: dict[str, int], assignment: Sequence[tuple[int, int, int, Recompute]]
) -> dict[str, int]:
    """A stage's static parts as charged under ``assignment``."""
    if REFETCH_PART in parts and keeps_all(assignment):
        return {k: v for k, v in parts.items() if k != REFETCH_PART}
    return dict(parts)


def stage_memory(stage: StagePlacement, parts: dict[str, int]) -> StageMemory:
    """One stage's memory: its layers, in-flight micro-batches, parts and their sum."""
    return StageMemory(
        stage=stage.index,
        layers=tuple((c.start, c.stop) for c in stage.chunks),
        in_flight=tuple(c.in_flight for c in stage.chunks),
        parts=parts,
        total_bytes=sum(parts.values()),
    )


def _finish(
    ctx: PricingContext, mode: str, stages: list[StageMemory], **extra: int
) -> MemoryBreakdown:
    peak = max(stages, key=lambda s: (s.total_bytes, -s.stage))
    return MemoryBreakdown(
        mode=mode,
        stages=tuple(stages),
        peak_bytes=peak.total_bytes,
        peak_stage=peak.stage,
        capacity_bytes=ctx.device_capacity_bytes,
        budget_bytes=ctx.budget_bytes,
        fits=peak.total_bytes <= ctx.budget_bytes,
        **extra,
    )


def _state_key(layout: Layout, stage: StagePlacement) -> tuple:
    return (
        stage.role[:4],
        layout.tp,
        layout.ep,
        layout.expert_tp,
        layout.dp * layout.cp,
        layout.expert_data_parallel,
        layout.zero,
        layout.offload_optimizer,
    )


def _buffer_key(layout: Layout, stage: StagePlacement, deferred_wgrads: int) -> tuple:
    return (
        stage.role,
        deferred_wgrads,  # the head stage buffers the deferred output-layer wgrad inputs
        layout.mbs,
        layout.cp,
        layout.tp,
        layout.sequence_parallel,
        layout.ep,
        layout.expert_tp,
        layout.recompute != "none",
    )


def padded_vocab(vocab: int, tp: int, multiple: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of ``128·tp`` so it splits evenly."""
    step = multiple * tp
    return -(-vocab // step) * step


def split_parameters(kind: LayerKind, p: KindParameters, h: int) -> tuple[int, int]:
    """(TP-split, TP-replicated) non-expert parameters of one layer.

    Norms, the router and MLA's down-projections are replicated across TP; the
    attention and FFN matrices (and their split biases) are split.
    """
    replicated = p.norms + p.router
    att = kind.attention
    if isinstance(att, LatentAttention):
        down = h * ((att.q_lora_rank or 0) + att.kv_lora_rank + att.qk_rope_head_dim)
        down += (att.q_lora_rank or 0) + att.kv_lora_rank  # latent norms
        replicated += down
    split = p.total - p.experts - replicated
    return split, replicated


class MegatronMemoryModel:
    """Megatron-LM's theoretical memory estimate, blind spots included (for comparison).

    Reproduces ``megatron/training/theoretical_memory_usage.py`` at the commit the
    reference vectors name: the weight-and-optimizer bytes of the most loaded shard
    (first stage: its layers plus the embedding; experts over EP with their own
    data-parallel group), and the activation formula of Korthikanti et al. Table 2
    (with SP and selective recompute) or its no-SP form, as Megatron chooses.
    It ignores what the complete model counts: the loss's fp32 logits, communication
    buffers, the backward working set, the runtime reserve.
    """

    name = "megatron"

    def weights_and_optimizer_bytes(self, ctx: PricingContext, layout: Layout) -> float:
        model = ctx.model
        h = model.hidden_size
        norm_size = 1 if model.kinds[0].norm == "rmsnorm" else 2
        non_expert_block = 0.0
        expert_block = 0.0
        for kind, count in model.kind_counts():
            ne, ex = _megatron_layer_params(kind, h, norm_size)
            non_expert_block += count * ne
            expert_block += count * ex
        # Norms are replicated across TP (the layer norms and the final norm).
        norms = (2 * model.num_layers + 1) * norm_size * h
        non_expert_block += norm_size * h  # final norm
        mtp_ne = mtp_ex = 0.0
        if model.mtp_kind is not None and model.num_mtp_layers:
            ne, ex = _megatron_layer_params(model.mtp_kind, h, norm_size)
            mtp_ne, mtp_ex = model.num_mtp_layers * ne, model.num_mtp_layers * ex
        embedding = h * padded_vocab(model.vocab_size, layout.tp)
        t, pp = layout.tp, layout.pp
        non_expert = ((non_expert_block - norms) / pp + mtp_ne + embedding) / t + norms / pp
        if not model.tie_word_embeddings and pp == 1:
            non_expert += embedding / t
        expert = (expert_block / pp + mtp_ex) / (layout.ep * layout.expert_tp)
        distributed = layout.zero >= 1

        def per_param(dp: int) -> float:
            return 6 + 12 / dp if distributed else 18

        return non_expert * per_param(layout.dp) + expert * per_param(layout.expert_data_parallel)

    def activation_bytes(self, ctx: PricingContext, layout: Layout) -> tuple[float, str]:
        """Megatron's activation estimate of the first stage, and which formula it used."""
        model = ctx.model
        s, b, h = ctx.job.seq_length, layout.mbs, model.hidden_size
        t, pp, L = layout.tp, layout.pp, model.num_layers
        vpp = layout.vpp if layout.schedule == "interleaved" else None
        m = layout.num_microbatches
        ffn = _megatron_ffn_width(model)
        vocab = padded_vocab(model.vocab_size, t)
        selective_sp = layout.sequence_parallel and layout.recompute == "selective"
        if selective_sp:
            act = s * b * h * (18 + 4 * (ffn / h)) * L
        else:
            act = s * b * h * (10 + 24 / t) * L
        act += 8 * s * b * pp + s * b * h * pp
        if vpp is not None:
            act *= 1 + (pp - 1) / (pp * vpp)
        elif pp > 1:
            act *= min(1, m / pp)
        if selective_sp:
            if pp == 1:
                act += s * b * h * 4 * (1 + vocab / h)
            return act / t, "sp"
        if pp == 1:
            act += (s * b * vocab / t + s * b * h) * 2
        return act * 1.05, "nosp"

    def breakdown(self, ctx: PricingContext, layout: Layout) -> MemoryBreakdown:
        weights = math.ceil(self.weights_and_optimizer_bytes(ctx, layout))
        act, _ = self.activation_bytes(ctx, layout)
        activations = math.ceil(act)
        stage = stage_memory(
            ctx.placement(layout)[0],
            {"weights_and_optimizer": weights, "activations": activations},
        )
        return _finish(
            ctx,
            "megatron",
            [stage],
            weights_and_optimizer_bytes=weights,
            activation_bytes=activations,
        )

    # The port, for searches run in megatron mode: the estimate split per layer.
    def layer_activation_bytes(
        self, ctx: PricingContext, layout: Layout, kind: LayerKind, recompute: Recompute
    ) -> int:
        s, b, h, t = ctx.job.seq_length, layout.mbs, ctx.model.hidden_size, layout.tp
        if recompute is None:
            return math.ceil(2 * s * b * h / (t if layout.sequence_parallel else 1) / layout.cp)
        if layout.sequence_parallel:
            return math.ceil(
                s * b * h * (18 + 4 * _megatron_ffn_width(ctx.model) / h) / t / layout.cp
            )
        return math.ceil(s * b * h * (10 + 24 / t) * 1.05 / layout.cp)

    def stage_static_bytes(
        self, ctx: PricingContext, layout: Layout, stage: StagePlacement
    ) -> dict[str, int]:
        weights = self.weights_and_optimizer_bytes(ctx, layout)
        if stage.index > 0:
            # Other shards hold their layers only, at the same bytes per parameter.
            model = ctx.model
            norm_size = 1 if model.kinds[0].norm == "rmsnorm" else 2
            per_layer = (
                sum(
                    c * sum(_megatron_layer_params(k, model.hidden_size, norm_size))
                    for k, c in model.kind_counts()
                )
                / model.num_layers
            )
            bpp = 6 + 12 / layout.dp if layout.zero >= 1 else 18
            weights = stage.num_layers * per_layer / layout.tp * bpp
        return {"weights_and_optimizer": math.ceil(weights)}


def _megatron_ffn_width(model) -> int:
    for kind in model.kinds:
        if isinstance(kind.ffn, DenseFFN):
            return kind.ffn.intermediate_size
    return model.kinds[0].ffn.expert_intermediate_size


def _megatron_layer_params(kind: LayerKind, h: int, norm_size: int) -> tuple[float, float]:
    """(non-expert, expert) parameters of one layer as Megatron's estimate counts them."""
    att = kind.attention
    if isinstance(att, LatentAttention):
        qk = att.qk_nope_head_dim + att.qk_rope_head_dim
        if att.q_lora_rank is None:
            q_term = h * att.num_heads * qk
        else:
            q_term = att.q_lora_rank * (h + att.num_heads * qk + norm_size)
        attn = (
            q_term
            + att.kv_lora_rank
            * (h + att.num_heads * (att.qk_nope_head_dim + att.v_head_dim) + norm_size)
            + h * att.qk_rope_head_dim
            + att.num_heads * att.v_head_dim * h
        )
    elif isinstance(att, StandardAttention):
        q = att.num_heads * att.head_dim
        attn = 2 * h * h * (1 + att.num_kv_heads / att.num_heads) * (q / h)
    else:  # not covered by Megatron's estimate: count its projections
        lin = att
        attn = (
            h
            * (
                2 * lin.num_key_heads * lin.key_head_dim
                + 2 * lin.num_value_heads * lin.value_head_dim
            )
            + lin.num_value_heads * lin.value_head_dim * h
        )
    ffn = kind.ffn
    mult = 1.5 if ffn.gated else 1.0
    if isinstance(ffn, DenseFFN):
        return 2 * h * (ffn.intermediate_size * mult + norm_size) + attn, 0.0
    shared = ffn.shared_intermediate_size * mult
    non_expert = 2 * h * (shared + norm_size) + attn + h * ffn.num_experts
    expert = 2 * h * ffn.expert_intermediate_size * ffn.num_experts * mult
    return non_expert, expert
