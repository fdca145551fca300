"""The HuggingFace config reader: family coverage, aliases, composites, absent fields.

Every expected total here is written out from the config's numbers with the
formulas of spec/model.md ('Parameter counts'), not copied from the code's output:
per layer ``attention = h·a·d + 2·h·g·d + a·d·h (+ biases, q/k norms)``,
``FFN = 3·h·f`` gated (2·h·f not), ``norms = 2·h``; MoE ``router = h·E``,
``experts = E·3·h·f_e``; embedding ``V·h``, head ``V·h`` unless tied, final norm ``h``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ndplan.adapters.readers.catalog import builtin_presets
from ndplan.adapters.readers.hf import HFConfigReader, load_config_file, read_hf_config
from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.counting import count_parameters
from ndplan.core.errors import InvalidInputError
from ndplan.core.model import (
    DenseFFN,
    LatentAttention,
    LinearAttention,
    ModelSpec,
    MoEFFN,
    StandardAttention,
)

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"


def preset(preset_id: str, recorder: AssumptionRecorder | None = None) -> ModelSpec:
    return read_hf_config(builtin_presets()[preset_id], origin=preset_id, recorder=recorder)


def fixture(name: str, recorder: AssumptionRecorder | None = None) -> ModelSpec:
    path = CONFIGS / name
    return read_hf_config(load_config_file(path), origin=str(path), recorder=recorder)


def kinds(model: ModelSpec) -> list[tuple[str, int]]:
    return [(kind.name, count) for kind, count in model.kind_counts()]


def order(model: ModelSpec) -> list[str]:
    return [model.kinds[i].name for i in model.layers]


def total(model: ModelSpec) -> int:
    return count_parameters(model).total_parameters


def gqa(h: int, a: int, g: int, d: int) -> int:
    """q, k, v, o projection weights of one attention block."""
    return h * a * d + 2 * h * g * d + a * d * h


# ----------------------------------------------------------------------------- Llama


@pytest.mark.parametrize(
    ("preset_id", "h", "layers", "a", "g", "f", "vocab", "published"),
    [
        ("llama-2-7b", 4096, 32, 32, 32, 11008, 32000, 6_738_415_616),
        ("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, 68_976_648_192),
        ("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, 8_030_261_248),
        ("llama-3.1-405b", 16384, 126, 128, 8, 53248, 128256, 405_853_388_800),
    ],
)
def test_llama_family(
    preset_id: str, h: int, layers: int, a: int, g: int, f: int, vocab: int, published: int
) -> None:
    """Llama 2/3/3.1: one kind (GQA or MHA, SwiGLU, RMSNorm), untied, no biases."""
    model = preset(preset_id)
    assert kinds(model) == [("attn+dense", layers)]
    (kind,) = model.kinds
    assert kind.attention == StandardAttention(num_heads=a, num_kv_heads=g, head_dim=h // a)
    assert kind.ffn == DenseFFN(intermediate_size=f, gated=True, activation="silu")
    expected = vocab * h * 2 + layers * (gqa(h, a, g, h // a) + 3 * h * f + 2 * h) + h
    assert total(model) == expected == published


def test_llama_2_unstated_fields_are_not_assumptions_when_implied() -> None:
    """Llama 2 states no head_dim/attention_bias: head_dim is h/a by definition, and a
    known family's bias convention is not an assumption."""
    recorder = AssumptionRecorder()
    preset("llama-2-7b", recorder)
    assert recorder.items == ()


# ----------------------------------------------------------------------------- Qwen


def test_qwen2_5_qkv_bias_implied_by_model_type() -> None:
    """Qwen2.5-7B: q/k/v biases (not stated, implied by qwen2), no output bias; the
    131072 sliding_window is inert (use_sliding_window false)."""
    h, layers, a, g, d, f, vocab = 3584, 28, 28, 4, 128, 18944, 152064
    model = preset("qwen2.5-7b")
    assert kinds(model) == [("attn+dense", layers)]
    att = model.kinds[0].attention
    assert att.qkv_bias and not att.out_bias and att.sliding_window is None
    per_layer = gqa(h, a, g, d) + (a * d + 2 * g * d) + 3 * h * f + 2 * h
    assert total(model) == 2 * vocab * h + layers * per_layer + h == 7_615_616_512


