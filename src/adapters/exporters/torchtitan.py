"""A torchtitan job config (TOML) for a plan: the parallelism, batch, checkpointing and
precision sections. The model (its flavor or HF assets) stays in the user's config."""

from __future__ import annotations

import json

from ndplan.core.context import PricingContext
from ndplan.core.layout import Layout
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported, PerLayerPricer, StandIn
from ndplan.core.recompute import FULL, NONE, StatedRecompute, every_nth, most_per_stage

from .common import (
    Chunk,
    Setting,
    chunks,
    layer_shape,
    options_used,
    per_layer,
    stated_candidates,
    summary_lines,
    written_recompute,
)

SCHEDULES = {
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "gpipe": "GPipe",
    "dualpipev": "DualPipeV",
}
PER_OP = "op"


NO_CHECKPOINTING = {"mode": "none"}
FULL_CHECKPOINTING = {"mode": "full"}
PER_OP_CHECKPOINTING = {"mode": "selective", "selective_ac_option": PER_OP}


def every(n: int) -> dict[str, str]:
    """One layer in every ``n`` checkpointed whole (torchtitan counts them per rank)."""
    return FULL_CHECKPOINTING if n == 1 else {"mode": "selective", "selective_ac_option": str(n)}


def _every_words(n: int) -> str:
    return (
        "every layer checkpointed whole" if n == 1 else f"one layer in every {n} checkpointed whole"
    )


def _every_counts(parts: tuple[Chunk, ...], n: int) -> list[int]:
    """Per chunk, the layers torchtitan wraps whole with ``selective_ac_option = n``."""
    wrapped = iter(every_nth(*layer_shape(parts), n))
    return [sum(next(wrapped) for _ in c.options) for c in parts]


def _every_options(parts: tuple[Chunk, ...], n: int) -> tuple[str, ...]:
    return tuple(FULL if w else NONE for w in every_nth(*layer_shape(parts), n))


def _per_rank(parts: tuple[Chunk, ...]) -> int:
    """The most decoder layers one rank holds."""
    return most_per_stage(*layer_shape(parts))


def exact_checkpointing(parts: tuple[Chunk, ...]) -> dict[str, str] | None:
    """torchtitan's ``[activation_checkpoint]`` where it states the plan exactly: no
    checkpointing, every layer whole, the per-op policy on every layer, or one layer in
    every N whole where that is each chunk's count (torchtitan counts a rank's layers
    over its chunks); None where it cannot."""
    used = options_used(parts)
    if used <= {NONE}:
        return NO_CHECKPOINTING
    if used == {FULL}:
        return FULL_CHECKPOINTING
    if used == {PER_OP}:
        return PER_OP_CHECKPOINTING
    if used == {NONE, FULL}:
        # Counts, not places: within a chunk, which layers are whole prices the same.
        wanted = [c.count(FULL) for c in parts]
        for n in range(2, _per_rank(parts) + 1):
            if _every_counts(parts, n) == wanted:
                return every(n)
    return None


def stated_checkpointing(setting: StatedRecompute) -> tuple[dict[str, str], str]:
    """torchtitan's ``[activation_checkpoint]`` for one setting it states, in words."""
    if setting.option == NONE:
        return NO_CHECKPOINTING, "no checkpointing"
    if setting.option == PER_OP:
        return PER_OP_CHECKPOINTING, "the per-op policy on every layer"
    n = setting.every or 1
    return every(n), _every_words(n)


def candidates(parts: tuple[Chunk, ...], ctx: PricingContext, layout: Layout) -> list[Setting]:
    """Every checkpointing torchtitan states at the plan's layout, in words and TOML."""
    return stated_candidates(parts, ctx, layout, stated_checkpointing)


def memory_safe(parts: tuple[Chunk, ...]) -> Setting:
    """A checkpointing that saves at least the planned memory in every chunk: the per-op
    policy on every layer where the plan checkpoints no layer whole, else one layer in
    every N whole with N small enough for each chunk's count (per-op layers counted as
    whole ones)."""
    if FULL not in options_used(parts):
        return Setting(
            PER_OP_CHECKPOINTING,
            "the per-op policy on every layer",
            per_layer(parts, lambda c, i: PER_OP),
        )
    # The sparsest that wraps at least as many layers as the plan recomputes in each chunk
    # (n = 1, every layer, always does).
    planned = [len(c.options) - c.count(NONE) for c in parts]
    n = next(
        n
        for n in range(_per_rank(parts), 0, -1)
        if all(w >= k for w, k in zip(_every_counts(parts, n), planned, strict=True))
    )
    return Setting(every(n), _every_words(n), _every_options(parts, n))


