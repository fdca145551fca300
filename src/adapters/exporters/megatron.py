"""Megatron-LM arguments for a plan: a bash array to pass to ``pretrain_gpt.py``.

The file holds the plan's own arguments (degrees, batch, recompute, precision, the
overlaps the time model assumes); the model's shape stays in the user's launch script.
"""

from __future__ import annotations

import shlex

from ndplan.core.context import PricingContext, layer_counts
from ndplan.core.layout import Layout
from ndplan.core.memory import fp8_primary_weights
from ndplan.core.model import ModelSpec
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported
from ndplan.core.recompute import FULL, NONE

from .common import OFFLOAD, Chunk, assignment_text, chunks, options_used, summary_lines, switches

MODULES = {
    "core_attn": "core_attn",
    "norm": "layernorm",
    "act": "moe_act",
    "mlp": "mlp",
    "mla_up": "mla_up_proj",
    "moe_ffn": "moe",
}
"""ndplan's recompute switches as Megatron-Core's ``--recompute-modules``; ``sp_gather``
has no module: Megatron re-gathers sequence-parallel inputs in the backward anyway."""

PRECISION_ARGS = {
    "bf16": ["--bf16"],
    "fp16": ["--fp16"],
    "fp8": ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    "fp8-blockwise": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
    "mxfp8": ["--bf16", "--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    "fp4": ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"],
}

ARRAY = "NDPLAN_ARGS"


def pipeline_layout(model: ModelSpec, layout: Layout) -> str:
    """``--pipeline-model-parallel-layout``: the chunks in order (virtual stage by
    virtual stage, each over the pipeline ranks), split by ``|``; ``E`` the embedding,
    ``t`` a decoder layer, ``m`` an MTP layer, ``L`` the loss. Megatron-Core reads it
    for any per-chunk counts, empty chunks included (e.g. ``Et*3|(tt|)*29,m|L``)."""
    parts = ["t" * n for n in layer_counts(model, layout)]
    parts[0] = "E" + parts[0]
    parts[-1] += "m" * model.num_mtp_layers + "L"
    return "|".join(parts)


def recompute_args(parts: tuple[Chunk, ...]) -> tuple[list[str], list[str]]:
    """Megatron's recompute arguments for the per-layer choice, and the caveats where it
    cannot state that choice. Megatron recomputes one way for every layer: whole layers
    (the first N of each chunk, ``block``) or the same modules of every layer
    (``selective``). A choice it cannot state is written so that each layer saves at
    least the memory planned (more recompute), and the caveat says what that costs."""
    used = options_used(parts)
    if used <= {NONE}:
        return [], []
    if used <= {NONE, OFFLOAD}:
        most = max(c.count(OFFLOAD) for c in parts)
        args = ["--cpu-offloading", "--cpu-offloading-num-layers", str(most)]
        exact = all(c.leads_with(OFFLOAD, most) for c in parts)
        return args, [] if exact else [
            _inexact(parts, f"activation offload of {most} layers per chunk")
        ]
    if used <= {NONE, FULL}:
        most = max(c.count(FULL) for c in parts)
        if used == {FULL}:
            return ["--recompute-granularity", "full", "--recompute-method", "uniform",
                    "--recompute-num-layers", "1"], []  # fmt: skip
        args = ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(most)]  # fmt: skip
        exact = all(c.leads_with(FULL, most) for c in parts)
        return args, [] if exact else [
            _inexact(parts, f"full recompute of the first {most} layers of each chunk")
        ]
    if FULL in used or OFFLOAD in used:
        # Whole layers beside selective ones: only 'full' saves at least as much on every layer.
        most = max(len(c.options) - c.count(NONE) for c in parts)
        args = ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(most)]  # fmt: skip
        return args, [_inexact(parts, f"full recompute of the first {most} layers of each chunk")]
    union = frozenset().union(*(switches(o) for o in used))
    modules = [MODULES[s] for s in MODULES if s in union]
    if not modules:  # only switches Megatron applies by itself
        return [], []
    args = ["--recompute-granularity", "selective", "--recompute-modules", *modules]
    caveats = []
    if len(used) > 1:
        caveats.append(
            _inexact(parts, f"selective recompute of {' '.join(modules)} on every layer")
        )
    return args, caveats


