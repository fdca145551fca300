"""Reading the layout of a torchtitan job config and of a MindFormers YAML
(adapters/readers/torchtitan_config.py, mindformers_config.py), as ``search --baseline``
does, and what a DeepSpeed JSON states (deepspeed_config.py). The round trip through ``--export`` is tested in tests/cli/test_export_cli.py."""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace

import pytest
import yaml

from ndplan.adapters.readers.deepspeed_config import deepspeed_refusal, is_deepspeed
from ndplan.adapters.readers.launch import Problem
from ndplan.adapters.readers.mindformers_config import is_mindformers, mindformers_layout
from ndplan.adapters.readers.torchtitan_config import torchtitan_layout
from ndplan.core.errors import InvalidInputError

PROBLEM = Problem(num_layers=32, is_moe=False, global_batch=64, seq_length=8192)

TITAN = """
[parallelism]
data_parallel_replicate_degree = 2
data_parallel_shard_degree = 4
tensor_parallel_degree = 2
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_microbatch_size = 1
module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1"], ["layers.2"], ["layers.3"], ["layers.4", "norm", "output"]]

[training]
local_batch_size = 8
global_batch_size = 64
seq_len = 8192

[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
"""


def titan(text: str, problem: Problem = PROBLEM):
    return torchtitan_layout(tomllib.loads(text), "f.toml", problem)


def test_a_torchtitan_config_states_its_layout() -> None:
    read = titan(TITAN, Problem(num_layers=5, is_moe=False, global_batch=64, seq_length=8192))
    assert read.degrees == {
        "tp": 2, "pp": 2, "cp": 1, "dp": 8, "zero": 3, "schedule": "interleaved", "vpp": 2,
        "mbs": 1, "recompute": "selective",
    }  # fmt: skip
    # HSDP is priced as FSDP over every data-parallel rank; the split is carried for the
    # search to compare with the one it places.
    assert len(read.notes) == 1 and "HSDP (replicate 2 × shard 4)" in read.notes[0]
    assert read.split == (2, 1, 1, 1)


def test_torchtitan_with_one_replica_leaves_the_zero_stage_to_the_search() -> None:
    """Shard and replicate degrees of 1 shard nothing (torchtitan applies no FSDP): the
    stage is moot, and the search's own stands for it, as for the layouts it ranks."""
    one = "[parallelism]\ntensor_parallel_degree = 8\ndata_parallel_replicate_degree = 1\n"
    read = titan(one + "data_parallel_shard_degree = 1\n")
    assert read.degrees == {"tp": 8, "pp": 1, "cp": 1, "dp": 1}
    two = titan(one.replace("tensor_parallel_degree = 8", "tensor_parallel_degree = 4")
                + "data_parallel_shard_degree = 2\n")  # fmt: skip
    assert two.degrees["zero"] == 3
    # With context parallelism torchtitan shards over the CP ranks whatever the shard degree.
    cp = titan(one.replace("tensor_parallel_degree = 8", "tensor_parallel_degree = 4")
               + "data_parallel_shard_degree = 1\ncontext_parallel_degree = 2\n")  # fmt: skip
    assert cp.degrees["zero"] == 3 and cp.degrees["cp"] == 2


