"""How a model is described: a sequence of layer kinds with shapes (spec/model.md).

A model never needs weights, only shapes. A *layer kind* is a class of identical
decoder layers (attention variant + FFN variant + norms); it is the unit the memory
model, the cost model and the recompute solver work on.
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import Field, model_validator

from .base import Frozen, NonNegativeInt, PositiveInt

NormType = Literal["rmsnorm", "layernorm"]


class StandardAttention(Frozen):
    """Multi-head / grouped-query / multi-query attention (optionally sliding-window)."""

    kind: Literal["standard"] = "standard"
    num_heads: PositiveInt
    """Query heads `a`."""
    num_kv_heads: PositiveInt
    """Key/value heads `g` (= a for MHA, 1 for MQA)."""
    head_dim: PositiveInt
    """Per-head width `d_h` (often stated; h/a otherwise)."""
    qkv_bias: bool = False
    """Biases on the q/k/v projections (Qwen2, GPT)."""
    out_bias: bool = False
    """Bias on the output projection."""
    qk_norm: bool = False
    """Per-head RMSNorm of q and k (Qwen3)."""
    output_gate: bool = False
    """The query projection also produces a sigmoid gate on the output (Qwen3-Next)."""
    sinks: bool = False
    """One learned attention-sink logit per head (gpt-oss)."""
    sliding_window: PositiveInt | None = None
    """Keys attended per query when the layer uses a sliding window; None for full attention."""

    @model_validator(mode="after")
    def _groups_divide_heads(self) -> StandardAttention:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads({self.num_heads}) is not a multiple of "
                f"num_key_value_heads({self.num_kv_heads})"
            )
        return self


class LatentAttention(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    kind: Literal["mla"] = "mla"
    num_heads: PositiveInt
    q_lora_rank: PositiveInt | None
    """Query latent rank; None projects queries directly from the hidden state."""
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt
    v_head_dim: PositiveInt


class LinearAttention(Frozen):
    """Gated delta-net linear attention (Qwen3-Next 'linear_attention' layers)."""

    kind: Literal["linear"] = "linear"
    num_key_heads: PositiveInt
    key_head_dim: PositiveInt
    num_value_heads: PositiveInt
    value_head_dim: PositiveInt
    conv_kernel_dim: PositiveInt
    chunk_size: PositiveInt = 64
    """Chunk length of the chunked delta-rule kernel (sets its intra-chunk FLOPs)."""


Attention = Annotated[
    StandardAttention | LatentAttention | LinearAttention, Field(discriminator="kind")
]


class DenseFFN(Frozen):
    """A dense MLP: gated (SwiGLU/GeGLU, 3 matrices) or not (GELU, 2 matrices)."""

    kind: Literal["dense"] = "dense"
    intermediate_size: PositiveInt
    gated: bool = True
    activation: str = "silu"
    bias: bool = False


class MoEFFN(Frozen):
    """A mixture-of-experts FFN: routed experts, optional shared experts, a router."""

    kind: Literal["moe"] = "moe"
    num_experts: PositiveInt
    top_k: PositiveInt
    expert_intermediate_size: PositiveInt
    gated: bool = True
    activation: str = "silu"
    expert_bias: bool = False
    """Biases inside each expert (gpt-oss)."""
    num_shared_experts: NonNegativeInt = 0
    """How many shared experts (DeepSeek states a count)."""
    shared_intermediate_size: NonNegativeInt = 0
    """Total width of the shared experts (Qwen2-MoE states one wide shared expert)."""
    shared_expert_gate: bool = False
    """A scalar sigmoid gate on the shared expert output (Qwen2-MoE, Qwen3-Next)."""
    router_bias: bool = False
    routing_groups: PositiveInt = 1
    """Contiguous expert groups of group-limited routing (DeepSeek's n_group; 1: none)."""
    routing_groups_per_token: PositiveInt | None = None
    """How many groups a token's experts may come from (DeepSeek's topk_group; None: all)."""

    @model_validator(mode="after")
    def _routing_fits_the_experts(self) -> MoEFFN:
        if self.top_k > self.num_experts:
            raise ValueError(
                f"num_experts_per_tok({self.top_k}) exceeds num_experts({self.num_experts})"
            )
        groups, per_token = self.routing_group_limit
        if self.num_experts % groups:
            raise ValueError(f"n_group({groups}) must divide num_experts({self.num_experts})")
        if per_token > groups:
            raise ValueError(f"topk_group({per_token}) exceeds n_group({groups})")
        if self.top_k > per_token * self.num_experts // groups:
            raise ValueError(
                f"num_experts_per_tok({self.top_k}) exceeds the experts of topk_group"
                f"({per_token}) of n_group({groups}) groups"
            )
        return self

    @property
    def routing_group_limit(self) -> tuple[int, int]:
        """(groups, groups a token may use); (1, 1) when routing is not group-limited."""
        per_token = self.routing_groups_per_token
        return self.routing_groups, self.routing_groups if per_token is None else per_token


FFN = Annotated[DenseFFN | MoEFFN, Field(discriminator="kind")]


class LayerKind(Frozen):
    """A class of identical layers: the unit of memory, time and recompute decisions."""

    name: str
    """Short unique name within the model, e.g. 'attn+dense', 'mla+moe', 'linear+moe', 'mtp'."""
    attention: Attention
    ffn: FFN
    norm: NormType = "rmsnorm"
    norm_bias: bool = False
    """LayerNorm with a bias (GPT-style)."""
    norms_per_layer: PositiveInt = 2
    """Hidden-width norms in the layer (2: pre-attention, pre-FFN; Gemma-2/3 use 4)."""
    extra_parameters: NonNegativeInt = 0
    """Parameters outside attention/FFN/norms, e.g. an MTP layer's projection and norms."""
    extra_matmul_parameters: NonNegativeInt = 0
    """The part of ``extra_parameters`` that is matrix weights (counted in FLOPs)."""

    @property
    def is_moe(self) -> bool:
        return isinstance(self.ffn, MoEFFN)


class VisionTower(Frozen):
    """The vision encoder of a vision-language model, planned as one block on the first stage."""

    num_layers: PositiveInt
    hidden_size: PositiveInt
    intermediate_size: PositiveInt
    num_heads: PositiveInt
    parameters: NonNegativeInt
    """Parameter count of the tower (encoder, patch embedding and projector)."""


class ModelSpec(Frozen):
    """A model as ndplan sees it: shapes only, layer kinds in model order."""

    name: str
    model_type: str = "unknown"
    hidden_size: PositiveInt
    """Model width `h`."""
    vocab_size: PositiveInt
    """Vocabulary `V` (unpadded)."""
    kinds: tuple[LayerKind, ...]
    """Distinct decoder layer kinds."""
    layers: tuple[NonNegativeInt, ...]
    """Kind index of every decoder layer, in model order (MTP layers excluded)."""
    num_mtp_layers: NonNegativeInt = 0
    """Multi-token-prediction layers (DeepSeek-V3), after the decoder, on the last stage."""
    mtp_kind: LayerKind | None = None
    tie_word_embeddings: bool = False
    position_embedding: Literal["rope", "learned", "alibi", "none"] = "rope"
    max_position_embeddings: PositiveInt | None = None
    final_norm: NormType = "rmsnorm"
    final_norm_bias: bool = False
    vision: VisionTower | None = None
    source: str = ""
    """Where the shapes came from (a preset, a file path)."""

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if not self.layers:
            raise ValueError("the model has no decoder layers")
        if max(self.layers) >= len(self.kinds):
            raise ValueError(f"layer kind index {max(self.layers)} out of range")
        unused = set(range(len(self.kinds))) - set(self.layers)
        if unused:
            raise ValueError(f"layer kinds never used: {sorted(unused)}")
        names = [k.name for k in self.kinds]
        if len(set(names)) != len(names):
            raise ValueError(f"layer kind names repeat: {names}")
        if self.num_mtp_layers and self.mtp_kind is None:
            raise ValueError("num_mtp_layers > 0 needs an mtp_kind")
        return self

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def kind_counts(self) -> tuple[tuple[LayerKind, int], ...]:
        """Each kind with how many decoder layers use it, in kind order."""
        counts = Counter(self.layers)
        return tuple((kind, counts[i]) for i, kind in enumerate(self.kinds))

    @property
    def is_moe(self) -> bool:
        return any(k.is_moe for k in self.kinds)

    @property
    def head_count_for_tp(self) -> tuple[int, int]:
        """(query heads, kv heads) that TP must divide, the strictest over kinds."""
        heads, kv = [], []
        for kind in self.kinds:
            att = kind.attention
            if isinstance(att, StandardAttention):
                heads.append(att.num_heads)
                kv.append(att.num_kv_heads)
            elif isinstance(att, LatentAttention):
                heads.append(att.num_heads)
            else:
                heads.append(att.num_value_heads)
                kv.append(att.num_key_heads)
        return (min(heads), min(kv) if kv else min(heads))
