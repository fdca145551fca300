"""Properties of the parameter and FLOP counts on random valid shapes (hypothesis).

Shapes cover dense MHA/GQA (with biases, qk-norm, sliding windows, output gates),
MoE with shared experts, MLA with and without a query latent, gated delta-net
layers, MTP, learned positions, tied heads and vision towers. On every model:
counts are non-negative integers whose parts sum to the total, active ≤ total,
FLOPs are non-negative and monotone in the sequence length, and the counts do not
depend on the parallel layout — the memory model's per-device parameters, summed
back over TP, EP and the pipeline stages, give the total again.
"""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ndplan.adapters.devices.catalog import builtin_devices
from ndplan.core.cluster import Cluster
from ndplan.core.context import PricingContext, place_layers
from ndplan.core.counting import count_flops, count_parameters, kind_parameters
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.memory import NdplanMemoryModel, padded_vocab
from ndplan.core.model import (
    DenseFFN,
    LatentAttention,
    LayerKind,
    LinearAttention,
    ModelSpec,
    MoEFFN,
    StandardAttention,
    VisionTower,
)

FAST = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
DEVICE = builtin_devices()[0]


@st.composite
def attention_st(draw, h: int):
    kind = draw(st.sampled_from(["standard", "standard", "mla", "linear"]))
    if kind == "standard":
        kv = draw(st.sampled_from([1, 2, 4, 8]))
        heads = kv * draw(st.integers(1, 4))
        return StandardAttention(
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=draw(st.sampled_from([16, 32, 64, 128])),
            qkv_bias=draw(st.booleans()),
            out_bias=draw(st.booleans()),
            qk_norm=draw(st.booleans()),
            output_gate=draw(st.booleans()),
            sinks=draw(st.booleans()),
            sliding_window=draw(st.none() | st.integers(1, 4096)),
        )
    if kind == "mla":
        return LatentAttention(
            num_heads=draw(st.integers(1, 16)),
            q_lora_rank=draw(st.none() | st.integers(8, 512)),
            kv_lora_rank=draw(st.integers(8, 512)),
            qk_nope_head_dim=draw(st.sampled_from([16, 32, 64, 128])),
            qk_rope_head_dim=draw(st.sampled_from([16, 32, 64])),
            v_head_dim=draw(st.sampled_from([16, 32, 64, 128])),
        )
    return LinearAttention(
        num_key_heads=draw(st.integers(1, 8)),
        key_head_dim=draw(st.sampled_from([32, 64, 128])),
        num_value_heads=draw(st.integers(1, 16)),
        value_head_dim=draw(st.sampled_from([32, 64, 128])),
        conv_kernel_dim=draw(st.integers(1, 4)),
    )


@st.composite
def ffn_st(draw, h: int):
    gated = draw(st.booleans())
    if draw(st.booleans()):
        return DenseFFN(
            intermediate_size=draw(st.integers(1, 4 * h)), gated=gated, bias=draw(st.booleans())
        )
    experts = draw(st.sampled_from([1, 2, 4, 8, 16, 64]))
    shared_count = draw(st.integers(0, 2))
    width = draw(st.integers(1, 2 * h))
    shared_width = shared_count * width if draw(st.booleans()) else draw(st.integers(0, 4 * h))
    return MoEFFN(
        num_experts=experts,
        top_k=draw(st.integers(1, experts)),
        expert_intermediate_size=width,
        gated=gated,
        expert_bias=draw(st.booleans()),
        num_shared_experts=shared_count if shared_width else 0,
        shared_intermediate_size=shared_width,
        shared_expert_gate=bool(shared_width) and draw(st.booleans()),
        router_bias=draw(st.booleans()),
    )


