"""Inputs shared by the commands that price layouts (estimate, search, explain)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from ndplan.adapters.yamlfile import read_yaml_file
from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.errors import InvalidInputError, did_you_mean, error_field, field_error
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.units import MAX_COUNT
from ndplan.planner import Planner, PricingOptions

from .options import State
from .output import note

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Preset name, config.json, or a model directory.")
]
DeviceOpt = Annotated[
    str, typer.Option("--device", "-d", help="Device id or alias (see `ndplan devices`).")
]
DevicesOpt = Annotated[
    int, typer.Option("--devices", "-n", min=1, max=MAX_COUNT, help="Number of devices.")
]
GbsOpt = Annotated[
    int,
    typer.Option("--gbs", min=1, max=MAX_COUNT, help="Global batch size (sequences per step)."),
]
SeqOpt = Annotated[
    int, typer.Option("--seq-len", "-s", min=1, max=MAX_COUNT, help="Sequence length (tokens).")
]
PrecisionOpt = Annotated[
    str | None,
    typer.Option(
        "--precision",
        help="bf16, fp16, fp8, fp8-blockwise, mxfp8 or fp4 [default: bf16].",
        show_default=False,
    ),
]
FrameworkOpt = Annotated[
    str | None,
    typer.Option(
        "--framework",
        help="megatron, torchtitan, mindformers or deepspeed "
        "(fixes which options exist) [default: megatron].",
        show_default=False,
    ),
]
AttentionOpt = Annotated[
    str | None,
    typer.Option(
        "--attention", help="Attention kernel: flash or eager [default: flash].", show_default=False
    ),
]
DropoutOpt = Annotated[
    float | None,
    typer.Option(
        "--dropout", min=0.0, max=0.99, help="Dropout probability [default: 0].", show_default=False
    ),
]
MaxMemOpt = Annotated[
    float | None,
    typer.Option(
        "--max-mem", help="Usable device memory, GiB [default: the device's].", show_default=False
    ),
]
ReserveOpt = Annotated[
    float | None,
    typer.Option(
        "--reserve",
        min=0.0,
        help="Memory held back for balancing, GiB [default: 0].",
        show_default=False,
    ),
]
RuntimeReserveOpt = Annotated[
    float | None,
    typer.Option(
        "--runtime-reserve",
        min=0.0,
        help="Fixed runtime reserve (context, NCCL, fragmentation), GiB [default: the device's].",
        show_default=False,
    ),
]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration", help="A calibration file from `ndplan compare --fit`.", show_default=False
    ),
]
CostModelOpt = Annotated[
    str,
    typer.Option(
        "--cost-model",
        help="The cost model that prices step time: 'ndplan', or one a plugin registers "
        "(`ndplan plugins` lists them).",
    ),
]
GradDtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--grad-dtype",
        help="Gradient buffer / reduction dtype: fp32 or bf16 [default: the framework's].",
        show_default=False,
    ),
]

TpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--tp-comm-overlap/--no-tp-comm-overlap",
        help="Whether TP collectives overlap the GEMMs (Megatron --tp-comm-overlap, "
        "torchtitan async TP) [default: on].",
        show_default=False,
    ),
]

MoeDispatcherOpt = Annotated[
    str | None,
    typer.Option(
        "--moe-dispatcher",
        help="How MoE tokens cross the expert-parallel group: alltoall (a copy per chosen "
        "expert) or deepep (DeepEP/HybridEP: Megatron's flex dispatcher, torchtitan's "
        "deepep backend; once per rank and remote node reached) [default: alltoall].",
        show_default=False,
    ),
]

MoeA2AOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--moe-a2a-overlap/--no-moe-a2a-overlap",
        help="Whether one micro-batch's MoE dispatch and combine overlap another's compute "
        "(Megatron --overlap-moe-expert-parallel-comm; applies with EP > 1 on one stage or "
        "an interleaved pipeline) [default: off].",
        show_default=False,
    ),
]

MoeFusedGroupedMlpOpt = Annotated[
    bool | None,
    typer.Option(
        "--moe-fused-grouped-mlp/--no-moe-fused-grouped-mlp",
        help="Whether the routed experts run Transformer Engine's fused grouped MLP (Megatron "
        "cutedsl_fused_grouped_mlp; Blackwell, fp8/MXFP8/fp4): one kernel over every local "
        "expert, as fast as one dense GEMM of their work, expert buffers sized statically "
        "[default: off].",
        show_default=False,
    ),
]

Fp8ParamsOpt = Annotated[
    bool | None,
    typer.Option(
        "--fp8-param-gather/--no-fp8-param-gather",
        help="Whether fp8/MXFP8 weights are the parameters, with no bf16 copy (Megatron "
        "--fp8-param-gather) [default: on with the distributed optimizer].",
        show_default=False,
    ),
]

ActivationOffloadOpt = Annotated[
    bool | None,
    typer.Option(
        "--activation-offload/--no-activation-offload",
        help="Whether layers may offload their activations to host memory (Megatron "
        "--cpu-offloading): an option of the per-layer choice with --recompute auto; with "
        "--recompute none, the layers that do not fit are offloaded [default: off].",
        show_default=False,
    ),
]

DocumentTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--document-tokens",
        min=1,
        help="Mean tokens per document when sequences pack several (SFT data packed to "
        "the sequence length): attention runs within each document [default: one "
        "document per sequence].",
        show_default=False,
    ),
]

DeferWgradOpt = Annotated[
    bool | None,
    typer.Option(
        "--defer-embedding-wgrad/--no-defer-embedding-wgrad",
        help="Whether the last pipeline stage defers the output layer's weight gradient to "
        "the pipeline drain (Megatron --defer-embedding-wgrad-compute), buffering each "
        "deferred micro-batch's logit gradient [default: off, as in Megatron-Core].",
        show_default=False,
    ),
]

WgradDeferralLimitOpt = Annotated[
    int | None,
    typer.Option(
        "--wgrad-deferral-limit",
        min=0,
        help="Micro-batches per step that defer it; 0 = every one (Megatron "
        "--wgrad-deferral-limit) [default: 22].",
        show_default=False,
    ),
]

JobFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--job",
        help="A YAML/JSON file of job settings (optimizer, cp_kind, finetune, fused_loss, ...: "
        "every field `ndplan schema Job` lists but the batch and sequence); flags override it.",
        show_default=False,
    ),
]
FILE_JOB_FIELDS = tuple(f for f in Job.model_fields if f not in ("global_batch_size", "seq_length"))
"""What a --job file may state; the batch and sequence come from their required flags."""


def read_yaml(path: Path, what: str) -> Any:
    """A user's YAML/JSON file (``what``: "job", "sweep", ...), or one line saying why not;
    None when it is empty."""
    return read_yaml_file(path, what)


def load_job_file(path: Path) -> dict[str, Any]:
    """``--job FILE``: a mapping of job fields, keys checked (values are checked with the
    flags', by ``Job``)."""
    return job_settings(read_yaml(path, "job"), str(path))


def job_settings(data: Any, where: str) -> dict[str, Any]:
    """A mapping of job fields (a ``--job`` file's, a sweep file's ``job:``), keys checked."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidInputError(f"{where}: expected a mapping of job field → value")
    for key in data:
        if key not in FILE_JOB_FIELDS:
            hint = (
                " (use --gbs / --seq-len)"
                if key in Job.model_fields
                else did_you_mean(key, FILE_JOB_FIELDS)
            )
            raise InvalidInputError(
                f"{where}: unknown key '{key}'{hint} (known: {', '.join(FILE_JOB_FIELDS)})"
            )
    return data


@dataclass
class JobInputs:
    gbs: int
    seq_len: int
    precision: str | None
    framework: str | None
    attention: str | None
    dropout: float | None
    grad_dtype: str | None = None
    tp_comm_overlap: bool | None = None
    fp8_param_gather: bool | None = None
    activation_offload: bool | None = None
    defer_embedding_wgrad: bool | None = None
    wgrad_deferral_limit: int | None = None
    document_tokens: int | None = None
    moe_dispatcher: str | None = None
    moe_a2a_overlap: bool | None = None
    moe_fused_grouped_mlp: bool | None = None
    file: Path | None = None
    settings: dict[str, Any] | None = None
    """Job fields already read (a sweep's, once for every scenario), in place of ``file``."""
    settings_from: str = "job"
    """Where ``settings`` came from, for errors."""

    def job(self) -> Job:
        flags = {
            "precision": self.precision,
            "framework": self.framework,
            "attention_kernel": self.attention,
            "dropout": self.dropout,
            "grad_reduce_dtype": self.grad_dtype,
            "tp_comm_overlap": self.tp_comm_overlap,
            "fp8_param_gather": self.fp8_param_gather,
            "activation_offload": self.activation_offload,
            "defer_embedding_wgrad": self.defer_embedding_wgrad,
            "wgrad_deferral_limit": self.wgrad_deferral_limit,
            "document_tokens": self.document_tokens,
            "moe_dispatcher": self.moe_dispatcher,
            "moe_a2a_overlap": self.moe_a2a_overlap,
            "moe_fused_grouped_mlp": self.moe_fused_grouped_mlp,
        }
        stated = {k: v for k, v in flags.items() if v is not None}
        if self.settings is not None:
            from_file, origin = self.settings, self.settings_from
        else:
            from_file = load_job_file(self.file) if self.file is not None else {}
            origin = str(self.file)
        try:
            job = Job(
                global_batch_size=self.gbs,
                seq_length=self.seq_len,
                **{**from_file, **stated},
            )
        except ValidationError as exc:
            field = error_field(exc)
            if field in from_file and field not in stated:
                where = f"{origin}: {field}"
            else:
                where = {
                    "precision": "--precision",
                    "framework": "--framework",
                    "attention_kernel": "--attention",
                    "dropout": "--dropout",
                    "grad_reduce_dtype": "--grad-dtype",
                    "tp_comm_overlap": "--tp-comm-overlap",
                    "fp8_param_gather": "--fp8-param-gather",
                    "activation_offload": "--activation-offload",
                    "defer_embedding_wgrad": "--defer-embedding-wgrad",
                    "wgrad_deferral_limit": "--wgrad-deferral-limit",
                    "document_tokens": "--document-tokens",
                    "moe_dispatcher": "--moe-dispatcher",
                    "moe_a2a_overlap": "--moe-a2a-overlap",
                    "moe_fused_grouped_mlp": "--moe-fused-grouped-mlp",
                }.get(field, field)
            raise InvalidInputError(field_error(exc, where)) from None
        if job.document_tokens is not None and job.document_tokens >= job.seq_length:
            where = (
                "--document-tokens" if "document_tokens" in stated else f"{origin}: document_tokens"
            )
            note(
                f"warning: {where} {job.document_tokens} is not shorter than the sequence "
                f"({job.seq_length}): each sequence holds one document, as without it",
                warning=True,
            )
        return job


SP_AT_TP_1 = (
    "warning: --sp has no effect at tp 1 (sequence parallelism splits activations over the "
    "TP group); priced without it"
)
"""Said by search and estimate when --sp comes with TP fixed at 1 (Megatron drops it too)."""


A2A_OVERLAP_IDLE = "warning: --moe-a2a-overlap has no effect: {}; priced without it"
"""Said by search and estimate where Megatron's combined 1F1B schedule cannot run."""


def check_choice(where: str, value: object, choices: tuple[str, ...]) -> None:
    """One named choice (a recompute policy, a schedule) from a flag or a file: a clear
    error naming the choices."""
    if value not in choices:
        raise InvalidInputError(
            f"{where}: {value!r} unknown; use {', '.join(choices[:-1])} or {choices[-1]}"
        )


def a2a_overlap_inapplicable(layout: Layout) -> str | None:
    """Why Megatron's combined 1F1B schedule (``--moe-a2a-overlap``) does nothing for
    ``layout``, or None where it runs: it pairs the EP all-to-alls of one micro-batch with
    another's compute, so it needs EP, and a pipeline that interleaves (or one stage);
    full recompute re-runs each layer whole, with nothing to pair."""
    if layout.ep == 1:
        return "there is no expert parallelism (ep 1)"
    if layout.schedule == "dualpipev":
        return "DualPipeV pairs its own micro-batches"
    if layout.pp > 1 and layout.schedule != "interleaved":
        return "the pipeline does not interleave (give --vpp)"
    if layout.recompute == "full":
        return "every layer is recomputed whole (--recompute full)"
    return None


OPTION_FLAGS = {
    "max_mem_gib": "--max-mem",
    "balance_reserve_gib": "--reserve",
    "reserve_gib": "--runtime-reserve",
}
"""The flags that set the pricing options, as the planner's error lines name them."""


def build_context(
    state: State,
    *,
    model: str,
    device: str,
    devices: int,
    job: JobInputs,
    device_files: list[Path] | None,
    strict: bool,
    options: PricingOptions,
    budget_from: str = "--max-mem",
):
    """The planner, the pricing context and the assumptions recorder for one command
    (``budget_from``: where the memory budget was given, for its error line)."""
    planner = Planner(state.components(device_files))
    recorder = AssumptionRecorder(strict=strict)
    spec = planner.model(model, recorder)
    dev = planner.device(device)
    ctx = planner.context(
        spec,
        dev,
        devices,
        job.job(),
        options=options,
        recorder=recorder,
        option_names=OPTION_FLAGS | {"max_mem_gib": budget_from},
    )
    return planner, ctx
