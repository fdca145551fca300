"""The combined 1F1B schedule (``moe_a2a_overlap``, Megatron's
--overlap-moe-expert-parallel-comm): one micro-batch's EP dispatch and combine run beside
another's compute of the same layer; warm-up forwards and cool-down backwards have no
partner; full recompute and non-interleaved pipelines do not run it."""

from __future__ import annotations

import pytest

from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.model import MoEFFN
from ndplan.planner import Planner, PricingOptions


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def ep_seconds(
    planner: Planner, layout: Layout, recompute=frozenset(), *, model="qwen3-30b-a3b", **job
) -> tuple[float, float, float]:
    """(exposed EP seconds of one MoE layer, its raw EP traffic, the calibration's
    interference share) for ``layout`` on H100s."""
    ctx = planner.context(
        planner.model(model),
        planner.device("h100-sxm"),
        layout.devices,
        Job(
            global_batch_size=layout.dp * layout.mbs * layout.num_microbatches,
            seq_length=4096,
            **job,
        ),
    )
    cost = planner.pricer(ctx, PricingOptions()).cost
    kind = next(k for k in ctx.model.kinds if isinstance(k.ffn, MoEFFN))
    raw = cost.layer_cost(ctx, layout, kind)
    return (
        cost.layer_seconds(ctx, layout, kind, recompute)["ep_comm"],
        raw.ep_forward_s + raw.ep_backward_s,
        ctx.calibration.interference,
    )


# EP 8 inside one H100 node, interleaved: the NVLink all-to-alls are shorter than every
# compute phase they are paired with, so paired passes show only the interference.
IN_NODE = Layout(dp=4, pp=2, vpp=2, ep=8, num_microbatches=16, schedule="interleaved")
# EP 16 over two nodes at one stage: the network all-to-alls outlast the attention phases.
ACROSS_NODES = Layout(dp=16, ep=16, num_microbatches=8)


def test_paired_passes_hide_what_the_other_pass_computes(planner) -> None:
    off, raw, slow = ep_seconds(planner, IN_NODE)
    on, _, _ = ep_seconds(planner, IN_NODE, moe_a2a_overlap=True)
    # Rank 0's warm-up: 2·(pp − 1) + (vpp − 1)·pp = 4 of its m·vpp = 32 chunk passes.
    unpaired = 4 / 32
    assert on == pytest.approx(unpaired * off + (1 - unpaired) * slow * raw, rel=1e-12)
    assert on < off


def test_transfers_longer_than_their_phase_stay_partly_exposed(planner) -> None:
    off, raw, slow = ep_seconds(planner, ACROSS_NODES)
    on, _, _ = ep_seconds(planner, ACROSS_NODES, moe_a2a_overlap=True)
    unpaired = 1 / 8  # one stage: the first forward and the last backward
    paired = (on - unpaired * off) / (1 - unpaired)
    assert slow * raw < paired < off


def test_more_micro_batches_pair_more_passes(planner) -> None:
    fewer, _, _ = ep_seconds(planner, ACROSS_NODES, moe_a2a_overlap=True)
    more, _, _ = ep_seconds(
        planner, ACROSS_NODES.model_copy(update={"num_microbatches": 32}), moe_a2a_overlap=True
    )
    assert more < fewer


@pytest.mark.parametrize(
    ("layout", "recompute", "why"),
    [
        (ACROSS_NODES.model_copy(update={"num_microbatches": 1}), frozenset(), "one micro-batch"),
        (IN_NODE.model_copy(update={"num_microbatches": 2}), frozenset(), "all warm-up"),
        (
            IN_NODE.model_copy(update={"vpp": 1, "schedule": "1f1b"}),
            frozenset(),
            "a pipeline without virtual stages",
        ),
        (IN_NODE, None, "full recompute"),
        (Layout(dp=8, num_microbatches=8), frozenset(), "no EP"),
    ],
)
def test_where_it_does_not_run_nothing_changes(planner, layout, recompute, why) -> None:
    off = ep_seconds(planner, layout, recompute)
    assert ep_seconds(planner, layout, recompute, moe_a2a_overlap=True) == off, why


def test_only_the_ep_part_moves(planner) -> None:
    """The switch hides traffic; it adds or removes no compute."""
    ctx_args = (planner.model("qwen3-30b-a3b"), planner.device("h100-sxm"), IN_NODE.devices)
    gbs = IN_NODE.dp * IN_NODE.mbs * IN_NODE.num_microbatches
    plans = []
    for overlap in (False, True):
        ctx = planner.context(
            *ctx_args, Job(global_batch_size=gbs, seq_length=4096, moe_a2a_overlap=overlap)
        )
        plans.append(planner.pricer(ctx, PricingOptions()).price(IN_NODE))
    off, on = (p.time.parts for p in plans)
    assert on["ep_comm"] < off["ep_comm"]
    for part in ("forward", "backward", "recompute", "tp_comm", "dp_comm", "optimizer"):
        assert on[part] == off[part], part
