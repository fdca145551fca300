"""A torchtitan job config (TOML) for a plan: the parallelism, batch, checkpointing and
precision sections. The model (its flavor or HF assets) stays in the user's config."""

from __future__ import annotations

import json

from ndplan.core.context import PricingContext
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported
from ndplan.core.recompute import FULL, NONE

from .common import Chunk, assignment_text, chunks, options_used, summary_lines

SCHEDULES = {
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "gpipe": "GPipe",
    "dualpipev": "DualPipeV",
}
PER_OP = "op"


def checkpoint_settings(parts: tuple[Chunk, ...]) -> tuple[dict[str, str], list[str]]:
    """torchtitan's ``[activation_checkpoint]`` for the per-layer choice, and the caveats
    where it cannot state it. torchtitan checkpoints every layer (``full``), applies its
    per-op policy to every layer (``selective``, ``op``), or checkpoints every N-th layer
    whole (``selective``, ``"N"``). Whatever it cannot state is written so that each
    chunk saves at least the memory planned."""
    used = options_used(parts)
    if used <= {NONE}:
        return {"mode": "none"}, []
    if used == {FULL}:
        return {"mode": "full"}, []
    if used == {PER_OP}:
        return {"mode": "selective", "selective_ac_option": PER_OP}, []
    if FULL not in used:  # the per-op policy on some layers only: on all of them
        return {"mode": "selective", "selective_ac_option": PER_OP}, [
            _inexact(parts, "the per-op policy on every layer")
        ]
    # Whole layers: every N-th, with N small enough that each chunk checkpoints at least
    # the layers the plan recomputes (counting per-op layers as whole ones).
    wanted = [(len(c.options), len(c.options) - c.count(NONE)) for c in parts]
    every = min(n // k for n, k in wanted if k)
    if every == 1:
        settings = {"mode": "full"}
        exact = all(k == n for n, k in wanted)
        written = "every layer checkpointed whole"
    else:
        settings = {"mode": "selective", "selective_ac_option": str(every)}
        exact = all(-(-n // every) == k for n, k in wanted)
        written = f"one layer in every {every} checkpointed whole"
    if PER_OP in used or not exact:
        return settings, [_inexact(parts, written)]
    return settings, []


def _inexact(parts: tuple[Chunk, ...], written: str) -> str:
    return (
        f"torchtitan: the plan recomputes per layer ({assignment_text(parts)}), which "
        f"torchtitan's activation_checkpoint cannot state; written as {written}: no more "
        "memory than planned, possibly slower (search with --recompute none, selective or "
        "full for plans torchtitan states exactly)"
    )


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

    def render(self, plan: Plan, ctx: PricingContext) -> Exported:
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
        checkpoint, inexact = checkpoint_settings(parts)
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
        head = [f"# {line}" for line in summary_lines(plan, ctx, "a torchtitan job config")]
        head += [f"# caveat: {c}" for c in caveats]
        if parallelism["enable_async_tensor_parallel"]:
            head.append("# async TP runs under torch.compile: keep [compile] enable = true")
        body = "\n\n".join(_section(name, values) for name, values in sections)
        return Exported(text="\n".join(head) + "\n\n" + body + "\n", caveats=tuple(caveats))


def _section(name: str, values: dict[str, object]) -> str:
    # Booleans, integers, strings and lists of them: JSON spells each as TOML does.
    return "\n".join([f"[{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in values.items()])
