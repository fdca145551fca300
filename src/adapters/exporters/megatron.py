"""Megatron-LM arguments for a plan: a bash array to pass to ``pretrain_gpt.py``.

The file holds the plan's own arguments (degrees, batch, recompute, precision, the
overlaps the time model assumes); the model's shape stays in the user's launch script.
"""

from __future__ import annotations

import shlex

from ndplan.core.context import PricingContext, layer_counts
from ndplan.core.frameworks import SWITCHES
from ndplan.core.layout import Layout
from ndplan.core.memory import fp8_primary_weights
from ndplan.core.model import ModelSpec
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported, PerLayerPricer, StandIn
from ndplan.core.recompute import FULL, NONE, StatedRecompute

from .common import (
    OFFLOAD,
    Chunk,
    Setting,
    chunks,
    options_used,
    per_layer,
    stated_candidates,
    summary_lines,
    switches,
    written_recompute,
)

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


SELECTIVE = ["--recompute-granularity", "selective", "--recompute-modules"]


def block(n: int) -> list[str]:
    """Whole layers: the first ``n`` of each chunk."""
    return ["--recompute-granularity", "full", "--recompute-method", "block",
            "--recompute-num-layers", str(n)]  # fmt: skip


UNIFORM_FULL = ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]  # fmt: skip


def offload(n: int) -> list[str]:
    return ["--cpu-offloading", "--cpu-offloading-num-layers", str(n)]


def offload_states(parts: tuple[Chunk, ...], n: int) -> bool:
    """Whether ``--cpu-offloading-num-layers n`` runs: Megatron-Core offloads fewer than
    all the layers, and refuses it under pipeline parallelism (one chunk only)."""
    return len(parts) == 1 and n < len(parts[0].options)


def _name(union: frozenset[str]) -> str:
    return "+".join(s for s in SWITCHES if s in union) or NONE


def exact_args(parts: tuple[Chunk, ...]) -> list[str] | None:
    """Megatron's arguments for the plan's recompute where they state it exactly (one way
    for every layer: the same modules, or whole or offloaded layers first in each chunk);
    None where they cannot."""
    used = options_used(parts)
    if used <= {NONE}:
        return []
    if used == {FULL}:
        return UNIFORM_FULL
    for option, args in ((FULL, block), (OFFLOAD, offload)):
        if used <= {NONE, option}:
            most = max(c.count(option) for c in parts)
            if option == OFFLOAD and not offload_states(parts, most):
                return None
            return args(most) if all(c.leads_with(option, most) for c in parts) else None
    if len(used) == 1:
        modules = [MODULES[s] for s in MODULES if s in switches(next(iter(used)))]
        # No modules: only switches Megatron applies by itself (the SP gathers).
        return [*SELECTIVE, *modules] if modules else []
    return None


def _first(parts: tuple[Chunk, ...], n: int, option: str) -> tuple[str, ...]:
    return per_layer(parts, lambda c, i: option if i < n else NONE)


def stated_args(setting: StatedRecompute, longest: int) -> tuple[list[str], str]:
    """Megatron's arguments for one setting it states, and the setting in words."""
    if setting.option == NONE:
        return [], "no recompute"
    if setting.option == FULL:
        if setting.first:
            return block(setting.first), _first_words(setting.first, "full recompute")
        return UNIFORM_FULL, "full recompute of every layer"
    if setting.option == OFFLOAD:
        n = setting.first or longest
        return offload(n), _first_words(n, "activation offload")
    modules = [MODULES[s] for s in MODULES if s in switches(setting.option)]
    return [*SELECTIVE, *modules], f"selective recompute of {' '.join(modules)} on every layer"


def candidates(parts: tuple[Chunk, ...], ctx: PricingContext, layout: Layout) -> list[Setting]:
    """Every recompute setting Megatron states at the plan's layout, in words and args."""
    longest = max(len(c.options) for c in parts)
    return stated_candidates(parts, ctx, layout, lambda s: stated_args(s, longest))


def _first_words(n: int, what: str) -> str:
    return f"{what} of the first {n} layer{'s' if n > 1 else ''} of each chunk"


def memory_safe(parts: tuple[Chunk, ...]) -> Setting:
    """A setting that saves at least the planned memory on every layer: whole layers
    where the plan recomputes any whole or offloads (the first N of each chunk), else
    the union of its modules on every layer. Offloading that Megatron cannot run (every
    layer, or under pipeline parallelism) is written as whole layers recomputed."""
    used = options_used(parts)
    most = max(c.count(OFFLOAD) for c in parts)
    if used <= {NONE, OFFLOAD} and offload_states(parts, most):
        return Setting(
            offload(most), _first_words(most, "activation offload"), _first(parts, most, OFFLOAD)
        )
    if FULL in used or OFFLOAD in used:
        most = max(len(c.options) - c.count(NONE) for c in parts)
        return Setting(block(most), _first_words(most, "full recompute"), _first(parts, most, FULL))
    union = frozenset().union(*(switches(o) for o in used))
    modules = [MODULES[s] for s in MODULES if s in union]
    name = _name(union)
    return Setting(
        [*SELECTIVE, *modules],
        f"selective recompute of {' '.join(modules)} on every layer",
        per_layer(parts, lambda c, i: name),
    )


def recompute_args(
    parts: tuple[Chunk, ...],
    plan: Plan,
    ctx: PricingContext,
    price: PerLayerPricer | None = None,
) -> tuple[list[str], list[str], StandIn | None]:
    """Megatron's recompute arguments for the plan, a caveat where they cannot state its
    per-layer choice, and the setting written priced (``stand_in``)."""
    args, caveats, priced = written_recompute(
        "megatron",
        "Megatron's arguments",
        parts,
        plan,
        exact_args(parts),
        lambda: candidates(parts, ctx, plan.layout),
        memory_safe,
        price,
    )
    return list(args), caveats, priced


class MegatronExporter:
    """``--export megatron``: a bash array of Megatron-LM arguments."""

    name = "megatron"
    suffix = ".sh"
    framework = "megatron"

    def render(
        self, plan: Plan, ctx: PricingContext, price: PerLayerPricer | None = None
    ) -> Exported:
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
        if lay.sequence_parallel and job.tp_comm_overlap:
            args.append(["--tp-comm-overlap"])
        elif lay.tp > 1 and ctx.job.tp_comm_overlap:
            # Megatron asserts sequence parallelism for it; the time model hid nothing.
            caveats.append(
                "--tp-comm-overlap left out: Megatron overlaps TP communication only with "
                "--sequence-parallel, which this plan runs without"
            )
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
        parts = chunks(plan, ctx)
        recompute, inexact, priced = recompute_args(parts, plan, ctx, price)
        if recompute:
            args.append(recompute)
        caveats += inexact
        head = [f"# {line}" for line in summary_lines(plan, ctx, "Megatron-LM arguments", priced)]
        head += [f"# caveat: {c}" for c in caveats]
        head.append(
            f'# use: source this file; torchrun ... pretrain_gpt.py <model arguments> "${{{ARRAY}[@]}}"'
        )
        body = "\n".join("  " + shlex.join(group) for group in args)
        return Exported(
            text="\n".join(head) + f"\n{ARRAY}=(\n{body}\n)\n",
            caveats=tuple(caveats),
            stand_in=priced,
        )