def checkpoint_settings(
    parts: tuple[Chunk, ...], plan: Plan, ctx: PricingContext, price: PerLayerPricer | None = None
) -> tuple[dict[str, str], list[str], StandIn | None]:
    """torchtitan's ``[activation_checkpoint]`` for the plan, a caveat where it cannot
    state its per-layer choice, and the setting written priced (``stand_in``)."""
    settings, caveats, priced = written_recompute(
        "torchtitan",
        "torchtitan's activation_checkpoint",
        parts,
        plan,
        exact_checkpointing(parts),
        lambda: candidates(parts, ctx, plan.layout),
        memory_safe,
        price,
    )
    return dict(settings), caveats, priced


def model_parts(parts: tuple[Chunk, ...]) -> list[list[str]]:
    """``module_fqns_per_model_part``: each chunk's modules in model order (the embedding
    with the first, the final norm and output layer with the last)."""
    fqns = [[f"layers.{i}" for i in range(c.start, c.start + len(c.options))] for c in parts]
    fqns[0].insert(0, "tok_embeddings")
    fqns[-1] += ["norm", "output"]
    return fqns


class TorchtitanExporter:
    """``--export torchtitan``: torchtitan's job config TOML."""

    name = "torchtitan"
    suffix = ".toml"
    framework = "torchtitan"

    def render(
        self, plan: Plan, ctx: PricingContext, price: PerLayerPricer | None = None
    ) -> Exported:
        lay, job = plan.layout, ctx.settings
        caveats: list[str] = []
        sharded = lay.zero == 3
        parallelism: dict[str, object] = {
            "data_parallel_replicate_degree": 1 if sharded else lay.dp,
            "data_parallel_shard_degree": lay.dp if sharded else 1,
            "tensor_parallel_degree": lay.tp,
            "enable_async_tensor_parallel": bool(lay.tp > 1 and job.tp_comm_overlap),
            "context_parallel_degree": lay.cp,
            "pipeline_parallel_degree": lay.pp,
        }
        parts = chunks(plan, ctx)
        if lay.pp > 1:
            parallelism["pipeline_parallel_schedule"] = SCHEDULES[lay.schedule]
            parallelism["pipeline_parallel_microbatch_size"] = lay.mbs
            parallelism["module_fqns_per_model_part"] = model_parts(parts)
        if ctx.model.is_moe:
            parallelism["expert_parallel_degree"] = lay.ep
            parallelism["expert_tensor_parallel_degree"] = lay.expert_tp
            if job.moe_dispatcher == "deepep":
                caveats.append(
                    "torchtitan: the plan dispatches tokens with DeepEP; choose torchtitan's "
                    "DeepEP expert-parallel backend in your release's setting for it"
                )
        # Per step each data-parallel rank runs mbs·m sequences: one pipelined batch, or m
        # accumulated micro-batches without a pipeline.
        training: dict[str, object] = {
            "local_batch_size": lay.mbs * lay.num_microbatches if lay.pp > 1 else lay.mbs,
            "global_batch_size": ctx.job.global_batch_size,
            "seq_len": ctx.job.seq_length,
            "mixed_precision_param": "bfloat16",
            "mixed_precision_reduce": "float32" if job.grad_reduce_dtype == "fp32" else "bfloat16",
        }
        if lay.offload_optimizer:
            training["enable_cpu_offload"] = True
            caveats.append(
                "torchtitan: enable_cpu_offload moves parameters and gradients to host "
                "memory as well as the optimizer state the plan offloads: less device "
                "memory than planned, and slower"
            )
        checkpoint, inexact, priced = checkpoint_settings(parts, plan, ctx, price)
        caveats += inexact
        sections: list[tuple[str, dict[str, object]]] = [
            ("parallelism", parallelism),
            ("training", training),
            ("activation_checkpoint", checkpoint),
        ]
        precision = job.precision
        if precision == "fp8":
            sections.append(("model", {"converters": ["float8"]}))
            sections.append(("float8", {"recipe_name": "tensorwise"}))
        elif precision == "mxfp8":
            sections.append(("model", {"converters": ["mx"]}))
            sections.append(("mx", {"recipe_name": "mxfp8_cublas"}))
        elif precision != "bf16":
            caveats.append(
                f"torchtitan: no {precision} recipe is written (its float8 and mx converters "
                "cover tensor-wise fp8 and MXFP8); set the numerics yourself"
            )
        head = [f"# {line}" for line in summary_lines(plan, ctx, "a torchtitan job config", priced)]
        head += [f"# caveat: {c}" for c in caveats]
        if parallelism["enable_async_tensor_parallel"]:
            head.append("# async TP runs under torch.compile: keep [compile] enable = true")
        body = "\n\n".join(_section(name, values) for name, values in sections)
        return Exported(
            text="\n".join(head) + "\n\n" + body + "\n", caveats=tuple(caveats), stand_in=priced
        )


def _section(name: str, values: dict[str, object]) -> str:
    # Booleans, integers, strings and lists of them: JSON spells each as TOML does.
    return "\n".join([f"[{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()])
