"""Exact parameter counts and FLOPs per token, derived term by term from shapes.

Conventions (spec/model.md): a matmul of m×k by k×n costs 2·m·k·n FLOPs; the
backward costs twice the forward; core attention is counted causally by default
(what a causal flash kernel executes) with ``attention="full"`` for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .base import Frozen
from .model import (
    DenseFFN,
    LatentAttention,
    LayerKind,
    LinearAttention,
    ModelSpec,
    MoEFFN,
    StandardAttention,
)

AttentionConvention = Literal["causal", "full"]


@dataclass(frozen=True, slots=True)
class KindParameters:
    """Parameters of one layer of a kind, by part. ``matmul`` parts drive FLOPs."""

    attention: int  # projections incl. biases, q/k norms, sinks, conv
    attention_matmul: int  # weight matrices only
    ffn: int  # dense FFN
    experts: int  # all routed experts
    expert_one: int  # one routed expert
    expert_one_matmul: int
    shared_experts: int
    router: int
    norms: int
    extra: int
    extra_matmul: int

    @property
    def total(self) -> int:
        return (
            self.attention
            + self.ffn
            + self.experts
            + self.shared_experts
            + self.router
            + self.norms
            + self.extra
        )

    def active(self, top_k: int) -> int:
        return self.total - self.experts + top_k * self.expert_one


def _norm(width: int, bias: bool) -> int:
    return width * (2 if bias else 1)


def attention_parameters(
    att: StandardAttention | LatentAttention | LinearAttention, h: int
) -> tuple[int, int]:
    """(all parameters, matmul weights) of one attention block."""
    if isinstance(att, StandardAttention):
        q = att.num_heads * att.head_dim
        kv = att.num_kv_heads * att.head_dim
        q_out = 2 * q if att.output_gate else q
        matmul = h * q_out + 2 * h * kv + q * h
        total = matmul
        if att.qkv_bias:
            total += q_out + 2 * kv
        if att.out_bias:
            total += h
        if att.qk_norm:
            total += 2 * att.head_dim
        if att.sinks:
            total += att.num_heads
        return total, matmul
    if isinstance(att, LatentAttention):
        a = att.num_heads
        qk_head = att.qk_nope_head_dim + att.qk_rope_head_dim
        if att.q_lora_rank:
            q_matmul = h * att.q_lora_rank + att.q_lora_rank * a * qk_head
            q_norm = att.q_lora_rank
        else:
            q_matmul, q_norm = h * a * qk_head, 0
        kv_matmul = h * (att.kv_lora_rank + att.qk_rope_head_dim) + att.kv_lora_rank * a * (
            att.qk_nope_head_dim + att.v_head_dim
        )
        out = a * att.v_head_dim * h
        matmul = q_matmul + kv_matmul + out
        return matmul + q_norm + att.kv_lora_rank, matmul
    # Gated delta net: in_proj_qkvz, in_proj_ba, depthwise conv over q/k/v channels,
    # per-head dt_bias and A_log, a gated RMSNorm over the value head width, out_proj.
    key = att.num_key_heads * att.key_head_dim
    value = att.num_value_heads * att.value_head_dim
    matmul = h * (2 * key + 2 * value) + h * 2 * att.num_value_heads + value * h
    conv = (2 * key + value) * att.conv_kernel_dim
    total = matmul + conv + 2 * att.num_value_heads + att.value_head_dim
    return total, matmul


def _mlp(h: int, width: int, gated: bool, bias: bool) -> tuple[int, int]:
    matrices = 3 if gated else 2
    matmul = matrices * h * width
    biases = ((2 if gated else 1) * width + h) if bias else 0
    return matmul + biases, matmul


def kind_parameters(kind: LayerKind, h: int) -> KindParameters:
    """Parameters of one layer of ``kind`` by part."""
    att, att_matmul = attention_parameters(kind.attention, h)
    norms = kind.norms_per_layer * _norm(h, kind.norm_bias)
    ffn = experts = expert_one = expert_one_matmul = shared = router = 0
    if isinstance(kind.ffn, DenseFFN):
        ffn, _ = _mlp(h, kind.ffn.intermediate_size, kind.ffn.gated, kind.ffn.bias)
    else:
        moe: MoEFFN = kind.ffn
        expert_one, expert_one_matmul = _mlp(
            h, moe.expert_intermediate_size, moe.gated, moe.expert_bias
        )
        experts = moe.num_experts * expert_one
        if moe.shared_intermediate_size:
            shared, _ = _mlp(h, moe.shared_intermediate_size, moe.gated, False)
            if moe.shared_expert_gate:
                shared += h
        router = h * moe.num_experts + (moe.num_experts if moe.router_bias else 0)
    return KindParameters(
        attention=att,
        attention_matmul=att_matmul,
        ffn=ffn,
        experts=experts,
        expert_one=expert_one,
        expert_one_matmul=expert_one_matmul,
        shared_experts=shared,
        router=router,
        norms=norms,
        extra=kind.extra_parameters,
        extra_matmul=kind.extra_matmul_parameters,
    )


class ParameterCount(Frozen):
    """Exact parameter counts of a model, by part (MTP reported beside the total)."""

    parts: dict[str, int]
    """Part name → parameters: embedding, position_embedding, attention, ffn, experts,
    shared_experts, router, norms, output_head, vision."""
    total_parameters: int
    """Sum of ``parts`` (MTP module excluded)."""
    active_parameters: int
    """Parameters touched per token: routed experts counted at top-k."""
    mtp_parameters: int
    """The multi-token-prediction module (embedding and head shared, not counted)."""


def count_parameters(model: ModelSpec) -> ParameterCount:
    """Exact counts from shapes; embedding and output head included."""
    h, v = model.hidden_size, model.vocab_size
    parts = dict.fromkeys(
        (
            "embedding",
            "position_embedding",
            "attention",
            "ffn",
            "experts",
            "shared_experts",
            "router",
            "norms",
            "extra",
            "output_head",
            "vision",
        ),
        0,
    )
    active = 0
    parts["embedding"] = v * h
    if model.position_embedding == "learned":
        parts["position_embedding"] = (model.max_position_embeddings or 0) * h
    parts["output_head"] = 0 if model.tie_word_embeddings else v * h
    parts["norms"] += _norm(h, model.final_norm_bias)
    for kind, count in model.kind_counts():
        p = kind_parameters(kind, h)
        parts["attention"] += count * p.attention
        parts["ffn"] += count * p.ffn
        parts["experts"] += count * p.experts
        parts["shared_experts"] += count * p.shared_experts
        parts["router"] += count * p.router
        parts["norms"] += count * p.norms
        parts["extra"] += count * p.extra
        top_k = kind.ffn.top_k if isinstance(kind.ffn, MoEFFN) else 0
        active += count * p.active(top_k)
    if model.vision is not None:
        parts["vision"] = model.vision.parameters
    fixed = (
        parts["embedding"]
        + parts["position_embedding"]
        + parts["output_head"]
        + _norm(h, model.final_norm_bias)
        + parts["vision"]
    )
    mtp = 0
    if model.mtp_kind is not None:
        mtp = model.num_mtp_layers * kind_parameters(model.mtp_kind, h).total
    parts = {k: val for k, val in parts.items() if val or k in ("embedding", "attention", "norms")}
    return ParameterCount(
        parts=parts,
        total_parameters=sum(parts.values()),
        active_parameters=active + fixed,
        mtp_parameters=mtp,
    )


# ----------------------------------------------------------------------------- FLOPs


def attended_keys(seq_len: int, window: int | None, convention: AttentionConvention) -> float:
    """Average keys each query attends to.

    Causal masking halves the full count: ``s/2`` (Megatron's convention, used so our
    totals match its closed form exactly). A sliding window of ``w < s`` attends
    ``w − w²/(2s)`` on average under causal masking (the first ``w`` queries see fewer).
    """
    if window is None or window >= seq_len:
        return seq_len / 2 if convention == "causal" else float(seq_len)
    if convention == "causal":
        return window - window * window / (2 * seq_len)
    return float(window)


@dataclass(frozen=True, slots=True)
class KindFlops:
    """Forward FLOPs per token of one layer of a kind, by part."""

    attention_projections: float
    core_attention: float
    ffn: float  # dense FFN, or the top-k routed experts
    shared_experts: float
    router: float
    extra: float

    @property
    def total(self) -> float:
        return (
            self.attention_projections
            + self.core_attention
            + self.ffn
            + self.shared_experts
            + self.router
            + self.extra
        )


def core_attention_flops(att, seq_len: int, convention: AttentionConvention) -> float:
    """Forward FLOPs per token of scores and the weighted sum (or the linear-attention state)."""
    if isinstance(att, StandardAttention):
        keys = attended_keys(seq_len, att.sliding_window, convention)
        return 2 * keys * att.num_heads * att.head_dim * 2
    if isinstance(att, LatentAttention):
        keys = attended_keys(seq_len, None, convention)
        d_qk = att.qk_nope_head_dim + att.qk_rope_head_dim
        return 2 * keys * att.num_heads * (d_qk + att.v_head_dim)
    # Delta rule per value head: state update and read-out (2·d_k·d_v each), plus
    # the chunked kernel's causal intra-chunk q·kᵀ and weighted sum (C·(d_k + d_v)).
    per_head = 4 * att.key_head_dim * att.value_head_dim
    per_head += att.chunk_size * (att.key_head_dim + att.value_head_dim)
    return float(per_head * att.num_value_heads)


def kind_flops(
    kind: LayerKind, h: int, seq_len: int, convention: AttentionConvention = "causal"
) -> KindFlops:
    """Forward FLOPs per token of one layer (2 × the matmul weights a token touches)."""
    p = kind_parameters(kind, h)
    ffn = shared = router = 0.0
    if isinstance(kind.ffn, DenseFFN):
        ffn = 2.0 * (3 if kind.ffn.gated else 2) * h * kind.ffn.intermediate_size
    else:
        moe = kind.ffn
        ffn = 2.0 * moe.top_k * p.expert_one_matmul
        if moe.shared_intermediate_size:
            shared = 2.0 * (3 if moe.gated else 2) * h * moe.shared_intermediate_size
            if moe.shared_expert_gate:
                shared += 2.0 * h
        router = 2.0 * h * moe.num_experts
    return KindFlops(
        attention_projections=2.0 * p.attention_matmul,
        core_attention=core_attention_flops(kind.attention, seq_len, convention),
        ffn=ffn,
        shared_experts=shared,
        router=router,
        extra=2.0 * p.extra_matmul,
    )


class FlopCount(Frozen):
    """FLOPs per token of a model at one sequence length."""

    seq_len: int
    attention: AttentionConvention
    forward_parts: dict[str, float]
    """Forward FLOPs per token by part (attention_projections, core_attention, ffn,
    shared_experts, router, logits, extra)."""
    forward_flops_per_token: float
    training_flops_per_token: float
    """Model FLOPs: 3 × forward, no recompute (what MFU counts)."""
    mtp_forward_flops_per_token: float
    """The MTP module's forward FLOPs per token (reported apart; its logits included)."""


