"""The layout a torchtitan job config (TOML) runs, as ``search --baseline FILE`` takes it.

A degree the file does not state is torchtitan's default (1; the FSDP degree ``-1``
takes the devices the other degrees leave), and so are, with a pipeline, the micro-batch
(1) and the stages per rank (those torchtitan builds). Without a pipeline the micro-batch
is ``local_batch_size``; when the file leaves that or the activation checkpointing out,
they are the search's to choose. A key torchtitan does not have is refused: torchtitan
refuses it too, and read past it would leave the setting it misspells at its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

from ndplan.core.errors import InvalidInputError, did_you_mean

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

PARALLELISM_KEYS = frozenset({
    "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
    "fsdp_symm_mem_scope", "enable_compiled_autograd", "tensor_parallel_degree",
    "enable_sequence_parallel", "disable_loss_parallel", "enable_async_tensor_parallel",
    "pipeline_parallel_degree", "pipeline_parallel_split_points", "module_fqns_per_model_part",
    "pipeline_parallel_module_fqns_per_model_part", "pipeline_parallel_first_stage_less_layers",
    "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
    "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
    "pipeline_parallel_microbatch_size", "pipeline_parallel_expert_parallel_overlap",
    "num_pp_microbatches", "pp_max_unsharded_active_stages", "pp_num_unshard_lookahead_factor",
    "context_parallel_degree", "context_parallel_rotate_method", "context_parallel_load_balancer",
    "expert_parallel_degree", "expert_tensor_parallel_degree", "expert_parallel_comm_backend",
})  # fmt: skip
"""The [parallelism] keys of torchtitan's releases: all of the section is the layout, so
any other key is refused (as torchtitan refuses it)."""
TRAINING_KEYS = frozenset({
    "dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm",
    "steps", "warmup_steps", "enable_cpu_offload", "dtype", "mixed_precision_param",
    "mixed_precision_reduce", "compile", "gc_freq", "gc_debug", "seed", "deterministic",
    "dataloader", "enable_loss_parallel", "enable_fp8_linear", "enable_float8_linear",
    "enable_compiled_autograd", "disable_loss_parallel", "fsdp_reshard_after_forward",
})  # fmt: skip
"""[training] keys of torchtitan's releases, old ones included."""
CHECKPOINT_KEYS = frozenset({
    "mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns", "early_stop",
    "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state",
    "determinism_check", "debug",
})  # fmt: skip
KNOWN_KEYS = {
    "parallelism": PARALLELISM_KEYS,
    "training": TRAINING_KEYS,
    "activation_checkpoint": CHECKPOINT_KEYS,
}
"""The keys torchtitan has, by the sections ndplan reads."""
READ = {
    "training": ("local_batch_size", "global_batch_size", "seq_len", "enable_cpu_offload"),
    "activation_checkpoint": ("mode", "selective_ac_option"),
}
"""The keys ndplan reads of the sections that hold more than the layout: an unknown key
there is refused when it looks like one of these (a typo of one), and otherwise left to
torchtitan, as its releases add settings there that have nothing to do with the layout."""


def torchtitan_layout(config: Mapping[str, Any], where: str, problem: Problem) -> LaunchLayout:
    result = LaunchLayout()
    degrees = result.degrees
    par = _section(config, "parallelism", where)
    training = _section(config, "training", where)
    _known_keys(par, "parallelism", where)
    _known_keys(training, "training", where)

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
        # Newer releases prefix the key; both name the modules of each chunk.
        parts = par.get("module_fqns_per_model_part",
                        par.get("pipeline_parallel_module_fqns_per_model_part"))  # fmt: skip
        if isinstance(parts, list) and parts:
            if len(parts) % pp:
                raise InvalidInputError(
                    f"{where}: parallelism.module_fqns_per_model_part has {len(parts)} parts, "
                    f"not a multiple of pp {pp}; fix it"
                )
            degrees["vpp"] = 1 if schedule == "DualPipeV" else len(parts) // pp
            counts = [sum(1 for m in part if str(m).startswith("layers.")) for part in parts]
            result.split = tuple(counts)
        else:
            per_rank, split = _generated_stages(par, pp, schedule, where, problem.num_layers)
            degrees["vpp"] = 1 if schedule == "DualPipeV" else per_rank
            result.split = split
        degrees["mbs"] = positive(par.get("pipeline_parallel_microbatch_size", 1),
                                  "parallelism.pipeline_parallel_microbatch_size", where)  # fmt: skip
    local = training.get("local_batch_size")
    if local is not None:
        local = positive(local, "training.local_batch_size", where)
        if pp == 1:
            degrees["mbs"] = local
        elif local % int(degrees["mbs"]):  # a rank's batch is whole micro-batches
            raise InvalidInputError(
                f"{where}: training.local_batch_size {local} is not a multiple of "
                f"parallelism.pipeline_parallel_microbatch_size {degrees['mbs']}, which "
                "torchtitan refuses; fix one of them"
            )
    stated = training.get("global_batch_size", -1)
    if stated != -1:
        check_batch(where, "training.global_batch_size", positive(stated, "training.global_batch_size", where), problem)  # fmt: skip
    elif local is not None:
        _default_batch(result, where, local, replicate, shard, problem)
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


