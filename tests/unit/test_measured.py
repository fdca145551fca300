"""Measured runs as pricing cases (issue 5; ``ndplan.adapters.measured``).

- precision strings map to bf16 / fp8 / fp8-blockwise / mxfp8 / fp4, framework strings to
  megatron / torchtitan (llm-foundry's Composer is priced with torchtitan's traits);
- LoRA rows price as ``finetune="lora"``; torchtitan rows that omit seq_len take it from
  the row's notes (and rows whose notes give none are skipped);
- Megatron-LM README rows resolve to the H100-family presets by their shapes (their
  label ``GPT-1.7B`` is also the 2021 paper's model); hybrid Mamba rows are skipped with
  a reason naming Mamba;
- the measured step time: ``step_time_s`` as stated, tokens/s → ``gbs·seq/(tokens·N)``,
  TFLOP/s only → back through the FLOP count with full attention before Megatron-Bridge
  25.09 and causal attention for Megatron-Bridge, checked by hand on a few rows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ndplan.adapters.measured import (
    REQUIRED_COLUMNS,
    SQUAD_DOCUMENT_TOKENS,
    RunCase,
    RunInterpreter,
    Skip,
    framework_of,
    precision_of,
    read_rows,
    recompute_of,
    release_number,
    source_short,
    zero_of,
)
from ndplan.core.counting import count_flops
from ndplan.core.errors import InvalidInputError
from ndplan.planner import Planner, PricingOptions
from ndplan.validation import price_case, unstated_mbs_variants

# = tests/conftest.py::SHARED_DATA
SHARED_DATA = Path(__file__).resolve().parents[1] / "data" / "shared"
RUNS = SHARED_DATA / "measured_runs.csv"
ROWS = read_rows(RUNS)
BY_ID = {int(r["row_id"]): r for r in ROWS}


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


@pytest.fixture(scope="module")
def interpreter(planner: Planner) -> RunInterpreter:
    return RunInterpreter(planner.components.presets, planner.components.devices)


@pytest.fixture(scope="module")
def interpreted(interpreter: RunInterpreter) -> dict[int, RunCase | Skip]:
    """Every row of the data, interpreted once."""
    return {int(r["row_id"]): interpreter.interpret(r) for r in ROWS}


def case(interpreter: RunInterpreter, row_id: int, **changes: str) -> RunCase:
    out = interpreter.interpret({**BY_ID[row_id], **changes})
    assert isinstance(out, RunCase), out
    return out


def skip(interpreter: RunInterpreter, row_id: int, **changes: str) -> Skip:
    out = interpreter.interpret({**BY_ID[row_id], **changes})
    assert isinstance(out, Skip), out
    return out


# --------------------------------------------------------------------------- mappings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("BF16", "bf16"),
        ("amp_bf16 (MP Mode DEFAULT)", "bf16"),
        ("bf16 (MP Mode PURE)", "bf16"),
        ("FP8", "fp8"),
        ("FP8-CS", "fp8"),
        ("FP8 (current scaling)", "fp8"),
        ("FP8 (25.09 table has no precision column)", "fp8"),
        ("amp_fp8 (MP Mode DEFAULT)", "fp8"),
        ("BF16 + Float8 linears", "fp8"),
        ("FP8 blockwise 128x128 weights / 1x128 activations", "fp8-blockwise"),
        ("MXFP8", "mxfp8"),
        ("FP8-MX", "mxfp8"),
        ("MXFP8 32x32 (footnote)", "mxfp8"),
        ("NVFP4", "fp4"),
        ("", None),
    ],
)
def test_precision_strings(text: str, expected: str | None) -> None:
    assert precision_of(text) == expected


def test_every_precision_string_in_the_data_is_mapped() -> None:
    known = {"bf16", "fp8", "fp8-blockwise", "mxfp8", "fp4", None}
    for text in {r["precision"] for r in ROWS}:
        assert precision_of(text) in known, text


@pytest.mark.parametrize(
    ("framework", "source", "expected"),
    [
        (
            "Megatron-Bridge / Megatron-Core",
            "NVIDIA Megatron-Bridge performance summary",
            "megatron",
        ),
        ("NeMo 2.0 (Megatron-Core)", "NVIDIA NeMo Framework performance summary", "megatron"),
        ("Megatron-LM (2021)", "Narayanan et al. 2021", "megatron"),
        ("Megatron-Core r0.8.0", "Megatron-LM README weak-scaling", "megatron"),
        ("Composer/llm-foundry (PyTorch FSDP)", "MosaicML llm-foundry", "composer"),
        ("torchtitan (FSDP2/DTensor)", "torchtitan benchmarks (Meta/PyTorch)", "torchtitan"),
        ("torchtitan FSDP2+TP (2D)", "torchtitan docs/performance.md", "torchtitan"),
    ],
)
def test_framework_strings(framework: str, source: str, expected: str) -> None:
    assert framework_of({"framework": framework, "source": source}) == expected


def test_every_row_prices_with_its_frameworks_traits(
    interpreted: dict[int, RunCase | Skip],
) -> None:
    """Composer rows take torchtitan's traits (FSDP, its recompute); nothing else appears."""
    seen = set()
    for row in ROWS:
        out = interpreted[int(row["row_id"])]
        if isinstance(out, Skip):
            continue
        fw = row["framework"].lower()
        expected = "torchtitan" if ("torchtitan" in fw or "composer" in fw) else "megatron"
        assert out.job.framework == expected, (out.row_id, row["framework"])
        if "composer" in fw:
            assert out.layout.zero in (2, 3), out.row_id  # FULL_SHARD / SHARD_GRAD_OP
        seen.add(out.job.framework)
    assert seen == {"megatron", "torchtitan"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ("none", None)),
        ("none", ("none", None)),
        ("no", ("none", None)),
        ("full", ("full", None)),
        ("full (activation checkpointing)", ("full", None)),
        ("selective", ("selective", None)),
        ("selective op", ("selective", None)),
        ("selective (attention core)", ("selective", None)),
        ("selective layer", ("none", 2)),
    ],
)
def test_recompute_strings(text: str, expected: tuple) -> None:
    assert recompute_of(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", None),
        ("FSDP FULL_SHARD (ZeRO-3)", 3),
        ("FSDP SHARD_GRAD_OP (ZeRO-2)", 2),
        ("FSDP2", 3),
        ("FSDP2 (ZeRO-3-like)", 3),
        ("megatron-fsdp", 3),
    ],
)
def test_zero_strings(text: str, expected: int | None) -> None:
    assert zero_of(text, "megatron") == expected


