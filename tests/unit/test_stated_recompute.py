"""``--recompute stated``: per layout, the fastest recompute setting that fits among those
the framework's config states, so the plan runs as priced.

Megatron states one set of modules on every layer, or the first N layers of each chunk
whole (or offloaded); torchtitan the per-op policy on every layer, or one layer in every
N whole; MindFormers and DeepSpeed count layers per stage, which is the per-layer
knapsack among whole, selective and none. A stated plan is the fastest of those settings
priced one by one, and exports with no caveat.
"""

from __future__ import annotations

import pytest

from ndplan.adapters.exporters.common import chunks, layer_shape
from ndplan.adapters.exporters.megatron import stated_args
from ndplan.adapters.exporters.torchtitan import stated_checkpointing
from ndplan.cli.render import stated_recompute_line
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.recompute import (
    StatedRecompute,
    stated_settings,
    stated_stage_options,
)
from ndplan.planner import Planner, PricingOptions


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def context(planner: Planner, framework: str, max_mem: float | None = None, **job):
    options = PricingOptions(max_mem_gib=max_mem)
    ctx = planner.context(
        planner.model(job.pop("model", "llama-3-8b")), planner.device("h100"), 8,
        Job(global_batch_size=32, seq_length=4096, framework=framework, **job), options=options,
    )  # fmt: skip
    return ctx, options


def test_a_setting_runs_its_option_on_every_layer_the_first_n_or_one_in_every_n() -> None:
    sizes = (3, 2)
    assert StatedRecompute("norm").per_layer(sizes, (0, 1)) == ("norm",) * 5
    assert StatedRecompute("full", first=2).per_layer(sizes, (0, 1)) == (
        "full", "full", "none", "full", "full",
    )  # fmt: skip
    one_rank, two_ranks = (0, 0), (0, 1)
    # torchtitan wraps every 2nd layer a rank holds, counted over its chunks in order.
    assert StatedRecompute("full", every=2).per_layer(sizes, one_rank) == (
        "none", "full", "none", "full", "none",
    )  # fmt: skip
    assert StatedRecompute("full", every=2).per_layer(sizes, two_ranks) == (
        "none", "full", "none", "none", "full",
    )  # fmt: skip


def test_megatron_states_module_sets_on_every_layer_and_whole_layers_first_in_each_chunk(
    planner,
) -> None:
    ctx, _ = context(planner, "megatron")
    layout = Layout(
        tp=2, pp=4, vpp=2, num_microbatches=8, zero=1, sp=True, schedule="interleaved"
    )  # 4 layers a chunk
    names = [(s.option, s.first) for s in stated_settings(ctx, layout)]
    # A dense Llama layer: core attention, the norms, the FFN whole (no moe_act, no MLA).
    uniform = ["none", "core_attn", "norm", "mlp", "core_attn+norm", "core_attn+mlp",
               "norm+mlp", "core_attn+norm+mlp", "full"]  # fmt: skip
    assert names == [(u, 0) for u in uniform] + [("full", n) for n in (1, 2, 3)]
    # Megatron-Core offloads activations (the first N < L layers) only without PP.
    offloading, _ = context(planner, "megatron", activation_offload=True)
    assert [(s.option, s.first) for s in stated_settings(offloading, layout)] == names
    single = Layout(tp=2, dp=4, num_microbatches=8, zero=1, sp=True)  # 32 layers, one chunk
    plain = [(s.option, s.first) for s in stated_settings(ctx, single)]
    extra = [(s.option, s.first) for s in stated_settings(offloading, single)][len(plain) :]
    assert extra == [("offload", n) for n in range(1, 32)]


def test_megatron_offers_every_switch_of_any_layer_kind(planner) -> None:
    ctx, _ = context(planner, "megatron", model="deepseek-v2-lite")
    layout = Layout(ep=8, num_microbatches=4, zero=1)
    uniform = {s.option for s in stated_settings(ctx, layout) if not s.first}
    # The dense first layer's mlp, the MoE layers' moe_act and moe, MLA's up-projections.
    assert "core_attn+norm+act+mlp+mla_up+moe_ffn" in uniform
    assert len(uniform) == 2**6 + 1  # every subset of six switches, and the whole layer


