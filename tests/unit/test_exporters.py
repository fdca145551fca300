"""Exporters (adapters/exporters): a priced plan written as the config its framework runs.

Each format is read back with the reader its framework uses (bash for Megatron's argument
array, tomllib, PyYAML, json) and checked against the plan: the degrees, the batch
arithmetic, the layer placement and the recompute. Where a framework cannot state the
plan's per-layer recompute, the written choice must save at least the planned memory on
every chunk, and a caveat must say so.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tomllib

import pytest
import yaml

from ndplan.adapters.exporters import megatron, torchtitan
from ndplan.adapters.exporters.common import Chunk, chunks, switches
from ndplan.adapters.exporters.megatron import ARRAY, MODULES, recompute_args
from ndplan.adapters.exporters.torchtitan import checkpoint_settings
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.ports import Exported, Exporter
from ndplan.planner import Planner, PricingOptions


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def priced(planner: Planner, model: str, n: int, gbs: int, seq: int, layout: Layout, **job):
    ctx = planner.context(
        planner.model(model), planner.device(job.pop("device", "h100")), n,
        Job(global_batch_size=gbs, seq_length=seq, **job),
    )  # fmt: skip
    return planner.estimate(ctx, layout), ctx


def export(planner: Planner, name: str, plan, ctx, price=None) -> Exported:
    exporter = planner.components.exporters.get(name)
    assert isinstance(exporter, Exporter)
    made = exporter.render(plan, ctx, price=price)
    assert isinstance(made, Exported)
    return made


def megatron_args(text: str, tmp_path) -> dict[str, list[str]]:
    """The argument array as bash sees it: flag -> the values after it."""
    script = tmp_path / "args.sh"
    script.write_text(text)
    out = subprocess.run(
        ["bash", "-c", f'source "{script}"; printf "%s\\n" "${{{ARRAY}[@]}}"'],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    args: dict[str, list[str]] = {}
    flag = None
    for token in out:
        if token.startswith("--"):
            flag = token
            assert flag not in args, f"{flag} given twice"
            args[flag] = []
        else:
            args[flag].append(token)
    return args


LLAMA_8B_CASES = [
    Layout(tp=2, pp=2, dp=4, num_microbatches=8, mbs=2, zero=1, sp=True, recompute="selective"),
    Layout(
        tp=1,
        pp=4,
        vpp=2,
        dp=4,
        num_microbatches=16,
        zero=1,
        schedule="interleaved",
        recompute="full",
    ),
    Layout(tp=4, cp=2, dp=2, num_microbatches=32, zero=3, sp=True),
    Layout(pp=8, dp=2, num_microbatches=32, zero=0, layers_per_stage=(3, 4, 4, 4, 4, 4, 4, 5)),
]


@pytest.mark.parametrize(
    "layout", LLAMA_8B_CASES, ids=["tp2pp2-sel", "pp4x2-full", "tp4cp2-z3", "pp8-uneven"]
)
def test_megatron_arguments_state_the_plan(planner: Planner, layout: Layout, tmp_path) -> None:
    plan, ctx = priced(planner, "llama-3-8b", 16, 64, 8192, layout)
    made = export(planner, "megatron", plan, ctx)
    assert made.caveats == ()  # every one of these is a layout Megatron states exactly
    args = megatron_args(made.text, tmp_path)
    lay = plan.layout
    assert args["--tensor-model-parallel-size"] == [str(lay.tp)]
    assert args["--pipeline-model-parallel-size"] == [str(lay.pp)]
    assert args["--context-parallel-size"] == [str(lay.cp)]
    assert args["--micro-batch-size"] == [str(lay.mbs)]
    assert args["--global-batch-size"] == ["64"] and args["--seq-length"] == ["8192"]
    # Megatron derives DP from the world size: the degrees multiply out to the devices.
    assert lay.tp * lay.pp * lay.cp * lay.dp == 16
    assert ("--sequence-parallel" in args) == lay.sequence_parallel
    assert ("--use-distributed-optimizer" in args) == (lay.zero >= 1)
    assert ("--use-megatron-fsdp" in args) == (lay.zero == 3)
    if lay.layers_per_stage is not None:
        spelled = args["--pipeline-model-parallel-layout"][0]
        assert [part.count("t") for part in spelled.split("|")] == list(lay.layers_per_stage)
        assert spelled.startswith("E") and spelled.endswith("L")
    elif lay.vpp > 1:
        assert args["--num-virtual-stages-per-pipeline-rank"] == [str(lay.vpp)]
    granularity = args.get("--recompute-granularity")
    if lay.recompute == "selective":
        assert granularity == ["selective"] and args["--recompute-modules"] == ["core_attn"]
    elif lay.recompute == "full":
        assert granularity == ["full"] and args["--recompute-method"] == ["uniform"]
    else:
        assert granularity is None


@pytest.mark.parametrize("stated", [None, True])
def test_megatron_overlaps_tp_communication_only_with_sequence_parallelism(
    planner: Planner, tmp_path, stated
) -> None:
    """Megatron asserts --sequence-parallel for --tp-comm-overlap: a plan without SP is
    written without it (and priced with nothing hidden); where the job asked for the
    overlap, a caveat says why it is left out."""
    for sp in (True, False):
        layout = Layout(tp=2, dp=4, num_microbatches=16, zero=1, sp=sp)
        plan, ctx = priced(planner, "llama-3-8b", 8, 64, 8192, layout, tp_comm_overlap=stated)
        made = export(planner, "megatron", plan, ctx)
        args = megatron_args(made.text, tmp_path)
        assert ("--tp-comm-overlap" in args) == sp
        assert ("--sequence-parallel" in args) == sp
        left_out = [c for c in made.caveats if "--tp-comm-overlap" in c]
        assert bool(left_out) == (not sp and stated is True)


def test_megatron_moe_and_fp8_arguments(planner: Planner, tmp_path) -> None:
    layout = Layout(tp=2, pp=8, dp=16, ep=32, etp=1, num_microbatches=16, zero=1, sp=True)
    plan, ctx = priced(
        planner, "deepseek-v3", 256, 256, 4096, layout, precision="mxfp8", device="b200"
    )
    args = megatron_args(export(planner, "megatron", plan, ctx).text, tmp_path)
    assert args["--expert-model-parallel-size"] == ["32"]
    assert args["--expert-tensor-parallel-size"] == ["1"]
    assert args["--fp8-recipe"] == ["mxfp8"] and "--fp8-param-gather" in args
    # 61 decoder layers over 8 stages do not split evenly: the layout is spelled out, with MTP.
    spelled = args["--pipeline-model-parallel-layout"][0]
    assert sum(part.count("t") for part in spelled.split("|")) == 61
    assert spelled.endswith("mL")


@pytest.mark.parametrize("name", ["megatron", "torchtitan"])
def test_an_export_without_a_pricer_says_its_stand_in_is_not_priced(planner, name) -> None:
    """Rendered without a pricer (a library caller may), a stand-in recompute is written
    unpriced: the header must not give the plan's own figures as the file's."""
    zero = 1 if name == "megatron" else 3
    layout = Layout(
        dp=4, tp=4, pp=4, mbs=1, num_microbatches=128, zero=zero, sp=True, recompute="auto"
    )
    plan, ctx = priced(planner, "llama-3-70b", 64, 512, 8192, layout, framework=name)
    made = export(planner, name, plan, ctx)
    predicted = next(line for line in made.text.splitlines() if "predicted:" in line)
    assert "not priced as written" in predicted and f"{plan.time.step_s:.3f} s" in predicted
    priced_made = export(
        planner, name, plan, ctx, price=lambda o: planner.estimate_per_layer(ctx, plan.layout, o)
    )
    assert "not priced" not in priced_made.text and " as written (" in priced_made.text


def chunk(options: str, index: int = 0, stage: int | None = None) -> Chunk:
    """A chunk of these options; on its own rank unless ``stage`` says which."""
    return Chunk(index, 0, tuple(options.split()), index if stage is None else stage)


@pytest.mark.parametrize(
    ("parts", "exact"),
    [
        ((chunk("full full none none"), chunk("full full none none", 1)), True),
        ((chunk("full none none none"), chunk("full full none none", 1)), False),
        ((chunk("none full none none"), chunk("none full none none", 1)), False),  # not leading
        ((chunk("core_attn core_attn"), chunk("core_attn core_attn", 1)), True),
        ((chunk("norm norm+mlp none"), chunk("none none norm", 1)), False),
        ((chunk("full core_attn none"), chunk("none none none", 1)), False),
    ],
)
def test_megatron_recompute_without_a_pricer_saves_at_least_the_planned_memory(
    parts, exact: bool
) -> None:
    args, caveats, written = recompute_args(parts, plan=None, ctx=None)
    # Nothing to price it with: exact, or a stand-in left unpriced.
    assert written is None if exact else written.plan is None
    assert (caveats == []) == exact
    if args[1] == "full":  # whole layers: the first N of each chunk
        n = int(args[args.index("--recompute-num-layers") + 1])
        if args[3] == "block":
            for c in parts:  # at least every recomputing layer is covered, counted per chunk
                assert n >= len(c.options) - c.count("none")
    else:  # the same modules on every layer: a superset of each layer's switches
        modules = set(args[args.index("--recompute-modules") + 1 :])
        for c in parts:
            for option in c.options:
                assert {MODULES[s] for s in switches(option) if s in MODULES} <= modules


@pytest.mark.parametrize(
    ("parts", "offloads"),
    [
        ((chunk("offload offload offload none"),), 3),  # the first 3 of 4, no PP: runs
        ((chunk("offload offload offload offload"),), None),  # every layer: Megatron refuses
        ((chunk("offload none"), chunk("offload none", 1)), None),  # under PP: refused
    ],
)
def test_megatron_writes_activation_offload_only_as_megatron_core_runs_it(parts, offloads) -> None:
    """Megatron-Core offloads --cpu-offloading-num-layers N < L layers, and not under
    pipeline parallelism; other offloading is written as whole layers recomputed (as much
    memory saved, a caveat saying so)."""
    args, caveats, _ = recompute_args(parts, plan=None, ctx=None)
    if offloads is None:
        assert "--cpu-offloading" not in args and caveats
        assert args[:2] == ["--recompute-granularity", "full"]
    else:
        assert args == ["--cpu-offloading", "--cpu-offloading-num-layers", str(offloads)]
        assert caveats == []


@pytest.mark.parametrize(
    ("parts", "settings", "exact"),
    [
        ((chunk("full full full"),), {"mode": "full"}, True),
        (
            (chunk("op op"), chunk("op op", 1)),
            {"mode": "selective", "selective_ac_option": "op"},
            True,
        ),
        ((chunk("full none full none"),), {"mode": "selective", "selective_ac_option": "2"}, True),
        ((chunk("full full full none"),), {"mode": "full"}, False),
        (  # one of six: options 4, 5 and 6 all wrap one layer; the first is written
            (chunk("full none none none none none"),),
            {"mode": "selective", "selective_ac_option": "4"},
            True,
        ),
        ((chunk("op none"),), {"mode": "selective", "selective_ac_option": "op"}, False),
        # torchtitan counts a rank's layers over its chunks: one rank holding a one-layer
        # and a three-layer chunk wraps its 2nd and 4th layers with option 2 ...
        (
            (chunk("none", 0, stage=0), chunk("full none full", 1, stage=0)),
            {"mode": "selective", "selective_ac_option": "2"},
            True,
        ),
        # ... and a rank holding one layer wraps none with any N ≥ 2: only every layer
        # whole saves the planned memory there.
        ((chunk("full"), chunk("full", 1), chunk("full none", 2)), {"mode": "full"}, False),
    ],
)
def test_torchtitan_checkpointing(parts, settings, exact: bool) -> None:
    written, caveats, priced = checkpoint_settings(parts, plan=None, ctx=None)
    assert priced is None if exact else priced.plan is None  # nothing to price it with
    assert written == settings
    assert (caveats == []) == exact


@pytest.mark.parametrize("layout", [
    Layout(tp=2, pp=4, vpp=2, dp=2, num_microbatches=32, zero=3, sp=True, schedule="interleaved", recompute="full"),
    Layout(tp=2, dp=8, mbs=2, num_microbatches=4, zero=0, sp=True, recompute="selective"),
])  # fmt: skip
def test_torchtitan_toml(planner: Planner, layout: Layout) -> None:
    plan, ctx = priced(planner, "llama-3-8b", 16, 64, 8192, layout, framework="torchtitan")
    made = export(planner, "torchtitan", plan, ctx)
    config = tomllib.loads(made.text)
    par, training = config["parallelism"], config["training"]
    lay = plan.layout
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert dp == lay.dp and (par["data_parallel_shard_degree"] > 1) == (lay.zero == 3)
    assert par["tensor_parallel_degree"] == lay.tp and par["pipeline_parallel_degree"] == lay.pp
    # torchtitan accumulates global / (local · dp) batches: one when the pipeline runs them.
    accumulated = training["global_batch_size"] // (training["local_batch_size"] * dp)
    assert training["global_batch_size"] == 64
    if lay.pp > 1:
        assert accumulated == 1
        assert training["local_batch_size"] == lay.mbs * lay.num_microbatches
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == lay.pp * lay.vpp
        layers = [m for part in parts for m in part if m.startswith("layers.")]
        assert layers == [f"layers.{i}" for i in range(32)]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    else:
        assert accumulated == lay.num_microbatches
    want = {
        "full": {"mode": "full"},
        "selective": {"mode": "selective", "selective_ac_option": "op"},
    }
    assert config["activation_checkpoint"] == want[lay.recompute]
    assert made.caveats == ()


def test_mindformers_offsets_and_recompute_lists(planner: Planner) -> None:
    layout = Layout(tp=2, pp=4, vpp=2, dp=2, num_microbatches=32, zero=1, sp=True, schedule="interleaved",
                    recompute="auto", layers_per_stage=(3, 4, 4, 5, 4, 4, 4, 4))  # fmt: skip
    plan, ctx = priced(planner, "llama-3-8b", 16, 64, 8192, layout, framework="mindformers")
    config = yaml.safe_load(export(planner, "mindformers", plan, ctx).text)
    par = config["parallel_config"]
    assert (par["data_parallel"], par["model_parallel"], par["pipeline_stage"]) == (2, 2, 4)
    assert (
        par["micro_batch_num"] * config["runner_config"]["batch_size"] * par["data_parallel"] == 64
    )
    offset = config["model"]["model_config"]["offset"]
    base = 32 // 8
    # [vpp][pp]: virtual stage v of stage s is chunk v·pp + s
    assert [base + o for row in offset for o in row] == list(layout.layers_per_stage)
    full = config["recompute_config"]["recompute"]
    selected = config["recompute_config"]["select_recompute"]
    parts = chunks(plan, ctx)
    for c in parts:
        v, s = divmod(c.index, 4)
        assert full[v][s] == c.count("full")
        assert selected[v][s] == len(c.options) - c.count("none", "full")


def test_mindformers_header_prices_the_default_selection_the_file_runs(planner: Planner) -> None:
    """Where the plan recomputes ops other than MindFormers' default selection, the file's
    select_recompute layers run that selection: the header prices the file as written
    (and says when it no longer fits), not the plan's own choice."""
    layout = Layout(tp=4, pp=4, vpp=5, dp=4, num_microbatches=64, zero=1, sp=True,
                    schedule="interleaved", recompute="auto")  # fmt: skip
    plan, ctx = priced(planner, "llama-3-70b", 64, 256, 8192, layout, framework="mindformers")
    parts = chunks(plan, ctx)
    assert {o for c in parts for o in c.options} - {"none", "full", "core_attn"}  # other ops
    made = export(
        planner, "mindformers", plan, ctx,
        price=lambda o: planner.estimate_per_layer(ctx, plan.layout, o),
    )  # fmt: skip
    predicted = next(line for line in made.text.splitlines() if "predicted:" in line)
    assert "as written (core_attn on the select_recompute layers)" in predicted
    written = float(predicted.split("predicted: step ")[1].split(" s")[0])
    assert written != round(plan.time.step_s, 3)
    assert any("does not fit" in c for c in made.caveats) == (
        "GiB" in predicted and float(predicted.split("peak ")[1].split(" GiB")[0]) > 80
    )