def count_flops(
    model: ModelSpec, seq_len: int, attention: AttentionConvention = "causal"
) -> FlopCount:
    """Forward and training FLOPs per token (decoder and logits; MTP reported apart)."""
    h = model.hidden_size
    parts = dict.fromkeys(
        (
            "attention_projections",
            "core_attention",
            "ffn",
            "shared_experts",
            "router",
            "extra",
            "logits",
        ),
        0.0,
    )
    for kind, count in model.kind_counts():
        f = kind_flops(kind, h, seq_len, attention)
        parts["attention_projections"] += count * f.attention_projections
        parts["core_attention"] += count * f.core_attention
        parts["ffn"] += count * f.ffn
        parts["shared_experts"] += count * f.shared_experts
        parts["router"] += count * f.router
        parts["extra"] += count * f.extra
    parts["logits"] = 2.0 * h * model.vocab_size
    forward = sum(parts.values())
    mtp = 0.0
    if model.mtp_kind is not None and model.num_mtp_layers:
        mtp = model.num_mtp_layers * (
            kind_flops(model.mtp_kind, h, seq_len, attention).total + 2.0 * h * model.vocab_size
        )
    return FlopCount(
        seq_len=seq_len,
        attention=attention,
        forward_parts=parts,
        forward_flops_per_token=forward,
        training_flops_per_token=3.0 * forward,
        mtp_forward_flops_per_token=mtp,
    )