@st.composite
def model_st(draw) -> ModelSpec:
    h = draw(st.sampled_from([64, 128, 256, 384, 512, 1024]))
    norm = draw(st.sampled_from(["rmsnorm", "layernorm"]))
    norm_bias = norm == "layernorm" and draw(st.booleans())
    kinds = []
    for i in range(draw(st.integers(1, 3))):
        kinds.append(
            LayerKind(
                name=f"k{i}",
                attention=draw(attention_st(h)),
                ffn=draw(ffn_st(h)),
                norm=norm,
                norm_bias=norm_bias,
                norms_per_layer=draw(st.sampled_from([2, 4])),
            )
        )
    extra_layers = draw(st.lists(st.integers(0, len(kinds) - 1), max_size=14))
    layers = draw(st.permutations(list(range(len(kinds))) + extra_layers))
    mtp = draw(st.integers(0, 2))
    mtp_kind = None
    if mtp:  # DeepSeek-V3's MTP: the last layer's shape + eh_proj (2h → h) and three norms
        mtp_kind = kinds[layers[-1]].model_copy(
            update={
                "name": "mtp",
                "extra_parameters": 3 * h + 2 * h * h,
                "extra_matmul_parameters": 2 * h * h,
            }
        )
    learned = draw(st.booleans())
    vision = None
    if draw(st.booleans()):
        vision = VisionTower(
            num_layers=2, hidden_size=64, intermediate_size=256, num_heads=4,
            parameters=draw(st.integers(0, 10**7)),
        )  # fmt: skip
    return ModelSpec(
        name="random",
        hidden_size=h,
        vocab_size=draw(st.integers(1, 70_000)),
        kinds=tuple(kinds),
        layers=tuple(layers),
        num_mtp_layers=mtp,
        mtp_kind=mtp_kind,
        tie_word_embeddings=draw(st.booleans()),
        position_embedding="learned" if learned else "rope",
        max_position_embeddings=draw(st.integers(1, 8192)) if learned else None,
        final_norm=norm,
        final_norm_bias=norm_bias,
        vision=vision,
    )


# ----------------------------------------------------------------------------- counts


@FAST
@given(model_st())
def test_counts_are_nonnegative_integers_that_sum(model: ModelSpec) -> None:
    count = count_parameters(model)
    assert all(isinstance(v, int) and v >= 0 for v in count.parts.values())
    assert isinstance(count.total_parameters, int)
    assert sum(count.parts.values()) == count.total_parameters
    assert 0 < count.active_parameters <= count.total_parameters
    # Only routed experts can be inactive.
    assert count.total_parameters - count.active_parameters <= count.parts.get("experts", 0)
    assert count.mtp_parameters >= 0
    assert (count.mtp_parameters > 0) == (model.num_mtp_layers > 0)
    if not model.is_moe:
        assert count.active_parameters == count.total_parameters
    h, v = model.hidden_size, model.vocab_size
    assert count.parts["embedding"] == v * h
    assert count.parts.get("output_head", 0) == (0 if model.tie_word_embeddings else v * h)


@FAST
@given(model_st(), st.integers(1, 16384), st.integers(1, 16384))
def test_flops_nonnegative_and_monotone_in_sequence_length(
    model: ModelSpec, s1: int, s2: int
) -> None:
    short, long = sorted((s1, s2))
    for convention in ("causal", "full"):
        a = count_flops(model, short, convention)
        b = count_flops(model, long, convention)
        assert all(v >= 0 for v in a.forward_parts.values())
        assert a.forward_flops_per_token <= b.forward_flops_per_token
        assert a.training_flops_per_token == 3 * a.forward_flops_per_token
        assert a.mtp_forward_flops_per_token <= b.mtp_forward_flops_per_token
        # Only core attention depends on the sequence length.
        for part in a.forward_parts:
            if part != "core_attention":
                assert a.forward_parts[part] == b.forward_parts[part]
    causal, full = count_flops(model, long), count_flops(model, long, "full")
    assert causal.forward_flops_per_token <= full.forward_flops_per_token


@FAST
@given(model_st(), st.integers(1, 8192))
def test_forward_flops_are_twice_the_touched_matmul_weights_plus_attention(
    model: ModelSpec, seq: int
) -> None:
    """Forward FLOPs ≥ 2 × (logits weights) and core attention is the only part that
    is not twice a whole number of weights."""
    flops = count_flops(model, seq)
    assert flops.forward_parts["logits"] == 2 * model.hidden_size * model.vocab_size
    for part, value in flops.forward_parts.items():
        if part != "core_attention":
            assert value % 2 == 0


# ----------------------------------------------------------------------------- layouts


def _replicated(kind: LayerKind, h: int) -> int:
    """Parameters of one layer that TP does not split: norms, the router, MLA's
    down-projections and latent norms (spec/memory.md)."""
    n = kind.norms_per_layer * h * (2 if kind.norm_bias else 1)
    if isinstance(kind.ffn, MoEFFN):
        n += h * kind.ffn.num_experts + (kind.ffn.num_experts if kind.ffn.router_bias else 0)
    att = kind.attention
    if isinstance(att, LatentAttention):
        rq = att.q_lora_rank or 0
        n += h * (rq + att.kv_lora_rank + att.qk_rope_head_dim) + rq + att.kv_lora_rank
    return n