def test_qwen2_slides_its_window_from_max_window_layers_on() -> None:
    """With use_sliding_window on, transformers' Qwen2 applies the window to the layers
    from max_window_layers on; the ones before attend in full."""
    raw = dict(builtin_presets()["qwen2.5-7b"])
    raw.update(use_sliding_window=True, sliding_window=4096, max_window_layers=20)
    model = read_hf_config(raw, origin="qwen2-swa")
    assert order(model) == ["attn+dense"] * 20 + ["swa+dense"] * 8
    assert model.kinds[model.layers[-1]].attention.sliding_window == 4096


def test_qwen3_qk_norm_and_explicit_head_dim() -> None:
    """Qwen3-32B: head_dim 128 while h/a = 80; per-head q/k RMSNorm (2·d per layer)."""
    h, layers, a, g, d, f, vocab = 5120, 64, 64, 8, 128, 25600, 151936
    model = preset("qwen3-32b")
    att = model.kinds[0].attention
    assert (att.head_dim, att.qk_norm, att.qkv_bias) == (128, True, False)
    assert h // a != d
    per_layer = gqa(h, a, g, d) + 2 * d + 3 * h * f + 2 * h
    assert total(model) == 2 * vocab * h + layers * per_layer + h == 32_762_123_264


def test_qwen2_moe_shared_expert_with_gate() -> None:
    """Qwen2-57B-A14B: 64 experts of 2560, top-8, one shared expert 20480 wide with a
    sigmoid gate (h), q/k/v biases; every layer MoE (decoder_sparse_step 1)."""
    h, layers, a, g, d, vocab = 3584, 28, 28, 4, 128, 151936
    e, k, fe, fs = 64, 8, 2560, 20480
    model = preset("qwen2-57b-a14b")
    assert kinds(model) == [("attn+moe", layers)]
    ffn = model.kinds[0].ffn
    assert isinstance(ffn, MoEFFN)
    assert (ffn.shared_intermediate_size, ffn.shared_expert_gate) == (fs, True)
    attention = gqa(h, a, g, d) + a * d + 2 * g * d
    moe = e * 3 * h * fe + 3 * h * fs + h + h * e
    expected = 2 * vocab * h + layers * (attention + moe + 2 * h) + h
    count = count_parameters(model)
    assert count.total_parameters == expected
    assert count.active_parameters == expected - layers * (e - k) * 3 * h * fe


def test_qwen2_moe_sparse_step_and_mlp_only_layers() -> None:
    """decoder_sparse_step 2 makes layers 1, 3, 5 MoE; mlp_only_layers [3] turns layer 3
    back to a dense MLP (transformers' Qwen2MoeDecoderLayer rule)."""
    h, a, g, d, vocab = 512, 8, 2, 64, 1000
    f, e, fe, fs = 1536, 8, 256, 1024
    model = fixture("qwen2_moe_mlp_only_layers.json")
    assert order(model) == [
        "attn+dense",
        "attn+moe",
        "attn+dense",
        "attn+dense",
        "attn+dense",
        "attn+moe",
    ]
    assert kinds(model) == [("attn+dense", 4), ("attn+moe", 2)]
    attention = gqa(h, a, g, d) + a * d + 2 * g * d
    dense = attention + 3 * h * f + 2 * h
    moe = attention + e * 3 * h * fe + 3 * h * fs + h + h * e + 2 * h
    assert total(model) == 2 * vocab * h + 4 * dense + 2 * moe + h


def test_qwen3_moe() -> None:
    """Qwen3-30B-A3B: 128 experts of 768, top-8, qk-norm, head_dim 128 (h/a = 64)."""
    h, layers, a, g, d, vocab, e, k, fe = 2048, 48, 32, 4, 128, 151936, 128, 8, 768
    model = preset("qwen3-30b-a3b")
    assert kinds(model) == [("attn+moe", layers)]
    per_layer = gqa(h, a, g, d) + 2 * d + e * 3 * h * fe + h * e + 2 * h
    count = count_parameters(model)
    assert count.total_parameters == 2 * vocab * h + layers * per_layer + h
    assert count.active_parameters == count.total_parameters - layers * (e - k) * 3 * h * fe