def test_mindformers_says_it_writes_no_expert_tp(planner: Planner) -> None:
    """MindFormers' parallel_config splits experts by model_parallel; a plan whose expert
    TP differs (the search folds it where EP reaches into the TP ranks, or --etp sets it)
    says so instead of writing a file that silently runs another layout."""

    def caveats(etp: int) -> list[str]:
        layout = Layout(tp=2, dp=4, ep=4, etp=etp, num_microbatches=8, zero=1, sp=True)
        plan, ctx = priced(planner, "mixtral-8x7b", 8, 32, 4096, layout, framework="mindformers")
        made = export(planner, "mindformers", plan, ctx)
        assert yaml.safe_load(made.text)["parallel_config"]["expert_parallel"] == 4
        return [c for c in made.caveats if "expert" in c]

    assert caveats(2) == []
    (line,) = caveats(1)
    assert "keeps each expert whole (expert TP 1), not over model_parallel's 2" in line


def test_deepspeed_json(planner: Planner) -> None:
    layout = Layout(
        tp=2,
        pp=2,
        dp=4,
        mbs=2,
        num_microbatches=8,
        zero=1,
        offload_optimizer=True,
        recompute="full",
    )
    plan, ctx = priced(planner, "llama-3-8b", 16, 64, 4096, layout, framework="deepspeed")
    made = export(planner, "deepspeed", plan, ctx)
    config = json.loads(made.text)
    assert (
        config["train_batch_size"]
        == config["train_micro_batch_size_per_gpu"]
        * config["gradient_accumulation_steps"]
        * layout.dp
        == 64
    )
    assert config["zero_optimization"]["stage"] == 1
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    # What DeepSpeed takes from the model code is named, not dropped.
    assert any(
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2" in c for c in made.caveats
    )
    assert any("--checkpoint-activations" in c for c in made.caveats)


