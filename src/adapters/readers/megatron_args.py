"""The layout a Megatron-LM launch runs, read from its arguments.

A launch script (``torchrun pretrain_gpt.py --tensor-model-parallel-size 4 …``, a bash
array such as ``search --export megatron`` writes) or a JSON/YAML of Megatron's args
(``tensor_model_parallel_size: 4``) states the layout the user runs today; ``search
--baseline FILE`` places it in the ranking. Megatron reads an absent flag as its default
(no TP, no pipeline, no distributed optimizer, no recompute), so an absent flag states
that default too. Arguments that are not about the layout are ignored; those that are
are read, including the ones Megatron derives and dumps with its args
(``virtual_pipeline_model_parallel_size``, ``data_parallel_size``), and ``--num-layers``
must be the model's.
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
    # No flag: Megatron derives it (world size over tp·pp·cp) and dumps it with its args.
    "--data-parallel-size": "dp",
}
VIRTUAL = (
    "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout",
)
"""The ways to state the virtual stages per pipeline rank; Megatron takes one at most."""
VALUED = (
    *DEGREES,
    *VIRTUAL,
    "--virtual-pipeline-model-parallel-size",
    "--num-layers",
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
ACCOUNTED = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
"""Switches that count the embedding (loss) as a layer of the first (last) stage."""
SWITCHES = (
    "--sequence-parallel",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--use-custom-fsdp",
    "--use-torch-fsdp2",
    "--optimizer-cpu-offload",
    "--recompute-activations",
    *ACCOUNTED,
)
LISTS = ("--recompute-modules",)
"""Flags followed by one or more values (up to the next flag)."""
KNOWN = (*VALUED, *SWITCHES, *LISTS)
LAYER_CHARS = "EtmL"
"""A layout's layers: the embedding, a decoder layer, an MTP layer, the loss."""
MAX_LAYOUT = 100_000
"""Layers a layout may spell once unrolled: far above any model's, short of a hang."""


def looks_like_megatron_args(text: str) -> bool:
    """Whether a file states Megatron layout flags (``--tensor-model-parallel-size``, …)
    or their argparse names as keys (``tensor_model_parallel_size``)."""
    # num_layers alone is no sign: other frameworks' configs name it too.
    telling = [flag for flag in KNOWN if flag != "--num-layers"]
    flags = {flag for flag in telling if flag in text}
    names = {flag[2:].replace("-", "_") for flag in telling if flag[2:].replace("-", "_") in text}
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
    search's own model, batch and sequence."""
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
    if (stated := _number(found, "--num-layers", where)) not in (None, problem.num_layers):
        raise InvalidInputError(
            f"{where}: --num-layers {stated} differs from the model's {problem.num_layers} "
            "layers; search the model this launch trains (--model) or place another layout"
        )
    pp = int(degrees["pp"])
    degrees["vpp"] = _virtual_stages(found, result, where, problem.num_layers, pp)
    fsdp = (
        found.get("--use-megatron-fsdp")
        or found.get("--use-custom-fsdp")  # its former name, still in Megatron's dumped args
        or found.get("--use-torch-fsdp2")
    )
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


def _virtual_stages(
    found: Mapping[str, Any], result: LaunchLayout, where: str, num_layers: int, pp: int
) -> int:
    """The virtual stages per pipeline rank, from whichever flag states them; a layout
    also places the decoder layers (``result.split``)."""
    given = [flag for flag in VIRTUAL if flag in found]
    if len(given) > 1:
        got = " and ".join(str(found[flag]) for flag in given)
        raise InvalidInputError(
            f"{where}: {' and '.join(given)} each state the virtual stages, which Megatron "
            f"refuses (got {got}); keep one of them"
        )
    # Each counts as a layer in Megatron's split: the first (last) stage holds one fewer.
    accounted = [flag for flag in ACCOUNTED if found.get(flag)]
    vpp = 1
    if "--num-layers-per-virtual-pipeline-stage" in found:
        per_stage = positive(found[given[0]], given[0], where)
        layers = num_layers + len(accounted)
        if layers % (pp * per_stage):
            counted = f" (+{len(accounted)}: {' '.join(accounted)})" if accounted else ""
            raise InvalidInputError(
                f"{where}: --num-layers-per-virtual-pipeline-stage {per_stage} does not divide "
                f"the model's {num_layers} layers{counted} over pp {pp}; fix the value"
            )
        vpp = layers // (pp * per_stage)
    elif "--num-virtual-stages-per-pipeline-rank" in found:
        vpp = positive(found[given[0]], given[0], where)
    elif "--pipeline-model-parallel-layout" in found:
        spelled = str(found[given[0]])
        chunks = layout_chunks(spelled, where)
        if len(chunks) % pp:
            raise InvalidInputError(
                f"{where}: --pipeline-model-parallel-layout has {len(chunks)} chunks, not a "
                f"multiple of pp {pp}; fix the layout"
            )
        counts = tuple(chunk.count("t") for chunk in chunks)
        if sum(counts) != num_layers:
            raise InvalidInputError(
                f"{where}: --pipeline-model-parallel-layout places {sum(counts)} decoder layers, "
                f"not the model's {num_layers} (got {spelled}); give one t per layer"
            )
        result.split = counts
        vpp = len(chunks) // pp
    first_last = any(
        flag in found
        for flag in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")
    )
    if result.split is None and (first_last or accounted):
        result.notes.append(
            f"{where}: ranked with the search's own layer splits (even or balanced), not its "
            "first/last-stage layer counts; price those with estimate --layers-per-chunk"
        )
    # Megatron derives this key from the flags above and dumps it with its args; NeMo and
    # Megatron-Bridge configs state the virtual stages by it alone.
    dumped = _number(found, "--virtual-pipeline-model-parallel-size", where)
    if dumped is not None:
        if given and dumped != vpp:
            raise InvalidInputError(
                f"{where}: --virtual-pipeline-model-parallel-size {dumped} differs from the "
                f"{vpp} virtual stages {given[0]} states; fix one of them"
            )
        vpp = dumped
    return vpp