def test_source_short_names() -> None:
    assert {source_short(r["source"]) for r in ROWS} == {
        "megatron-bridge",
        "nemo",
        "nemo-cp",
        "llm-foundry",
        "torchtitan",
        "torchtitan-2024",
        "narayanan-2021",
        "megatron-lm",
        "korthikanti-2022",
    }


# --------------------------------------------------------------------------- interpretation


def test_precision_reaches_the_job(interpreter: RunInterpreter) -> None:
    for row_id, expected in ((1, "mxfp8"), (320, "fp8"), (371, "bf16"), (373, "fp8")):
        assert case(interpreter, row_id).job.precision == expected
    nvfp4 = next(
        r for r in ROWS if r["precision"] == "NVFP4" and not r["model_type"].startswith("hybrid")
    )
    out = interpreter.interpret(nvfp4)
    assert isinstance(out, RunCase) and out.job.precision == "fp4"
    blockwise = next(r for r in ROWS if "blockwise" in r["precision"])
    out = interpreter.interpret(blockwise)
    assert isinstance(out, RunCase) and out.job.precision == "fp8-blockwise"
    unstated = case(interpreter, 1, precision="")
    assert unstated.job.precision == "bf16" and "precision=bf16" in unstated.assumed


def test_fp4_on_a_device_without_an_fp4_rate_is_skipped(interpreter: RunInterpreter) -> None:
    out = skip(interpreter, 371, precision="NVFP4")  # H100: no fp4 tensor cores
    assert "fp4" in out.reason


def test_lora_rows_price_as_lora(interpreted: dict[int, RunCase | Skip]) -> None:
    lora = [r for r in ROWS if r["workload"].lower() == "lora"]
    assert len(lora) == 8
    for row in lora:
        out = interpreted[int(row["row_id"])]
        assert isinstance(out, RunCase), out
        assert out.job.finetune == "lora", out.row_id
    for row in ROWS:
        if row["workload"].lower() in ("sft", "pretrain"):
            out = interpreted[int(row["row_id"])]
            if isinstance(out, RunCase):
                assert out.job.finetune == "full", out.row_id


def test_torchtitan_rows_without_seq_len_take_it_from_the_notes(
    interpreter: RunInterpreter,
) -> None:
    omitted = [r for r in ROWS if not r["seq_len"].strip()]
    from_notes = [r for r in omitted if re.search(r"default[^.;]* is (\d+)", r["notes"])]
    assert {int(r["row_id"]) for r in from_notes} == {371, 372, 373, 378, 379, 380}
    for row in from_notes:
        out = interpreter.interpret(row)
        assert isinstance(out, RunCase), out
        assert out.source == "torchtitan"
        assert out.job.seq_length == 8192  # "torchtitan llama3 toml default at 9dec370 is 8192"
        assert "seq_len=8192 (source's default, from notes)" in out.assumed
    # a different default in the notes is what is used
    other = case(interpreter, 371, notes="seq_len not stated; the toml default at abc is 4096")
    assert other.job.seq_length == 4096
    # rows whose notes give no default are skipped, not guessed
    for row in omitted:
        if row not in from_notes:
            out = interpreter.interpret(row)
            assert isinstance(out, Skip) and out.reason == "sequence length not stated"


def test_megatron_readme_rows_resolve_to_the_h100_presets(interpreter: RunInterpreter) -> None:
    readme = [r for r in ROWS if source_short(r["source"]) == "megatron-lm"]
    assert len(readme) == 9
    for row in readme:
        spec, preset = interpreter.model_for(row)
        assert spec is not None, preset
        assert preset.startswith("megatron-h100-gpt-"), (row["model"], preset)
        assert spec.hidden_size == int(row["hidden"])
        assert spec.num_layers == int(row["layers"])
        assert spec.vocab_size == 131072
    # 'GPT-1.7B' names two models: the README's (h=2048, V=131072) and the 2021 paper's
    # (h=2304, V=51200); each row gets the one its shapes describe.
    readme_17 = next(r for r in readme if r["model"] == "GPT-1.7B")
    paper_17 = next(r for r in ROWS if r["model"] == "GPT-1.7B" and r is not readme_17)
    assert interpreter.model_for(readme_17)[1] == "megatron-h100-gpt-1.7b"
    spec, preset = interpreter.model_for(paper_17)
    assert preset == "megatron-gpt-1.7b" and spec.hidden_size == 2304


