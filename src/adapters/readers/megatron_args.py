"""The layout a Megatron-LM launch runs, read from its arguments.

A launch script (``torchrun pretrain_gpt.py --tensor-model-parallel-size 4 …``, a bash
array such as ``search --export megatron`` writes) or a JSON/YAML of Megatron's args
(``tensor_model_parallel_size: 4``) states the layout the user runs today; ``search
--baseline FILE`` places it in the ranking. Megatron reads an absent flag as its default
(no TP, no pipeline, no distributed optimizer, no recompute), so an absent flag states
that default too. Arguments that are not about the layout are ignored.
"""

from __future__ import annotations

import re
import shlex
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

DEGREES = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--context-parallel-size": "cp",
    "--expert-model-parallel-size": "ep",
    "--expert-tensor-parallel-size": "etp",
    "--micro-batch-size": "mbs",
    "--num-virtual-stages-per-pipeline-rank": "vpp",
}
VALUED = (
    *DEGREES,
    "--num-layers-per-virtual-pipeline-stage",
    "--pipeline-model-parallel-layout",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--global-batch-size",
    "--seq-length",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--data-parallel-sharding-strategy",
    "--optimizer-offload-fraction",
)
SWITCHES = (
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--use-torch-fsdp2",
    "--optimizer-cpu-offload",
)
LISTS = ("--recompute-modules",)
"""Flags followed by one or more values (up to the next flag)."""
KNOWN = (*VALUED, *SWITCHES, *LISTS)


def looks_like_megatron_args(text: str) -> bool:
    """Whether a file states Megatron layout flags (``--tensor-model-parallel-size``, …)
    or their argparse names as keys (``tensor_model_parallel_size``)."""
    flags = {flag for flag in KNOWN if flag in text}
    names = {flag[2:].replace("-", "_") for flag in KNOWN if flag[2:].replace("-", "_") in text}
    return bool(flags or names)


def tokens_of(text: str, where: str) -> list[str]:
    """The words of a shell script: comments dropped, ``\\``-newlines joined, quotes
    removed; ``--flag=value`` split in two."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:  # an unclosed quote
        raise InvalidInputError(f"{where}: cannot read it as shell arguments ({exc})") from None
    out: list[str] = []
    for word in words:
        flag, eq, value = word.partition("=")
        if flag.startswith("--") and eq:
            out += [flag, value]
        else:
            out.append(word)
    return out


def arguments_from_mapping(data: Mapping[str, Any]) -> list[str]:
    """Megatron's args as a mapping (``tensor_model_parallel_size: 4``, as its argparse
    namespace is dumped) spelled as flags; a true switch is its flag, a false one none."""
    out: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is None or value is False:
            continue
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def parse_arguments(words: list[str], where: str) -> dict[str, Any]:
    """The layout flags among ``words``, as argparse keeps them: the last one given wins."""
    found: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word in SWITCHES:
            found[word] = True
        elif word in VALUED:
            if i + 1 >= len(words) or words[i + 1].startswith("--"):
                raise InvalidInputError(f"{where}: {word} has no value; give one")
            found[word] = words[i + 1]
            i += 1
        elif word in LISTS:
            values = []
            # Module names up to the next flag (or the end of a bash array, ``)``).
            while i + 1 < len(words) and re.fullmatch(r"[A-Za-z_]\w*", words[i + 1]):
                values.append(words[i + 1])
                i += 1
            found[word] = values
        i += 1
    return found


def _number(found: Mapping[str, Any], flag: str, where: str) -> int | None:
    value = found.get(flag)
    return None if value is None else positive(value, flag, where)


def megatron_layout(found: Mapping[str, Any], where: str, problem: Problem) -> LaunchLayout:
    """The layout stated by Megatron arguments (``parse_arguments``), checked against the
    search's own batch and sequence."""
    num_layers = problem.num_layers
    result = LaunchLayout()
    degrees = result.degrees
    for flag, name in DEGREES.items():
        value = _number(found, flag, where)
        if value is not None:
            degrees[name] = value
    for name in ("tp", "pp", "cp", "mbs"):
        degrees.setdefault(name, 1)  # Megatron's defaults
    if problem.is_moe:
        degrees.setdefault("ep", 1)
        degrees.setdefault("etp", degrees["tp"])  # Megatron: expert TP follows TP
    if (stated := _number(found, "--global-batch-size", where)) is not None:
        check_batch(where, "--global-batch-size", stated, problem)
    if (stated := _number(found, "--seq-length", where)) is not None:
        check_sequence(where, "--seq-length", stated, problem)
    pp = int(degrees["pp"])
    per_stage = _number(found, "--num-layers-per-virtual-pipeline-stage", where)
    if per_stage is not None:
        if num_layers % (pp * per_stage):
            raise InvalidInputError(
                f"{where}: --num-layers-per-virtual-pipeline-stage {per_stage} does not divide "
                f"the model's {num_layers} layers over pp {pp}; fix the value"
            )
        degrees["vpp"] = num_layers // (pp * per_stage)
    spelled = found.get("--pipeline-model-parallel-layout")
    if spelled is not None:
        chunks = spelled.count("|") + 1
        if chunks % pp:
            raise InvalidInputError(
                f"{where}: --pipeline-model-parallel-layout has {chunks} chunks, not a multiple "
                f"of pp {pp}; fix the layout"
            )
        degrees["vpp"] = chunks // pp
        counts = [part.count("t") for part in spelled.split("|")]
        result.split = tuple(counts)
    elif (
        "--decoder-first-pipeline-num-layers" in found
        or "--decoder-last-pipeline-num-layers" in found
    ):
        result.notes.append(
            f"{where}: ranked with the search's own layer splits (even or balanced), not its "
            "first/last-stage layer counts; price those with estimate --layers-per-chunk"
        )
    degrees.setdefault("vpp", 1)
    fsdp = found.get("--use-megatron-fsdp") or found.get("--use-torch-fsdp2")
    if fsdp:
        strategy = found.get("--data-parallel-sharding-strategy", "optim_grads_params")
        stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
        if strategy not in stages:
            raise InvalidInputError(
                f"{where}: --data-parallel-sharding-strategy {strategy} unknown; use "
                "no_shard, optim, optim_grads or optim_grads_params"
            )
        degrees["zero"] = stages[strategy]
    else:
        degrees["zero"] = 1 if found.get("--use-distributed-optimizer") else 0
    degrees["sp"] = bool(found.get("--sequence-parallel"))
    degrees["offload_optimizer"] = bool(found.get("--optimizer-cpu-offload"))
    degrees["recompute"] = _recompute(found, result, where, problem, pp * int(degrees["vpp"]))
    return result


def _recompute(
    found: Mapping[str, Any], result: LaunchLayout, where: str, problem: Problem, chunks: int
) -> str:
    granularity = found.get("--recompute-granularity")
    if granularity is None:
        return "none"
    if granularity == "full":
        method = found.get("--recompute-method")
        n = _number(found, "--recompute-num-layers", where) or 1
        if method in (None, "uniform") or n * chunks >= problem.num_layers:
            return "full"
        what = f"full recompute of the first {n} layers of each chunk"
        return per_layer_recompute(result, where, what, "megatron", problem)
    if granularity == "selective":
        modules = found.get("--recompute-modules") or ["core_attn"]
        if set(modules) == {"core_attn"}:
            return "selective"
        what = f"selective recompute of {' '.join(modules)}"
        return per_layer_recompute(result, where, what, "megatron", problem)
    raise InvalidInputError(
        f"{where}: --recompute-granularity {granularity} unknown; use full or selective"
    )