@st.composite
def layout_st(draw, model: ModelSpec) -> Layout:
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    pp = draw(st.integers(1, min(4, model.num_layers)))
    schedule = "1f1b"
    vpp = 1
    if pp > 1:
        schedule = draw(st.sampled_from(["1f1b", "gpipe", "interleaved", "dualpipev"]))
        if schedule == "interleaved":
            vpp = draw(st.integers(2, 3))
    ep = etp = 1
    if model.is_moe:
        experts = min(k.ffn.num_experts for k in model.kinds if isinstance(k.ffn, MoEFFN))
        ep = draw(st.sampled_from([d for d in (1, 2, 4, 8) if experts % d == 0]))
        etp = draw(st.sampled_from([1, tp]))
    return Layout(
        tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp, schedule=schedule,
        num_microbatches=draw(st.integers(1, 8)),
    )  # fmt: skip


@FAST
@given(st.data())
def test_stage_parameters_summed_over_ranks_reconstruct_the_total(data) -> None:
    """Per stage, a device holds split/t + replicated dense parameters and E/(ep·etp) of
    the experts. Undo that (× t on the split part, × ep·etp on experts), sum over
    stages, and the total comes back — up to the embedding tables the placement adds
    (vocab padded to 128·t; a tied head on another stage keeps its own copy; the MTP
    layer embeds again on the last stage) and the MTP module, which the total excludes.
    """
    model = data.draw(model_st())
    layout = data.draw(layout_st(model))
    assume(layout.chunks <= model.num_layers)
    h, v, t = model.hidden_size, model.vocab_size, layout.tp
    ctx = PricingContext(
        model=model,
        cluster=Cluster(device=DEVICE, num_devices=layout.devices),
        job=Job(global_batch_size=layout.num_microbatches, seq_length=256),
    )
    memory = NdplanMemoryModel()
    stages = place_layers(model, layout)
    assert sorted(i for s in stages for i in s.layers) == list(range(model.num_layers))

    rebuilt = 0.0
    tables = 0
    final_norm = h * (2 if model.final_norm_bias else 1)
    for stage in stages:
        dense, experts, _ = memory.stage_parameters(ctx, layout, stage)
        replicated = sum(n * _replicated(model.kinds[k], h) for k, n, _ in stage.groups)
        if stage.has_embedding:
            tables += 1
            if model.position_embedding == "learned":
                replicated += (model.max_position_embeddings or 0) * h
        if stage.has_head:
            replicated += final_norm
            tables += not (model.tie_word_embeddings and stage.has_embedding)
            if stage.has_mtp:
                replicated += model.num_mtp_layers * _replicated(model.mtp_kind, h)
                tables += not stage.has_embedding
        rebuilt += (dense - replicated) * t + replicated + experts * layout.ep * layout.expert_tp

    count = count_parameters(model)
    counted_tables = 1 if model.tie_word_embeddings else 2
    expected = (
        count.total_parameters
        - counted_tables * v * h
        + tables * padded_vocab(v, t) * h
        + count.mtp_parameters
    )
    assert round(rebuilt) == expected
    assert abs(rebuilt - expected) < 1e-6 * max(1, expected)


@FAST
@given(st.data())
def test_one_device_holds_everything_at_tp1_pp1(data) -> None:
    """At tp = pp = ep = 1 the single stage holds exactly the counted total (+ MTP, + the
    vocab padding to 128)."""
    model = data.draw(model_st())
    layout = Layout()
    ctx = PricingContext(
        model=model,
        cluster=Cluster(device=DEVICE, num_devices=1),
        job=Job(global_batch_size=1, seq_length=256),
    )
    (stage,) = place_layers(model, layout)
    dense, experts, _ = NdplanMemoryModel().stage_parameters(ctx, layout, stage)
    count = count_parameters(model)
    tables = 1 if model.tie_word_embeddings else 2
    padding = tables * (padded_vocab(model.vocab_size, 1) - model.vocab_size) * model.hidden_size
    assert dense + experts == count.total_parameters + count.mtp_parameters + padding
    mtp_experts = 0
    if model.mtp_kind is not None:
        mtp_experts = (
            model.num_mtp_layers * kind_parameters(model.mtp_kind, model.hidden_size).experts
        )
    assert experts == count.parts.get("experts", 0) + mtp_experts