def test_shapes_that_disagree_with_every_preset_are_skipped(interpreter: RunInterpreter) -> None:
    out = skip(interpreter, 344, hidden="2050")
    assert "GPT-1.7B" in out.reason or "gpt-1.7b" in out.reason
    unknown = skip(interpreter, 344, model="Nonexistent-9B", hidden="2050")
    assert "architecture" in unknown.reason and "unknown" in unknown.reason


def test_a_label_without_preset_or_shapes_is_skipped(interpreter: RunInterpreter) -> None:
    """With no shape stated every preset "agrees": an unknown label must not take the first
    preset (DeepSeekV4 Flash was priced as DeepSeek-V2 236B before the fix)."""
    for row_id in (3, 4):
        row = BY_ID[row_id]
        assert row["model"] == "DeepSeekV4 Flash" and not row["layers"] and not row["hidden"]
        out = skip(interpreter, row_id)
        assert out.reason.startswith("architecture of 'DeepSeekV4 Flash' unknown"), out
    blank = {c: "" for c in BY_ID[1]}
    out = interpreter.interpret({**blank, "row_id": "9", "model": "Mystery-7B", "num_gpus": "8"})
    assert isinstance(out, Skip) and "unknown" in out.reason
    # a named preset still resolves without shapes; stated shapes still select a preset
    assert interpreter.model_for({**blank, "model": "Llama 3 70B"})[1] == "llama-3-70b"
    spec, preset = interpreter.model_for(BY_ID[344])
    assert spec is not None and preset == "megatron-h100-gpt-1.7b"


def test_hybrid_mamba_rows_are_skipped_naming_mamba(
    interpreted: dict[int, RunCase | Skip],
) -> None:
    hybrid = [r for r in ROWS if r["model_type"].startswith("hybrid")]
    assert len(hybrid) == 53
    for row in hybrid:
        out = interpreted[int(row["row_id"])]
        assert isinstance(out, Skip), row["row_id"]
        assert "Mamba" in out.reason


def test_layout_from_the_stated_degrees(interpreter: RunInterpreter) -> None:
    c = case(interpreter, 1)  # DeepSeekV3 GB300: 256 GPUs, tp1 pp2 vpp8 cp1 ep32, gbs 4096
    lay = c.layout
    assert (lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.dp, lay.mbs) == (1, 2, 8, 1, 32, 128, 1)
    assert lay.num_microbatches == 4096 // 128
    assert lay.schedule == "interleaved"
    assert c.moe and c.family == "deepseek" and c.hardware == "gb300"
    assert c.job.grad_reduce_dtype == "bf16"  # NVIDIA's performance recipes
    assert "distributed optimizer" in c.assumed and lay.zero == 1
    # FSDP rows: ZeRO-3, no sequence parallelism without TP
    t = case(interpreter, 405)
    assert (t.layout.dp, t.layout.zero, t.layout.sp, t.layout.recompute) == (64, 3, False, "full")


def test_an_unstated_expert_tp_folds_where_ep_reaches_into_the_tp_ranks(
    interpreter: RunInterpreter,
) -> None:
    """Qwen3 235B on 64 GB200 at tp 2, ep 64, read as a source without recipes of its own
    would be: expert TP 2 would need 128 ranks, so the run folded the experts (ETP 1).
    Before, the row was priced at expert TP 2, a layout Megatron cannot run; a stated
    expert TP and one that fits are kept."""
    folded = case(interpreter, 276, source_id="S4")
    assert (folded.layout.tp, folded.layout.ep, folded.layout.dp) == (2, 64, 32)
    assert folded.layout.etp == 1 and "etp" in folded.unstated
    assert "etp=1 (ep 64 reaches into the tp 2 ranks)" in folded.assumed
    kept = case(interpreter, 276, ep="32", source_id="S4")  # expert TP 2 fits 32·2 = 64 ranks
    assert kept.layout.etp is None and kept.layout.expert_tp == 2 and "etp" not in kept.unstated
    stated = case(interpreter, 276, etp="2")
    assert stated.layout.etp == 2 and "etp" not in stated.unstated


def test_megatron_bridge_moe_rows_run_expert_tp_1_as_their_recipes_set_it(
    interpreter: RunInterpreter,
) -> None:
    """Megatron-Bridge's MoE presets set expert_tensor_parallel_size=1 (DeepSeek-V3 on
    1,024 H100 at tp 2, ep 64 among them), where Megatron alone would take TP's; the
    table leaves it out, so the row says it was assumed. A stated one is kept."""
    for row_id in (290, 276):
        c = case(interpreter, row_id)
        assert c.layout.tp == 2 and c.layout.etp == 1 and "etp" in c.unstated, row_id
        assert "etp=1 (the source's MoE recipes set expert TP 1)" in c.assumed
    assert case(interpreter, 290, etp="2").layout.etp == 2


def test_a_table_without_an_interleaving_column_leaves_vpp_unstated(
    interpreter: RunInterpreter,
) -> None:
    """NeMo 24.07's fine-tuning table has no VP column: its pipelined rows' empty vpp is
    unstated (priced at 1, and recorded as assumed), while the same release's
    pre-training table states VP, and an empty vpp elsewhere still means 1."""
    sft = case(interpreter, 307)  # Llama 2 13B SFT, 8 H100, tp1 pp4
    assert sft.layout.pp == 4 and sft.layout.vpp == 1
    assert "vpp" in sft.unstated and "vpp=1" in sft.assumed
    unpipelined = case(interpreter, 306)  # pp 1: nothing to interleave
    assert "vpp" not in unpipelined.unstated
    pretraining = case(interpreter, 299)  # the pre-training table: pp4 × vpp10
    assert pretraining.layout.vpp == 10 and "vpp" not in pretraining.unstated
    bridge = case(interpreter, 43)  # Megatron-Bridge, pp 8, its VP cell empty
    assert bridge.layout.vpp == 1 and "vpp" not in bridge.unstated