def test_an_unstated_expert_width_is_an_assumption_where_the_family_states_it() -> None:
    """Qwen-MoE experts are far narrower than its dense FFN: without
    ``moe_intermediate_size`` the width read is a guess, said and refused by --strict.
    Mixtral's experts are ``intermediate_size`` wide by its own convention: no guess."""
    raw = dict(builtin_presets()["qwen3-30b-a3b"])
    raw.pop("moe_intermediate_size")
    recorder = AssumptionRecorder()
    model = read_hf_config(raw, origin="qwen", recorder=recorder)
    assert model.kinds[0].ffn.expert_intermediate_size == raw["intermediate_size"]
    assert "model.moe_intermediate_size" in {a.field for a in recorder.items}
    with pytest.raises(InvalidInputError, match="moe_intermediate_size: not stated"):
        read_hf_config(raw, origin="qwen", recorder=AssumptionRecorder(strict=True))
    mixtral = AssumptionRecorder()
    preset("mixtral-8x7b", mixtral)
    assert "model.moe_intermediate_size" not in {a.field for a in mixtral.items}


def test_qwen3_next_linear_and_full_kinds() -> None:
    """Qwen3-Next-80B-A3B: full_attention_interval 4 → 36 gated-delta-net layers and 12
    gated full-attention layers, (linear ×3, full) repeated; every layer MoE with a gated
    shared expert."""
    h, vocab = 2048, 151936
    nk, dk, nv, dv, conv = 16, 128, 32, 128, 4
    a, g, d = 16, 2, 256
    e, fe, fs = 512, 512, 512
    model = preset("qwen3-next-80b-a3b")
    assert kinds(model) == [("linear+moe", 36), ("attn+moe", 12)]
    assert order(model) == ["linear+moe", "linear+moe", "linear+moe", "attn+moe"] * 12
    linear, full = model.kinds[0].attention, model.kinds[1].attention
    assert isinstance(linear, LinearAttention) and isinstance(full, StandardAttention)
    assert full.output_gate and full.qk_norm
    key, value = nk * dk, nv * dv
    linear_params = (
        h * (2 * key + 2 * value)  # in_proj_qkvz
        + h * 2 * nv  # in_proj_ba
        + (2 * key + value) * conv  # depthwise conv over q, k, v
        + 2 * nv  # dt_bias, A_log
        + dv  # gated RMSNorm
        + value * h  # out_proj
    )
    full_params = h * 2 * a * d + 2 * h * g * d + a * d * h + 2 * d  # q emits q and gate
    moe = e * 3 * h * fe + 3 * h * fs + h + h * e
    expected = (
        2 * vocab * h + 36 * (linear_params + moe + 2 * h) + 12 * (full_params + moe + 2 * h) + h
    )
    assert total(model) == expected


def test_qwen3_vl_text_tower_keeps_qk_norm() -> None:
    """Composite Qwen3-VL-8B: the text tower is a Qwen3-8B decoder (q/k norms); the vision
    tower is counted as its own part. (Regression: qwen3_vl_text was read as an unknown
    Llama-style type and lost its qk-norm.)"""
    recorder = AssumptionRecorder()
    model = preset("qwen3-vl-8b", recorder)
    assert model.kinds[0].attention.qk_norm
    count = count_parameters(model)
    assert count.total_parameters - count.parts["vision"] == total(preset("qwen3-8b"))
    assert "model.model_type" not in {a.field for a in recorder.items}


# ----------------------------------------------------------------------------- Mistral


def test_mistral_sliding_window() -> None:
    """Mistral-7B v0.1: every layer slides a 4096 window (kind 'swa+dense')."""
    h, layers, a, g, f, vocab = 4096, 32, 32, 8, 14336, 32000
    model = preset("mistral-7b-v0.1")
    assert kinds(model) == [("swa+dense", layers)]
    assert model.kinds[0].attention.sliding_window == 4096
    per_layer = gqa(h, a, g, 128) + 3 * h * f + 2 * h
    assert total(model) == 2 * vocab * h + layers * per_layer + h == 7_241_732_096


