"""The per-device memory model (spec/memory.md, issue 4): anchors and rules, case by case.

- Korthikanti et al. 2022's per-layer activation anchors come out exactly (GPT, 4h GELU
  MLP, MHA, eager attention, dropout on), and the flash kernel drops the ``5as/h`` term.
- Adam under Megatron: 18 B/param without a distributed optimizer, ``6 + 12/(dp·cp)``
  with one; expert state shards over ``dp·cp·tp/(ep·etp)``; FSDP (torchtitan) keeps
  16 B/param over the shard group.
- Schedules' in-flight counts, where embedding and head sit, the tied-embedding rule,
  optimizer offload and fp8 weight copies.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from ndplan.adapters.readers.hf import read_hf_config
from ndplan.core.context import (
    PricingContext,
    default_split,
    even_split,
    interleaved_in_flight,
    place_layers,
)
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.memory import LOW_PRECISION_WEIGHT_BYTES, NdplanMemoryModel, padded_vocab
from ndplan.core.model import ModelSpec
from ndplan.planner import Planner

STATE_PARTS = ("weights", "gradients", "optimizer")


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def gpt(h: int, a: int, s: int, layers: int = 4) -> ModelSpec:
    """Korthikanti's GPT: 4h GELU MLP with biases, LayerNorm, MHA, learned positions."""
    return read_hf_config(
        {
            "model_type": "gpt",
            "hidden_size": h,
            "num_hidden_layers": layers,
            "num_attention_heads": a,
            "vocab_size": 51200,
            "max_position_embeddings": s,
        }
    )


def llama(*, tie: bool = False, layers: int = 8, vocab: int = 32000) -> ModelSpec:
    return read_hf_config(
        {
            "model_type": "llama",
            "hidden_size": 1024,
            "num_hidden_layers": layers,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "intermediate_size": 2816,
            "vocab_size": vocab,
            "tie_word_embeddings": tie,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
        }
    )


def mixtral(layers: int = 8) -> ModelSpec:
    return read_hf_config(
        {
            "model_type": "mixtral",
            "hidden_size": 1024,
            "num_hidden_layers": layers,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "intermediate_size": 2048,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "vocab_size": 32000,
            "tie_word_embeddings": False,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
        }
    )


def make_ctx(planner: Planner, model: ModelSpec, layout: Layout, **job) -> PricingContext:
    job.setdefault("global_batch_size", layout.dp * layout.mbs * layout.num_microbatches)
    job.setdefault("seq_length", 4096)
    return planner.context(model, planner.device("h100-sxm"), layout.devices, Job(**job))


def static_parts(ctx: PricingContext, layout: Layout) -> list[dict[str, int]]:
    mm = NdplanMemoryModel()
    return [mm.stage_static_bytes(ctx, layout, s) for s in ctx.placement(layout)]


def state_bytes(parts: dict[str, int]) -> int:
    return sum(parts.get(k, 0) for k in STATE_PARTS)


# ----------------------------------------------------------------------------- Korthikanti

KORTHIKANTI = [
    # (h, a, s, b, t)
    (12288, 96, 2048, 1, 8),  # GPT-3 175B, the paper's own
    (6144, 48, 2048, 1, 4),  # the 22B model
    (4096, 32, 2048, 2, 2),
    (2048, 16, 1024, 4, 8),
    (8192, 64, 4096, 1, 4),
]


def _layer_bytes(planner: Planner, h, a, s, b, t, *, sp: bool, **job) -> tuple[int, int, int]:
    model = gpt(h, a, s)
    layout = Layout(tp=t, mbs=b, sp=sp)
    ctx = make_ctx(
        planner, model, layout, global_batch_size=b, seq_length=s, framework="megatron", **job
    )
    mm = NdplanMemoryModel()
    kind = model.kinds[0]
    none = mm.layer_activation_bytes(ctx, layout, kind, frozenset())
    selective = mm.layer_activation_bytes(ctx, layout, kind, ctx.framework.selective)
    full = mm.layer_activation_bytes(ctx, layout, kind, None)
    return none, selective, full