def test_llm_foundry_rows_use_its_fused_cross_entropy(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """llm-foundry's MPT defaults to flash-attn's fused cross-entropy: its rows keep no
    fp32 copy of the logits (torchtitan's own rows do), so the 65,536-token MPT-350m
    micro-batch that ran on 80 GB A100s is priced as fitting."""
    foundry = case(interpreter, 535)
    assert foundry.job.fused_loss is True and foundry.job.framework == "torchtitan"
    assert case(interpreter, 371).job.fused_loss is None  # torchtitan's default: not fused
    ctx = planner.context(foundry.model, foundry.device, foundry.num_devices, foundry.job)
    memory = planner.estimate(ctx, foundry.layout).memory
    assert memory.fits
    tokens = foundry.layout.mbs * foundry.job.seq_length
    assert memory.stages[0].parts["loss_activations"] < 3 * tokens * foundry.model.vocab_size


def test_megatron_2022_rows_run_their_tp_collectives_in_line(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """Korthikanti et al. (2022) measured Megatron-LM before Transformer Engine's TP
    overlap existed: their rows expose every TP collective, so tp 8 costs more than the
    same layout with the framework's fitted overlap (row 364, with SP; row 363 runs
    without SP, where no overlap applies either way). The 2024 Megatron-LM README rows
    state --tp-comm-overlap and keep the default."""
    assert case(interpreter, 347).job.tp_comm_overlap is None

    def tp_comm(row: int, overlap: bool) -> float:
        run = case(interpreter, row)
        assert run.job.tp_comm_overlap is False and run.layout.tp == 8
        job = run.job.model_copy(update={"tp_comm_overlap": overlap})
        ctx = planner.context(run.model, run.device, run.num_devices, job)
        return planner.estimate(ctx, run.layout).time.parts["tp_comm"]

    assert tp_comm(364, overlap=False) > tp_comm(364, overlap=True) > 0
    assert tp_comm(363, overlap=False) == tp_comm(363, overlap=True) > 0


def test_nemo_1_rows_keep_bf16_weights_beside_their_fp8_copies(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """NeMo 24.x performance runs used NeMo 1.0 launcher configs, which leave fp8_params
    off; NeMo 2.0 (25.x) and Megatron-Bridge recipes turn --fp8-param-gather on, so their
    rows keep the default."""
    nemo_1 = case(interpreter, 300)  # NeMo 24.07, LLAMA2-70B fp8
    assert nemo_1.job.precision == "fp8" and nemo_1.job.fp8_param_gather is False
    for row in (36, 261):  # Megatron-Bridge fp8 rows
        assert case(interpreter, row).job.fp8_param_gather is None
    ctx = planner.context(nemo_1.model, nemo_1.device, nemo_1.num_devices, nemo_1.job)
    kept = planner.estimate(ctx, nemo_1.layout).memory.stages[0].parts["weights"]
    primary_job = nemo_1.job.model_copy(update={"fp8_param_gather": True})
    ctx = planner.context(nemo_1.model, nemo_1.device, nemo_1.num_devices, primary_job)
    primary = planner.estimate(ctx, nemo_1.layout).memory.stages[0].parts["weights"]
    assert primary < kept / 4


def test_nvidia_recipe_rows_defer_the_output_layer_weight_gradient(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """NeMo 2.0's recipes and Megatron-Bridge's Llama recipes defer the last stage's
    output-layer weight gradient to the pipeline drain (22 micro-batches); Megatron-Bridge's
    MoE performance configs and NeMo 1.0's launcher configs (the NeMo 24.x rows) never set
    it, and Megatron-LM's own rows keep Megatron-Core's default: off."""
    row = case(interpreter, 80)  # Megatron-Bridge, Llama-3 70B, tp4 pp8×5, 128 micro-batches
    assert row.job.defer_embedding_wgrad is True and row.layout.pp == 8
    for other in (331, 340, 36):  # NeMo 25.02 and 25.04, Megatron-Bridge Llama 3.1 405B
        assert case(interpreter, other).job.defer_embedding_wgrad is True
    # NeMo 24.x (300, 302, 321); Megatron-Bridge's DeepSeek, Kimi, GPT-OSS, Qwen3 (2, 53, 96, 264)
    for off in (300, 302, 321, 2, 53, 96, 264):
        assert case(interpreter, off).job.defer_embedding_wgrad is False, off
    assert case(interpreter, 349).job.defer_embedding_wgrad is None  # Megatron-LM README
    ctx = planner.context(row.model, row.device, row.num_devices, row.job)
    assert ctx.deferred_head_wgrads(row.layout) == 22
    deferred = planner.estimate(ctx, row.layout)
    inline_job = row.job.model_copy(update={"defer_embedding_wgrad": False})
    ctx = planner.context(row.model, row.device, row.num_devices, inline_job)
    inline = planner.estimate(ctx, row.layout)
    assert deferred.time.step_s < inline.time.step_s
    assert deferred.memory.stages[-1].parts["deferred_wgrad_buffers"] > 0


def test_squad_fine_tuning_rows_attend_within_packed_documents(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """NeMo's fine-tuning rows say "SQuAD-v1.1 packed to 4096"; Megatron-Bridge's SFT and
    LoRA recipes pack SQuAD the same way. Pre-training rows hold one document a sequence."""
    for row in (307, 309, 64, 69):  # NeMo SFT and LoRA; Megatron-Bridge SFT and LoRA
        assert case(interpreter, row).job.document_tokens == SQUAD_DOCUMENT_TOKENS
    for row in (80, 300, 349):
        assert case(interpreter, row).job.document_tokens is None
    sft = case(interpreter, 307)
    ctx = planner.context(sft.model, sft.device, sft.num_devices, sft.job)
    packed = planner.estimate(ctx, sft.layout).time.step_s
    whole_job = sft.job.model_copy(update={"document_tokens": None})
    ctx = planner.context(sft.model, sft.device, sft.num_devices, whole_job)
    assert packed < planner.estimate(ctx, sft.layout).time.step_s


def test_megatron_bridge_fsdp_rows_may_offload_activations(interpreter: RunInterpreter) -> None:
    """Megatron-Bridge's Megatron-FSDP performance recipes offload the activations of some
    layers to host memory (cpu_offloading_num_layers); its other rows, and other sources,
    keep the default (off)."""
    for row in (77, 268, 270):  # Llama-3 70B / 3.1 405B on GB200, Megatron-FSDP
        c = case(interpreter, row)
        assert c.layout.zero == 3 and c.job.activation_offload is True
    for row in (36, 300, 347):
        assert case(interpreter, row).job.activation_offload is None


def test_megatron_bridge_deepseek_v3_rows_run_the_recipes_uneven_split(
    interpreter: RunInterpreter,
) -> None:
    """Megatron-Bridge's DeepSeek-V3 layout leaves the last chunk room for MTP and the
    loss (three layers' worth): pp 16 → 4×15 + 1, pp 8 → 8×7 + 5, and the same decoder
    counts per chunk under vpp. 32 chunks leave too little room (64 slots / 32 = 2 < 3):
    with MTP the H100 recipe runs them as ``Et|(tt|)*30mL``; without MTP no recipe
    layout is known and the even split stays."""
    assert case(interpreter, 137).layout.layers_per_stage == (4,) * 15 + (1,)  # pp16 B200
    assert case(interpreter, 43).layout.layers_per_stage == (8,) * 7 + (5,)  # pp8 B300
    assert case(interpreter, 1).layout.layers_per_stage == (4,) * 15 + (1,)  # pp2 × vpp8
    h100 = case(interpreter, 290)  # pp8 × vpp4, MTP
    assert h100.model.num_mtp_layers == 1
    assert h100.layout.layers_per_stage == (1,) + (2,) * 30 + (0,)
    assert case(interpreter, 248).layout.layers_per_stage is None  # pp8 × vpp4, w/o MTP
    # Another source, or another model, keeps the even split.
    assert (
        case(interpreter, 137, source="NVIDIA NeMo performance summary").layout.layers_per_stage
        is None
    )
    assert case(interpreter, 80).layout.layers_per_stage is None  # Llama 3 70B pp8 × vpp5


def test_a_without_mtp_tag_switches_mtp_off(interpreter: RunInterpreter) -> None:
    assert "w/o MTP" in BY_ID[238]["notes"]
    assert case(interpreter, 238).model.num_mtp_layers == 0
    assert case(interpreter, 256).model.num_mtp_layers == 1  # "(w/ MTP)"


def test_rows_lacking_degrees_or_batch_are_skipped(interpreter: RunInterpreter) -> None:
    assert skip(interpreter, 353).reason == "degrees not stated (only the TP·PP product)"
    assert skip(interpreter, 1, num_gpus="").reason == "device count not stated"
    assert "does not divide" in skip(interpreter, 1, num_gpus="255").reason
    assert "not a multiple" in skip(interpreter, 336).reason  # GBS=1/MBS=64 as printed
    assert "catalog" in skip(interpreter, 1, hardware="Imaginary-GPU 9000").reason
    assert (
        "no throughput" in skip(interpreter, 1, tokens_per_sec_per_gpu="", tflops_per_gpu="").reason
    )


def test_check_rows_are_flagged(interpreter: RunInterpreter) -> None:
    assert case(interpreter, 316).check
    assert not case(interpreter, 320).check


# --------------------------------------------------------------------------- measured step time


def test_step_time_from_tokens_per_second(interpreter: RunInterpreter) -> None:
    # row 1: gbs 4096 × seq 4096 tokens per step; 6288 tokens/s on each of 256 GPUs.
    # It also states 1635 TFLOP/s: tokens/s wins, being what the cluster measured.
    c = case(interpreter, 1)
    assert c.step_from == "tokens/s"
    assert c.measured_step_s == pytest.approx(4096 * 4096 / (6288 * 256))
    # row 405 (torchtitan, 64 A100): gbs 64 × seq 8192 at 331 tokens/s/GPU
    c = case(interpreter, 405)
    assert c.measured_step_s == pytest.approx(64 * 8192 / (331 * 64))
    # a row giving only the total throughput
    total = case(interpreter, 405, tokens_per_sec_per_gpu="", tokens_per_sec_total="21184")
    assert total.step_from == "tokens/s"
    assert total.measured_step_s == pytest.approx(64 * 8192 / 21184)


def test_step_time_as_stated(interpreter: RunInterpreter) -> None:
    for row_id in (363, 364, 365, 366, 367, 368, 369, 370):  # Korthikanti 2022
        c = case(interpreter, row_id)
        assert c.step_from == "step_time"
        assert c.measured_step_s == float(BY_ID[row_id]["step_time_s"])
    # step_time_s wins over tokens/s when both are stated
    both = case(interpreter, 405, step_time_s="30.0")
    assert both.measured_step_s == 30.0 and both.step_from == "step_time"


def test_step_time_from_tflops_full_attention_by_hand(interpreter: RunInterpreter) -> None:
    # row 344: Megatron-LM README (2024, full attention), GPT-1.7B on 48 H100, gbs 192,
    # seq 4096, 408.8 TFLOP/s. An ungated 4h GELU MLP, MHA and untied V=131072:
    # training FLOPs/token = 72·l·h²·(1 + s/(6h) + V/(12·l·h)).
    row = BY_ID[344]
    assert (row["tflops_per_gpu"], row["tokens_per_sec_per_gpu"], row["step_time_s"]) == (
        "408.8",
        "",
        "",
    )
    layers, h, s, v = 24, 2048, 4096, 131072
    per_token = 72 * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    c = case(interpreter, 344)
    assert c.step_from == "tflops (full attention)"
    assert c.measured_step_s == pytest.approx(192 * s * per_token / (408.8e12 * 48), rel=1e-9)
    assert c.measured_step_s == pytest.approx(0.4519, abs=1e-4)

    # row 320: NeMo long-context table (full attention), LLAMA2-7B on 4 H100, gbs 1024,
    # seq 4096, 768 TFLOP/s. SwiGLU (f = 11008), MHA, V = 32000:
    # 3·[l·(8h² + 6·h·f + 4·s·h) + 2·h·V].
    layers, h, s, v, f = 32, 4096, 4096, 32000, 11008
    per_token = 3 * (layers * (8 * h * h + 6 * h * f + 4 * s * h) + 2 * h * v)
    c = case(interpreter, 320)
    assert c.step_from == "tflops (full attention)"
    assert c.measured_step_s == pytest.approx(1024 * s * per_token / (768e12 * 4), rel=1e-9)


def test_step_time_from_tflops_causal_for_megatron_bridge(interpreter: RunInterpreter) -> None:
    # row 291 is the one Megatron-Bridge row with only TFLOP/s: from 25.09 the bridge
    # counts causal attention, so the conversion must use the causal count.
    row = BY_ID[291]
    assert source_short(row["source"]) == "megatron-bridge"
    assert not row["tokens_per_sec_per_gpu"] and not row["step_time_s"]
    c = case(interpreter, 291)
    assert c.step_from == "tflops (causal attention)"
    seq, gbs, n, tflops = 4096, 8192, 1024, 330.0
    assert (c.job.seq_length, c.job.global_batch_size, c.num_devices) == (seq, gbs, n)
    causal = count_flops(c.model, seq, "causal").training_flops_per_token
    full = count_flops(c.model, seq, "full").training_flops_per_token
    assert causal < full  # the convention matters on this row (≈ 11 %)
    assert c.measured_step_s == pytest.approx(gbs * seq * causal / (tflops * 1e12 * n), rel=1e-12)
    # the same figure from a NeMo (pre-25.09) source would be read with full attention
    nemo = case(interpreter, 291, source="NVIDIA NeMo Framework performance summary")
    assert nemo.step_from == "tflops (full attention)"
    assert nemo.measured_step_s == pytest.approx(gbs * seq * full / (tflops * 1e12 * n))


def test_every_tflops_only_row_uses_its_sources_convention(
    interpreted: dict[int, RunCase | Skip],
) -> None:
    checked = 0
    for row in ROWS:
        if row["tokens_per_sec_per_gpu"] or row["tokens_per_sec_total"] or row["step_time_s"]:
            continue
        out = interpreted[int(row["row_id"])]
        if isinstance(out, Skip):
            continue
        convention = "causal" if out.source == "megatron-bridge" else "full"
        assert out.step_from == f"tflops ({convention} attention)", out.row_id
        per_token = count_flops(out.model, out.job.seq_length, convention).training_flops_per_token
        expected = (
            out.job.global_batch_size
            * out.job.seq_length
            * per_token
            / (float(row["tflops_per_gpu"]) * 1e12 * out.num_devices)
        )
        assert out.measured_step_s == pytest.approx(expected), out.row_id
        checked += 1
    assert checked == 25


# --------------------------------------------------------------------------- reading


def test_read_rows_refuses_a_csv_without_the_required_columns(tmp_path: Path) -> None:
    bad = tmp_path / "runs.csv"
    bad.write_text("row_id,model\n1,llama\n", encoding="utf-8")
    with pytest.raises(InvalidInputError, match="missing column"):
        read_rows(bad)
    with pytest.raises(InvalidInputError, match="cannot read"):
        read_rows(tmp_path / "absent.csv")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"row_id,source,model,hardware,num_gpus\n\xff1,a,b,c,8\n")
    with pytest.raises(InvalidInputError, match="UTF-8 CSV"):
        read_rows(binary)
    short = tmp_path / "short.csv"
    short.write_text("row_id,source,model,hardware,num_gpus\n1,a\n", encoding="utf-8")
    assert read_rows(short) == [
        {"row_id": "1", "source": "a", "model": "", "hardware": "", "num_gpus": ""}
    ]
    assert set(REQUIRED_COLUMNS) <= set(ROWS[0])


def test_an_unstated_micro_batch_is_priced_at_the_fastest_that_fits(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """The Megatron-LM README gives no micro-batch size: its GPT-32B row (tp8, dp48, four
    sequences per replica) is priced at each size the batch allows and the fastest that
    fits stands for it, as the search would choose; a stated size is priced as stated."""
    calibration = planner.calibration(None)
    unstated = case(interpreter, 347)
    assert unstated.unstated == frozenset({"mbs"}) and unstated.layout.mbs == 1
    sizes = [lay.mbs for lay in unstated_mbs_variants(unstated)]
    assert sizes == [2, 4]
    each = {
        mbs: price_case(planner, case(interpreter, 347, micro_batch_size=str(mbs)), calibration)
        for mbs in (1, 2, 4)
    }
    assert all(r.fits for r in each.values())
    fastest = min(each, key=lambda mbs: each[mbs].predicted_s)
    priced = price_case(planner, unstated, calibration)
    assert priced.predicted_s == each[fastest].predicted_s < each[1].predicted_s
    assert f" mbs{fastest} " in priced.layout
    assert f"mbs={fastest} (unstated: the fastest that fits)" in priced.assumed
    stated = case(interpreter, 347, micro_batch_size="1")
    assert stated.unstated == frozenset() and unstated_mbs_variants(stated) == []


def test_an_unstated_micro_batch_keeps_its_default_when_no_size_fits(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """With room for no size, the row is priced at mbs 1, as not fitting."""
    calibration = planner.calibration(None)
    tiny = {**BY_ID[347], "hardware": "a100-40gb"}  # GPT-32B on tp8 and 40 GB
    cramped = interpreter.interpret({**tiny, "seq_len": "65536", "global_batch_size": "192"})
    assert isinstance(cramped, RunCase)
    priced = price_case(planner, cramped, calibration)
    assert not priced.fits and " mbs1 " in priced.layout
    assert "mbs=1 (unstated: no size fits)" in priced.assumed


def test_layer_level_checkpointing_recomputes_every_second_layer_whole(
    planner: Planner, interpreter: RunInterpreter
) -> None:
    """torchtitan's "selective layer" AC wraps every second layer in a checkpoint: row 403
    (Llama 3 8B, 32 layers, FSDP on 64 A100) recomputes 16 layers whole and keeps the
    other 16, so its recompute time is half of full recompute's and its activations the
    mean of the kept and the whole-layer options."""
    calibration = planner.calibration(None)
    mixed = case(interpreter, 403)
    assert mixed.whole_layer_every == 2 and mixed.layout.recompute == "none"
    by_policy = {
        policy: price_case(planner, case(interpreter, 403, recompute=text), calibration)
        for policy, text in (("none", "none"), ("full", "full"))
    }
    priced = price_case(planner, mixed, calibration)
    full, none = by_policy["full"], by_policy["none"]
    assert priced.parts["recompute"] == pytest.approx(full.parts["recompute"] / 2, rel=1e-12)
    assert none.parts["recompute"] == 0.0
    assert none.predicted_s < priced.predicted_s < full.predicted_s
    ctx = planner.context(mixed.model, mixed.device, mixed.num_devices, mixed.job)
    pricer = planner.pricer(ctx, PricingOptions())
    kept = pricer.price(mixed.layout).activations[0]
    whole = pricer.price(mixed.layout.model_copy(update={"recompute": "full"})).activations[0]
    assert pricer.price_layer_checkpointing(mixed.layout, 2).activations[0] == (kept + whole) / 2


def test_megatron_bridge_moe_rows_dispatch_as_their_performance_configs(
    interpreter: RunInterpreter,
) -> None:
    """Megatron-Bridge's performance configs dispatch with DeepEP/HybridEP (flex) for
    DeepSeek-V3 and Qwen3-30B-A3B on every system, and for Qwen3-235B-A22B only on
    GB200/GB300 (its B200, B300 and H100 configs set the all-to-all); GPT-OSS 120B only in
    its GBS-1,280 MXFP8 configs on GB200/GB300 and its ep-8 B300 one. Every other row leaves the
    dispatcher unstated (the all-to-all)."""
    deepep = {
        50: "Qwen3-30B-A3B, 16 H100, ep16",
        91: "DeepSeek-V3, 256 B200, ep32",
        290: "DeepSeek-V3, 1,024 H100, ep64",
        10: "Qwen3-235B-A22B, 256 GB200",
        5: "GPT-OSS 120B, 64 GB300, MXFP8, GBS 1,280",
        94: "GPT-OSS 120B, 64 B300, BF16, GBS 1,280",
    }
    alltoall = {
        106: "Qwen3-235B-A22B, 256 H100",
        105: "Qwen3-235B-A22B, 256 B200",
        92: "GPT-OSS 120B, 64 GB300, BF16",
        95: "GPT-OSS 120B, 64 B200, BF16",
        221: "GPT-OSS 120B, 64 B300, ep 64 (26.02, before the ep-8 HybridEP config)",
        335: "Mixtral 8x7B, NeMo",
        74: "Llama 3 70B: dense",
    }
    for row_id, what in deepep.items():
        assert case(interpreter, row_id).job.moe_dispatcher == "deepep", what
    for row_id, what in alltoall.items():
        assert case(interpreter, row_id).job.moe_dispatcher is None, what


def test_the_a2a_overlap_is_set_where_the_config_ties_it_to_the_row(interpreter) -> None:
    """Megatron-Bridge's configs overlap the EP all-to-alls with another micro-batch's
    compute where a row can be tied to such a config (``a2a_overlap_recipe``); the
    Qwen3-235B H100 config turns the TP overlap off beside it. Every other row leaves the
    switch unstated (off): configs that keep it off, and newer configs that turn it on with
    a layout older releases ran too."""
    overlapped = {
        290: "DeepSeek-V3, 1,024 H100, 25.09",
        291: "DeepSeek-V3, 1,024 H100, 25.09, fp8 blockwise",
        91: "DeepSeek-V3, 256 B200, ep32",
        1: "DeepSeek-V3, 256 GB300, MXFP8, pp 2 x vpp 8, mbs 1",
        106: "Qwen3-235B-A22B, 256 H100, GBS 8,192",
        5: "GPT-OSS 120B, 64 GB300, MXFP8, GBS 1,280",
    }
    not_overlapped = {
        265: "Qwen3-235B-A22B, 256 H100, GBS 2,048 (25.11: config not known)",
        137: "DeepSeek-V3, 256 B200, ep8",
        88: "DeepSeek-V3, 256 GB300, MXFP8, mbs 2 (the config before)",
        239: "DeepSeek-V3, 256 GB300, FP8-MX, 25.11, pp 2 x vpp 4",
        89: "DeepSeek-V3, 256 GB200 (a layout every release ran)",
        92: "GPT-OSS 120B, 64 GB300, BF16",
        50: "Qwen3-30B-A3B, 16 H100 (its config sets moe_a2a_overlap=False)",
        53: "Kimi K2, 256 GB300, mbs 2 (its config keeps it off)",
        74: "Llama 3 70B: dense",
    }
    for row_id, what in overlapped.items():
        job = case(interpreter, row_id).job
        assert job.moe_a2a_overlap is True, what
        assert job.tp_comm_overlap is (False if row_id == 106 else None), what
    for row_id, what in not_overlapped.items():
        job = case(interpreter, row_id).job
        assert job.moe_a2a_overlap is None and job.tp_comm_overlap is None, what


def test_the_fused_grouped_mlp_is_set_from_the_release_whose_configs_run_it(interpreter) -> None:
    """Megatron-Bridge's MXFP8 configs for DeepSeek-V3 on GB300 and GB200, for
    Qwen3-30B-A3B on GB300, GB200 and B300 and for Qwen3-235B-A22B's V2 on GB300 and GB200
    run the routed experts through Transformer Engine's fused grouped MLP with
    full-iteration CUDA graphs (``fused_grouped_mlp_recipe``); rows from release 26.06 on
    ran them. The first two overlap the all-to-alls beside it, Qwen3-235B-A22B's does not.
    Earlier releases of the same layouts did not run it, nor did the other models, systems
    and recipes."""
    fused = {
        1: "DeepSeek-V3, 256 GB300, MXFP8, 26.08",
        41: "DeepSeek-V3, 256 GB300, MXFP8, GBS 15,360, 26.06",
        2: "DeepSeek-V3, 256 GB200, MXFP8, 26.08",
        42: "DeepSeek-V3, 256 GB200, MXFP8, 26.06",
        7: "Qwen3-30B-A3B, 8 GB300, MXFP8, 26.08",
        8: "Qwen3-30B-A3B, 8 GB200, MXFP8, 26.08",
        49: "Qwen3-30B-A3B, 8 B300, MXFP8, 26.06",
        9: "Qwen3-235B-A22B, 256 GB300, MXFP8, 26.08",
        52: "Qwen3-235B-A22B, 256 GB200, MXFP8, 26.06",
    }
    unfused = {
        88: "DeepSeek-V3, 256 GB300, MXFP8, 26.04.0",
        89: "DeepSeek-V3, 256 GB200, MXFP8, 26.04.0 (the same layout as row 2)",
        247: "DeepSeek-V3, 256 GB200, BF16",
        43: "DeepSeek-V3, 256 B300, 26.06 (a layout of the configs before)",
        97: "Qwen3-30B-A3B, 8 GB300, MXFP8, 26.04.0",
        50: "Qwen3-30B-A3B, 16 H100, FP8",
        102: "Qwen3-235B-A22B, 256 GB300, MXFP8, 26.04.01 (the same layout as row 9)",
        251: "Qwen3-235B-A22B, 256 GB200, BF16",
        104: "Qwen3-235B-A22B, 256 B300, MXFP8, 26.04.01",
        53: "Kimi K2, 256 GB300, 26.06",
        5: "GPT-OSS 120B, 64 GB300, MXFP8, 26.08",
        74: "Llama 3 70B: dense",
    }
    for row_id, what in fused.items():
        job = case(interpreter, row_id).job
        assert job.moe_fused_grouped_mlp is True, what
        assert job.moe_a2a_overlap is (None if "Qwen3-235B" in what else True), what
    for row_id, what in unfused.items():
        assert case(interpreter, row_id).job.moe_fused_grouped_mlp is None, what


@pytest.mark.parametrize(
    ("release", "number"),
    [
        ("NeMo container 26.06", (26, 6)),
        ("NeMo container 26.06.0", (26, 6)),
        ("NeMo container 25.11", (25, 11)),
        ("NeMo 24.07", (24, 7)),
        ("2023 (README 2024-04)", None),
        ("", None),
    ],
)
def test_release_numbers(release: str, number: tuple[int, int] | None) -> None:
    assert release_number(release) == number
