"""Measured training runs (the ``measured_runs.csv`` format) as pricing cases.

Each row becomes a model, a device, a job and a layout, plus the step time the
cluster measured. Published tables state different things: where a row gives
tokens/s the step time follows directly; where it gives only TFLOP/s it is
converted back with the FLOP convention its source used (full or causal
attention). What a row leaves unstated takes the framework's default of that
release, recorded as an assumption (an unstated micro-batch size is settled when the
row is priced: the fastest that fits); a row that lacks the architecture, the
degrees or the batch is skipped with a reason.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.cluster import DeviceSpec
from ndplan.core.context import default_split, head_counted_split, mtp_room_splits_evenly
from ndplan.core.counting import count_flops
from ndplan.core.errors import InvalidInputError, NdplanError, field_error
from ndplan.core.job import Job
from ndplan.core.layout import Layout, free_etp
from ndplan.core.model import DenseFFN, ModelSpec, MoEFFN, StandardAttention

from .readers.hf import read_hf_config

REQUIRED_COLUMNS = ("row_id", "source", "model", "hardware", "num_gpus")
SQUAD_DOCUMENT_TOKENS = 225
"""Mean tokens of one SQuAD v1.1 training example (context, question, answer, prompt).
The Hugging Face dataset card gives 79,346,108 bytes for its 87,599 training examples,
906 bytes each; at about 4 bytes per token for English under Llama-family subword
vocabularies that is about 225 tokens. An estimate, not a measurement: NeMo's and
Megatron-Bridge's fine-tuning benchmarks pack these examples to the sequence length."""
TABLES_WITHOUT_VPP = frozenset({("S1", "Finetuning")})
"""(source_id, table) of published tables with no interleaving (VP) column, so an empty
vpp cell there is unstated, not 1. NeMo 24.07's fine-tuning table gives only TP and PP
(docs/source/performance/performance_summary.md), while its pre-training table beside it
has CP and VP columns; its Llama 2 13B SFT at pp 4 reports 754 model TFLOP/s per GPU, the
pre-training run's figure at pp 4 × vpp 10, where pp 4 without interleaving would idle
3/16 of each step in the pipeline bubble."""

SOURCES_WITH_EXPERT_TP_ONE = frozenset({"S3"})
"""source_id of published MoE runs whose recipes set expert TP 1 where the table leaves it
out: Megatron-Bridge's performance presets (scripts/performance/configs/*/
*_workload_base_configs.py) state ``expert_tensor_parallel_size=1`` in the base preset
of DeepSeek-V3, Qwen3 (30B-A3B, 235B-A22B, Next-80B-A3B), and run GPT OSS and Kimi K2 at
TP 1, where Megatron alone would default expert TP to TP."""


@dataclass
class RunCase:
    """One measured row, ready to price."""

    row_id: int
    source: str
    model_label: str
    family: str
    hardware: str
    moe: bool
    check: bool
    """The source contradicts itself (``CHECK:`` in notes): kept out of fits, reported apart."""
    model: ModelSpec
    device: DeviceSpec
    num_devices: int
    job: Job
    layout: Layout
    measured_step_s: float
    step_from: str
    """How the step time was derived: step_time, tokens/s, or tflops (convention)."""
    measured_peak_gib: float | None = None
    assumed: list[str] = field(default_factory=list)
    whole_layer_every: int | None = None
    """Layer-level checkpointing: one layer in this many is recomputed whole, the rest
    keep everything (``layout.recompute`` is then ``none``)."""
    unstated: frozenset[str] = frozenset()
    """Layout fields the source leaves unstated (``mbs``, ``vpp``); ``layout`` holds their
    defaults. Pricing tries every micro-batch size (``validation.price_case``), and the
    search quality benchmark counts any value of either as the published layout."""
    release: str = ""
    """The software release or date the row was measured with (``release_or_date``)."""


@dataclass
class Skip:
    row_id: int
    source: str
    model_label: str
    reason: str