def _exact(x: Fraction) -> int:
    assert x.denominator == 1, f"pick shapes where the anchor is an integer, got {x}"
    return int(x)


def test_the_korthikanti_model_is_the_papers_gpt() -> None:
    kind = gpt(4096, 32, 2048).kinds[0]
    assert kind.ffn.intermediate_size == 4 * 4096
    assert not kind.ffn.gated and kind.ffn.activation.startswith("gelu")
    assert kind.attention.num_kv_heads == kind.attention.num_heads == 32
    assert kind.norm == "layernorm"


@pytest.mark.parametrize(("h", "a", "s", "b", "t"), KORTHIKANTI)
def test_korthikanti_anchors_with_tp_and_sp(planner: Planner, h, a, s, b, t) -> None:
    none, selective, full = _layer_bytes(
        planner, h, a, s, b, t, sp=True, attention_kernel="eager", dropout=0.1
    )
    sbh = s * b * h
    assert none == _exact(sbh * (Fraction(34, t) + Fraction(5 * a * s, h * t)))
    assert selective == _exact(Fraction(34 * sbh, t))  # core attention recomputed
    assert full == _exact(Fraction(2 * sbh, t))  # only the layer input


@pytest.mark.parametrize(("h", "a", "s", "b", "t"), [*KORTHIKANTI, (4096, 32, 2048, 1, 1)])
def test_korthikanti_anchors_without_sp(planner: Planner, h, a, s, b, t) -> None:
    none, selective, full = _layer_bytes(
        planner, h, a, s, b, t, sp=False, attention_kernel="eager", dropout=0.1
    )
    sbh = s * b * h
    assert none == _exact(sbh * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t)))
    assert selective == _exact(sbh * (10 + Fraction(24, t)))
    assert full == 2 * sbh


@pytest.mark.parametrize(("h", "a", "s", "b", "t"), KORTHIKANTI)
def test_flash_attention_drops_the_5as_over_h_term(planner: Planner, h, a, s, b, t) -> None:
    """Flash saves only the softmax statistics, ``a·s·4`` bytes per sequence (per TP rank)."""
    none, _, full = _layer_bytes(
        planner, h, a, s, b, t, sp=True, attention_kernel="flash", dropout=0.1
    )
    assert none == _exact(Fraction(34 * s * b * h, t) + Fraction(4 * a * s * b, t))
    assert full == _exact(Fraction(2 * s * b * h, t))


# ----------------------------------------------------------------------------- Adam, ZeRO, FSDP


@pytest.mark.parametrize(
    ("tp", "pp", "cp", "dp"),
    [(1, 1, 1, 8), (2, 1, 1, 4), (2, 2, 1, 2), (1, 1, 2, 4), (4, 2, 2, 1), (1, 4, 1, 2)],
)
def test_adam_18_bytes_per_parameter_without_a_distributed_optimizer(
    planner: Planner, tp, pp, cp, dp
) -> None:
    model = llama()
    layout = Layout(tp=tp, pp=pp, cp=cp, dp=dp, zero=0, num_microbatches=4)
    ctx = make_ctx(planner, model, layout, framework="megatron", precision="bf16")
    assert ctx.settings.grad_reduce_dtype == "fp32"  # Megatron's fp32 main gradients
    mm = NdplanMemoryModel()
    for stage, parts in zip(ctx.placement(layout), static_parts(ctx, layout), strict=True):
        dense, expert, _ = mm.stage_parameters(ctx, layout, stage)
        params = dense + expert
        assert parts["weights"] == pytest.approx(2 * params, abs=1)
        assert parts["gradients"] == pytest.approx(4 * params, abs=1)
        assert parts["optimizer"] == pytest.approx(12 * params, abs=1)
        assert 0 <= state_bytes(parts) - 18 * params < 3  # each part rounds up to a byte


