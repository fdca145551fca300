"""What each training framework offers and how it keeps its state.

The framework a plan is for fixes which options exist (ZeRO stages, recompute
switches, schedules, CP algorithms) and the bytes it keeps per parameter; the
search and the models read these traits instead of branching on names.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidInputError
from .units import MiB

OFFLOAD = "offload"
"""The activation-offload option: a layer's saved activations go to host memory after
its forward and come back before its backward (Megatron's --cpu-offloading)."""


STATED_PER_STAGE = "per_stage"
STATED_FIRST_IN_CHUNK = "first_in_chunk"
STATED_EVERY_NTH = "every_nth"


def offloads(recompute: frozenset[str] | None) -> bool:
    """Whether a recompute option is activation offload (full recompute is ``None``)."""
    return recompute is not None and OFFLOAD in recompute


SWITCHES = ("core_attn", "norm", "act", "mlp", "sp_gather", "mla_up", "moe_ffn", "op")
"""Recomputable ops (spec/recompute.md): core attention (scores/softmax, or the flash
kernel's saved state), the norms, the FFN activation function, a dense FFN whole (its two
projections, the activation and the block's TP collectives; Megatron's ``mlp`` module),
the sequence-parallel all-gather outputs, MLA up-projections, the routed-expert FFN; and
``op``, torchtitan's per-op selective policy (``selective_ac_option = "op"``), which saves
the attention kernel's output, the reduce-scatters and every other matmul output of a
layer (the 1st, 3rd, 5th, … in call order) and recomputes everything else. On a
standard-attention layer that recomputes the norms, RoPE, the K and output projections,
the residual add and, for a gated FFN, the up projection and the activation; on other
layers (latent or linear attention, MoE FFN) it is priced as recomputing the norms and
activations."""


def per_op_policy_applies(framework: FrameworkTraits, standard_attention: bool) -> bool:
    """Whether ``op`` is priced as the per-op policy itself (standard-attention layers in a
    framework that offers it); elsewhere it means recomputing the norms and activations."""
    return standard_attention and "op" in framework.switches


@dataclass(frozen=True, slots=True)
class FrameworkTraits:
    name: str
    zero_stages: tuple[int, ...]
    """ZeRO stages the framework offers (3 = FSDP)."""
    default_zero: int
    """The stage a layout uses when the user does not say (Megatron: distributed optimizer)."""
    schedules: tuple[str, ...]
    switches: frozenset[str]
    """Selective recompute switches it can apply per layer."""
    dense_activation_recompute: bool
    """Whether ``act`` reaches a dense FFN's activation (and a shared expert's), or only the
    routed experts' (Megatron-Core's ``moe_act``: it recomputes a dense FFN only whole,
    its ``mlp`` module)."""
    forced_switches: frozenset[str]
    """Switches always in effect (Megatron/TE re-gathers SP inputs in the backward)."""
    selective: frozenset[str]
    """What ``--recompute selective`` means in this framework."""
    cp_kinds: tuple[str, ...]
    grad_reduce_dtype: str
    """Default gradient buffer / reduction dtype (Megatron-LM: fp32 main grads)."""
    fused_loss: bool
    """Whether the default cross-entropy avoids materialising fp32 logits."""
    fsdp_fp32_params: bool
    """Sharded fp32 parameters serve as the master copy (torchtitan, llm-foundry FSDP)."""
    expert_tp: bool
    """Experts may use their own TP degree (ETP)."""
    uneven_pipeline: bool
    dp_bucket_bytes: int
    """Gradient bucket memory outside the gradient buffer (DDP/DeepSpeed buckets)."""
    fp8_primary_weights: bool
    """Quantised weights can be the parameters themselves, gathered by the distributed
    optimizer (Megatron's --fp8-param-gather)."""
    activation_offload: bool
    """Layers can offload their saved activations to host memory (Megatron's
    --cpu-offloading, Transformer Engine's offload context)."""
    tp_comm_overlap: bool = True
    """TP collectives can overlap the GEMMs around them (Megatron's --tp-comm-overlap,
    torchtitan's async TP); DeepSpeed's tensor parallelism has no such overlap."""
    deduplicated_dispatch: bool = False
    """MoE tokens can be dispatched with DeepEP or HybridEP (Megatron's flex token
    dispatcher, torchtitan's deepep/hybridep expert-parallel backend), which send each
    token once per destination rank and once per remote scale-up domain."""
    paired_a2a_overlap: bool = False
    """The expert-parallel all-to-alls of one micro-batch can overlap another's compute
    (Megatron's --overlap-moe-expert-parallel-comm, the combined 1F1B schedule)."""
    fused_grouped_mlp: bool = False
    """The routed experts can run Transformer Engine's fused grouped MLP (Megatron's
    cutedsl_fused_grouped_mlp)."""
    deferred_embedding_wgrad: bool = False
    """The last pipeline stage can defer the output layer's weight gradient to the
    pipeline drain (Megatron's --defer-embedding-wgrad-compute)."""
    sequence_parallel: tuple[bool, ...] = (False, True)
    """The sequence-parallel settings it offers with TP (torchtitan's TP plan always
    shards the norms over the sequence)."""
    sp_with_cp: bool = True
    """Sequence parallelism runs beside context parallelism (Megatron-DeepSpeed's
    --ds-sequence-parallel-size cannot be combined with its --sequence-parallel)."""
    max_zero_with_pipeline: int = 3
    """The highest ZeRO stage it runs beside pipeline stages (DeepSpeed's pipeline engine
    asserts ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism)."""
    fsdp_with_cp: bool = False
    """Context parallelism always runs under FSDP over the data-parallel and CP ranks
    (torchtitan enables FSDP whenever cp > 1), so ZeRO-3 is its only stage there."""
    stated_recompute: str = STATED_PER_STAGE
    """How its config states recompute, which ``--recompute stated`` keeps to:
    ``STATED_PER_STAGE``, counts of layers per stage (or chunk) that recompute whole or
    run its selective recompute; ``STATED_FIRST_IN_CHUNK``, one option on every layer or
    the first N layers of each chunk whole or offloaded (Megatron's --recompute-modules,
    --recompute-method block, --cpu-offloading-num-layers); ``STATED_EVERY_NTH``, one
    option on every layer or one layer in every N whole (torchtitan's
    activation_checkpoint)."""

    @property
    def dense_activation_switches(self) -> tuple[str, ...]:
        """The switches that recompute a dense FFN's activation alone, as the memory and
        cost models tag it (a shared expert's too: ``act`` then reaches it only where the
        framework has a dense-activation switch)."""
        return ("act", "op") if self.dense_activation_recompute else ("op",)

    @property
    def cp_kind(self) -> str:
        """The context-parallel algorithm a job gets when it does not say (DeepSpeed's
        Ulysses is all-to-all; the others default to the ring)."""
        return self.cp_kinds[0]

    def lacks(self, field: str, value: object) -> str | None:
        """Why a job switch set to ``value`` does not exist in this framework (a one-line
        refusal with the fix), or None when it does. Only stated switches are checked: a
        switch the framework lacks would otherwise go unread, and the plan would silently
        price something other than what was asked."""
        if field == "cp_kind" and value not in self.cp_kinds:
            kinds = " or ".join(self.cp_kinds)
            return f"{self.name} has no {value} context parallelism (it offers {kinds}); use cp_kind {self.cp_kind}"
        if field == "activation_offload" and value and not self.activation_offload:
            return (
                f"{self.name} does not offload activations to host memory (Megatron's "
                "--cpu-offloading); drop --activation-offload or use --framework megatron"
            )
        if field == "tp_comm_overlap" and value and not self.tp_comm_overlap:
            return (
                f"{self.name} does not overlap TP collectives with the GEMMs (Megatron's "
                "--tp-comm-overlap); drop --tp-comm-overlap or use --framework megatron"
            )
        if field == "defer_embedding_wgrad" and value and not self.deferred_embedding_wgrad:
            return (
                f"{self.name} does not defer the output layer's weight gradient (Megatron's "
                "--defer-embedding-wgrad-compute); drop --defer-embedding-wgrad or use "
                "--framework megatron"
            )
        if field == "moe_dispatcher" and value == "deepep" and not self.deduplicated_dispatch:
            return (
                f"{self.name} has no DeepEP/HybridEP token dispatcher (Megatron's flex "
                "dispatcher, torchtitan's deepep backend); use moe_dispatcher alltoall"
            )
        if field == "moe_a2a_overlap" and value and not self.paired_a2a_overlap:
            return (
                f"{self.name} does not overlap the MoE all-to-alls with another "
                "micro-batch's compute (Megatron's --overlap-moe-expert-parallel-comm); "
                "drop --moe-a2a-overlap or use --framework megatron"
            )
        if field == "moe_fused_grouped_mlp" and value and not self.fused_grouped_mlp:
            return (
                f"{self.name} does not run the routed experts as Transformer Engine's fused "
                "grouped MLP (Megatron's cutedsl_fused_grouped_mlp); drop "
                "--moe-fused-grouped-mlp or use --framework megatron"
            )
        if field == "fp8_param_gather" and value and not self.fp8_primary_weights:
            return (
                f"{self.name} keeps no fp8 weights as the parameters (Megatron's "
                "--fp8-param-gather); drop --fp8-param-gather or use --framework megatron"
            )
        return None

    def schedule_not_offered(self, schedule: str) -> str:
        """The one-line refusal of a pipeline schedule it lacks (search and estimate)."""
        return f"schedule '{schedule}' is not offered by {self.name} (offers {', '.join(self.schedules)})"

    def sp_not_offered(self, sp: str, tp: str) -> str:
        """The one-line refusal of SP settings (``on``, ``off``) with TP degrees it lacks."""
        return (
            f"sp {sp} with tp({tp}) is not offered by {self.name} (its tensor parallelism "
            "always shards the norms over the sequence); drop --no-sp"
        )


FRAMEWORKS: dict[str, FrameworkTraits] = {
    "megatron": FrameworkTraits(
        name="megatron",
        zero_stages=(0, 1, 3),
        default_zero=1,
        schedules=("1f1b", "interleaved", "dualpipev"),
        # Megatron-Core's --recompute-modules: core_attn, layernorm, moe_act (routed
        # experts only), mlp (a dense FFN whole), mla_up_proj, moe.
        switches=frozenset({"core_attn", "norm", "act", "mlp", "mla_up", "moe_ffn"}),
        dense_activation_recompute=False,
        forced_switches=frozenset({"sp_gather"}),
        selective=frozenset({"core_attn"}),
        cp_kinds=("ring", "all_to_all"),
        grad_reduce_dtype="fp32",
        fused_loss=True,
        fsdp_fp32_params=False,
        expert_tp=True,
        uneven_pipeline=True,
        dp_bucket_bytes=0,
        fp8_primary_weights=True,
        activation_offload=True,
        deduplicated_dispatch=True,
        paired_a2a_overlap=True,
        fused_grouped_mlp=True,
        deferred_embedding_wgrad=True,
        stated_recompute=STATED_FIRST_IN_CHUNK,
    ),
    "torchtitan": FrameworkTraits(
        name="torchtitan",
        zero_stages=(0, 3),
        default_zero=3,
        schedules=("1f1b", "interleaved", "gpipe", "dualpipev"),
        # Per-layer choices: keep, the per-op policy, or the whole layer (torchtitan's
        # "selective layer" checkpoints every n-th layer whole).
        switches=frozenset({"op"}),
        dense_activation_recompute=True,
        forced_switches=frozenset(),
        selective=frozenset({"op"}),
        cp_kinds=("ring",),
        grad_reduce_dtype="fp32",
        fused_loss=False,
        fsdp_fp32_params=True,
        expert_tp=True,
        uneven_pipeline=True,
        dp_bucket_bytes=50 * MiB,
        fp8_primary_weights=False,
        activation_offload=False,
        deduplicated_dispatch=True,
        sequence_parallel=(True,),
        fsdp_with_cp=True,
        stated_recompute=STATED_EVERY_NTH,
    ),
    "mindformers": FrameworkTraits(
        name="mindformers",
        zero_stages=(0, 1),
        default_zero=1,
        schedules=("1f1b", "interleaved"),
        switches=frozenset({"core_attn", "norm", "act", "sp_gather", "mla_up", "moe_ffn"}),
        dense_activation_recompute=True,
        forced_switches=frozenset(),
        selective=frozenset({"core_attn"}),
        cp_kinds=("ring", "all_to_all"),
        grad_reduce_dtype="fp32",
        fused_loss=False,
        fsdp_fp32_params=False,
        expert_tp=True,
        uneven_pipeline=True,
        dp_bucket_bytes=0,
        fp8_primary_weights=False,
        activation_offload=False,
    ),
    "deepspeed": FrameworkTraits(
        name="deepspeed",
        zero_stages=(0, 1, 2, 3),
        default_zero=1,
        schedules=("1f1b",),
        switches=frozenset(),
        dense_activation_recompute=True,
        forced_switches=frozenset(),
        selective=frozenset(),
        cp_kinds=("all_to_all",),
        grad_reduce_dtype="bf16",
        fused_loss=False,
        fsdp_fp32_params=False,
        expert_tp=False,
        uneven_pipeline=False,
        dp_bucket_bytes=2 * 500_000_000 * 2,
        fp8_primary_weights=False,
        activation_offload=False,
        tp_comm_overlap=False,
        max_zero_with_pipeline=1,
        sp_with_cp=False,
    ),
}


def traits_for(name: str) -> FrameworkTraits:
    try:
        return FRAMEWORKS[name]
    except KeyError:
        raise InvalidInputError(
            f"framework '{name}' unknown; use one of {', '.join(FRAMEWORKS)}"
        ) from None