def test_torchtitan_defaults_fsdp_over_the_rest_and_leaves_unstated_choices_free() -> None:
    read = titan("[parallelism]\ntensor_parallel_degree = 4\n")
    assert read.degrees == {"tp": 4, "pp": 1, "cp": 1, "zero": 3}
    assert (
        titan(
            "[parallelism]\ndata_parallel_shard_degree = 1\ndata_parallel_replicate_degree = 8\n"
        ).degrees["zero"]
        == 0
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "ZBVZeroBubble"',
            "is not one ndplan prices",
        ),
        (
            "[training]\nglobal_batch_size = 128",
            "training.global_batch_size 128 differs from the search's --gbs 64",
        ),
        (
            "[training]\nseq_len = 4096",
            "training.seq_len 4096 differs from the search's --seq-len 8192",
        ),
        (
            "[parallelism]\ntensor_parallel_degree = 0",
            "parallelism.tensor_parallel_degree 0: expected a positive integer",
        ),
        (
            '[activation_checkpoint]\nmode = "sometimes"',
            "activation_checkpoint.mode 'sometimes' unknown",
        ),
    ],
)
def test_bad_torchtitan_values_are_one_line(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(")):
        titan(text)


def test_torchtitan_without_a_global_batch_steps_local_batch_times_dp() -> None:
    """torchtitan's global_batch_size defaults to local_batch_size × the data-parallel
    degree, one step without accumulation: a file that leaves it out states that batch,
    which must be the search's (it was placed at any --gbs)."""
    fsdp = "[parallelism]\ntensor_parallel_degree = 8\n[training]\nlocal_batch_size = 8\n"
    # FSDP over what TP leaves of 64 devices: dp 8, so 64 sequences a step.
    with pytest.raises(InvalidInputError, match=re.escape(
        "f.toml: training.global_batch_size is unset, so torchtitan steps local_batch_size 8 "
        "× data-parallel degree 8 = 64 sequences, not the search's --gbs 512; search with "
        "--gbs 64 or set global_batch_size = 512 to accumulate gradients"
    )):  # fmt: skip
        titan(fsdp, replace(PROBLEM, global_batch=512, devices=64))
    assert titan(fsdp, replace(PROBLEM, devices=64)).degrees["mbs"] == 8  # 8 × 8 = --gbs 64
    # Not told the devices, the reader places the dp that makes the search's batch (the
    # search refuses it where the devices give another), or refuses a batch none makes.
    read = titan(fsdp, replace(PROBLEM, global_batch=512))
    assert read.degrees["dp"] == 64 and read.notes[0].endswith("at --gbs 512 that is dp 64")
    with pytest.raises(InvalidInputError, match="sequences, never the search's --gbs 100"):
        titan(fsdp, replace(PROBLEM, global_batch=100))
    # A shard degree the file states is its dp; a global batch it states is what counts.
    shard = fsdp.replace("[training]", "data_parallel_shard_degree = 4\n[training]")
    with pytest.raises(InvalidInputError, match="8 × data-parallel degree 4 = 32 sequences"):
        titan(shard)
    assert titan(shard + "global_batch_size = 64\n").degrees["dp"] == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "[parallelism]\ntensor_paralel_degree = 8",
            "parallelism.tensor_paralel_degree is not a torchtitan setting; did you mean "
            "tensor_parallel_degree, expert_tensor_parallel_degree, expert_parallel_degree?",
        ),
        (
            "[parallelism]\nzero_stage = 3",
            "parallelism.zero_stage is not a torchtitan setting; correct its name or remove it",
        ),
        (
            "[training]\nlocal_batch_sise = 8",
            "training.local_batch_sise is not a torchtitan setting; did you mean "
            "local_batch_size, global_batch_size?",
        ),
        (
            "[training]\ntensor_parallel_degree = 8",
            "training.tensor_parallel_degree: torchtitan reads the parallel degrees from "
            "[parallelism]; move it there",
        ),
        (
            '[activation_checkpoint]\nmod = "full"',
            "activation_checkpoint.mod is not a torchtitan setting; did you mean mode?",
        ),
    ],
)
def test_a_key_torchtitan_does_not_have_is_refused(text: str, message: str) -> None:
    """torchtitan refuses them too; read past, a misspelt degree would be placed at 1."""
    with pytest.raises(InvalidInputError, match=re.escape(f"f.toml: {message}")):
        titan(text)


def test_torchtitan_settings_ndplan_does_not_read_are_accepted() -> None:
    """Real keys ndplan does not read pass; so, where a section holds more than the
    layout, does an unknown key like none ndplan reads (torchtitan's to judge)."""
    text = """
[parallelism]
tensor_parallel_degree = 2
fsdp_reshard_after_forward = "always"
disable_loss_parallel = true
enable_compiled_autograd = false
context_parallel_rotate_method = "alltoall"
pipeline_parallel_schedule_csv = ""

[training]
dataset = "c4"
steps = 1000
a_setting_of_a_later_release = 1

[activation_checkpoint]
mode = "full"
preserve_rng_state = true
"""
    assert titan(text).degrees == {"tp": 2, "pp": 1, "cp": 1, "zero": 3, "recompute": "full"}
    # Later releases name the modules of each chunk pipeline_parallel_module_fqns_per_model_part.
    newer = TITAN.replace("module_fqns", "pipeline_parallel_module_fqns")
    assert titan(newer, replace(PROBLEM, num_layers=5)).split == (2, 1, 1, 1)


@pytest.mark.parametrize(
    ("option", "recompute", "noted"),
    [("op", "selective", False), ("1", "full", False), ("2", "auto", True)],
)
def test_torchtitan_layer_checkpointing(option: str, recompute: str, noted: bool) -> None:
    text = f'[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "{option}"\n'
    read = titan(text)
    assert read.degrees["recompute"] == recompute and bool(read.notes) == noted
    # In a torchtitan search, one layer in every N is one of the settings `stated` weighs.
    own = titan(text, replace(PROBLEM, framework="torchtitan"))
    assert own.degrees["recompute"] == ("stated" if noted else recompute)