def test_deepspeed_names_megatron_deepspeeds_expert_parallel_flag(planner: Planner) -> None:
    layout = Layout(dp=8, ep=8, mbs=1, num_microbatches=4, zero=1)
    plan, ctx = priced(planner, "mixtral-8x7b", 8, 32, 4096, layout, framework="deepspeed")
    made = export(planner, "deepspeed", plan, ctx)
    # Megatron-DeepSpeed's flag; --expert-model-parallel-size is Megatron-LM's.
    assert any("--moe-expert-parallel-size 8" in c for c in made.caveats), made.caveats
    assert not any("--expert-model-parallel-size" in c for c in made.caveats)


def test_ndplan_json_is_the_plan_with_its_inputs(planner: Planner) -> None:
    layout = Layout(tp=2, pp=2, dp=4, num_microbatches=16, zero=1, recompute="auto")
    plan, ctx = priced(planner, "llama-3-8b", 16, 64, 8192, layout)
    document = json.loads(export(planner, "ndplan", plan, ctx).text)
    inputs = document.pop("inputs")
    assert inputs == {"model": ctx.model.name, "device": "h100-sxm", "devices": 16,
                      "job": {"global_batch_size": 64, "seq_length": 8192}}  # fmt: skip
    assert document == json.loads(plan.model_dump_json())


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_a_per_layer_choice_is_written_as_the_fastest_setting_that_fits(
    planner: Planner, framework: str
) -> None:
    """Where the framework cannot state the plan's per-layer recompute, the exporter
    prices every setting it can state and writes the fastest that fits, saying what it
    costs; checked here against pricing each candidate by hand."""
    options = PricingOptions(max_mem_gib=24)
    ctx = planner.context(
        planner.model("llama-3-8b"), planner.device("h100"), 8,
        Job(global_batch_size=32, seq_length=4096, framework=framework), options=options,
    )  # fmt: skip
    # The best layouts of that search (ndplan search … --max-mem 24): per-layer mixes.
    layout = (
        Layout(tp=4, pp=2, num_microbatches=32, zero=1, sp=True, recompute="auto")
        if framework == "megatron"
        else Layout(tp=4, cp=2, num_microbatches=32, zero=3, sp=True, recompute="auto")
    )
    plan = planner.estimate(ctx, layout, options)
    parts = chunks(plan, ctx)
    assert len({o for c in parts for o in c.options}) > 1  # a per-layer mix to stand in for

    def price(recompute):
        return planner.estimate_per_layer(ctx, plan.layout, recompute, options)

    module = megatron if framework == "megatron" else torchtitan
    found = [(price(s.options), s) for s in module.candidates(parts, ctx, plan.layout)]
    fitting = [(p.time.step_s, i, s) for i, (p, s) in enumerate(found) if p.memory.fits]
    assert fitting, "some setting the framework states fits"
    step, _, best = min(fitting)
    assert step >= plan.time.step_s * (1 - 1e-12)  # the per-layer choice was the optimum
    made = export(planner, framework, plan, ctx, price=price)
    (caveat,) = [c for c in made.caveats if "per layer" in c]
    assert f"written as {best.description}, the fastest setting it states that fits" in caveat
    assert f"{step:.3f} s per step" in caveat
    assert made.stand_in is not None and made.stand_in.description == best.description
    assert made.stand_in.plan.time.step_s == step
    if framework == "megatron":
        assert "  " + shlex.join(best.settings) in made.text.splitlines() or best.settings == []
    else:
        assert tomllib.loads(made.text)["activation_checkpoint"] == best.settings