def layout_chunks(spelled: str, where: str) -> list[str]:
    """The chunks of ``--pipeline-model-parallel-layout``, each a string of E, t, m and L,
    as Megatron-Core reads it (``PipelineParallelLayerLayout.parse_str_to_list``): commas
    (and blanks) are cosmetic, ``(…)*n`` then ``x*n`` repeat, ``|`` ends a chunk."""
    size = 0

    def unroll(match: re.Match[str]) -> str:
        nonlocal size
        digits = match.group(2)  # a longer count is over the limit (and int() may refuse it)
        times = int(digits) if len(digits) <= 6 else MAX_LAYOUT + 1
        size += len(match.group(1)) * times
        if size > MAX_LAYOUT:
            raise InvalidInputError(
                f"{where}: --pipeline-model-parallel-layout unrolls to over {MAX_LAYOUT} "
                f"layers (got {spelled}); fix the repeat counts"
            )
        return match.group(1) * times

    text = re.sub(r"[,\s]", "", spelled)
    # One pass each, groups first, as Megatron: a nested group is left unread (an error).
    text = re.sub(r"\(([^)]+)\)\*(\d+)", unroll, text)
    text = re.sub(r"(.)\*(\d+)", unroll, text)
    if unknown := sorted(set(text) - set(LAYER_CHARS + "|")):
        raise InvalidInputError(
            f"{where}: --pipeline-model-parallel-layout has {''.join(unknown)!r}, not a layer "
            f"(got {spelled}); spell it with E t m L, | between chunks, x*n and (…)*n"
        )
    return text.split("|")


def _recompute(
    found: Mapping[str, Any], result: LaunchLayout, where: str, problem: Problem, chunks: int
) -> str:
    granularity = found.get("--recompute-granularity")
    if found.get("--recompute-activations"):
        granularity = "selective"  # Megatron's validate_args, over any granularity given
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


NESTED_SECTIONS = ("model", "train", "optimizer", "ddp", "dist")
"""The sections of a Megatron-Bridge ConfigContainer YAML (NeMo 1.0 keeps all under
``model``) that hold Megatron's arguments by their argparse names."""
NEMO_NAMES = {
    "encoder_seq_length": "seq_length",
    "activations_checkpoint_granularity": "recompute_granularity",
    "activations_checkpoint_method": "recompute_method",
    "activations_checkpoint_num_layers": "recompute_num_layers",
}
"""NeMo 1.0's names for Megatron's arguments."""


def nested_megatron_args(data: Any, where: str) -> dict[str, Any] | None:
    """A Megatron-Bridge or NeMo 1.0 YAML (``model.tensor_model_parallel_size``,
    ``train.global_batch_size``, …) as the flat arguments the Megatron reader takes; None
    when ``data`` has no ``model`` section. A layout value two sections state differently
    is refused: which one the job runs is not ours to guess."""
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        return None
    flat: dict[str, Any] = {}
    origin: dict[str, str] = {}
    reads = {flag[2:].replace("-", "_") for flag in KNOWN}

    def put(key: str, value: Any, path: str) -> None:
        key = NEMO_NAMES.get(key, key)
        prior = flat.get(key)
        if value is None or value is False or (value is True and prior is not True):
            # A switch set anywhere is set: a dumped config carries every section's fields,
            # the default (false, null) in the sections that do not own it.
            if value is True or key not in flat:
                flat[key], origin[key] = value, path
            return
        # (identity, not ==: a prior 0 is a value, not an unset switch)
        if key in reads and prior is not None and prior is not False and prior != value:
            raise InvalidInputError(
                f"{where}: {path}: {value!r} differs from {origin[key]} {prior!r}; make them agree"
            )
        flat[key], origin[key] = value, path

    for section in NESTED_SECTIONS:
        part = data.get(section)
        for key, value in part.items() if isinstance(part, dict) else ():
            if not isinstance(value, dict):
                put(str(key), value, f"{section}.{key}")
    dataset = data.get("dataset")
    if isinstance(dataset, dict) and "sequence_length" in dataset:  # Megatron-Bridge
        put("seq_length", dataset["sequence_length"], "dataset.sequence_length")
    optim = data["model"].get("optim")
    if isinstance(optim, dict) and str(optim.get("name", "")).startswith(
        ("distributed_fused_adam", "mcore_distributed_optim")
    ):  # NeMo 1.0 names its distributed optimizer
        put("use_distributed_optimizer", True, "model.optim.name")
    return flat