MINDFORMERS = """
parallel_config: {data_parallel: 2, model_parallel: 2, pipeline_stage: 4, context_parallel: 1,
                  use_seq_parallel: true, micro_batch_num: 16}
parallel: {enable_parallel_optimizer: true}
runner_config: {batch_size: 2}
model:
  model_config:
    num_layers: 32
    seq_length: 8192
    pp_interleave_num: 2
    offset: [[0, 0, 1, 0], [0, 0, 0, -1]]
recompute_config:
  recompute: [[4, 4, 5, 4], [4, 4, 4, 3]]
"""


def test_a_mindformers_config_states_its_layout() -> None:
    data = yaml.safe_load(MINDFORMERS)
    assert is_mindformers(data)
    read = mindformers_layout(data, "f.yaml", PROBLEM)
    assert read.degrees == {
        "dp": 2, "tp": 2, "pp": 4, "cp": 1, "sp": True, "vpp": 2, "mbs": 2, "zero": 1,
        "recompute": "full",  # every layer of every chunk, counted per chunk with the offsets
    }  # fmt: skip
    assert read.split == (4, 4, 5, 4, 4, 4, 4, 3) and read.notes == []


@pytest.mark.parametrize(
    ("recompute_config", "recompute"),
    [
        ({"recompute": False, "select_recompute": True}, "selective"),
        ({"recompute": [0, 0, 0, 0]}, "none"),
        ({"recompute": [8, 8, 9, 7]}, "full"),  # per stage: 4+4, 4+4, 5+4, 4+3 layers
        ({"recompute": [2, 0, 0, 0], "select_recompute": [6, 8, 9, 7]}, "auto"),
    ],
)
def test_mindformers_recompute_counts(recompute_config: dict, recompute: str) -> None:
    data = yaml.safe_load(MINDFORMERS)
    data["recompute_config"] = recompute_config
    assert mindformers_layout(data, "f.yaml", PROBLEM).degrees["recompute"] == recompute
    own = replace(PROBLEM, framework="mindformers")
    expected = "stated" if recompute == "auto" else recompute  # per-stage counts, as stated
    assert mindformers_layout(data, "f.yaml", own).degrees["recompute"] == expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"runner_config": {"batch_size": 4}},
            "data_parallel · batch_size · micro-batches 128 differs",
        ),
        (
            {"model": {"model_config": {"pp_interleave_num": 2, "offset": [1, -1]}}},
            "offset has 2 entries for 8 chunks",
        ),
        (
            {"recompute_config": {"recompute": [1, 2, 3]}},
            "recompute_config.recompute has 3 counts for 4 stages",
        ),
        # The model and sequence the config was made for must be the search's.
        (
            {"model": {"model_config": {"seq_length": 4096}}},
            "model.model_config.seq_length 4096 differs from the search's --seq-len 8192",
        ),
        (
            {"model": {"model_config": {"num_layers": 80}}},
            "model.model_config.num_layers 80 differs from the searched model's 32 decoder",
        ),
        # Offsets that place a layer twice (or none) or leave a stage fewer than none.
        (
            {"model": {"model_config": {"offset": [1, 0, 0, 0]}}},
            "places 33 layers where the model has 32 .4 chunks of 8 plus the offsets.; give "
            "offsets that sum to 0",
        ),
        (
            {"model": {"model_config": {"offset": [-9, 3, 3, 3]}}},
            "leaves stage 0 with -1 layers",
        ),
    ],
)
def test_bad_mindformers_values_are_one_line(change: dict, message: str) -> None:
    data = yaml.safe_load(MINDFORMERS) | change
    with pytest.raises(InvalidInputError, match=message):
        mindformers_layout(data, "f.yaml", PROBLEM)


DEEPSPEED = {
    "train_batch_size": 64,
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 4,
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
}


