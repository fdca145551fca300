"""The layout a MindFormers (HyperParallel) YAML runs, as ``search --baseline FILE``
takes it: ``parallel_config``, the interleave, the optimizer sharding, the recompute."""

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


def is_mindformers(data: Any) -> bool:
    return isinstance(data, Mapping) and isinstance(data.get("parallel_config"), Mapping)


def _flat(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [x for item in value for x in _flat(item)]
    return [value]


def mindformers_layout(config: Mapping[str, Any], where: str, problem: Problem) -> LaunchLayout:
    result = LaunchLayout()
    degrees = result.degrees
    par = config["parallel_config"]

    def count(section: Mapping[str, Any], key: str, prefix: str, default: int = 1) -> int:
        return positive(section.get(key, default), f"{prefix}.{key}", where)

    for name, key in (("dp", "data_parallel"), ("tp", "model_parallel"), ("pp", "pipeline_stage"),
                      ("cp", "context_parallel")):  # fmt: skip
        degrees[name] = count(par, key, "parallel_config")
    if problem.is_moe:
        degrees["ep"] = count(par, "expert_parallel", "parallel_config")
    degrees["sp"] = bool(par.get("use_seq_parallel", False))
    model_config = (config.get("model") or {}).get("model_config") or {}
    # The model config states the model and sequence the layout was made for (as --export
    # mindformers writes them): placed in another search they would mean another job.
    if "seq_length" in model_config:
        check_sequence(where, "model.model_config.seq_length", count(model_config, "seq_length", "model.model_config"), problem)  # fmt: skip
    if "num_layers" in model_config:
        num_layers = count(model_config, "num_layers", "model.model_config")
        if num_layers != problem.num_layers:
            raise InvalidInputError(
                f"{where}: model.model_config.num_layers {num_layers} differs from the searched "
                f"model's {problem.num_layers} decoder layers; search the model this config "
                "trains (-m) or place another layout"
            )
    vpp = count(model_config, "pp_interleave_num", "model.model_config")
    degrees["vpp"] = vpp
    runner = config.get("runner_config") or {}
    if "batch_size" in runner:
        degrees["mbs"] = count(runner, "batch_size", "runner_config")
        if degrees["pp"] > 1:
            m = count(par, "micro_batch_num", "parallel_config")
        else:
            m = count(runner, "gradient_accumulation_steps", "runner_config")
        stated = int(degrees["dp"]) * int(degrees["mbs"]) * m
        check_batch(where, "data_parallel · batch_size · micro-batches", stated, problem)
    parallel = config.get("parallel") or {}
    if "enable_parallel_optimizer" in parallel:
        degrees["zero"] = 1 if parallel["enable_parallel_optimizer"] else 0
    pp = int(degrees["pp"])
    chunks = pp * vpp
    base = problem.num_layers // chunks
    flat = _flat(model_config.get("offset", 0))
    if any(flat) and len(flat) != chunks:
        raise InvalidInputError(
            f"{where}: model.model_config.offset has {len(flat)} entries for {chunks} "
            "chunks (pipeline_stage · pp_interleave_num); fix it"
        )
    # Layers per chunk in chunk order (virtual stage v of stage s is chunk v·pp + s).
    layers = [base + int(o) for o in flat] if any(flat) else [base] * chunks
    if any(flat):
        # Each chunk holds num_layers // chunks layers plus its offset: the offsets place
        # every layer once only if they add up to what that division leaves over.
        offset = model_config["offset"]
        if min(layers) < 0:
            v, s = divmod(layers.index(min(layers)), pp)
            chunk = f"stage {s}" if vpp == 1 else f"virtual stage {v} of stage {s}"
            raise InvalidInputError(
                f"{where}: model.model_config.offset {offset} leaves {chunk} with "
                f"{min(layers)} layers ({base} a chunk plus its offset); fix it"
            )
        if sum(layers) != problem.num_layers:
            raise InvalidInputError(
                f"{where}: model.model_config.offset {offset} places {sum(layers)} layers "
                f"where the model has {problem.num_layers} ({chunks} chunks of {base} plus "
                f"the offsets); give offsets that sum to {problem.num_layers - base * chunks}"
            )
        result.split = tuple(layers)
    recompute = _recompute(config.get("recompute_config") or {}, where, result, layers, pp, problem)
    if recompute is not None:
        degrees["recompute"] = recompute
    return result


def _recompute(
    section: Mapping[str, Any],
    where: str,
    result: LaunchLayout,
    layers: list[int],
    pp: int,
    problem: Problem,
) -> str | None:
    """``recompute`` (whole layers) then ``select_recompute`` (core attention): true for
    every layer, or counts per stage (``[pp]``) or per chunk (``[vpp][pp]``)."""
    if not isinstance(section, Mapping) or not section:
        return None
    per_stage = [sum(layers[s::pp]) for s in range(pp)]

    def covers(key: str) -> str:
        value = section.get(key, False)
        if value is True:
            return "all"
        if not value:
            return "none"
        if not isinstance(value, list):
            raise InvalidInputError(
                f"{where}: recompute_config.{key}: expected true, false or counts per stage, "
                f"got {value!r}"
            )
        counts = [int(c) for c in _flat(value)]
        held = {len(layers): layers, pp: per_stage}.get(len(counts))
        if held is None:
            raise InvalidInputError(
                f"{where}: recompute_config.{key} has {len(counts)} counts for {pp} stages "
                f"of {len(layers) // pp} chunks; fix it"
            )
        if not any(counts):
            return "none"
        return "all" if all(c >= n for c, n in zip(counts, held, strict=True)) else "some"

    full = covers("recompute")
    if full == "all":
        return "full"
    selected = covers("select_recompute")
    if full == "none" and selected == "none":
        return "none"
    if full == "none" and selected == "all":
        return "selective"
    what = "recompute of some layers per stage"
    return per_layer_recompute(result, where, what, "mindformers", problem)