def test_torchtitan_states_the_per_op_policy_or_one_layer_in_every_n(planner) -> None:
    ctx, _ = context(planner, "torchtitan")
    # 8 layers a chunk, two chunks a rank: one in every N of the rank's 16.
    layout = Layout(pp=2, vpp=2, num_microbatches=8, zero=3, schedule="interleaved")
    names = [(s.option, s.every) for s in stated_settings(ctx, layout)]
    assert names == [("none", 0), ("op", 0), ("full", 0)] + [("full", n) for n in range(2, 17)]


LAYOUTS = {
    # Tight enough that keeping everything does not fit, so the choice is made.
    "megatron": (
        Layout(tp=2, pp=4, vpp=2, num_microbatches=32, zero=1, sp=True, schedule="interleaved"),
        35,
    ),
    "torchtitan": (
        Layout(
            tp=2, pp=2, vpp=2, dp=2, num_microbatches=16, zero=3, sp=True, schedule="interleaved"
        ),
        30,
    ),
}


@pytest.mark.parametrize("framework", list(LAYOUTS))
def test_a_stated_plan_is_the_fastest_stated_setting_that_fits_and_exports_exactly(
    planner, framework
) -> None:
    ctx, options = context(planner, framework, max_mem=LAYOUTS[framework][1])
    layout = LAYOUTS[framework][0].model_copy(update={"recompute": "stated"})
    plan = planner.estimate(ctx, layout, options)
    assert plan.memory.fits
    sizes, stages = layer_shape(chunks(plan, ctx))
    fitting = []
    for i, setting in enumerate(stated_settings(ctx, layout)):
        priced = planner.estimate_per_layer(ctx, layout, setting.per_layer(sizes, stages), options)
        if priced.memory.fits:
            fitting.append((priced.time.step_s, i, setting, priced))
    step, _, best, priced = min(fitting, key=lambda f: f[:2])
    assert best != StatedRecompute("none")  # the case makes a choice
    assert plan.time.step_s == step
    assert plan.memory.peak_bytes == priced.memory.peak_bytes
    assert plan.recompute == priced.recompute  # the layers the setting names, in place
    auto = planner.estimate(ctx, layout.model_copy(update={"recompute": "auto"}), options)
    assert auto.time.step_s <= step  # the per-layer knapsack weighs these settings too
    exporter = planner.components.exporters.get(framework)
    made = exporter.render(plan, ctx)
    assert not [c for c in made.caveats if "per layer" in c]
    # The report names the setting as the framework's config states it.
    line = stated_recompute_line(ctx, plan)
    if framework == "megatron":
        assert line == "megatron: " + " ".join(stated_args(best, max(sizes))[0])
        assert "\n  " + line.removeprefix("megatron: ") + "\n" in made.text  # as exported
    else:
        section, _ = stated_checkpointing(best)
        assert line == "torchtitan: [activation_checkpoint] " + ", ".join(
            f'{k} = "{v}"' for k, v in section.items()
        )


@pytest.mark.parametrize("framework", ["mindformers", "deepspeed"])
def test_a_per_stage_config_states_the_knapsack_among_whole_selective_and_none(
    planner, framework
) -> None:
    ctx, options = context(planner, framework, max_mem=30)
    layout = Layout(tp=2, pp=4, num_microbatches=32, zero=1, sp=framework == "mindformers")
    stated = planner.estimate(ctx, layout.model_copy(update={"recompute": "stated"}), options)
    auto = planner.estimate(ctx, layout.model_copy(update={"recompute": "auto"}), options)
    assert stated.memory.fits
    used = {r.option for r in stated.recompute}
    assert len(used) > 1 and used <= set(stated_stage_options(ctx))
    assert auto.time.step_s <= stated.time.step_s
    if framework == "deepspeed":  # no selective switch: whole or none is all auto has too
        assert (stated.time.step_s, stated.memory.peak_bytes) == (
            auto.time.step_s,
            auto.memory.peak_bytes,
        )


def test_nothing_stated_fits_prices_the_lightest_as_over_memory(planner) -> None:
    ctx, options = context(planner, "megatron", max_mem=20)
    layout = Layout(tp=2, pp=4, num_microbatches=32, zero=1, sp=True, recompute="stated")
    plan = planner.estimate(ctx, layout, options)
    assert not plan.memory.fits
    assert {r.option for r in plan.recompute} == {"full"}