def model_flops_per_step(model: ModelSpec, tokens_per_step: int, attention_span: int) -> float:
    """The FLOPs MFU counts for one optimizer step: 3 × forward of the decoder, logits and
    MTP modules, no recompute, attention over ``attention_span`` keys (the packed
    document when sequences pack several)."""
    f = count_flops(model, attention_span)
    return tokens_per_step * (f.training_flops_per_token + 3 * f.mtp_forward_flops_per_token)


def megatron_closed_form_flops(model: ModelSpec, global_batch: int, seq_len: int) -> float:
    """Megatron-LM's closed form FLOPs per iteration (training.py, causal attention).

    ``F = 6·T·[h·c·(f·L_d + (f_e·k + f_s)·L_m) + L·(h·(q + 2·g·d_h) + q·h) + h·V]
    + 6·gbs·s²·q·L`` with ``T = gbs·s``. Defined only for standard attention; norms,
    routers and element-wise ops are left out, as in the original.
    """
    h, v = model.hidden_size, model.vocab_size
    tokens = global_batch * seq_len
    per_token = 0.0
    attention_quadratic = 0.0
    for kind, count in model.kind_counts():
        att = kind.attention
        if not isinstance(att, StandardAttention):
            raise ValueError("the closed form covers standard attention only")
        q = att.num_heads * att.head_dim
        per_token += count * (h * (q + 2 * att.num_kv_heads * att.head_dim) + q * h)
        attention_quadratic += count * q
        if isinstance(kind.ffn, DenseFFN):
            c = 3 if kind.ffn.gated else 2
            per_token += count * h * c * kind.ffn.intermediate_size
        else:
            c = 3 if kind.ffn.gated else 2
            per_token += (
                count
                * h
                * c
                * (
                    kind.ffn.expert_intermediate_size * kind.ffn.top_k
                    + kind.ffn.shared_intermediate_size
                )
            )
    per_token += h * v
    return 6.0 * tokens * per_token + 6.0 * global_batch * seq_len * seq_len * attention_quadratic