@pytest.mark.parametrize(
    ("tp", "pp", "cp", "dp"),
    [(1, 1, 1, 8), (2, 1, 1, 4), (2, 2, 1, 2), (1, 1, 2, 4), (1, 1, 4, 2), (2, 1, 2, 16)],
)
def test_adam_6_plus_12_over_dp_cp_with_a_distributed_optimizer(
    planner: Planner, tp, pp, cp, dp
) -> None:
    model = llama()
    layout = Layout(tp=tp, pp=pp, cp=cp, dp=dp, zero=1, num_microbatches=4)
    ctx = make_ctx(planner, model, layout, framework="megatron", precision="bf16")
    mm = NdplanMemoryModel()
    for stage, parts in zip(ctx.placement(layout), static_parts(ctx, layout), strict=True):
        dense, expert, _ = mm.stage_parameters(ctx, layout, stage)
        assert expert == 0
        per_param = Fraction(6) + Fraction(12, dp * cp)  # CP ranks hold identical weights
        assert 0 <= state_bytes(parts) - float(per_param * Fraction(dense)) < 3


@pytest.mark.parametrize(
    ("tp", "cp", "dp", "ep", "etp"),
    [(1, 1, 8, 8, None), (2, 1, 4, 4, None), (2, 1, 4, 8, 1), (1, 2, 4, 4, None), (2, 2, 2, 2, 2)],
)
def test_expert_state_shards_over_the_expert_data_parallel_group(
    planner: Planner, tp, cp, dp, ep, etp
) -> None:
    model = mixtral()
    layout = Layout(tp=tp, cp=cp, dp=dp, ep=ep, etp=etp, zero=1, num_microbatches=2)
    ctx = make_ctx(planner, model, layout, framework="megatron")
    expert_dp = dp * cp * tp // (ep * layout.expert_tp)
    assert layout.expert_data_parallel == expert_dp
    ((stage,), (parts,)) = ctx.placement(layout), static_parts(ctx, layout)
    dense, expert, _ = NdplanMemoryModel().stage_parameters(ctx, layout, stage)
    assert expert > 0 and dense > 0
    assert parts["weights"] == pytest.approx(2 * (dense + expert), abs=1)
    assert parts["gradients"] == pytest.approx(4 * (dense + expert), abs=1)
    assert parts["optimizer"] == pytest.approx(12 * (dense / (dp * cp) + expert / expert_dp), abs=1)


@pytest.mark.parametrize(("dp", "cp", "tp", "ep"), [(8, 1, 1, 1), (4, 2, 1, 1), (2, 2, 2, 1)])
def test_fsdp_keeps_16_bytes_per_parameter_sharded(planner: Planner, dp, cp, tp, ep) -> None:
    """torchtitan FSDP: fp32 sharded parameters (4) + fp32 grads (4) + Adam moments (8)."""
    model = llama()
    layout = Layout(dp=dp, cp=cp, tp=tp, ep=ep, zero=3, num_microbatches=1)
    ctx = make_ctx(planner, model, layout, framework="torchtitan")
    ((stage,), (parts,)) = ctx.placement(layout), static_parts(ctx, layout)
    dense, expert, _ = NdplanMemoryModel().stage_parameters(ctx, layout, stage)
    assert expert == 0
    shard = dp * cp
    assert parts["weights"] == pytest.approx(4 * dense / shard, abs=1)
    assert 0 <= state_bytes(parts) - 16 * dense / shard < 3
    assert parts["gathered_parameters"] > 0  # the bf16 working copies of gathered layers


def test_fsdp_shards_expert_state_over_the_expert_data_parallel_group(planner: Planner) -> None:
    model = mixtral()
    layout = Layout(dp=8, ep=4, zero=3, num_microbatches=1)
    ctx = make_ctx(planner, model, layout, framework="torchtitan")
    ((stage,), (parts,)) = ctx.placement(layout), static_parts(ctx, layout)
    dense, expert, _ = NdplanMemoryModel().stage_parameters(ctx, layout, stage)
    assert layout.expert_data_parallel == 2
    assert state_bytes(parts) == pytest.approx(16 * (dense / 8 + expert / 2), abs=3)