def test_mixtral_num_local_experts_alias() -> None:
    """Mixtral-8x7B states num_local_experts (alias of num_experts); experts are
    intermediate_size wide."""
    h, layers, a, g, vocab, e, fe = 4096, 32, 32, 8, 32000, 8, 14336
    model = preset("mixtral-8x7b")
    assert kinds(model) == [("attn+moe", layers)]
    assert model.kinds[0].ffn == MoEFFN(num_experts=e, top_k=2, expert_intermediate_size=fe)
    per_layer = gqa(h, a, g, 128) + e * 3 * h * fe + h * e + 2 * h
    assert total(model) == 2 * vocab * h + layers * per_layer + h == 46_702_792_704


# ----------------------------------------------------------------------------- DeepSeek


def mla(h: int, a: int, rq: int | None, rkv: int, nope: int, rope: int, v: int) -> int:
    q = h * rq + rq + rq * a * (nope + rope) if rq else h * a * (nope + rope)
    kv = h * (rkv + rope) + rkv + rkv * a * (nope + v)
    return q + kv + a * v * h


def test_deepseek_v2_lite_mla_first_k_dense_shared_experts() -> None:
    """DeepSeek-V2-Lite: MLA without a query latent, layer 0 dense
    (first_k_dense_replace 1), then 26 MoE layers of 64 routed + 2 shared experts."""
    h, vocab, a, f = 2048, 102400, 16, 10944
    e, k, fe, shared = 64, 6, 1408, 2
    model = preset("deepseek-v2-lite")
    assert kinds(model) == [("mla+dense", 1), ("mla+moe", 26)]
    assert order(model) == ["mla+dense"] + ["mla+moe"] * 26
    att = model.kinds[0].attention
    assert isinstance(att, LatentAttention) and att.q_lora_rank is None
    ffn = model.kinds[1].ffn
    assert (ffn.num_shared_experts, ffn.shared_intermediate_size) == (2, 2 * fe)
    attention = mla(h, a, None, 512, 128, 64, 128)
    dense = attention + 3 * h * f + 2 * h
    moe = attention + e * 3 * h * fe + shared * 3 * h * fe + h * e + 2 * h
    count = count_parameters(model)
    assert count.total_parameters == 2 * vocab * h + dense + 26 * moe + h == 15_706_484_224
    assert count.active_parameters == count.total_parameters - 26 * (e - k) * 3 * h * fe
    assert count.mtp_parameters == 0


def test_deepseek_v3_mla_with_query_latent_and_mtp() -> None:
    """DeepSeek-V3: q_lora_rank 1536, 3 dense layers then 58 MoE (256 + 1 shared, top-8),
    one MTP layer counted apart (n_routed_experts alias)."""
    h, vocab, a, f = 7168, 129280, 128, 18432
    e, k, fe = 256, 8, 2048
    model = preset("deepseek-v3")
    assert kinds(model) == [("mla+dense", 3), ("mla+moe", 58)]
    assert order(model)[:4] == ["mla+dense"] * 3 + ["mla+moe"]
    assert model.num_mtp_layers == 1 and model.mtp_kind is not None
    attention = mla(h, a, 1536, 512, 128, 64, 128)
    dense = attention + 3 * h * f + 2 * h
    moe = attention + e * 3 * h * fe + 3 * h * fe + h * e + 2 * h
    count = count_parameters(model)
    assert count.total_parameters == 2 * vocab * h + 3 * dense + 58 * moe + h
    assert count.active_parameters == count.total_parameters - 58 * (e - k) * 3 * h * fe
    assert count.mtp_parameters == moe + 3 * h + 2 * h * h


# ----------------------------------------------------------------------------- GPT-OSS


def test_gpt_oss_sliding_and_full_kinds() -> None:
    """GPT-OSS-120B: layer_types alternate sliding (window 128) and full attention;
    q/k/v/o biases, one sink logit per head, expert and router biases. OpenAI's model
    card: 116.83B total."""
    h, layers, a, g, d, vocab, e, f = 2880, 36, 64, 8, 64, 201088, 128, 2880
    model = preset("gpt-oss-120b")
    assert kinds(model) == [("swa+moe", 18), ("attn+moe", 18)]
    assert order(model) == ["swa+moe", "attn+moe"] * 18
    assert model.kinds[0].attention.sliding_window == 128
    assert model.kinds[1].attention.sliding_window is None
    attention = gqa(h, a, g, d) + (a * d + 2 * g * d) + h + a  # biases, sinks
    moe = h * e + e + e * (3 * h * f + 2 * f + h)  # router (+bias), experts (+biases)
    expected = 2 * vocab * h + layers * (attention + moe + 2 * h) + h
    assert total(model) == expected == 116_829_156_672


