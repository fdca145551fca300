"""The layout a torchtitan job config (TOML) runs, as ``search --baseline FILE`` takes it.

A degree the file does not state is torchtitan's default (1; the FSDP degree ``-1``
takes the devices the other degrees leave). The micro-batch size and the activation
checkpointing are the search's to choose when the file leaves them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ndplan.core.errors import InvalidInputError

from .launch import (
    LaunchLayout,
    Problem,
    check_batch,
    check_sequence,
    per_layer_recompute,
    positive,
)

SCHEDULES = {
    "1F1B": "1f1b",
    "Interleaved1F1B": "interleaved",
    "GPipe": "gpipe",
    "DualPipeV": "dualpipev",
}
SINGLE_STAGE = ("1F1B", "GPipe")
"""Schedules that run one model chunk per pipeline rank."""


def torchtitan_layout(config: Mapping[str, Any], where: str, problem: Problem) -> LaunchLayout:
    result = LaunchLayout()
    degrees = result.degrees
    par = _section(config, "parallelism", where)
    training = _section(config, "training", where)

    def degree(key: str, default: int = 1) -> int:
        return positive(par.get(key, default), f"parallelism.{key}", where)

    for name, key in (("tp", "tensor_parallel_degree"), ("pp", "pipeline_parallel_degree"),
                      ("cp", "context_parallel_degree")):  # fmt: skip
        degrees[name] = degree(key)
    if problem.is_moe:
        degrees["ep"] = degree("expert_parallel_degree")
        degrees["etp"] = degree("expert_tensor_parallel_degree")
    replicate = degree("data_parallel_replicate_degree")
    shard = par.get("data_parallel_shard_degree", -1)
    if shard == -1:  # FSDP over the devices the other degrees leave
        degrees["zero"] = 3
    else:
        shard = positive(shard, "parallelism.data_parallel_shard_degree", where)
        degrees["dp"] = replicate * shard
        if shard > 1 or degrees["cp"] > 1:
            degrees["zero"] = 3  # torchtitan shards over the dp_shard × cp ranks
        elif replicate > 1:
            degrees["zero"] = 0
        # else one replica: no stage shards anything, so the search's own stands for it
        if replicate > 1 and shard > 1:
            result.notes.append(
                f"{where}: HSDP (replicate {replicate} × shard {shard}) is priced as FSDP over "
                f"all {replicate * shard} data-parallel ranks"
            )
    pp = degrees["pp"]
    schedule = par.get("pipeline_parallel_schedule", "1F1B")
    if pp > 1:
        if schedule not in SCHEDULES:
            raise InvalidInputError(
                f"{where}: parallelism.pipeline_parallel_schedule {schedule!r} is not one ndplan "
                f"prices; use {', '.join(SCHEDULES)}"
            )
        degrees["schedule"] = SCHEDULES[schedule]
        parts = par.get("module_fqns_per_model_part")
        if isinstance(parts, list) and parts:
            if len(parts) % pp:
                raise InvalidInputError(
                    f"{where}: parallelism.module_fqns_per_model_part has {len(parts)} parts, "
                    f"not a multiple of pp {pp}; fix it"
                )
            degrees["vpp"] = 1 if schedule == "DualPipeV" else len(parts) // pp
            counts = [sum(1 for m in part if str(m).startswith("layers.")) for part in parts]
            result.split = tuple(counts)
        elif schedule in SINGLE_STAGE:
            degrees["vpp"] = 1
        else:
            result.notes.append(
                f"{where}: the stages per rank follow from pipeline_parallel_layers_per_stage; "
                "the search chooses VPP"
            )
        if "pipeline_parallel_microbatch_size" in par:
            degrees["mbs"] = positive(par["pipeline_parallel_microbatch_size"],
                                      "parallelism.pipeline_parallel_microbatch_size", where)  # fmt: skip
    elif "local_batch_size" in training:
        degrees["mbs"] = positive(training["local_batch_size"], "training.local_batch_size", where)
    stated = training.get("global_batch_size", -1)
    if stated != -1:
        check_batch(where, "training.global_batch_size", positive(stated, "training.global_batch_size", where), problem)  # fmt: skip
    if "seq_len" in training:
        check_sequence(where, "training.seq_len", positive(training["seq_len"], "training.seq_len", where), problem)  # fmt: skip
    if training.get("enable_cpu_offload"):
        degrees["offload_optimizer"] = True
        result.notes.append(
            f"{where}: enable_cpu_offload is priced as optimizer offload; torchtitan moves the "
            "parameters and gradients to host memory too"
        )
    recompute = _checkpointing(config, where, result, problem)
    if recompute is not None:
        degrees["recompute"] = recompute
    return result


def _section(config: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    section = config.get(name, {})
    if not isinstance(section, Mapping):
        raise InvalidInputError(f"{where}: [{name}] should be a table")
    return section


def _checkpointing(
    config: Mapping[str, Any], where: str, result: LaunchLayout, problem: Problem
) -> str | None:
    ac = _section(config, "activation_checkpoint", where)
    if "mode" not in ac:
        return None  # the search's to choose
    mode = ac["mode"]
    if mode in ("none", "full"):
        return mode
    if mode != "selective":
        raise InvalidInputError(
            f"{where}: activation_checkpoint.mode {mode!r} unknown; use none, selective or full"
        )
    option = str(ac.get("selective_ac_option", "op"))
    if option == "op":
        return "selective"
    every = positive(option, "activation_checkpoint.selective_ac_option", where)
    if every == 1:
        return "full"
    what = f"checkpointing one layer in every {every}"
    return per_layer_recompute(result, where, what, "torchtitan", problem)
