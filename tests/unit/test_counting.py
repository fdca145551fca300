"""Parameter counts and FLOPs per token (spec/model.md, 'Parameter counts' and 'FLOPs').

Published totals are reproduced exactly from the shipped presets (the public
``config.json`` files), and our term-by-term FLOPs equal Megatron-LM's closed form
(``megatron/training/training.py::num_floating_point_operations``) wherever that form
applies: exactly on dense models, and on MoE models once the router — which the
closed form leaves out and we report as its own part — is added back.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from ndplan.adapters.readers.catalog import builtin_presets
from ndplan.adapters.readers.hf import read_hf_config
from ndplan.core.counting import (
    attended_keys,
    count_flops,
    count_parameters,
    megatron_closed_form_flops,
)
from ndplan.core.model import DenseFFN, LayerKind, ModelSpec, MoEFFN, StandardAttention

# = tests/conftest.py::SHARED_DATA: the in-repo copy of the shared measurements and
# Megatron-LM's reference vectors.
SHARED_DATA = Path(__file__).resolve().parents[1] / "data" / "shared"


def preset(preset_id: str) -> ModelSpec:
    return read_hf_config(builtin_presets()[preset_id], origin=preset_id)


def raw(preset_id: str) -> dict:
    return builtin_presets()[preset_id]


# ----------------------------------------------------------------------------- totals


@pytest.mark.parametrize(
    ("preset_id", "total"),
    [
        ("llama-3-8b", 8_030_261_248),
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3-70b", 70_553_706_496),
        ("llama-3.1-70b", 70_553_706_496),
        ("llama-3.1-405b", 405_853_388_800),
        ("mixtral-8x7b", 46_702_792_704),
        ("deepseek-v3", 671_026_404_352),
    ],
)
def test_published_totals(preset_id: str, total: int) -> None:
    """The parameter counts the model publishers state, from their public configs.

    Sources: the safetensors parameter counts on the HuggingFace model pages
    (meta-llama/Meta-Llama-3-8B 8,030,261,248; meta-llama/Meta-Llama-3-70B
    70,553,706,496; meta-llama/Llama-3.1-405B 405,853,388,800;
    mistralai/Mixtral-8x7B-v0.1 46,702,792,704) and the DeepSeek-V3 technical report
    (arXiv:2412.19437, §1/§4: 671B total, 37B activated; the 685B checkpoint adds the
    14B MTP module), as restated in spec/model.md 'Published totals'.
    """
    count = count_parameters(preset(preset_id))
    assert count.total_parameters == total
    assert sum(count.parts.values()) == total
    assert all(isinstance(v, int) for v in count.parts.values())


def test_deepseek_v3_activated_and_mtp_apart() -> None:
    """DeepSeek-V3: 37,552,282,624 activated per token (≈ 37B, arXiv:2412.19437 Table 1);
    the MTP module is reported beside the total, never inside it."""
    count = count_parameters(preset("deepseek-v3"))
    assert count.total_parameters == 671_026_404_352
    assert count.active_parameters == 37_552_282_624
    # One MTP layer: the last (MoE) decoder layer's shape plus enorm, hnorm, the
    # shared head's norm (3h) and eh_proj (2h → h); embedding and head are shared.
    h, a, rq, rkv, nope, rope, v = 7168, 128, 1536, 512, 128, 64, 128
    e, fe = 256, 2048
    mla = (
        h * rq + rq + rq * a * (nope + rope)  # q down, q norm, q up
        + h * (rkv + rope) + rkv + rkv * a * (nope + v)  # kv down (+rope key), kv norm, kv up
        + a * v * h  # out
    )  # fmt: skip
    moe = e * 3 * h * fe + 1 * 3 * h * fe + h * e  # routed, one shared expert, router
    mtp = mla + moe + 2 * h + 3 * h + 2 * h * h
    assert count.mtp_parameters == mtp == 11_610_067_968
    # The checkpoint's 685B: total + MTP + the MTP's own copies of embedding and head.
    assert 684e9 < count.total_parameters + mtp + 2 * 129280 * h < 686e9


def test_llama_2_7b_by_hand() -> None:
    """Llama-2-7B (MHA, untied): 6,738,415,616 (meta-llama/Llama-2-7b-hf, 6.74B)."""
    h, layers, vocab, f = 4096, 32, 32000, 11008
    per_layer = 4 * h * h + 3 * h * f + 2 * h
    expected = vocab * h + layers * per_layer + h + vocab * h
    count = count_parameters(preset("llama-2-7b"))
    assert count.total_parameters == expected == 6_738_415_616
    assert count.parts == {
        "embedding": vocab * h,
        "attention": layers * 4 * h * h,
        "ffn": layers * 3 * h * f,
        "norms": (2 * layers + 1) * h,
        "output_head": vocab * h,
    }
    assert count.active_parameters == expected


def test_tied_head_and_active_for_moe() -> None:
    """Active = total − the (E − k) routed experts a token skips, per MoE layer."""
    h, layers, e, k, fe = 4096, 32, 8, 2, 14336
    count = count_parameters(preset("mixtral-8x7b"))
    skipped = layers * (e - k) * 3 * h * fe
    assert count.active_parameters == count.total_parameters - skipped == 12_879_925_248
    assert count.parts["router"] == layers * h * e
    assert count.parts["experts"] == layers * e * 3 * h * fe


# ----------------------------------------------------------------------------- FLOPs


def closed_form_by_hand(
    *,
    h: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    ffn: int,
    vocab: int,
    seq: int,
    gbs: int,
    gated: bool = True,
    moe_layers: int = 0,
    expert_ffn: int = 0,
    top_k: int = 0,
    shared_ffn: int = 0,
) -> int:
    """spec/model.md's statement of Megatron-LM's closed form, written out in integers."""
    tokens = gbs * seq
    c = 3 if gated else 2
    q = heads * head_dim
    dense_layers = layers - moe_layers
    per_token = (
        h * c * (ffn * dense_layers + (expert_ffn * top_k + shared_ffn) * moe_layers)
        + layers * (h * (q + 2 * kv_heads * head_dim) + q * h)
        + h * vocab
    )
    return 6 * tokens * per_token + 6 * gbs * seq * seq * q * layers


def test_llama_2_7b_training_flops_at_4096() -> None:
    """The Llama-2-7B shape at s = 4096: 42,863,689,728 training FLOPs per token
    (spec/model.md, from Megatron-LM's closed form)."""
    model = preset("llama-2-7b")
    flops = count_flops(model, 4096)
    assert flops.training_flops_per_token == 42_863_689_728
    by_hand = closed_form_by_hand(
        h=4096, layers=32, heads=32, kv_heads=32, head_dim=128, ffn=11008, vocab=32000,
        seq=4096, gbs=1,
    )  # fmt: skip
    assert by_hand == 42_863_689_728 * 4096
    assert megatron_closed_form_flops(model, 1, 4096) == by_hand


DENSE = [
    "llama-2-7b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-405b",
    "qwen2.5-7b",  # q/k/v biases: parameters, not matmul FLOPs
    "qwen3-32b",  # qk-norm and head_dim ≠ h/a
    "mistral-7b-v0.1",  # sliding window 4096 ≥ s below: no effect yet
    "gpt3-175b",  # GELU (2 matrices), learned positions, biases
    "nemotron-4-15b",  # squared ReLU, ungated
    "mpt-7b",  # ALiBi, no biases
]


@pytest.mark.parametrize("preset_id", DENSE)
@pytest.mark.parametrize("seq", [1024, 2048, 3000, 4096])
@pytest.mark.parametrize("gbs", [1, 32])
def test_dense_flops_equal_megatron_closed_form(preset_id: str, seq: int, gbs: int) -> None:
    """On dense models the closed form is exact: training FLOPs/token × tokens."""
    model = preset(preset_id)
    flops = count_flops(model, seq)
    assert megatron_closed_form_flops(model, gbs, seq) == gbs * seq * flops.training_flops_per_token
    assert flops.training_flops_per_token == 3 * flops.forward_flops_per_token
    assert sum(flops.forward_parts.values()) == flops.forward_flops_per_token


@pytest.mark.parametrize("preset_id", ["llama-3-8b", "llama-3.1-405b", "qwen3-32b", "gpt3-175b"])
def test_dense_closed_form_written_out(preset_id: str) -> None:
    """The same equality against the closed form written out here from the config."""
    cfg = raw(preset_id)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    seq = 2048
    by_hand = closed_form_by_hand(
        h=h,
        layers=cfg["num_hidden_layers"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim", h // heads),
        ffn=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        seq=seq,
        gbs=1,
        gated=cfg.get("hidden_act", "silu") == "silu",
    )
    assert count_flops(preset(preset_id), seq).training_flops_per_token * seq == by_hand


MOE = [
    # (preset, MoE layers, experts, shared-expert gate)
    ("mixtral-8x7b", 32, 8, False),
    ("mixtral-8x22b", 56, 8, False),
    ("qwen3-30b-a3b", 48, 128, False),
    ("qwen3-235b-a22b", 94, 128, False),
    ("qwen2-57b-a14b", 28, 64, True),
]


@pytest.mark.parametrize(("preset_id", "moe_layers", "experts", "gate"), MOE)
@pytest.mark.parametrize("seq", [2048, 4096, 8192])
def test_moe_flops_equal_closed_form_plus_router(
    preset_id: str, moe_layers: int, experts: int, gate: bool, seq: int
) -> None:
    """The closed form counts the k routed experts and the shared expert but not the
    router (an h×E matmul, 2·h·E forward FLOPs per token per MoE layer) nor Qwen2-MoE's
    shared-expert gate (an h×1 matmul, 2·h). Training is 3 × forward, so

        training_flops_per_token = closed_form / tokens + 3 · L_m · (2·h·E + 2·h·[gate])

    and the router term is exactly 3 × the reported router part. Norms cost no
    matmul FLOPs on either side.
    """
    model = preset(preset_id)
    h = raw(preset_id)["hidden_size"]
    flops = count_flops(model, seq)
    closed = megatron_closed_form_flops(model, 1, seq)
    omitted = 3 * moe_layers * (2 * h * experts + (2 * h if gate else 0))
    assert flops.training_flops_per_token * seq == closed + omitted * seq
    assert 3 * flops.forward_parts["router"] == 3 * moe_layers * 2 * h * experts
    assert megatron_closed_form_flops(model, 32, seq) == 32 * closed


def test_moe_closed_form_written_out() -> None:
    """Mixtral-8x7B against the closed form written out from its config (k = 2 of 8)."""
    seq = 4096
    by_hand = closed_form_by_hand(
        h=4096, layers=32, heads=32, kv_heads=8, head_dim=128, ffn=0, vocab=32000, seq=seq,
        gbs=1, moe_layers=32, expert_ffn=14336, top_k=2,
    )  # fmt: skip
    flops = count_flops(preset("mixtral-8x7b"), seq)
    assert (flops.training_flops_per_token - 3 * 32 * 2 * 4096 * 8) * seq == by_hand


def _row_model(row: dict[str, str]) -> ModelSpec:
    """A ModelSpec from one row of megatron_reference_vectors.csv."""
    h, heads = int(row["hidden"]), int(row["heads"])
    attention = StandardAttention(
        num_heads=heads, num_kv_heads=int(row["kv_groups"]), head_dim=int(row["kv_channels"])
    )
    gated = row["swiglu"] == "true"
    if row["num_experts"]:
        ffn: DenseFFN | MoEFFN = MoEFFN(
            num_experts=int(row["num_experts"]),
            top_k=int(row["topk"]),
            expert_intermediate_size=int(row["moe_ffn_hidden"]),
            gated=gated,
        )
    else:
        ffn = DenseFFN(intermediate_size=int(row["ffn_hidden"]), gated=gated)
    norm = "rmsnorm" if row["norm"] == "RMSNorm" else "layernorm"
    kind = LayerKind(name="layer", attention=attention, ffn=ffn, norm=norm)
    return ModelSpec(
        name=row["model"],
        hidden_size=h,
        vocab_size=int(row["vocab_padded"]),
        kinds=(kind,),
        layers=(0,) * int(row["layers"]),
        tie_word_embeddings=row["untied"] != "true",
    )


def _reference_rows() -> list[dict[str, str]]:
    with (SHARED_DATA / "megatron_reference_vectors.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_reference_vectors_file_has_rows_a_to_f() -> None:
    assert [r["case"] for r in _reference_rows()] == ["A", "B", "C", "D", "E", "F"]


@pytest.mark.parametrize("case", ["A", "B", "C", "D", "E", "F"])
def test_megatron_reference_vectors_flops(case: str) -> None:
    """``flops_per_iteration_gbs32`` of megatron_reference_vectors.csv
    (Megatron-LM's own num_floating_point_operations at gbs = 32; the file keeps
    6–7 significant digits, hence the relative tolerance)."""
    (row,) = [r for r in _reference_rows() if r["case"] == case]
    model = _row_model(row)
    seq = int(row["seq_len"])
    expected = float(row["flops_per_iteration_gbs32"])
    closed = megatron_closed_form_flops(model, 32, seq)
    assert closed == pytest.approx(expected, rel=1e-6)
    flops = count_flops(model, seq)
    ours = flops.training_flops_per_token - 3 * flops.forward_parts["router"]
    assert 32 * seq * ours == closed
    if not model.is_moe:
        assert flops.forward_parts["router"] == 0


# ----------------------------------------------------------------------------- conventions


@pytest.mark.parametrize("preset_id", ["llama-3-8b", "qwen3-32b", "mixtral-8x7b"])
@pytest.mark.parametrize("seq", [2048, 8192])
def test_full_attention_adds_the_masked_half(preset_id: str, seq: int) -> None:
    """Full masking counts s keys per query, causal s/2: the difference in training
    FLOPs is 3 × L × (2·s·a·d_qk + 2·s·a·d_v)/2 = 6·s·a·d·L."""
    cfg = raw(preset_id)
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
    model = preset(preset_id)
    causal = count_flops(model, seq)
    full = count_flops(model, seq, "full")
    assert causal.attention == "causal"
    assert full.training_flops_per_token - causal.training_flops_per_token == (
        6 * seq * heads * head_dim * layers
    )


def test_sliding_window_counts_min_of_window_and_sequence() -> None:
    """Mistral-7B (window 4096): at s = 8192 each causal query sees w − w²/(2s) keys on
    average (3072), under full masking w; at s ≤ w the window changes nothing."""
    model = preset("mistral-7b-v0.1")
    heads, head_dim, layers, w = 32, 128, 32, 4096
    per_key = 2 * 2 * heads * head_dim  # scores + weighted sum, per attended key
    s = 8192
    causal = count_flops(model, s).forward_parts["core_attention"]
    full = count_flops(model, s, "full").forward_parts["core_attention"]
    assert causal == layers * per_key * 3072
    assert full == layers * per_key * w
    assert attended_keys(s, w, "causal") == w - w * w / (2 * s)
    assert count_flops(model, 4096).forward_parts["core_attention"] == layers * per_key * 2048


def test_mtp_flops_reported_apart() -> None:
    """DeepSeek-V3's MTP layer (with its logits) is not in the training FLOPs."""
    model = preset("deepseek-v3")
    flops = count_flops(model, 4096)
    assert flops.mtp_forward_flops_per_token > 0
    assert sum(flops.forward_parts.values()) == flops.forward_flops_per_token
    without_mtp = model.model_copy(update={"num_mtp_layers": 0, "mtp_kind": None})
    assert count_flops(without_mtp, 4096).training_flops_per_token == (
        flops.training_flops_per_token
    )


def test_closed_form_refuses_latent_attention() -> None:
    """Megatron's closed form is stated for standard attention; MLA is refused, not guessed."""
    with pytest.raises(ValueError, match="standard attention"):
        megatron_closed_form_flops(preset("deepseek-v2-lite"), 1, 4096)


def test_logits_and_learned_positions() -> None:
    """GPT-2 XL: logits cost 2·h·V forward per token; the learned position table is
    parameters only (a lookup, no FLOPs)."""
    model = preset("gpt2-xl")
    flops = count_flops(model, 1024)
    assert flops.forward_parts["logits"] == 2 * 1600 * 50257
    assert count_parameters(model).parts["position_embedding"] == 1024 * 1600
