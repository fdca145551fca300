"""A DeepSpeed config (JSON) for a plan: batch, ZeRO, offload and precision.

DeepSpeed reads the model's tensor, pipeline, sequence and expert degrees and its
activation checkpointing from the model code (Megatron-DeepSpeed's arguments), not from
this file: the caveats name them so nothing of the plan is dropped silently.
"""

from __future__ import annotations

import json

from ndplan.core.context import PricingContext
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported, PerLayerPricer
from ndplan.core.recompute import FULL

from .common import chunks, options_used


class DeepSpeedExporter:
    """``--export deepspeed``: a DeepSpeed JSON config."""

    name = "deepspeed"
    suffix = ".json"
    framework = "deepspeed"

    def render(
        self, plan: Plan, ctx: PricingContext, price: PerLayerPricer | None = None
    ) -> Exported:
        lay, job = plan.layout, ctx.settings
        caveats: list[str] = []
        zero: dict[str, object] = {
            "stage": lay.zero,
            "overlap_comm": True,
            "contiguous_gradients": True,
        }
        if lay.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        config: dict[str, object] = {
            # DeepSpeed checks train_batch_size = micro-batch · accumulation · data-parallel ranks.
            "train_batch_size": ctx.job.global_batch_size,
            "train_micro_batch_size_per_gpu": lay.mbs,
            "gradient_accumulation_steps": lay.num_microbatches,
            "zero_optimization": zero,
        }
        if job.precision == "fp16":
            config["fp16"] = {"enabled": True}
        else:
            config["bf16"] = {"enabled": True}
            if job.precision != "bf16":
                caveats.append(
                    f"deepspeed: {job.precision} GEMMs come from the model code (Transformer "
                    "Engine); the file enables bf16 only"
                )
        if job.grad_reduce_dtype == "fp32":
            config["communication_data_type"] = "fp32"
        degrees = {
            "--tensor-model-parallel-size": lay.tp,
            "--pipeline-model-parallel-size": lay.pp,
            "--ds-sequence-parallel-size": lay.cp,
        }
        if ctx.model.is_moe:
            degrees["--moe-expert-parallel-size"] = lay.ep
        stated = " ".join(f"{flag} {n}" for flag, n in degrees.items() if n > 1)
        if stated:
            caveats.append(
                f"deepspeed: the model code sets the degrees (Megatron-DeepSpeed: {stated}"
                f"{' --sequence-parallel' if lay.sequence_parallel else ''})"
            )
        parts = chunks(plan, ctx)
        used = options_used(parts)  # none and full: DeepSpeed has no selective switch
        if used == {FULL}:
            caveats.append(
                "deepspeed: the plan recomputes every layer: checkpoint them in the model "
                "code (Megatron-DeepSpeed: --checkpoint-activations)"
            )
        elif FULL in used:
            per_stage = ", ".join(str(c.count(FULL)) for c in parts)
            caveats.append(
                "deepspeed: the plan recomputes the first layers of each stage whole "
                f"({per_stage} per stage) and keeps the rest: checkpoint those in the "
                "model code"
            )
        return Exported(text=json.dumps(config, indent=2) + "\n", caveats=tuple(caveats))