# ----------------------------------------------------------------------------- GPT-2


def test_gpt2_native_names_layernorm_biases_learned_positions() -> None:
    """GPT-2 XL states n_embd/n_layer/n_head/n_positions, no n_inner and no
    tie_word_embeddings: 4h MLP and tied head are transformers' defaults, recorded as
    assumptions. 1,557,611,200 parameters (openai-community/gpt2-xl)."""
    h, layers, vocab, positions = 1600, 48, 50257, 1024
    recorder = AssumptionRecorder()
    model = preset("gpt2-xl", recorder)
    assert kinds(model) == [("attn+dense", layers)]
    kind = model.kinds[0]
    assert (kind.norm, kind.norm_bias, model.position_embedding) == ("layernorm", True, "learned")
    assert kind.ffn == DenseFFN(
        intermediate_size=4 * h, gated=False, activation="gelu_new", bias=True
    )
    assert kind.attention.qkv_bias and kind.attention.out_bias
    per_layer = (
        4 * h * h + 4 * h  # c_attn (3h) and c_proj with biases
        + 2 * 4 * h * h + 4 * h + h  # c_fc, c_proj with biases
        + 2 * 2 * h  # ln_1, ln_2 (weight and bias)
    )  # fmt: skip
    expected = vocab * h + positions * h + layers * per_layer + 2 * h  # head tied
    assert total(model) == expected == 1_557_611_200
    fields = {a.field for a in recorder.items}
    assert {"model.intermediate_size", "model.tie_word_embeddings"} <= fields


# ----------------------------------------------------------------------------- composites


def test_llava_style_composite_plans_the_text_tower() -> None:
    """text_config is the decoder; vision_config becomes the vision tower (an
    approximate ViT census: attention and MLP with biases, two LayerNorms per layer,
    patch embedding, projector), recorded as an assumption."""
    recorder = AssumptionRecorder()
    model = fixture("llava_composite.json", recorder)
    h, layers, a, g, d, f, vocab = 2048, 22, 32, 4, 64, 5632, 32064
    assert kinds(model) == [("attn+dense", layers)]
    assert model.model_type == "llama"
    w, mlp, depth, patch, out = 1024, 4096, 24, 14, 768
    vision = depth * (4 * w * w + 4 * w + 2 * w * mlp + mlp + w + 4 * w)
    vision += 3 * patch * patch * w + w * out
    assert model.vision is not None and model.vision.parameters == vision
    text = 2 * vocab * h + layers * (gqa(h, a, g, d) + 3 * h * f + 2 * h) + h
    count = count_parameters(model)
    assert count.parts["vision"] == vision
    assert count.total_parameters == text + vision
    assert "model.vision_config" in {a.field for a in recorder.items}


def test_published_llava_without_text_shapes_is_refused() -> None:
    """llava-hf/llava-1.5-7b-hf states no text shapes (they are LlamaConfig defaults):
    absent is not zero, so the reader names the first missing field."""
    with pytest.raises(InvalidInputError, match="missing required field 'hidden_size'"):
        fixture("llava-1.5-7b-hf.json")


# ----------------------------------------------------------------------------- absent fields