@pytest.mark.parametrize(
    ("change", "stated"),
    [
        ({}, "dp=8,mbs=2,offload_optimizer=true,zero=3"),
        # Without the accumulation steps the batch does not give the data-parallel degree.
        ({"gradient_accumulation_steps": None}, "mbs=2,offload_optimizer=true,zero=3"),
        # No zero_optimization section: DeepSpeed runs without ZeRO.
        ({"zero_optimization": None}, "dp=8,mbs=2,zero=0"),
        # "auto" (the HF Trainer's integration fills it in) states nothing.
        ({"train_micro_batch_size_per_gpu": "auto"}, "offload_optimizer=true,zero=3"),
    ],
)
def test_a_deepspeed_config_is_refused_naming_what_it_states(change: dict, stated: str) -> None:
    data = {k: v for k, v in (DEEPSPEED | change).items() if v is not None}
    assert is_deepspeed(data) and not is_mindformers(data)
    message = str(deepspeed_refusal(data, "ds.json", PROBLEM))
    assert message == (
        f"ds.json: a DeepSpeed config states {stated} but not TP or PP, which DeepSpeed takes "
        f"from the model code; give them too: --baseline tp=TP,pp=PP,{stated}"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"train_batch_size": 128}, "train_batch_size 128 differs from the search's --gbs 64"),
        ({"zero_optimization": {"stage": 4}}, r"zero_optimization.stage 4: expected 0, 1, 2 or 3"),
        ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu 0"),
    ],
)
def test_bad_deepspeed_values_are_one_line(change: dict, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        deepspeed_refusal(DEEPSPEED | change, "ds.json", PROBLEM)


EIGHTY = Problem(num_layers=80, is_moe=False, global_batch=64, seq_length=8192)
PIPELINE = '[parallelism]\npipeline_parallel_degree = 4\npipeline_parallel_schedule = "{}"\n'


@pytest.mark.parametrize(
    ("schedule", "extra", "vpp", "split"),
    [
        # No weight for the embedding and output: 80 layers make 16 stages of 5, 4 a rank.
        ("Interleaved1F1B", "pipeline_parallel_layers_per_stage = 5\n"
         "pipeline_parallel_first_stage_less_layers = 0\n"
         "pipeline_parallel_last_stage_less_layers = 0\n", 4, (5,) * 16),
        # torchtitan's default weight of 1 each: ceil(82 / 11) = 8 stages, the end ones short.
        ("Interleaved1F1B", "pipeline_parallel_layers_per_stage = 11\n", 2,
         (10, 11, 10, 10, 10, 10, 10, 9)),
        ("1F1B", "pipeline_parallel_layers_per_stage = 21\n", 1, (20, 21, 20, 19)),
        # Stated neither way, torchtitan builds two stages a rank for a multi-stage schedule.
        ("Interleaved1F1B", "", 2, None),
        ("1F1B", "", 1, None),
        # Releases before module lists: a stage begins at each split point.
        ("1F1B", 'pipeline_parallel_split_points = ["layers.15", "layers.40", "layers.60"]\n',
         1, (15, 25, 20, 20)),
    ],
)  # fmt: skip
def test_torchtitan_stages_per_rank_are_the_ones_it_builds(
    schedule: str, extra: str, vpp: int, split: tuple[int, ...] | None
) -> None:
    """torchtitan's pipeline_llm: ceil((layers + first + last stage weights) / layers per
    stage) stages, generate_llm_fqn_per_model_part's split; placed, not left to the search."""
    read = titan(PIPELINE.format(schedule) + extra, EIGHTY)
    assert read.degrees["vpp"] == vpp and read.split == split
    assert read.notes == []
    # An unstated micro-batch is torchtitan's default of 1, as an unstated degree is.
    assert read.degrees["mbs"] == 1


@pytest.mark.parametrize(
    ("schedule", "extra", "message"),
    [
        ("Interleaved1F1B", "pipeline_parallel_layers_per_stage = 5\n",
         "f.toml: parallelism.pipeline_parallel_layers_per_stage: torchtitan refuses the stages "
         "it makes, not a multiple of pp 4 (got 5: ceil((80 layers + 1 + 1 for the embedding "
         "and output) / 5) = 17 stages); use a value it runs, e.g. 3"),
        ("Interleaved1F1B", "pipeline_parallel_layers_per_stage = 21\n",
         "1 per rank where Interleaved1F1B runs 2 or more (got 21: ceil((80 layers + 1 + 1 "
         "for the embedding and output) / 21) = 4 stages); use a value it runs, e.g. 11"),
        ("1F1B", "pipeline_parallel_layers_per_stage = 11\n",
         "2 per rank where 1F1B runs 1 (got 11"),
        ("1F1B", 'pipeline_parallel_split_points = ["layers.40"]\n',
         "parallelism.pipeline_parallel_split_points: they make 2 stages, which 1F1B cannot run "
         "over pp 4 (got ['layers.40'])"),
        ("1F1B", "pipeline_parallel_microbatch_size = 3\n[training]\nlocal_batch_size = 8\n",
         "training.local_batch_size 8 is not a multiple of "
         "parallelism.pipeline_parallel_microbatch_size 3, which torchtitan refuses"),
    ],
)  # fmt: skip
def test_torchtitan_stages_it_refuses_are_one_line(schedule: str, extra: str, message: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        titan(PIPELINE.format(schedule) + extra, EIGHTY)
    assert message in str(caught.value) and "\n" not in str(caught.value)