def read_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            # Fix: restval="" — a short row's missing cells read as unstated, not None
            # (None crashed the interpreter with an AttributeError, exit 5).
            reader = csv.DictReader(fh, restval="")
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInputError(
                    f"{path}: missing column(s) {', '.join(missing)}; use the measured_runs.csv format"
                )
            return list(reader)
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read ({exc.strerror})") from None
    # Fix: bad input is exit 3, not an internal error (exit 5).
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InvalidInputError(f"{path}: cannot parse as a UTF-8 CSV ({exc})") from None


# Columns that, when stated, hold a positive finite number: a row where one does not
# (a typo, a negative time, "four") is skipped by name rather than read as a default.
POSITIVE_COLUMNS = (
    "num_gpus",
    "gpus_per_node",
    "seq_len",
    "global_batch_size",
    "micro_batch_size",
    "grad_accum",
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "dp",
    "tflops_per_gpu",
    "tokens_per_sec_per_gpu",
    "tokens_per_sec_total",
    "step_time_s",
    "peak_mem",
)


def unusable_number(row: Mapping[str, str]) -> str | None:
    """The first stated number column that is not a positive finite number, described."""
    for column in POSITIVE_COLUMNS:
        text = (row.get(column) or "").strip()
        if not text:
            continue
        value = _float(text)
        if value is None or not math.isfinite(value) or value <= 0:
            return f"{column} '{text}' is not a positive number"
    text = (row.get("row_id") or "").strip()
    if text and (not text.isdigit()):
        return f"row_id '{text}' is not a whole number"
    return None


def _int(value: str) -> int | None:
    value = (value or "").strip().replace(",", "")
    if not value:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _float(value: str) -> float | None:
    value = (value or "").strip().replace(",", "")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def source_short(source: str) -> str:
    s = source.lower()
    for key, short in (
        ("megatron-bridge", "megatron-bridge"),
        ("nemo long", "nemo-cp"),
        ("nemo framework", "nemo"),
        ("nemo performance", "nemo"),
        ("llm-foundry", "llm-foundry"),
        ("torchtitan benchmarks", "torchtitan"),
        ("torchtitan docs", "torchtitan-2024"),
        ("narayanan", "narayanan-2021"),
        ("megatron-lm readme", "megatron-lm"),
        ("korthikanti", "korthikanti-2022"),
    ):
        if key in s:
            return short
    return source[:24]


def framework_of(row: Mapping[str, str]) -> str:
    text = (row.get("framework", "") + " " + row.get("source", "")).lower()
    if "torchtitan" in text:
        return "torchtitan"
    if "foundry" in text or "composer" in text:
        return "composer"
    if "deepspeed" in text:
        return "deepspeed"
    if "mindformers" in text or "mindspeed" in text:
        return "mindformers"
    return "megatron"


def precision_of(value: str) -> str | None:
    v = value.lower()
    if not v.strip():
        return None
    if "nvfp4" in v or "fp4" in v:
        return "fp4"
    if "mxfp8" in v or "fp8-mx" in v:
        return "mxfp8"
    if "blockwise" in v:
        return "fp8-blockwise"
    if "fp8" in v or "float8" in v:
        return "fp8"
    if "fp16" in v and "bf16" not in v:
        return "fp16"
    if "bf16" in v or "bfloat16" in v:
        return "bf16"
    raise ValueError(f"precision '{value}' unknown (bf16, fp16, fp8, fp8-blockwise, mxfp8, fp4)")


def recompute_of(value: str) -> tuple[str, int | None]:
    """(policy, every how many layers one is recomputed whole, when only some are) for
    the CSV's recompute column."""
    v = value.lower().strip()
    if not v or v in ("none", "no"):
        return "none", None
    if v.startswith("full"):
        return "full", None
    if "layer" in v:  # torchtitan's layer-level selective AC: every second layer whole
        return "none", 2
    return "selective", None


def zero_of(value: str, framework: str) -> int | None:
    v = value.lower()
    if not v.strip():
        return None
    if "shard_grad_op" in v or "zero-2" in v:
        return 2
    return 3