def _generated_stages(
    par: Mapping[str, Any], pp: int, schedule: str, where: str, num_layers: int
) -> tuple[int, tuple[int, ...] | None]:
    """The stages per pipeline rank torchtitan builds when no module list names them
    (``pipeline_llm``), and the decoder layers per stage where
    ``pipeline_parallel_layers_per_stage`` has it generate them. The embedding and the
    output count as ``pipeline_parallel_first_stage_less_layers`` (``last_``) layers,
    1 each by default: 80 layers at 5 per stage make ceil(82 / 5) = 17 stages."""
    points = par.get("pipeline_parallel_split_points")
    if isinstance(points, list) and points:  # releases before module lists
        return _split_point_stages(points, pp, schedule, where, num_layers)
    if par.get("pipeline_parallel_layers_per_stage") is None:
        # torchtitan's default: one stage per rank, two for a multi-stage schedule
        return (1 if schedule in SINGLE_STAGE else 2), None
    name = "parallelism.pipeline_parallel_layers_per_stage"
    per_stage = positive(par["pipeline_parallel_layers_per_stage"], name, where)
    first = _count(par, "pipeline_parallel_first_stage_less_layers", where)
    last = _count(par, "pipeline_parallel_last_stage_less_layers", where)
    effective = num_layers + first + last
    stages = -(-effective // per_stage)
    got = (
        f"got {per_stage}: ceil(({num_layers} layers + {first} + {last} for the embedding and "
        f"output) / {per_stage}) = {stages} stages"
    )
    if not _stages_fit(stages, pp, schedule):
        want = {"DualPipeV": "2", **dict.fromkeys(SINGLE_STAGE, "1")}.get(schedule, "2 or more")
        why = (
            f"not a multiple of pp {pp}"
            if stages % pp
            else f"{stages // pp} per rank where {schedule} runs {want}"
        )
        fits = [n for n in range(1, effective + 1)
                if _stages_fit(-(-effective // n), pp, schedule)]  # fmt: skip
        fix = f"e.g. {min(fits, key=lambda n: abs(n - per_stage))}" if fits else "or another pp"
        raise InvalidInputError(
            f"{where}: {name}: torchtitan refuses the stages it makes, {why} ({got}); use a "
            f"value it runs, {fix}"
        )
    # generate_llm_fqn_per_model_part: the effective layers spread evenly, the first
    # stages one more, the embedding's and output's weight taken off the end stages.
    base, extra = divmod(effective, stages)
    if first > base or last > base:
        raise InvalidInputError(
            f"{where}: {name}: a stage holds {base} layers, fewer than the embedding's or "
            f"output's weight ({first}, {last}), which torchtitan refuses ({got}); lower "
            "pipeline_parallel_first_stage_less_layers / last_stage_less_layers"
        )
    counts = [base + (i < extra) for i in range(stages)]
    counts[0] -= first
    counts[-1] -= last
    return stages // pp, tuple(counts)


def _stages_fit(stages: int, pp: int, schedule: str) -> bool:
    """Whether torchtitan runs this many stages over pp ranks with this schedule."""
    per_rank, rest = divmod(stages, pp)
    if rest or per_rank < 1:
        return False
    if schedule in SINGLE_STAGE:
        return per_rank == 1
    return per_rank == 2 if schedule == "DualPipeV" else per_rank >= 2


def _split_point_stages(
    points: list[Any], pp: int, schedule: str, where: str, num_layers: int
) -> tuple[int, tuple[int, ...] | None]:
    """Stages that begin at each of ``pipeline_parallel_split_points`` (``layers.N``)."""
    stages = len(points) + 1
    if not _stages_fit(stages, pp, schedule):
        raise InvalidInputError(
            f"{where}: parallelism.pipeline_parallel_split_points: they make {stages} stages, "
            f"which {schedule} cannot run over pp {pp} (got {points}); torchtitan refuses it "
            "too: fix the points"
        )
    starts = [str(p).removeprefix("layers.") for p in points]
    split = None
    if all(s.isdigit() for s in starts):
        bounds = [0, *map(int, starts), num_layers]
        if bounds == sorted(bounds):
            split = tuple(b - a for a, b in pairwise(bounds))
    return stages // pp, split


def _count(par: Mapping[str, Any], key: str, where: str) -> int:
    """A layer count that may be 0; torchtitan's default is 1."""
    value = par.get(key, 1)
    if value == 0 and not isinstance(value, bool):
        return 0
    return positive(value, f"parallelism.{key}", where)


def _section(config: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    section = config.get(name, {})
    if not isinstance(section, Mapping):
        raise InvalidInputError(f"{where}: [{name}] should be a table")
    return section


def _known_keys(section: Mapping[str, Any], name: str, where: str) -> None:
    """Refuse a key torchtitan does not have where ndplan would read past it: a misspelt
    ``tensor_parallel_degree`` would otherwise place the layout at TP 1."""
    known = KNOWN_KEYS[name]
    read = READ.get(name)
    for key in section:
        if key in known:
            continue
        if name == "training" and key.endswith("_degree"):
            # Releases before [parallelism] kept the degrees here.
            raise InvalidInputError(
                f"{where}: training.{key}: torchtitan reads the parallel degrees from "
                f"[parallelism]; move it there{did_you_mean(key, PARALLELISM_KEYS)}"
            )
        hint = did_you_mean(key, known if read is None else read)
        if read is not None and not hint:
            continue  # not one ndplan reads: torchtitan's to judge
        raise InvalidInputError(
            f"{where}: {name}.{key} is not a torchtitan setting"
            + (hint or "; correct its name or remove it")
        )


def _default_batch(
    result: LaunchLayout, where: str, local: int, replicate: int, shard: int, problem: Problem
) -> None:
    """With no ``global_batch_size`` torchtitan steps ``local_batch_size`` × the
    data-parallel degree (replicate × shard) sequences, without accumulation: the file
    states the global batch as surely as if it gave it, and must be the search's."""
    degrees, searched = result.degrees, problem.global_batch
    others = int(degrees["tp"]) * int(degrees["pp"]) * int(degrees["cp"])
    if shard != -1:
        dp: int | None = replicate * shard
    elif problem.devices and problem.devices % others == 0:
        dp = problem.devices // others  # FSDP over the devices the other degrees leave
    else:
        dp = None
    if dp is None:
        # No data-parallel degree from the devices (a library caller gave none, or the
        # degrees do not divide them): the file runs at this --gbs only with dp = gbs /
        # local_batch_size, so that is the dp placed (and refused there if the devices
        # give another).
        if searched % local:
            raise InvalidInputError(
                f"{where}: training.global_batch_size is unset, so torchtitan steps "
                f"local_batch_size {local} × the data-parallel degree sequences, never the "
                f"search's --gbs {searched}; search with a multiple of {local} or set "
                "global_batch_size"
            )
        degrees["dp"] = searched // local
        result.notes.append(
            f"{where}: training.global_batch_size is unset, so torchtitan steps "
            f"local_batch_size {local} × the data-parallel degree sequences: at --gbs "
            f"{searched} that is dp {searched // local}"
        )
        return
    implied = local * dp
    if implied != searched:
        fix = (
            f" or set global_batch_size = {searched} to accumulate gradients"
            if searched % implied == 0
            else " or place another layout"
        )
        raise InvalidInputError(
            f"{where}: training.global_batch_size is unset, so torchtitan steps "
            f"local_batch_size {local} × data-parallel degree {dp} = {implied} sequences, "
            f"not the search's --gbs {searched}; search with --gbs {implied}{fix}"
        )


def _checkpointing(
    config: Mapping[str, Any], where: str, result: LaunchLayout, problem: Problem
) -> str | None:
    ac = _section(config, "activation_checkpoint", where)
    _known_keys(ac, "activation_checkpoint", where)
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
