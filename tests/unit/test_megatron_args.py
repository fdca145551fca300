"""Reading the layout of a Megatron-LM launch (adapters/readers/megatron_args.py), as
``search --baseline FILE`` does: a script of flags or a JSON/YAML of Megatron's args."""

from __future__ import annotations

import pytest

from ndplan.adapters.readers.launch import Problem
from ndplan.adapters.readers.megatron_args import (
    arguments_from_mapping,
    looks_like_megatron_args,
    megatron_layout,
    parse_arguments,
    tokens_of,
)
from ndplan.core.errors import InvalidInputError

SCRIPT = """#!/bin/bash
# launch
torchrun --nproc-per-node 8 pretrain_gpt.py \\
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size=4 \\
    --num-layers-per-virtual-pipeline-stage 5 \\
    --sequence-parallel --use-distributed-optimizer   # ZeRO-1
    --micro-batch-size 2 --global-batch-size 512 --seq-length 8192 \\
    --recompute-granularity selective --lr 1e-4 --tensor-model-parallel-size 8
"""


def problem(**changes) -> Problem:
    settings = {"num_layers": 80, "is_moe": False, "global_batch": 512, "seq_length": 8192}
    return Problem(**(settings | changes))


def read(text: str, **changes):
    return megatron_layout(parse_arguments(tokens_of(text, "f"), "f"), "f", problem(**changes))


def test_a_launch_script_states_its_layout_and_the_last_flag_wins() -> None:
    assert looks_like_megatron_args(SCRIPT)
    layout = read(SCRIPT)
    assert layout.degrees == {
        "tp": 8,  # given twice: argparse keeps the last
        "pp": 4,
        "mbs": 2,
        "cp": 1,
        "vpp": 4,  # 80 layers / (pp 4 · 5 per virtual stage)
        "zero": 1,
        "sp": True,
        "offload_optimizer": False,
        "recompute": "selective",  # core attention, Megatron's default module
    }
    assert layout.notes == []


def test_absent_flags_are_megatrons_defaults_and_moe_experts_follow_tp() -> None:
    layout = read("--tensor-model-parallel-size 2", is_moe=True)
    assert layout.degrees == {
        "tp": 2, "pp": 1, "cp": 1, "mbs": 1, "ep": 1, "etp": 2, "vpp": 1, "zero": 0,
        "sp": False, "offload_optimizer": False, "recompute": "none",
    }  # fmt: skip


def test_an_exported_bash_array_and_a_json_of_args_read_the_same() -> None:
    array = """NDPLAN_ARGS=(
  --tensor-model-parallel-size 2
  --pipeline-model-parallel-layout 'Ettt|tttt|tttt|ttttL'
  --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
  --recompute-granularity selective --recompute-modules core_attn
)"""
    mapping = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_layout": "Ettt|tttt|tttt|ttttL",
        "use_megatron_fsdp": True,
        "data_parallel_sharding_strategy": "optim_grads_params",
        "recompute_granularity": "selective",
        "recompute_modules": ["core_attn"],
        "sequence_parallel": False,
    }
    words = arguments_from_mapping(mapping)
    from_script = read(array, num_layers=15)
    from_json = megatron_layout(parse_arguments(words, "f"), "f", problem(num_layers=15))
    assert from_script.degrees == from_json.degrees
    assert from_script.degrees["zero"] == 3 and from_script.degrees["recompute"] == "selective"
    # pp is 1 here: the layout's 4 chunks are 4 virtual stages of one rank
    assert from_script.degrees["vpp"] == 4
    assert from_script.split == from_json.split == (3, 4, 4, 4)


@pytest.mark.parametrize(
    ("text", "recompute", "noted"),
    [
        ("--recompute-granularity full", "full", False),
        (
            "--recompute-granularity full --recompute-method block --recompute-num-layers 20",
            "full",
            False,
        ),
        (
            "--recompute-granularity full --recompute-method block --recompute-num-layers 2",
            "auto",
            True,
        ),
        ("--recompute-granularity selective --recompute-modules core_attn mlp", "auto", True),
    ],
)
def test_recompute_the_search_cannot_state_is_priced_per_layer_and_said(
    text, recompute, noted
) -> None:
    layout = read(f"--pipeline-model-parallel-size 4 {text}")
    assert layout.degrees["recompute"] == recompute
    assert bool(layout.notes) == noted
    # In a Megatron search, what Megatron states: the fastest of its settings that fits.
    own = read(f"--pipeline-model-parallel-size 4 {text}", framework="megatron")
    assert own.degrees["recompute"] == ("stated" if noted else recompute)
    if noted:
        assert "(recompute stated), which may be faster than it" in own.notes[0]
        assert "(recompute auto)" in layout.notes[0]
    assert bool(layout.notes) == noted


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "--tensor-model-parallel-size $TP",
            "f: --tensor-model-parallel-size $TP: expected a positive integer",
        ),
        (
            "--global-batch-size 1024",
            "f: --global-batch-size 1024 differs from the search's --gbs 512",
        ),
        ("--seq-length 4096", "f: --seq-length 4096 differs from the search's --seq-len 8192"),
        ("--micro-batch-size", "f: --micro-batch-size has no value"),
        ("--recompute-granularity some", "f: --recompute-granularity some unknown"),
        (
            "--pipeline-model-parallel-size 3 --num-layers-per-virtual-pipeline-stage 7",
            "does not divide",
        ),
        ("--tensor-model-parallel-size 'unclosed", "f: cannot read it as shell arguments"),
        (
            "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 "
            "--num-virtual-stages-per-pipeline-rank 2",
            "f: --num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-"
            "rank each state the virtual stages, which Megatron refuses (got 5 and 2); keep one",
        ),
        (
            "--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
            "--pipeline-model-parallel-layout 'E(t*10|)*8,L'",
            "--num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout each",
        ),
        (
            "--num-layers 32",
            "f: --num-layers 32 differs from the model's 80 layers; search the model this "
            "launch trains (--model)",
        ),
        (
            "--pipeline-model-parallel-size 4 "
            "--pipeline-model-parallel-layout 'Et*19|(t*20|)*2t*20L'",
            "f: --pipeline-model-parallel-layout places 79 decoder layers, not the model's 80 "
            "(got Et*19|(t*20|)*2t*20L); give one t per layer",
        ),
        ("--pipeline-model-parallel-layout 'Et*20|t*20|t*20|t*20,x,L'", "has 'x', not a layer"),
        ("--pipeline-model-parallel-layout 'E|(t|)*999999999L'", "unrolls to over 100000 layers"),
        pytest.param(
            "--pipeline-model-parallel-layout 'Et*" + "9" * 5000 + "L'",
            "unrolls to over 100000 layers",
            id="a-count-too-long-for-int",
        ),
    ],
)
def test_bad_arguments_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        read(text)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_file_without_megatron_flags_is_not_taken_for_one() -> None:
    assert not looks_like_megatron_args("tp: 4\npp: 8\n")