def recipe_layers_per_chunk(
    source: str, model: ModelSpec, preset_id: str, chunks: int
) -> tuple[int, ...] | None:
    """The uneven decoder split a source's recipe runs, where it is published; None for the
    even split. Megatron-Bridge's DeepSeek-V3 recipes (``set_deepseek_v3_pipeline_model_
    parallel_layout``) keep the embedding on the first chunk and leave the last one room
    for one MTP block and the loss — 16/16/16/13 over 4 chunks, 8×7 + 5 over 8, 4×15 + 1
    over 16 — whether MTP runs or not. With MTP, the H100 recipe interleaves 32 chunks
    as ``Et|(tt|)*30mL``: the embedding, the MTP block and the loss a layer each. Other
    chunk counts, and 32 without MTP, have no recipe layout."""
    if source != "megatron-bridge" or preset_id != "deepseek-v3" or chunks < 2:
        return None
    if mtp_room_splits_evenly(model.num_layers, chunks, mtp_layers=1):
        return default_split(model.num_layers, chunks, mtp_layers=1)
    if model.num_mtp_layers == 1:
        # One stage may have no short slot: the exact split, or None.
        return head_counted_split(model.num_layers, 1, chunks, mtp_layers=1)
    return None


def without_mtp(model: ModelSpec, notes: str) -> ModelSpec:
    """The model as run: a source tag "(w/o MTP)" means the MTP block was switched off."""
    if model.num_mtp_layers and re.search(r"w/o\s*MTP", notes, re.IGNORECASE):
        return model.model_copy(update={"num_mtp_layers": 0})
    return model