@pytest.mark.parametrize("recompute", ["auto", "none", "selective", "full"])
@pytest.mark.parametrize(
    "layout",
    [
        Layout(tp=2, pp=2, dp=4, num_microbatches=16, zero=1, sp=True),
        Layout(tp=1, pp=4, vpp=2, dp=4, num_microbatches=16, zero=1, schedule="interleaved"),
    ],
    ids=["tp2pp2", "pp4x2"],
)
def test_pricing_per_layer_reproduces_the_plans_own_choice(
    planner: Planner, layout: Layout, recompute: str
) -> None:
    """Planner.estimate_per_layer, given the options a plan runs on each layer, prices that
    plan again: memory to the byte, time to rounding (a fixed policy sums its layers in
    another grouping). The stand-ins an exporter compares are priced on the same footing."""
    options = PricingOptions(max_mem_gib=40)
    ctx = planner.context(
        planner.model("llama-3-8b"), planner.device("h100"), 16,
        Job(global_batch_size=64, seq_length=8192), options=options,
    )  # fmt: skip
    plan = planner.estimate(ctx, layout.model_copy(update={"recompute": recompute}), options)
    per_layer = [o for c in chunks(plan, ctx) for o in c.options]
    again = planner.estimate_per_layer(ctx, plan.layout, per_layer, options)
    assert again.time.step_s == pytest.approx(plan.time.step_s, rel=1e-12)
    assert again.memory.peak_bytes == plan.memory.peak_bytes
    assert again.memory.peak_stage == plan.memory.peak_stage


def test_an_unpriced_stand_in_of_a_plan_without_times_renders(planner: Planner) -> None:
    """Neither the plan's nor the written setting's figures: no predicted line, no crash."""
    zero = 1
    layout = Layout(
        dp=4, tp=4, pp=4, mbs=1, num_microbatches=128, zero=zero, sp=True, recompute="auto"
    )
    plan, ctx = priced(planner, "llama-3-70b", 64, 512, 8192, layout)
    made = export(planner, "megatron", plan.model_copy(update={"time": None}), ctx)
    assert "predicted:" not in made.text and made.caveats