def test_offloaded_optimizer_state_is_zero_on_the_device(planner: Planner) -> None:
    model = llama()
    for framework, zero in (("megatron", 0), ("megatron", 1), ("torchtitan", 3)):
        kept = Layout(dp=4, tp=2, zero=zero, num_microbatches=2)
        offloaded = kept.model_copy(update={"offload_optimizer": True})
        ctx = make_ctx(planner, model, kept, framework=framework)
        (with_state,) = static_parts(ctx, kept)
        (without,) = static_parts(ctx, offloaded)
        assert with_state["optimizer"] > 0
        assert without.get("optimizer", 0) == 0
        rest = {k: v for k, v in with_state.items() if k != "optimizer"}
        assert {k: v for k, v in without.items() if k != "optimizer"} == rest


@pytest.mark.parametrize("precision", ["fp8", "fp8-blockwise", "mxfp8"])
def test_fp8_adds_low_precision_weight_copies(planner: Planner, precision: str) -> None:
    model = llama()
    layout = Layout(dp=4, tp=2, zero=1, num_microbatches=2)
    bf16 = make_ctx(planner, model, layout, precision="bf16")
    fp8 = make_ctx(planner, model, layout, precision=precision, fp8_param_gather=False)
    ((stage,), (plain,), (low,)) = (
        bf16.placement(layout),
        static_parts(bf16, layout),
        static_parts(fp8, layout),
    )
    assert "low_precision_weights" not in plain
    _, _, linear = NdplanMemoryModel().stage_parameters(fp8, layout, stage)
    expected = LOW_PRECISION_WEIGHT_BYTES[precision] * linear
    assert low["low_precision_weights"] == pytest.approx(expected, abs=1)
    for part in STATE_PARTS:  # the master state does not change with the GEMM recipe
        assert low[part] == plain[part]


@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
def test_the_embedding_and_output_layer_keep_no_low_precision_copy(
    planner: Planner, precision: str
) -> None:
    """Transformer Engine quantises the decoder's linear layers; the embedding and the
    output layer run in bf16 (the time model prices the logits GEMM so). Two stages with
    the same decoder layers keep the same quantised copies, head or not."""
    model = llama(layers=8)
    layout = Layout(dp=2, tp=2, pp=2, zero=1, num_microbatches=4)
    ctx = make_ctx(planner, model, layout, precision=precision)
    first, last = static_parts(ctx, layout)
    assert first["low_precision_weights"] == last["low_precision_weights"] > 0


@pytest.mark.parametrize("precision", ["fp8", "mxfp8"])
@pytest.mark.parametrize("zero", [1, 3])
def test_fp8_parameters_keep_no_bf16_copy_of_the_quantised_weights(
    planner: Planner, precision: str, zero: int
) -> None:
    """Megatron's --fp8-param-gather: the quantised weights are the parameters, so the
    bf16 copy of every linear weight goes (its fp32 master is in the distributed
    optimizer); norms and the embedding stay bf16, gradients and optimizer state stay."""
    model = llama()
    layout = Layout(dp=4, tp=2, zero=zero, num_microbatches=2)
    kept = make_ctx(planner, model, layout, precision=precision, fp8_param_gather=False)
    primary = make_ctx(planner, model, layout, precision=precision, fp8_param_gather=True)
    ((stage,), (before,), (after,)) = (
        kept.placement(layout),
        static_parts(kept, layout),
        static_parts(primary, layout),
    )
    dense, _, linear = NdplanMemoryModel().stage_parameters(primary, layout, stage)
    shard = layout.dp if zero >= 3 else 1
    assert after["weights"] == pytest.approx(2 * (dense - linear) / shard, abs=1)
    assert before["weights"] - after["weights"] == pytest.approx(2 * linear / shard, abs=1)
    for part in ("gradients", "optimizer", "low_precision_weights"):
        assert after[part] == before[part]