class RunInterpreter:
    """Turns CSV rows into RunCases, using the presets and the device catalog."""

    def __init__(self, presets, devices) -> None:
        self.presets = presets
        self.devices = devices
        self._models: dict[str, list[tuple[str, ModelSpec]]] = {}
        self._all: list[tuple[str, ModelSpec]] | None = None

    def _preset(self, preset_id: str) -> ModelSpec:
        raw = self.presets.get(preset_id)()
        return read_hf_config(raw, origin=f"preset {preset_id}", recorder=AssumptionRecorder())

    def _all_presets(self) -> list[tuple[str, ModelSpec]]:
        if self._all is None:
            out = []
            for pid in self.presets:
                try:
                    out.append((pid, self._preset(pid)))
                except NdplanError:
                    continue  # presets the reader refuses (Mamba) cannot match a priceable row
            self._all = out
        return self._all

    def model_for(self, row: Mapping[str, str]) -> tuple[ModelSpec | None, str]:
        """The preset the row names and whose shapes agree with the columns it states."""
        label = row["model"]
        if row.get("model_type", "").startswith("hybrid"):
            return None, "hybrid Mamba layers are not supported (no Mamba layer kind)"
        named: list[tuple[str, ModelSpec]] = []
        if label in self.presets:
            try:
                pid = self.presets.resolve(label)
                named = [(pid, self._preset(pid))]
            except NdplanError as exc:
                return None, str(exc)
        # Fix: match shapes against every preset only when the row states them (layers and
        # hidden): with nothing stated, every preset "agrees" and an unknown label (e.g.
        # DeepSeekV4 Flash) was priced as whichever preset came first (DeepSeek-V2 236B).
        states_shapes = all(_int(row.get(c, "")) is not None for c in ("layers", "hidden"))
        for pid, spec in named + (self._all_presets() if states_shapes else []):
            if _agrees(spec, row):
                return spec, pid
        if named:
            return None, f"row shapes disagree with preset '{named[0][0]}'"
        return None, f"architecture of '{label}' unknown (no preset, and the row does not state it)"

    def interpret(self, row: Mapping[str, str]) -> RunCase | Skip:
        row_id = _int(row.get("row_id", "")) or 0
        label = row.get("model", "")
        source = row.get("source", "")

        def skip(reason: str) -> Skip:
            return Skip(row_id, source_short(source), label, reason)

        bad = unusable_number(row)
        if bad is not None:
            return skip(bad)
        model, info = self.model_for(row)
        if model is None:
            return skip(info)
        preset_id = info
        notes = row.get("notes", "")
        model = without_mtp(model, notes)
        short = source_short(source)
        try:
            device = self.devices.get(row.get("hardware", ""))
        except NdplanError:
            return skip(f"hardware '{row.get('hardware')}' not in the device catalog")
        assumed: list[str] = []
        framework = framework_of(row)
        n = _int(row.get("num_gpus", ""))
        tp = _int(row.get("tp", "")) or 1
        pp = _int(row.get("pp", ""))
        cp = _int(row.get("cp", "")) or 1
        dp = _int(row.get("dp", ""))
        if n is None:
            return skip("device count not stated")
        if pp is None:
            if dp is not None and n % (tp * cp * dp) == 0:
                pp = n // (tp * cp * dp)
            elif "(TP*PP)" in notes or "tp/pp split" in notes.lower():
                return skip("degrees not stated (only the TP·PP product)")
            else:
                pp = 1
                assumed.append("pp=1")
        if row.get("tp", "") == "" and "(TP*PP)" in notes:
            return skip("degrees not stated (only the TP·PP product)")
        if n % (tp * pp * cp):
            return skip(f"tp({tp})·pp({pp})·cp({cp}) does not divide {n} devices")
        dp = n // (tp * pp * cp)
        seq = _int(row.get("seq_len", ""))
        if seq is None:
            match = re.search(r"default[^.;]* is (\d+)", notes)
            if not match:
                return skip("sequence length not stated")
            seq = int(match.group(1))
            assumed.append(f"seq_len={seq} (source's default, from notes)")
        mbs = _int(row.get("micro_batch_size", ""))
        gbs = _int(row.get("global_batch_size", ""))
        unstated: set[str] = set()
        if mbs is None:
            mbs = 1
            assumed.append("mbs=1")
            unstated.add("mbs")
        if gbs is None:
            accum = _int(row.get("grad_accum", "")) or 1
            gbs = dp * mbs * accum
            assumed.append(f"gbs=dp·mbs·{accum}")
        if gbs % (dp * mbs):
            return skip(f"global batch {gbs} is not a multiple of dp({dp})·mbs({mbs})")
        vpp = _int(row.get("vpp", "")) or 1
        if (
            pp > 1
            and row.get("vpp", "") == ""
            and (
                re.search(r"\bVPP\b[^.;]*not stated", notes)
                or (row.get("source_id", ""), row.get("table", "")) in TABLES_WITHOUT_VPP
            )
        ):
            # An empty vpp column means "not interleaved", unless the source does not state
            # it (the notes say so, as of the Megatron-LM README table, or the source's
            # table has no such column); record that it was assumed.
            assumed.append("vpp=1")
            unstated.add("vpp")
        ep = _int(row.get("ep", "")) or 1
        etp = _int(row.get("etp", ""))
        expert_tp_one = row.get("source_id", "") in SOURCES_WITH_EXPERT_TP_ONE
        if etp is None and ep > 1 and tp > 1 and expert_tp_one:
            etp = 1
            assumed.append("etp=1 (the source's MoE recipes set expert TP 1)")
            unstated.add("etp")
        elif etp is None and framework == "megatron" and ep > 1:
            # Unstated, expert TP is TP's own unless EP reaches into the TP ranks: there
            # Megatron cannot run TP's, so the run folded the experts (as the search does).
            folded = free_etp(tp, ep, dp * cp)
            if folded != tp:
                etp = folded
                assumed.append(f"etp={etp} (ep {ep} reaches into the tp {tp} ranks)")
                unstated.add("etp")
        policy, whole_every = recompute_of(row.get("recompute", ""))
        if not row.get("recompute", "").strip():
            assumed.append("recompute=none")
        zero = zero_of(row.get("fsdp_zero", ""), framework)
        if zero is None:
            zero = {"megatron": 1, "torchtitan": 3, "composer": 3}.get(framework, 1)
            if framework == "megatron":
                assumed.append("distributed optimizer")
        if framework == "megatron" and zero == 2:
            zero = 3
        sp_col = row.get("sequence_parallel", "").lower()
        sp = tp > 1 if not sp_col else sp_col.startswith("y")
        try:
            precision = precision_of(row.get("precision", ""))
        except ValueError as exc:
            return skip(str(exc))
        if precision is None:
            precision = "bf16"
            assumed.append("precision=bf16")
        if precision == "fp4" and "fp4" not in device.peak_tflops:
            return skip(f"fp4 on {device.id}, which has no fp4 rate")
        moe = any(isinstance(k.ffn, MoEFFN) for k in model.kinds)
        nvidia_perf = short in ("megatron-bridge", "nemo", "nemo-cp")
        nemo_1 = short in ("nemo", "nemo-cp") and row.get("release_or_date", "").startswith(
            "NeMo 24."
        )
        job_framework = "torchtitan" if framework == "composer" else framework
        family = _family(model, label)
        # Deferring the output layer's weight gradient to the pipeline drain (22
        # micro-batches a step) is off in Megatron-Core and in Megatron-Bridge's
        # CommOverlapConfig unless a recipe sets it: its Llama recipes do, its DeepSeek-V3,
        # Kimi K2, Qwen3 and GPT-OSS performance configs do not. NeMo 2.0's recipes
        # (NeMo 25.x) set it; NeMo 1.0's launcher configs (NeMo 24.x) never do.
        if short == "megatron-bridge":
            defers_head_wgrad: bool | None = family == "llama"
        else:
            defers_head_wgrad = (not nemo_1) if nvidia_perf else None
        release = row.get("release_or_date", "")
        a2a_overlap = (
            short == "megatron-bridge"
            and moe
            and a2a_overlap_recipe(
                label, device.id, precision, gbs, release, pp=pp, vpp=vpp, ep=ep, mbs=mbs
            )
        )
        fused_mlp = (
            short == "megatron-bridge"
            and moe
            and fused_grouped_mlp_recipe(label, device.id, precision, release)
        )
        try:
            job = Job(
                moe_fused_grouped_mlp=True if fused_mlp else None,
                moe_dispatcher="deepep"
                if short == "megatron-bridge"
                and moe
                and deepep_recipe(label, device.id, precision, gbs, ep)
                else None,
                moe_a2a_overlap=True if a2a_overlap else None,
                global_batch_size=gbs,
                seq_length=seq,
                precision=precision,
                framework=job_framework,
                attention_kernel="flash",
                dropout=0.0,
                # NVIDIA's performance recipes reduce gradients in bf16 and fuse the loss.
                grad_reduce_dtype="bf16" if nvidia_perf else None,
                # llm-foundry's MPT defaults to `loss_fn: fused_crossentropy` (flash-attn's
                # cross-entropy kernel): no fp32 copy of the logits is kept.
                fused_loss=True if framework == "composer" else None,
                # Megatron-LM in 2022 ran its TP collectives in line: the overlap with
                # the GEMMs (Transformer Engine's userbuffers) came in 2023. Megatron-
                # Bridge's Qwen3-235B H100 config turns it off beside the A2A overlap.
                tp_comm_overlap=False
                if short == "korthikanti-2022" or (a2a_overlap and label == "Qwen3_235B_a22B")
                else None,
                # NeMo 24.x ran NeMo 1.0 launcher configs, which leave fp8_params at its
                # default (off); NeMo 2.0's and Megatron-Bridge's fp8 recipes turn it on.
                fp8_param_gather=False if nemo_1 else None,
                # Megatron-Bridge pairs Megatron-FSDP with activation offload
                # (cpu_offloading_num_layers in its Llama-3/3.1 performance recipes).
                activation_offload=True if short == "megatron-bridge" and zero == 3 else None,
                defer_embedding_wgrad=defers_head_wgrad,
                finetune="lora" if row.get("workload", "").lower() == "lora" else "full",
                document_tokens=SQUAD_DOCUMENT_TOKENS if packs_squad(row, short) else None,
            )
            layout = Layout(
                dp=dp,
                tp=tp,
                pp=pp,
                vpp=vpp,
                cp=cp,
                ep=ep,
                etp=etp,
                mbs=mbs,
                num_microbatches=gbs // (dp * mbs),
                zero=zero,
                sp=sp,
                schedule="interleaved" if vpp > 1 and pp > 1 else "1f1b",
                recompute=policy,
                layers_per_stage=recipe_layers_per_chunk(
                    short, model, preset_id, pp * vpp if pp > 1 else 1
                ),
            )
        except ValidationError as exc:
            return skip(f"layout: {field_error(exc)}")
        if whole_every is not None:
            assumed.append(
                f"layer-level AC: one layer in {whole_every} recomputed whole (torchtitan's default)"
            )
        step, how = self._measured_step(row, model, n, gbs, seq)
        if step is None:
            return skip("no throughput stated (tokens/s, step time or TFLOP/s)")
        peak = _float(row.get("peak_mem", ""))
        if peak is not None and row.get("peak_mem_unit", "").upper() == "GB":
            peak = peak * 1e9 / 2**30
        return RunCase(
            row_id=row_id,
            source=short,
            model_label=label,
            family=family,
            hardware=device.id,
            moe=moe,
            check="CHECK:" in notes,
            model=model,
            device=device,
            num_devices=n,
            job=job,
            layout=layout,
            measured_step_s=step,
            step_from=how,
            measured_peak_gib=peak,
            assumed=assumed,
            unstated=frozenset(unstated),
            whole_layer_every=whole_every,
            release=row.get("release_or_date", "").strip(),
        )

    @staticmethod
    def _measured_step(
        row, model: ModelSpec, n: int, gbs: int, seq: int
    ) -> tuple[float | None, str]:
        step = _float(row.get("step_time_s", ""))
        if step:
            return step, "step_time"
        tokens = _float(row.get("tokens_per_sec_per_gpu", ""))
        if tokens:
            return gbs * seq / (tokens * n), "tokens/s"
        total = _float(row.get("tokens_per_sec_total", ""))
        if total:
            return gbs * seq / total, "tokens/s"
        tflops = _float(row.get("tflops_per_gpu", ""))
        if tflops:
            # Sources before Megatron-Bridge 25.09 count full (non-causal) attention.
            convention = (
                "causal" if source_short(row.get("source", "")) == "megatron-bridge" else "full"
            )
            per_token = count_flops(model, seq, convention).training_flops_per_token
            return gbs * seq * per_token / (tflops * 1e12 * n), f"tflops ({convention} attention)"
        return None, ""

    def interpret_all(self, rows: Iterable[Mapping[str, str]]) -> tuple[list[RunCase], list[Skip]]:
        cases, skips = [], []
        for row in rows:
            out = self.interpret(row)
            (cases if isinstance(out, RunCase) else skips).append(out)
        return cases, skips