def test_unknown_model_type_reads_standard_fields_with_an_assumption() -> None:
    h, layers, a, g, f, vocab = 1024, 4, 16, 4, 2816, 32000
    recorder = AssumptionRecorder()
    model = fixture("unknown_model_type.json", recorder)
    assert model.model_type == "acme_lm"
    assert kinds(model) == [("attn+dense", layers)]
    assert total(model) == 2 * vocab * h + layers * (gqa(h, a, g, h // a) + 3 * h * f + 2 * h) + h
    (assumption,) = recorder.items
    assert assumption.field == "model.model_type"
    assert "acme_lm" in str(assumption.value)
    assert recorder.line().startswith("assumed: model.model_type=")


def test_unknown_model_type_strict_names_the_field() -> None:
    with pytest.raises(InvalidInputError, match=r"model\.model_type.*--strict"):
        fixture("unknown_model_type.json", AssumptionRecorder(strict=True))


def test_known_config_is_strict_clean() -> None:
    """A config that states everything reads the same under --strict."""
    strict = preset("llama-3-8b", AssumptionRecorder(strict=True))
    assert strict == preset("llama-3-8b")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing_hidden_size.json", r"missing required field 'hidden_size'"),
        ("wrong_type.json", r"field 'hidden_size' must be an integer, got '4096'"),
        ("negative_layers.json", r"field 'num_hidden_layers' must be ≥ 1, got -2"),
        (
            "heads_not_dividing_hidden.json",
            r"hidden_size\(1000\) is not divisible by num_attention_heads\(7\)",
        ),
        ("not_json.json", r"not valid JSON"),
    ],
)
def test_malformed_configs_name_the_field(name: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        fixture(name)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"num_key_value_heads": 5}, r"not a multiple of num_key_value_heads\(5\)"),
        ({"tie_word_embeddings": "no"}, r"'tie_word_embeddings' must be true or false"),
        ({"num_experts": 4, "num_experts_per_tok": 8}, r"exceeds num_experts\(4\)"),
        ({"layer_types": ["full_attention", "mamba"]}, r"'mamba'"),
        (
            {"num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": "3"},
            r"'mlp_only_layers' must be a list of integers",
        ),
        ({"vocab_size": True}, r"'vocab_size' must be an integer"),
        ({"intermediate_size": 0}, r"'intermediate_size' must be ≥ 1, got 0"),
    ],
)
def test_more_bad_values(patch: dict, message: str) -> None:
    cfg = {**json.loads((CONFIGS / "unknown_model_type.json").read_text()), "model_type": "llama"}
    cfg["num_hidden_layers"] = 2
    cfg.update(patch)
    with pytest.raises(InvalidInputError, match=message):
        read_hf_config(cfg)


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[1, 2, 3]")
    with pytest.raises(InvalidInputError, match="JSON object"):
        load_config_file(path)


def test_mamba_hybrid_is_refused_naming_the_layer_type() -> None:
    with pytest.raises(InvalidInputError, match="layer type 'mamba'"):
        preset("nemotron-h-8b")


# ----------------------------------------------------------------------------- files


def test_an_unstated_tie_follows_the_familys_config_class() -> None:
    """transformers' LlamaConfig (and Mistral, Qwen, DeepSeek, GPT-OSS) default to an untied
    head; PretrainedConfig, which GPT-2 uses, to a tied one. Either way it is assumed aloud."""
    raw = dict(builtin_presets()["llama-3-8b"])
    raw.pop("tie_word_embeddings")
    recorder = AssumptionRecorder()
    assert not read_hf_config(raw, origin="llama", recorder=recorder).tie_word_embeddings
    assert "model.tie_word_embeddings" in {a.field for a in recorder.items}
    assert preset("gpt2-xl").tie_word_embeddings


def test_mlp_only_layers_must_name_layers_of_the_model() -> None:
    raw = dict(builtin_presets()["qwen3-30b-a3b"])
    raw["mlp_only_layers"] = [0, 1, 100]
    with pytest.raises(
        InvalidInputError, match="'mlp_only_layers' names layer 100, but the layers"
    ):
        read_hf_config(raw, origin="qwen", recorder=AssumptionRecorder())


def test_a_config_with_a_byte_order_mark_reads(tmp_path: Path) -> None:
    text = (CONFIGS / "model_dir" / "config.json").read_text(encoding="utf-8")
    path = tmp_path / "config.json"
    path.write_bytes("\ufeff".encode() + text.encode())
    plain = load_config_file(CONFIGS / "model_dir" / "config.json")
    assert load_config_file(path) == plain


def test_reader_takes_a_model_directory() -> None:
    reader = HFConfigReader()
    directory = CONFIGS / "model_dir"
    assert reader.can_read(directory)
    assert not reader.can_read(CONFIGS)
    model = reader.read(directory, AssumptionRecorder())
    h, vocab, f = 256, 1024, 688
    assert model.tie_word_embeddings
    assert total(model) == vocab * h + 2 * (4 * h * h + 3 * h * f + 2 * h) + h


