"""The training job: batch, sequence, precision, optimizer, framework.

Fields the user may leave unstated are ``None``; reading one through
:class:`JobSettings` uses the documented default and records it as an assumption.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from .assumptions import AssumptionRecorder
from .base import Frozen
from .frameworks import traits_for
from .units import MAX_COUNT

Precision = Literal["bf16", "fp16", "fp8", "fp8-blockwise", "mxfp8", "fp4"]
"""Training recipes: bf16/fp16; fp8 with tensor-wise (delayed or current) scaling,
128×128/1×128 block-wise scaling, or MXFP8 (32-element blocks); NVFP4/MXFP4."""
Framework = Literal["megatron", "torchtitan", "mindformers", "deepspeed"]
Optimizer = Literal["adam", "sgd", "muon"]
AttentionKernel = Literal["flash", "eager"]
CPKind = Literal["ring", "all_to_all"]
MoEDispatcher = Literal["alltoall", "deepep"]

GEMM_PRECISION: dict[str, str] = {
    "bf16": "bf16",
    "fp16": "fp16",
    "fp8": "fp8",
    "fp8-blockwise": "fp8",
    "mxfp8": "fp8",
    "fp4": "fp4",
}
"""Which device peak a recipe's GEMMs run at."""


class Job(Frozen):
    """What to train: the batch and the numerics."""

    global_batch_size: int = Field(ge=1, le=MAX_COUNT)
    """Sequences per optimizer step."""
    seq_length: int = Field(ge=1, le=MAX_COUNT)
    """Tokens per sequence."""
    precision: Precision | None = None
    """GEMM recipe; bf16 when unstated."""
    optimizer: Optimizer | None = None
    """Adam (fp32 master weights and two moments) when unstated."""
    framework: Framework | None = None
    """The framework the plan is for; it fixes which options exist. megatron when unstated."""
    attention_kernel: AttentionKernel | None = None
    """flash (saves only softmax statistics) or eager (materialises the scores)."""
    dropout: float | None = Field(default=None, ge=0.0, lt=1.0)
    """Dropout probability; modern runs use 0."""
    cp_kind: CPKind | None = None
    """Context-parallel algorithm: ring (P2P K/V exchange) or all-to-all (Ulysses); the
    framework's default when unstated (DeepSpeed has only Ulysses; the others, the ring)."""
    fused_loss: bool | None = None
    """Whether the cross-entropy is fused/chunked, so fp32 logits are never materialised;
    the framework's default when unstated."""
    grad_reduce_dtype: Literal["fp32", "bf16"] | None = None
    """Dtype of the gradient buffer and its data-parallel reduction; the framework's
    default when unstated (Megatron-LM: fp32 main gradients)."""
    finetune: Literal["full", "lora"] | None = None
    """What trains: every weight (pre-training, SFT), or low-rank adapters on frozen
    weights (LoRA: no weight gradients, optimizer state or gradient reduction for the
    base model; adapters are small enough to leave out)."""
    moe_capacity_factor: float | None = Field(default=None, gt=0)
    """Expert capacity factor; dropless, force-balanced routing (1.0) when unstated."""
    moe_dispatcher: MoEDispatcher | None = None
    """How routed tokens cross the expert-parallel group. ``alltoall`` sends one copy of a
    token per chosen expert (Megatron's alltoall dispatcher, torchtitan's default);
    ``deepep`` (DeepEP or HybridEP: Megatron's flex dispatcher, torchtitan's deepep and
    hybridep backends) sends it once to each rank holding any of its experts, and across
    the network once per remote scale-up domain, forwarding inside the domain. alltoall
    when unstated."""
    moe_a2a_overlap: bool | None = None
    """Whether the expert-parallel dispatch and combine of one micro-batch overlap the
    compute of another (Megatron's ``--overlap-moe-expert-parallel-comm``, the combined
    1F1B schedule: each layer's forward of one micro-batch runs beside its backward of
    the one before). It exists where Megatron runs it: EP > 1, one pipeline stage or an
    interleaved pipeline, and layers not fully recomputed; the warm-up forwards and
    cool-down backwards have no partner and hide only what they would without it. Off
    when unstated, as in Megatron."""
    moe_fused_grouped_mlp: bool | None = None
    """Whether the routed experts run Transformer Engine's fused grouped MLP (Megatron's
    ``cutedsl_fused_grouped_mlp``, a CuTe DSL kernel for Blackwell in fp8, MXFP8 or fp4):
    one persistent kernel per pass over every local expert, which reads the token counts
    on the device. It runs as one dense GEMM the size of all the local experts' work
    does, where the unfused path runs a GEMM per expert at that size's efficiency and
    the grouped GEMMs' lower fraction of peak; and with it Megatron sizes the expert
    buffers statically (``moe_expert_rank_capacity_factor``), so the dispatch sends no
    token counts to the host and the layer's host synchronisation goes. Off when
    unstated, as in Megatron."""
    tp_comm_overlap: bool | None = None
    """Whether the TP all-gathers and reduce-scatters overlap the GEMMs around them
    (Megatron's ``--tp-comm-overlap``, Transformer Engine's userbuffers; torchtitan's
    async TP), hiding the framework's fitted share; False exposes them whole. The
    framework's default when unstated: on where it has the overlap (performance recipes
    turn it on), off for DeepSpeed, which has none (asking for it there is refused)."""
    fp8_param_gather: bool | None = None
    """Whether fp8/MXFP8-quantised linear weights are the model's parameters (Megatron's
    ``--fp8-param-gather``): no bf16 copy of them is kept beside the quantised one, the
    fp32 master lives in the distributed optimizer, and per-tensor fp8 weights are
    all-gathered in fp8. Read only where it applies (Megatron, fp8 or MXFP8, distributed
    optimizer, full training); on when unstated: NeMo's and Megatron-Bridge's fp8 and
    MXFP8 recipes turn it on."""
    activation_offload: bool | None = None
    """Whether layers may offload their saved activations to host memory (Megatron's
    --cpu-offloading): an option of the per-layer ``auto`` choice; under ``none``, the
    layers that do not fit are offloaded. Priced over the host link, hidden behind the
    next layer's compute. Off when unstated, as in Megatron."""
    document_tokens: int | None = Field(default=None, ge=1)
    """Mean tokens per document when each sequence packs several short documents (SFT
    datasets packed to the sequence length, Megatron's THD format): attention runs within
    each document, so its FLOPs scale with the document, not the sequence, and each
    kernel sees document-length keys. Unset: one document per sequence."""
    defer_embedding_wgrad: bool | None = None
    """Whether the last pipeline stage defers the output layer's weight-gradient GEMM to
    the pipeline drain, where it idles (Megatron's ``--defer-embedding-wgrad-compute``):
    its steady state carries the logits' forward and input gradient only, and it buffers
    each deferred micro-batch's input and logit gradient until the drain. Read only where
    it applies (Megatron, pp > 1, 1F1B or interleaved, full training). Off when unstated,
    as in Megatron-Core: the buffers cost the last stage memory (NeMo's and
    Megatron-Bridge's recipes turn it on, with a limit of 22)."""
    wgrad_deferral_limit: int | None = Field(default=None, ge=0)
    """How many micro-batches per step defer their output-layer weight gradient (the rest
    compute it in line); 0 defers every one, as in Megatron. 22 when unstated, the
    recipes' value."""

    @field_validator(
        "cp_kind",
        "moe_dispatcher",
        "moe_a2a_overlap",
        "moe_fused_grouped_mlp",
        "tp_comm_overlap",
        "fp8_param_gather",
        "activation_offload",
        "defer_embedding_wgrad",
    )
    @classmethod
    def _offered_by_the_framework(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        # An invalid framework is reported on its own field; check against the default.
        framework = info.data.get("framework") or JOB_DEFAULTS["framework"]
        why = traits_for(framework).lacks(info.field_name, value)
        if why is not None:
            raise ValueError(why)
        return value

    @field_validator("wgrad_deferral_limit")
    @classmethod
    def _limit_needs_deferral(cls, limit: int | None, info: ValidationInfo) -> int | None:
        # A limit without the deferral would be silently ignored, as Megatron ignores it.
        if limit is not None and info.data.get("defer_embedding_wgrad") is not True:
            raise ValueError(
                "a deferral limit applies only with defer_embedding_wgrad on; "
                "add --defer-embedding-wgrad (or defer_embedding_wgrad: true)"
            )
        return limit


JOB_DEFAULTS: dict[str, Any] = {
    "precision": "bf16",
    "optimizer": "adam",
    "framework": "megatron",
    "attention_kernel": "flash",
    "dropout": 0.0,
    "moe_capacity_factor": 1.0,
    "moe_dispatcher": "alltoall",
    "moe_a2a_overlap": False,
    "moe_fused_grouped_mlp": False,
    "finetune": "full",
    "fp8_param_gather": True,
    "activation_offload": False,
    "defer_embedding_wgrad": False,
    "wgrad_deferral_limit": 22,
}
FRAMEWORK_DEFAULTED = ("fused_loss", "grad_reduce_dtype", "cp_kind", "tp_comm_overlap")
"""Fields whose default depends on the framework (read from its traits)."""


def _state(name: str, value: Any) -> str:
    """How to state a job field rather than have it assumed (the --strict fix)."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"state it, e.g. '{name}: {text}' in a --job file"


class JobSettings:
    """A job whose unset fields resolve to defaults on first read, recording each.

    Only fields that pricing actually reads become assumptions: a setting that no
    component looks at is not reported.
    """

    def __init__(self, job: Job, recorder: AssumptionRecorder, reader: str = "pricing") -> None:
        self.job = job
        self.recorder = recorder
        self.reader = reader

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.job, name)
        if value is None and name in JOB_DEFAULTS:
            default = JOB_DEFAULTS[name]
            value = self.recorder.default(
                f"job.{name}", default, self.reader, _state(name, default)
            )
        elif value is None and name in FRAMEWORK_DEFAULTED:
            default = getattr(traits_for(self.framework), name)
            value = self.recorder.default(
                f"job.{name}", default, f"{self.framework} default", _state(name, default)
            )
        # Cache on the instance: later reads skip __getattr__ entirely.
        setattr(self, name, value)
        return value

    @property
    def attention_span(self) -> int:
        """Keys a token attends over at most: the sequence, or its packed document."""
        seq = self.job.seq_length
        docs = self.job.document_tokens
        return min(seq, docs) if docs else seq

    @property
    def gemm_precision(self) -> str:
        return GEMM_PRECISION[self.precision]

    @property
    def grad_reduce_bytes(self) -> int:
        """Bytes per element of the gradient buffer and its data-parallel reduction."""
        return 4 if self.grad_reduce_dtype == "fp32" else 2

    @property
    def is_low_precision(self) -> bool:
        return self.precision in ("fp8", "fp8-blockwise", "mxfp8", "fp4")