def _agrees(spec: ModelSpec, row: Mapping[str, str]) -> bool:
    """Whether the shapes the row states match the spec (unstated columns match anything)."""
    kind = spec.kinds[-1]
    att = kind.attention
    checks = {
        "layers": spec.num_layers,
        "hidden": spec.hidden_size,
        "heads": getattr(att, "num_heads", None),
        "vocab": spec.vocab_size,
    }
    if isinstance(att, StandardAttention):
        checks["kv_heads"] = att.num_kv_heads
    dense = next((k.ffn for k in spec.kinds if isinstance(k.ffn, DenseFFN)), None)
    moe = next((k.ffn for k in spec.kinds if isinstance(k.ffn, MoEFFN)), None)
    if dense is not None:
        checks["ffn_hidden"] = dense.intermediate_size
    if moe is not None:
        checks["moe_ffn_hidden"] = moe.expert_intermediate_size
        checks["experts"] = moe.num_experts
        checks["topk"] = moe.top_k
    for column, value in checks.items():
        stated = _int(row.get(column, ""))
        if stated is not None and value is not None and stated != value:
            if column == "vocab" and abs(stated - value) <= 1024:
                continue  # padded or instruct vocabularies differ by a few hundred entries
            if column == "ffn_hidden" and moe is not None and dense is None:
                continue
            return False
    return True