@pytest.mark.parametrize(
    ("framework", "precision", "zero", "finetune"),
    [
        ("megatron", "fp8-blockwise", 1, "full"),  # Megatron-Bridge: no param gather
        ("megatron", "fp4", 1, "full"),
        ("megatron", "bf16", 1, "full"),
        ("megatron", "fp8", 0, "full"),  # no distributed optimizer to hold the master
        ("megatron", "fp8", 1, "lora"),
        ("torchtitan", "fp8", 3, "full"),
    ],
)
def test_fp8_parameters_are_read_only_where_they_exist(
    planner: Planner, framework: str, precision: str, zero: int, finetune: str
) -> None:
    model = llama()
    layout = Layout(dp=4, tp=2, zero=zero, num_microbatches=2)
    job = {"precision": precision, "framework": framework, "finetune": finetune}
    unstated = make_ctx(planner, model, layout, **job)
    stated = make_ctx(planner, model, layout, **job, fp8_param_gather=False)
    assert static_parts(unstated, layout) == static_parts(stated, layout)
    assert "job.fp8_param_gather" not in [a.field for a in unstated.recorder.items]
    applies = make_ctx(planner, model, Layout(dp=4, tp=2, zero=1, num_microbatches=2),
                       precision="fp8")  # fmt: skip
    static_parts(applies, Layout(dp=4, tp=2, zero=1, num_microbatches=2))
    assert "job.fp8_param_gather" in [a.field for a in applies.recorder.items]


@pytest.mark.parametrize(("precision", "copies"), [("fp8", 1), ("mxfp8", 2), ("fp8-blockwise", 2)])
def test_blackwell_keeps_one_orientation_of_per_tensor_fp8_weights(
    planner: Planner, precision: str, copies: int
) -> None:
    """Blackwell's tensor cores take fp8 in any layout, so per-tensor fp8 weights need no
    transposed copy; block-scaled recipes keep both orientations on any device."""
    model = llama()
    layout = Layout(dp=4, tp=2, zero=1, num_microbatches=2)
    job = Job(global_batch_size=8, seq_length=4096, precision=precision)
    parts = {}
    for device in ("h100-sxm", "b200"):
        ctx = planner.context(model, planner.device(device), layout.devices, job)
        (parts[device],) = static_parts(ctx, layout)
    hopper = parts["h100-sxm"]["low_precision_weights"]
    assert parts["b200"]["low_precision_weights"] == pytest.approx(hopper * copies / 2, abs=1)


# ----------------------------------------------------------------------------- placement


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 7, 16])
def test_1f1b_stage_i_holds_min_pp_minus_i_and_m(pp: int, m: int) -> None:
    stages = place_layers(llama(layers=16), Layout(pp=pp, num_microbatches=m))
    assert [s.max_in_flight for s in stages] == [min(pp - i, m) for i in range(pp)]


@pytest.mark.parametrize(("pp", "m"), [(2, 1), (2, 8), (4, 3), (4, 16)])
def test_gpipe_holds_every_micro_batch(pp: int, m: int) -> None:
    stages = place_layers(llama(layers=16), Layout(pp=pp, num_microbatches=m, schedule="gpipe"))
    assert all(c.in_flight == m for s in stages for c in s.chunks)
    assert stages[-1].head_in_flight == m


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (4, (16, 16, 16, 13)),  # Megatron-Bridge's DeepSeek-V3 pp 4
        (8, (8,) * 7 + (5,)),  # pp 8, or pp 4 × vpp 2
        (16, (4,) * 15 + (1,)),  # pp 16, pp 8 × vpp 2, pp 4 × vpp 4
        (32, None),  # no room for three slots on the last chunk: the even split
    ],
)
def test_mtp_models_leave_the_last_chunk_room_for_mtp_and_the_loss(
    chunks: int, expected: tuple[int, ...] | None
) -> None:
    assert sum(default_split(61, chunks, mtp_layers=1)) == 61
    assert default_split(61, chunks, mtp_layers=1) == (expected or even_split(61, chunks))
    assert default_split(61, chunks, mtp_layers=0) == even_split(61, chunks)