def test_every_preset_reads_or_is_refused_by_name() -> None:
    """All 65 presets read; only the hybrid Mamba one is refused."""
    refused = []
    for preset_id in builtin_presets():
        try:
            preset(preset_id)
        except InvalidInputError as exc:
            refused.append((preset_id, "mamba" in str(exc)))
    assert len(builtin_presets()) == 65
    assert refused == [("nemotron-h-8b", True)]


# ----------------------------------------------------------------------------- BLOOM


@pytest.mark.parametrize("width_key", ["hidden_size", "n_embed"])
def test_bloom_reads_n_embed_and_alibi(width_key: str) -> None:
    """BLOOM-176B (bigscience/bloom): BloomConfig takes the width as hidden_size or as
    n_embed, heads and layers as n_head and n_layer; no n_inner means the 4h GELU MLP;
    positions are ALiBi (no position parameters). 176,247,242,752 parameters: the model
    card's 176,247,271,424 less the embedding LayerNorm's 2h, which ndplan does not
    count."""
    h, layers, vocab = 14336, 70, 250880
    raw = {
        "architectures": ["BloomForCausalLM"],
        "model_type": "bloom",
        width_key: h,
        "n_layer": layers,
        "n_head": 112,
        "vocab_size": vocab,
        "layer_norm_epsilon": 1e-5,
    }
    model = read_hf_config(raw, origin="bloom", recorder=AssumptionRecorder())
    assert model.hidden_size == h
    assert model.position_embedding == "alibi"
    assert kinds(model) == [("attn+dense", layers)]
    assert model.kinds[0].ffn.intermediate_size == 4 * h
    assert total(model) == 176_247_271_424 - 2 * h


def test_falcon_states_alibi() -> None:
    """Falcon's config says whether it uses ALiBi (the 7B and 40B use rotary)."""
    raw = {
        "model_type": "falcon",
        "hidden_size": 4544,
        "num_hidden_layers": 32,
        "num_attention_heads": 71,
        "vocab_size": 65024,
    }
    assert read_hf_config({**raw, "alibi": True}, origin="f").position_embedding == "alibi"
    assert read_hf_config({**raw, "alibi": False}, origin="f").position_embedding == "rope"


@pytest.mark.parametrize(
    ("preset_id", "limit"),
    [
        ("deepseek-v3", (8, 4)),  # noaux_tc: always group-limited
        ("deepseek-v2", (8, 3)),  # topk_method group_limited_greedy
        ("deepseek-v2-lite", (1, 1)),  # topk_method greedy: plain top-k
        ("kimi-k2", (1, 1)),  # n_group 1
        ("qwen3-30b-a3b", (1, 1)),  # no groups stated
    ],
)
def test_group_limited_routing_is_read_where_the_router_applies_it(
    preset_id: str, limit: tuple[int, int]
) -> None:
    model = preset(preset_id)
    moe = [k.ffn for k in model.kinds if isinstance(k.ffn, MoEFFN)]
    if model.mtp_kind is not None:
        moe.append(model.mtp_kind.ffn)
    assert moe and all(ffn.routing_group_limit == limit for ffn in moe)


def test_megatron_router_group_names_and_their_limits() -> None:
    """Megatron's moe_router_num_groups / moe_router_group_topk name the same limit; a
    limit that cannot hold its top-k, or groups that do not divide the experts, are
    refused naming the field."""
    raw = dict(builtin_presets()["deepseek-v3"])
    for key in ("n_group", "topk_group", "topk_method"):
        raw.pop(key)
    megatron = {**raw, "moe_router_num_groups": 8, "moe_router_group_topk": 2}
    spec = read_hf_config(megatron, origin="megatron")
    assert spec.kinds[-1].ffn.routing_group_limit == (8, 2)
    assert read_hf_config(raw, origin="none").kinds[-1].ffn.routing_group_limit == (1, 1)
    with pytest.raises(InvalidInputError, match="topk_group"):
        read_hf_config(
            {**megatron, "moe_router_group_topk": 1, "num_experts_per_tok": 40}, origin="x"
        )
    with pytest.raises(InvalidInputError, match="n_group"):
        read_hf_config({**megatron, "moe_router_num_groups": 7}, origin="x")
    with pytest.raises(InvalidInputError, match="topk_group"):
        read_hf_config({**raw, "n_group": 8}, origin="x")