def _family(model: ModelSpec, label: str) -> str:
    text = (label + " " + model.model_type).lower()
    for key in (
        "llama",
        "qwen",
        "deepseek",
        "kimi",
        "mixtral",
        "nemotron",
        "mpt",
        "gpt-oss",
        "gpt oss",
        "gpt",
    ):
        if key in text:
            return key.replace(" ", "-")
    return model.model_type


DEEPEP_RECIPES: dict[str, frozenset[str]] = {
    "DeepSeekV3": frozenset({"gb300", "gb200", "b300", "b200", "h100-sxm"}),
    "Qwen3_30B_a3B": frozenset({"gb300", "gb200", "b300", "b200", "h100-sxm"}),
    "Qwen3_235B_a22B": frozenset({"gb300", "gb200"}),
    "Kimi_K2": frozenset({"gb300", "gb200"}),
}
"""Where Megatron-Bridge's performance configs dispatch MoE tokens with DeepEP or
HybridEP (``moe_flex_dispatcher_backend``), by model and system, read from
scripts/performance/configs/{deepseek,qwen,kimi,gpt_oss}/*_workload_base_configs.py.
Qwen3-235B-A22B's B200, B300 and H100 configs set ``moe_token_dispatcher_type="alltoall"``;
GPT-OSS 120B sets HybridEP only in some of its GBS-1,280 configs (``deepep_recipe``)."""