def _inexact(parts: tuple[Chunk, ...], written: str) -> str:
    return (
        f"megatron: the plan recomputes per layer ({assignment_text(parts)}), which Megatron's "
        f"arguments cannot state; written as {written}: no more memory than planned, possibly "
        "slower (search with --recompute none, selective or full for plans Megatron states "
        "exactly)"
    )


class MegatronExporter:
    """``--export megatron``: a bash array of Megatron-LM arguments."""

    name = "megatron"
    suffix = ".sh"
    framework = "megatron"

    def render(self, plan: Plan, ctx: PricingContext) -> Exported:
        lay, job = plan.layout, ctx.settings
        caveats: list[str] = []
        args: list[list[str]] = [
            ["--tensor-model-parallel-size", str(lay.tp)],
            ["--pipeline-model-parallel-size", str(lay.pp)],
            ["--context-parallel-size", str(lay.cp)],
        ]
        counts = layer_counts(ctx.model, lay)
        if lay.schedule == "dualpipev":
            caveats.append(
                "megatron: Megatron-LM's arguments have no DualPipeV schedule (DeepSeek's "
                "DualPipe runs it); the degrees are written, the schedule is yours to set"
            )
        elif len(set(counts)) > 1:
            args.append(["--pipeline-model-parallel-layout", pipeline_layout(ctx.model, lay)])
        elif lay.vpp > 1:
            args.append(["--num-virtual-stages-per-pipeline-rank", str(lay.vpp)])
        if ctx.model.is_moe:
            args.append(["--expert-model-parallel-size", str(lay.ep)])
            args.append(["--expert-tensor-parallel-size", str(lay.expert_tp)])
            if job.moe_dispatcher == "deepep":
                args.append(["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"])  # fmt: skip
            else:
                args.append(["--moe-token-dispatcher-type", "alltoall"])
            args.append(["--moe-grouped-gemm"])
            if job.moe_a2a_overlap and lay.ep > 1:
                args.append(["--overlap-moe-expert-parallel-comm"])
        args += [
            ["--micro-batch-size", str(lay.mbs)],
            ["--global-batch-size", str(ctx.job.global_batch_size)],
            ["--seq-length", str(ctx.job.seq_length)],
        ]
        if lay.sequence_parallel:
            args.append(["--sequence-parallel"])
        if lay.tp > 1 and job.tp_comm_overlap:
            args.append(["--tp-comm-overlap"])
        if lay.cp > 1:
            args.append(["--cp-comm-type", "a2a" if job.cp_kind == "all_to_all" else "p2p"])
        if lay.zero >= 1:
            args.append(["--use-distributed-optimizer"])
        if lay.zero == 3:
            args.append(["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"])  # fmt: skip
            args.append(["--no-gradient-accumulation-fusion"])
        # The time model hides the gradient reduce-scatter (and the parameter all-gather
        # of the distributed optimizer) behind compute: Megatron does so only when asked.
        if lay.dp * lay.cp > 1:
            args.append(["--overlap-grad-reduce"])
            if lay.zero >= 1:
                args.append(["--overlap-param-gather"])
        if lay.offload_optimizer:
            args.append(["--optimizer-cpu-offload", "--optimizer-offload-fraction", "1.0"])
        if job.grad_reduce_dtype == "bf16":
            args.append(["--grad-reduce-in-bf16"])
        args.append(PRECISION_ARGS[job.precision])
        if fp8_primary_weights(ctx, lay):
            args.append(["--fp8-param-gather"])
        if job.fused_loss:
            args.append(["--cross-entropy-loss-fusion"])
        if ctx.deferred_head_wgrads(lay):
            args.append(["--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", str(job.wgrad_deferral_limit)])  # fmt: skip
        recompute, inexact = recompute_args(chunks(plan, ctx))
        if recompute:
            args.append(recompute)
        caveats += inexact
        head = [f"# {line}" for line in summary_lines(plan, ctx, "Megatron-LM arguments")]
        head += [f"# caveat: {c}" for c in caveats]
        head.append(
            f'# use: source this file; torchrun ... pretrain_gpt.py <model arguments> "${{{ARRAY}[@]}}"'
        )
        body = "\n".join("  " + shlex.join(group) for group in args)
        return Exported(text="\n".join(head) + f"\n{ARRAY}=(\n{body}\n)\n", caveats=tuple(caveats))