def test_placement_of_an_mtp_model_shortens_its_critical_stage() -> None:
    """DeepSeek-V3 at pp 16: with the even split the last stage carries four layers plus
    MTP and the head and sets the pipeline's pace; the default split moves three layers
    off it, so the slowest stage gets faster and the step shorter."""
    planner = Planner()
    spec = planner.model("deepseek-v3")
    job = Job(global_batch_size=512, seq_length=4096, precision="mxfp8")
    ctx = planner.context(spec, planner.device("b200"), 256, job)
    layout = Layout(pp=16, ep=8, dp=16, num_microbatches=32)
    even = layout.model_copy(update={"layers_per_stage": even_split(61, 16)})
    chunks = [c.stop - c.start for s in place_layers(spec, layout) for c in s.chunks]
    assert chunks == [4] * 15 + [1]
    balanced, uneven = planner.estimate(ctx, layout).time, planner.estimate(ctx, even).time
    assert max(balanced.stage_forward_s) < max(uneven.stage_forward_s)
    assert balanced.step_s < uneven.step_s


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_dualpipev_chunk_counts(pp: int) -> None:
    m = 4 * pp  # enough that nothing is capped
    stages = place_layers(
        llama(layers=8 * pp), Layout(pp=pp, num_microbatches=m, schedule="dualpipev")
    )
    for i, stage in enumerate(stages):
        first, second = stage.chunks
        assert (first.in_flight, second.in_flight) == (2 * pp - 1 - i, i + 1)
    # With few micro-batches the counts are capped at m.
    capped = place_layers(
        llama(layers=8 * pp), Layout(pp=pp, num_microbatches=2, schedule="dualpipev")
    )
    for i, stage in enumerate(capped):
        assert tuple(c.in_flight for c in stage.chunks) == (min(2, 2 * pp - 1 - i), min(2, i + 1))


def test_dualpipev_chunks_fold_the_model_into_a_v() -> None:
    """Stage i runs chunk i and chunk 2·pp − 1 − i: stage 0 holds both ends of the model."""
    stages = place_layers(llama(layers=16), Layout(pp=4, num_microbatches=8, schedule="dualpipev"))
    assert [tuple((c.start, c.stop) for c in s.chunks) for s in stages] == [
        ((0, 2), (14, 16)),
        ((2, 4), (12, 14)),
        ((4, 6), (10, 12)),
        ((6, 8), (8, 10)),
    ]


@pytest.mark.parametrize(
    "layout",
    [
        Layout(pp=1),
        Layout(pp=4, num_microbatches=8),
        Layout(pp=4, num_microbatches=8, schedule="gpipe"),
        Layout(pp=2, vpp=2, num_microbatches=4, schedule="interleaved"),
        Layout(pp=4, vpp=2, num_microbatches=8, schedule="interleaved"),
    ],
    ids=["pp1", "1f1b", "gpipe", "interleaved-2x2", "interleaved-4x2"],
)
def test_embedding_on_the_first_stage_and_head_on_the_last(layout: Layout) -> None:
    stages = place_layers(llama(layers=16), layout)
    assert [s.has_embedding for s in stages] == [i == 0 for i in range(layout.pp)]
    assert [s.has_head for s in stages] == [i == layout.pp - 1 for i in range(layout.pp)]
    assert sorted(i for s in stages for i in s.layers) == list(range(16))


@pytest.mark.parametrize("pp", [2, 4])
def test_dualpipev_puts_embedding_and_head_on_stage_0(pp: int) -> None:
    stages = place_layers(llama(layers=16), Layout(pp=pp, num_microbatches=8, schedule="dualpipev"))
    expected = [(True, True)] + [(False, False)] * (pp - 1)
    assert [(s.has_embedding, s.has_head) for s in stages] == expected