def deepep_recipe(label: str, device_id: str, precision: str, gbs: int, ep: int) -> bool:
    """Whether a Megatron-Bridge MoE row's performance config uses DeepEP or HybridEP.
    GPT-OSS 120B's GBS-1,280 configs set HybridEP at MXFP8 on GB200 and GB300, and on
    B300 together with EP 8 (its earlier B300 runs, at EP 64, kept the all-to-all)."""
    if label == "GPT OSS 120B":
        if gbs != 1280:
            return False
        if device_id == "b300":
            return ep == 8
        return device_id in ("gb300", "gb200") and precision == "mxfp8"
    return device_id in DEEPEP_RECIPES.get(label, frozenset())


def a2a_overlap_recipe(
    label: str,
    device_id: str,
    precision: str,
    gbs: int,
    release: str,
    *,
    pp: int,
    vpp: int,
    ep: int,
    mbs: int,
) -> bool:
    """Whether a Megatron-Bridge MoE row's performance config overlaps the EP all-to-alls
    with another micro-batch's compute (``moe_a2a_overlap``, Megatron's
    --overlap-moe-expert-parallel-comm), where a config turns it on and the row can be tied
    to that config by its release or by a layout no earlier config ran:

    - DeepSeek-V3 on 1,024 H100 in 25.09: that release's deepseek_llm_pretrain.py calls
      ``set_moe_a2a_overlap_overrides``;
    - DeepSeek-V3 on B200 at EP 32: the MXFP8 V2 config, the only one at that EP;
    - DeepSeek-V3 on GB300 in MXFP8 at pp 2 × vpp 8, micro-batch 1: the FP8_MX config
      that moved from micro-batch 2 to 1 with the overlap (and full-iteration CUDA graphs);
    - Qwen3-235B-A22B on H100 at GBS 8,192: the V2 config, from V1's
      ``moe_a2a_overlap=True``;
    - GPT-OSS 120B in MXFP8 at GBS 1,280 on GB300, GB200 and B300: the FP8_MX V2 configs.

    The fused grouped MLP's DeepSeek-V3 and Qwen3-30B-A3B configs turn it on too
    (``fused_grouped_mlp_recipe``, ``FUSED_MLP_A2A_OVERLAP``: their rows from 26.06). The
    newest B300 MXFP8 DeepSeek-V3 and GB200 BF16 GPT-OSS configs turn it on with layouts
    their older releases share, so which rows ran it is not known; they are left off, as
    is every model whose configs keep it off."""
    if label in FUSED_MLP_A2A_OVERLAP and fused_grouped_mlp_recipe(
        label, device_id, precision, release
    ):
        return True
    if label == "DeepSeekV3":
        return (
            (device_id == "h100-sxm" and "25.09" in release)
            or (device_id == "b200" and ep == 32)
            or (device_id == "gb300" and precision == "mxfp8" and (pp, vpp, mbs) == (2, 8, 1))
        )
    if label == "GPT OSS 120B":
        return gbs == 1280 and precision == "mxfp8" and device_id in ("gb300", "gb200", "b300")
    return label == "Qwen3_235B_a22B" and device_id == "h100-sxm" and gbs == 8192