def test_a_dumped_args_namespace_states_its_virtual_stages_and_data_parallelism() -> None:
    """Megatron dumps the virtual stages it derives as virtual_pipeline_model_parallel_size
    (NeMo and Megatron-Bridge configs state them so), and data_parallel_size."""
    dumped = {
        "tensor_model_parallel_size": 8,
        "pipeline_model_parallel_size": 4,
        "virtual_pipeline_model_parallel_size": 5,
        "num_layers_per_virtual_pipeline_stage": None,
        "data_parallel_size": 2,
        "num_layers": 80,
        "world_size": 64,
        "recompute_granularity": None,
        "bf16": True,
    }
    read = megatron_layout(parse_arguments(arguments_from_mapping(dumped), "f"), "f", problem())
    assert (read.degrees["vpp"], read.degrees["dp"]) == (5, 2)
    # Beside the flag it was derived from, it must agree with it.
    agreeing = dumped | {"num_layers_per_virtual_pipeline_stage": 4}
    words = arguments_from_mapping(agreeing)
    assert megatron_layout(parse_arguments(words, "f"), "f", problem()).degrees["vpp"] == 5
    words = arguments_from_mapping(dumped | {"num_layers_per_virtual_pipeline_stage": 10})
    with pytest.raises(InvalidInputError) as err:
        megatron_layout(parse_arguments(words, "f"), "f", problem())
    assert str(err.value) == (
        "f: --virtual-pipeline-model-parallel-size 5 differs from the 2 virtual stages "
        "--num-layers-per-virtual-pipeline-stage states; fix one of them"
    )


@pytest.mark.parametrize(
    ("spelled", "pp", "layers", "split"),
    [
        ("Et*7|t*8|t*8|t*9,L", 4, 32, (7, 8, 8, 9)),
        ("E t*7 | t*8 | t*8 | t*9 L", 4, 32, (7, 8, 8, 9)),  # blanks are cosmetic too
        # Megatron's own example: DeepSeek-V3's 61 layers and its MTP layer over PP16 VPP2.
        ("Et*3|(tt|)*29,m|L", 16, 61, (3, *[2] * 29, 0, 0)),
        ("(Et*4|)*1,(t*4|)*6,t*4L", 4, 32, (4,) * 8),
    ],
)
def test_a_compact_layout_is_unrolled_as_megatron_reads_it(spelled, pp, layers, split) -> None:
    layout = read(
        f"--pipeline-model-parallel-size {pp} --pipeline-model-parallel-layout '{spelled}'",
        num_layers=layers,
    )
    assert layout.split == split
    assert layout.degrees["vpp"] == len(split) // pp


def test_recompute_activations_is_selective_recompute_over_any_granularity() -> None:
    assert read("--recompute-activations").degrees["recompute"] == "selective"
    # Megatron's validate_args sets selective whatever granularity is given.
    both = read("--recompute-granularity full --recompute-activations")
    assert both.degrees["recompute"] == "selective"
    json = {"recompute_activations": True, "recompute_granularity": "full"}
    words = arguments_from_mapping(json)
    assert megatron_layout(parse_arguments(words, "f"), "f", problem()).degrees["recompute"] == (
        "selective"
    )


def test_the_models_own_layer_count_and_the_split_flags_are_read() -> None:
    assert read("--num-layers 80 --pipeline-model-parallel-size 4").degrees["pp"] == 4
    # The embedding and loss count as layers: (78 + 2) / (pp 4 · 5 per virtual stage) = 4.
    layout = read(
        "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 "
        "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split",
        num_layers=78,
    )
    assert layout.degrees["vpp"] == 4
    assert "not its first/last-stage layer counts" in layout.notes[0]
    # Megatron FSDP's earlier name, which Megatron's dumped args still carry.
    assert read("--use-custom-fsdp").degrees["zero"] == 3