def test_interleaved_chunk_counts_follow_megatrons_schedule_table() -> None:
    """Forwards run in micro-batch groups of pp through every chunk; the last group may be
    smaller. pp=4, vpp=4, m=5: stage 0 does 4·4 + 3 = 19 forwards before its first backward —
    micro-batches 0-3 on chunks 0-3, then micro-batch 4 on chunks 0, 1 and 2."""
    assert interleaved_in_flight(4, 4, 5, 0) == (5, 5, 5, 4)
    assert interleaved_in_flight(4, 2, 8, 0) == (7, 4)  # groups of pp: 4 + 3 on chunk 0
    assert interleaved_in_flight(4, 2, 4, 0) == (4, 4)  # m = pp: every forward before a backward
    assert interleaved_in_flight(4, 2, 8, 3) == (4, 1)  # the last stage: vpp − 1 groups + 1


def _schedule_table_counts(pp: int, vpp: int, m: int, stage: int) -> tuple[int, ...]:
    """The oracle: Megatron's forward order written out in full — micro-batch groups of
    pp, each through every chunk — and its first warm-up + 1 forwards counted per chunk."""
    order = [
        chunk
        for first in range(0, m, pp)
        for chunk in range(vpp)
        for _ in range(first, min(first + pp, m))
    ]
    warm = min(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, m * vpp)
    return tuple(order[:warm].count(chunk) for chunk in range(vpp))


@pytest.mark.parametrize("pp", [2, 3, 4, 8])
def test_interleaved_chunk_counts_match_the_written_out_schedule(pp: int) -> None:
    """Every stage, depth and micro-batch count up to 3·pp·vpp, and far past it (the walk
    stops once the warm-up is counted; a million micro-batches gives the same counts)."""
    for vpp in range(1, 6):
        for m in [*range(1, 3 * pp * vpp + 2), 1000]:
            for stage in range(pp):
                want = _schedule_table_counts(pp, vpp, m, stage)
                assert interleaved_in_flight(pp, vpp, m, stage) == want, (pp, vpp, m, stage)
        assert interleaved_in_flight(pp, vpp, 10**6, 0) == _schedule_table_counts(pp, vpp, 1000, 0)


# ----------------------------------------------------------------------------- tied embeddings


def _stage_dense(planner: Planner, model: ModelSpec, layout: Layout) -> list[float]:
    ctx = make_ctx(planner, model, layout)
    mm = NdplanMemoryModel()
    return [mm.stage_parameters(ctx, layout, s)[0] for s in ctx.placement(layout)]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tied_embedding_one_copy_on_one_stage_two_when_split(planner: Planner, tp: int) -> None:
    tied, untied = llama(tie=True, vocab=32003), llama(tie=False, vocab=32003)
    embedding = padded_vocab(32003, tp) * 1024 / tp
    assert padded_vocab(32003, tp) % (128 * tp) == 0 and padded_vocab(32003, tp) >= 32003
    one_stage = Layout(tp=tp, num_microbatches=4)
    split = Layout(tp=tp, pp=2, num_microbatches=4)
    v_shape = Layout(tp=tp, pp=2, num_microbatches=4, schedule="dualpipev")

    (tied_1,) = _stage_dense(planner, tied, one_stage)
    (untied_1,) = _stage_dense(planner, untied, one_stage)
    assert untied_1 - tied_1 == pytest.approx(embedding)  # one copy serves both ends

    tied_2 = _stage_dense(planner, tied, split)
    untied_2 = _stage_dense(planner, untied, split)
    assert sum(tied_2) == pytest.approx(sum(untied_2))  # split: a second copy on the last stage
    assert sum(tied_2) - tied_1 == pytest.approx(embedding)

    tied_v = _stage_dense(planner, tied, v_shape)
    assert sum(tied_v) == pytest.approx(tied_1)  # DualPipeV: both ends on stage 0, one copy