FUSED_MLP_RECIPES: dict[str, frozenset[str]] = {
    "DeepSeekV3": frozenset({"gb300", "gb200"}),
    "Qwen3_30B_a3B": frozenset({"gb300", "gb200", "b300"}),
    "Qwen3_235B_a22B": frozenset({"gb300", "gb200"}),
}
"""Where Megatron-Bridge's MXFP8 performance configs run the routed experts through
Transformer Engine's fused grouped MLP (``cutedsl_fused_grouped_mlp=True``, with
``cuda_graph_impl="full_iteration"``), by model and system: DeepSeek-V3's GB300 and GB200
FP8_MX configs in deepseek_workload_base_configs.py; Qwen3-30B-A3B's GB300, GB200 and
B300 fp8_mx variants (qwen3_llm_pretrain.py calls ``set_full_iter_cg_configs`` for them;
its VR200 variant was later made to mirror the GB200 one); Qwen3-235B-A22B's 256-GPU V2
configs on GB300 and GB200, whose 26.06 config dump (a public GB200 deployment report of
NeMo 26.06: ``cuda_graph_impl == "full_iteration"``, ``moe_paged_stash``, capacity factor
1.5, "V2 uses 256 GPU with VPP=3 + full_iteration CUDA Graph + cutedsl enabled") shows
the V1 to V2 switch as the whole full-iteration stack. DeepSeek-V3's B300 FP8_MX config
runs it too, at pp 8 × vpp 2 and micro-batch 1, a layout no measured B300 row has. Kimi
K2's and GPT-OSS's measured systems have no such config."""
FUSED_MLP_A2A_OVERLAP = frozenset({"DeepSeekV3", "Qwen3_30B_a3B"})
"""The models whose fused-MLP configs overlap the all-to-alls as well (``moe_a2a_overlap=
True`` beside the fused MLP). Qwen3-235B-A22B's V2 config dump lists no such change from
V1, whose GB300 and GB200 configs leave it off."""
FUSED_MLP_RELEASE = (26, 6)
"""The release from which those rows ran it: the same model, system, batch and layout
step 14-36 % faster from 26.06 than in 26.04 (DeepSeek-V3 on 256 GB200 at pp 4 × 4,
EP 64; Qwen3-30B-A3B on 8 GB200 and GB300; Qwen3-235B-A22B on 256 GB300 and GB200, 23 %),
where the configs before kept TE-scoped CUDA graphs and the unfused experts (the report
above names NeMo 26.06 and Megatron Core 0.18 the first to run the stack)."""


def release_number(release: str) -> tuple[int, int] | None:
    """A NeMo container release's (year, month), e.g. ``NeMo container 26.06.0`` → (26, 6)."""
    found = re.search(r"\b(\d{2})\.(\d{2})\b", release)
    return (int(found.group(1)), int(found.group(2))) if found else None


def fused_grouped_mlp_recipe(label: str, device_id: str, precision: str, release: str) -> bool:
    """Whether a Megatron-Bridge MoE row ran the fused grouped MLP (``FUSED_MLP_RECIPES``
    from release ``FUSED_MLP_RELEASE``); most of its configs overlap the all-to-alls as
    well (``FUSED_MLP_A2A_OVERLAP``)."""
    if precision != "mxfp8" or device_id not in FUSED_MLP_RECIPES.get(label, frozenset()):
        return False
    number = release_number(release)
    return number is not None and number >= FUSED_MLP_RELEASE


def packs_squad(row: dict[str, str], source: str) -> bool:
    """Whether a row fine-tuned on SQuAD packed to its sequence length: NeMo's rows say
    so in their notes; Megatron-Bridge's SFT and LoRA recipes all use
    ``default_squad_config(seq_length, packed_sequence=True)``."""
    workload = row.get("workload", "").lower()
    if source == "megatron-bridge":
        return workload in ("sft", "lora")
    notes = row.get("notes", "").lower()
    return source in ("nemo", "nemo-cp") and "squad" in notes and "packed" in notes