# ----------------------------------------------------------------------------- torchtitan's per-op policy


def test_torchtitan_per_op_policy_keeps_every_other_matmul_output(planner: Planner) -> None:
    """torchtitan's ``selective_ac_option = "op"`` saves the outputs of a layer's 1st, 3rd,
    5th and 7th matmul (q, v, the FFN gate and down projections), the attention kernel's
    output and softmax statistics, beside the layer's input; everything else (norms, k,
    RoPE, the output projection, the residual add, the up projection, the activation)
    is recomputed. By hand for Llama (h 1024, 16 heads of 64, 4 KV heads, FFN 2816)."""
    model = llama()
    layout = Layout(dp=8, zero=3, mbs=2, num_microbatches=1)
    ctx = make_ctx(planner, model, layout, framework="torchtitan", global_batch_size=16)
    assert ctx.framework.selective == frozenset({"op"})
    mm = NdplanMemoryModel()
    kind = model.kinds[0]
    n, h, q, kv, ffn = 2 * 4096, 1024, 16 * 64, 4 * 64, 2816
    stats = 4 * 16 * n  # fp32 log-sum-exp per head and token
    kept = 2 * n * (h + q + kv + q + ffn + h) + stats  # input, q, v, attention out, gate, down
    assert mm.layer_activation_bytes(ctx, layout, kind, frozenset({"op"})) == kept
    # The plain layer keeps k, the norm outputs, the mid residual, both FFN projections and
    # the activation instead, and not the down projection's output.
    plain = 2 * n * (h + h + q + 2 * kv + q + h + h + 2 * ffn + ffn) + stats
    assert mm.layer_activation_bytes(ctx, layout, kind, frozenset()) == plain
    assert mm.layer_activation_bytes(ctx, layout, kind, None) == 2 * n * h


def test_torchtitan_per_op_policy_under_tp_keeps_the_reduce_scatters(planner: Planner) -> None:
    """With TP (and its sequence parallelism) the policy also saves both reduce-scatter
    outputs, and the down projection's output is the full-sequence partial sum; the norm
    outputs are gathered again in the backward, so no gathered copy is kept."""
    model = llama()
    t = 2
    layout = Layout(tp=t, sp=True, dp=4, zero=3, mbs=1, num_microbatches=1)
    ctx = make_ctx(planner, model, layout, framework="torchtitan", global_batch_size=4)
    mm = NdplanMemoryModel()
    n, h, q, kv, ffn = 4096, 1024, 16 * 64, 4 * 64, 2816
    stats = 4 * 16 * n / t
    kept = 2 * n * (h / t + q / t + kv / t + q / t + ffn / t + h + h / t + h / t) + stats
    assert mm.layer_activation_bytes(ctx, layout, model.kinds[0], frozenset({"op"})) == kept


def test_megatron_keeps_its_own_switches_and_no_per_op_policy(planner: Planner) -> None:
    model = llama()
    layout = Layout(dp=8, mbs=1, num_microbatches=1)
    ctx = make_ctx(planner, model, layout, framework="megatron", global_batch_size=8)
    assert "op" not in ctx.framework.switches
    mm = NdplanMemoryModel()
    plain = mm.layer_activation_bytes(ctx, layout, model.kinds[0], frozenset())
    norm_act = mm.layer_activation_bytes(ctx, layout, model.kinds[0], frozenset({"norm", "act"}))
    n, h, ffn = 4096, 1024, 2816
    assert plain - norm_act == 2 * n * (2 * h + ffn)  # the two norm outputs, the activation
    # Megatron's mlp module: the FFN recomputed whole drops its gate-and-up output and the
    # activation output, and keeps its input (the norm output) to re-run from.
    whole_ffn = mm.layer_activation_bytes(ctx, layout, model.kinds[0], frozenset({"mlp"}))
    assert plain - whole_ffn == 2 * n * (2 * ffn + ffn)
