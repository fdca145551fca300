"""The step-time model against hand-computed cases (spec/performance.md).

Composition is checked with hand-made per-stage seconds fed to ``NdplanCostModel.step``;
overlap clamps with a cost model whose layer cost is fixed by the test; GEMMs, TP, CP,
PP, DP (per step and, under ZeRO-3/FSDP, per micro-batch) and the optimizer against the
formulas with the catalog's H100 figures. The per-step DP windows are the minimum over
stages of the per-micro-batch backward and of the forward, each less the compute hiding
that stage's CP ring (an interleaved or V schedule reduces its gradients chunk by chunk
through the drain, so the window is a stage's whole last backward); interleaved and
DualPipeV stretch an off-critical stage's windows by the share of its wait for the
critical stage that the pipeline does not charge it (1 − 1/vpp; all of it in DualPipeV).
Recompute is not part of the backward window, so no recompute choice shortens the step
through it (the search's bound, every layer at its fastest option, stays a lower bound).
DualPipeV's bubble unit is the mean over stages of ``max(0, t_s − (bwd_s + dp_comm_s)/2)/2``.

The step is meant to be monotone: no stage getting slower, and no device getting a lower
peak or bandwidth, makes it faster (the pipeline grows by at least its weight × a stage's
growth, the exposed DP shrinks by at most the DP overlap × the part of it the stretch
does not absorb); the cases that broke it under earlier compositions are pinned near the
end as regressions.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from ndplan.adapters.devices.catalog import builtin_devices
from ndplan.core.calibration import Calibration, DeviceEfficiency, Overlap
from ndplan.core.cluster import Cluster
from ndplan.core.collectives import (
    all_gather_s,
    all_reduce_s,
    all_to_all_s,
    group_link,
    reduce_scatter_s,
)
from ndplan.core.context import PricingContext
from ndplan.core.counting import core_attention_flops, count_flops
from ndplan.core.job import Job
from ndplan.core.kernels.knapsack import DefaultKnapsackSolver
from ndplan.core.layout import Layout
from ndplan.core.memory import NdplanMemoryModel
from ndplan.core.model import DenseFFN, LayerKind, ModelSpec, MoEFFN, StandardAttention
from ndplan.core.performance import (
    ATTENTION_HALF_KEYS,
    FLASH_BACKWARD_FACTOR,
    LAYER_PARTS,
    TIME_PARTS,
    LayerCost,
    NdplanCostModel,
    Op,
    StageSeconds,
)
from ndplan.core.pricing import Pricer
from ndplan.core.recompute import applicable_switches
from ndplan.planner import Planner

DEVICES = {d.id: d for d in builtin_devices()}
H100 = DEVICES["h100-sxm"]
NO_OVERHEAD = Calibration(step_overhead_s=0.0)
H100_UP = 450e9 * 0.75  # NVLink per direction × the default scale-up bus efficiency
H100_ALPHA = 3e-6

ATTENTION = StandardAttention(num_heads=16, num_kv_heads=4, head_dim=128)
DENSE = LayerKind(name="dense", attention=ATTENTION, ffn=DenseFFN(intermediate_size=8192))
MOE = LayerKind(
    name="moe",
    attention=ATTENTION,
    ffn=MoEFFN(num_experts=16, top_k=2, expert_intermediate_size=1024),
)


def dense_model(layers: int = 8) -> ModelSpec:
    return ModelSpec(
        name="dense", hidden_size=2048, vocab_size=32000, kinds=(DENSE,), layers=(0,) * layers
    )


def moe_model(layers: int = 8) -> ModelSpec:
    return ModelSpec(
        name="moe", hidden_size=2048, vocab_size=32000, kinds=(DENSE, MOE),
        layers=(0,) + (1,) * (layers - 1),
    )  # fmt: skip


def make_ctx(
    layout: Layout,
    model: ModelSpec | None = None,
    *,
    device=H100,
    seq: int = 4096,
    precision: str = "bf16",
    framework: str | None = None,
    **job,
) -> PricingContext:
    model = model or dense_model()
    return PricingContext(
        model=model,
        cluster=Cluster(device=device, num_devices=layout.devices),
        job=Job(
            global_batch_size=layout.dp * layout.mbs * layout.num_microbatches,
            seq_length=seq,
            precision=precision,
            framework=framework,
            **job,
        ),
    )


def stage_secs(**parts: float) -> dict[str, float]:
    out = dict.fromkeys((*LAYER_PARTS, "pp_comm", "dp_comm"), 0.0)
    out.update(parts)
    return out


def run_step(layout: Layout, stage_seconds: list[dict[str, float]], cal: Calibration = NO_OVERHEAD):
    ctx = make_ctx(layout)
    cm = NdplanCostModel(cal)
    stages = ctx.placement(layout)
    assert len(stages) == len(stage_seconds)
    return cm.step(ctx, layout, stages, stage_seconds)


def pipeline_s(time) -> float:
    """The step less what is paid once per step (DP communication, optimizer, overhead),
    for stage seconds without a ZeRO-3 part (all of ``dp_comm`` is then per step)."""
    p = time.parts
    return time.step_s - p["dp_comm"] - p["optimizer"] - p["overhead"]


def overlap_model(**overlap: float) -> NdplanCostModel:
    return NdplanCostModel(Calibration(overlap={"default": Overlap(**overlap)}, step_overhead_s=0))


def volumes(cm: NdplanCostModel, ctx: PricingContext, layout: Layout) -> list[tuple[float, float]]:
    """Per stage, (parameter all-gather, gradient reduce-scatter) seconds (checked by hand
    in test_dp_volumes_by_hand)."""
    return [cm._dp_volumes(ctx, layout, s) for s in ctx.placement(layout)]


def fsdp_volumes(
    cm: NdplanCostModel, ctx: PricingContext, layout: Layout
) -> list[tuple[float, float]]:
    """Per stage, the same as ZeRO-3 moves them each micro-batch, a collective per sharded
    unit (checked by hand in test_fsdp_stage_part_by_hand)."""
    return [cm._fsdp_volumes(ctx, layout, s) for s in ctx.placement(layout)]


# ----------------------------------------------------------------------------- composition


EQUAL = stage_secs(forward=1.0, backward=2.0, recompute=0.25, tp_comm=0.5, pp_comm=0.125)
T_EQUAL = sum(EQUAL.values())  # 3.875


@pytest.mark.parametrize(("pp", "m"), [(2, 1), (2, 8), (4, 4), (4, 8), (8, 3), (8, 64)])
def test_1f1b_bubble_fraction_for_equal_stages(pp: int, m: int) -> None:
    layout = Layout(pp=pp, num_microbatches=m)
    time = run_step(layout, [dict(EQUAL) for _ in range(pp)])
    pipe = pipeline_s(time)
    assert math.isclose(pipe, (m + pp - 1) * T_EQUAL, rel_tol=1e-12)
    assert math.isclose(time.parts["bubble"], (pp - 1) * T_EQUAL, rel_tol=1e-12)
    assert math.isclose(time.parts["bubble"] / pipe, (pp - 1) / (m + pp - 1), rel_tol=1e-12)
    # The other parts are m micro-batches of one stage.
    for name in ("forward", "backward", "recompute", "tp_comm", "pp_comm"):
        assert math.isclose(time.parts[name], m * EQUAL[name], rel_tol=1e-12)
    assert time.parts["overhead"] == 0.0


def test_no_pipeline_no_bubble() -> None:
    time = run_step(Layout(num_microbatches=16), [dict(EQUAL)])
    assert time.parts["bubble"] == 0.0
    assert math.isclose(pipeline_s(time), 16 * T_EQUAL, rel_tol=1e-12)


def test_1f1b_unequal_stages() -> None:
    totals = [1.0, 3.0, 2.0, 2.5]
    m = 6
    layout = Layout(pp=4, num_microbatches=m)
    secs = [stage_secs(forward=t / 3, backward=2 * t / 3) for t in totals]
    time = run_step(layout, secs)
    expected = sum(totals) + (m - 1) * max(totals)  # 8.5 + 15 = 23.5
    assert math.isclose(pipeline_s(time), expected, rel_tol=1e-12)
    assert math.isclose(time.parts["bubble"], expected - m * 3.0, rel_tol=1e-12)
    # The slowest stage (index 1) sets the per-micro-batch parts.
    assert math.isclose(time.parts["forward"], m * 1.0, rel_tol=1e-12)
    assert math.isclose(time.parts["backward"], m * 2.0, rel_tol=1e-12)
    assert time.stage_forward_s == pytest.approx(tuple(t / 3 for t in totals))
    assert time.stage_backward_s == pytest.approx(tuple(2 * t / 3 for t in totals))


def test_1f1b_slowest_stage_breaks_ties_to_the_first() -> None:
    layout = Layout(pp=2, num_microbatches=4)
    a = stage_secs(forward=1.0, backward=2.0)
    b = stage_secs(forward=0.5, backward=2.5)
    time = run_step(layout, [a, b])
    assert time.parts["forward"] == 4 * 1.0
    assert math.isclose(time.parts["bubble"], 3.0, rel_tol=1e-12)


@pytest.mark.parametrize(("pp", "vpp", "m"), [(2, 2, 4), (4, 2, 8), (2, 4, 6), (4, 2, 4)])
def test_interleaved_bubble_is_pp_minus_one_chunk_times(pp: int, vpp: int, m: int) -> None:
    layout = Layout(pp=pp, vpp=vpp, schedule="interleaved", num_microbatches=m)
    time = run_step(layout, [dict(EQUAL) for _ in range(pp)])
    assert math.isclose(time.parts["bubble"], (pp - 1) / vpp * T_EQUAL, rel_tol=1e-12)
    assert math.isclose(pipeline_s(time), (m + (pp - 1) / vpp) * T_EQUAL, rel_tol=1e-12)
    plain = run_step(Layout(pp=pp, num_microbatches=m), [dict(EQUAL) for _ in range(pp)])
    assert math.isclose(time.parts["bubble"] * vpp, plain.parts["bubble"], rel_tol=1e-12)


def test_interleaved_unequal_stages() -> None:
    totals = [1.0, 3.0, 2.0, 2.5]
    m, v = 8, 2
    layout = Layout(pp=4, vpp=v, schedule="interleaved", num_microbatches=m)
    time = run_step(layout, [stage_secs(forward=t) for t in totals])
    assert math.isclose(time.parts["bubble"], (sum(totals) - 3.0) / v, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("schedule", "vpp", "hops"),
    [("1f1b", 1, 3), ("gpipe", 1, 3), ("interleaved", 2, 7), ("interleaved", 4, 15),
     ("dualpipev", 1, 6)],
)  # fmt: skip
def test_fill_and_drain_sends_cross_every_chunk_boundary(schedule, vpp, hops) -> None:
    """pp 4, tp 2 with SP, seq 4096, hidden 2048: one send is 4096·2048·2 B / 2 = 8 MiB
    over the pipeline link. The fill and drain chain is 2·hops sends, fully exposed; the
    compute-bubble formula already holds 2·(pp − 1) of them at the exposed share
    (1 − 0.8), and the step adds the rest to the bubble."""
    layout = Layout(
        tp=2, pp=4, sp=True, vpp=vpp, schedule=schedule, num_microbatches=8,
    )  # fmt: skip
    ctx = make_ctx(layout, dense_model(16))
    cm = NdplanCostModel(NO_OVERHEAD)
    link = cm.links(ctx, layout).pp
    send = 4096 * 2048 * 2 / 2 / link.bytes_per_s + link.latency_s
    assert cm.pipeline_send_s(ctx, layout) == pytest.approx(send, rel=1e-12)
    chain = 2 * (hops - 3 * (1 - 0.8)) * send
    assert cm.fill_drain_sends_s(ctx, layout, send) == pytest.approx(chain, rel=1e-12)
    pricer = Pricer(ctx, NdplanMemoryModel(), cm, DefaultKnapsackSolver())
    priced = pricer.price(layout)
    assert all(s.pipeline_send == pytest.approx(send, rel=1e-12) for s in priced.stage_seconds)
    alone = cm.step(
        ctx, layout, priced.stages, [dict(s) for s in priced.stage_seconds]
    )  # plain dicts carry no send: the compute bubble alone
    assert priced.time.parts["bubble"] == pytest.approx(alone.parts["bubble"] + chain, rel=1e-12)


def test_no_pipeline_no_fill_and_drain_sends() -> None:
    layout = Layout(tp=2, dp=4, sp=True, num_microbatches=8)
    ctx = make_ctx(layout)
    cm = NdplanCostModel(NO_OVERHEAD)
    assert cm.fill_drain_sends_s(ctx, layout, 1.0) == 0.0


def test_gpipe_same_time_as_1f1b() -> None:
    totals = [1.0, 3.0, 2.0, 2.5]
    secs = [stage_secs(forward=t / 3, backward=2 * t / 3) for t in totals]
    one = run_step(Layout(pp=4, num_microbatches=6), [dict(s) for s in secs])
    gp = run_step(Layout(pp=4, num_microbatches=6, schedule="gpipe"), [dict(s) for s in secs])
    assert gp.step_s == one.step_s
    assert gp.parts == one.parts


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 20)])
def test_dualpipev_bubble_below_1f1b(pp: int, m: int) -> None:
    secs = stage_secs(forward=1.0, backward=2.0, tp_comm=0.5)
    t = 3.5
    dual = run_step(Layout(pp=pp, schedule="dualpipev", num_microbatches=m), [dict(secs)] * pp)
    one = run_step(Layout(pp=pp, num_microbatches=m), [dict(secs)] * pp)
    # The weight-gradient half of the backward fills the bubble; the rest is paid per
    # half-step: (pp − 1) · (t − bwd/2) / 2.
    expected = (pp - 1) * (t - 0.5 * 2.0) / 2
    assert math.isclose(dual.parts["bubble"], expected, rel_tol=1e-12)
    assert 0 < dual.parts["bubble"] < one.parts["bubble"]
    assert dual.step_s < one.step_s


def test_dualpipev_bubble_clamps_at_zero() -> None:
    """A stage that is nothing but backward leaves no bubble once the weight gradients fill it."""
    secs = stage_secs(backward=2.0)
    time = run_step(Layout(pp=2, schedule="dualpipev", num_microbatches=4), [dict(secs)] * 2)
    assert time.parts["bubble"] == pytest.approx(0.5)  # (t − bwd/2)/2 = (2 − 1)/2
    secs = stage_secs(backward=0.0)
    time = run_step(Layout(pp=2, schedule="dualpipev", num_microbatches=4), [dict(secs)] * 2)
    assert time.parts["bubble"] == 0.0


def test_dualpipev_bubble_unit_is_the_mean_over_stages() -> None:
    """Unequal stages: (pp − 1) × the mean of max(0, t_s − bwd_s/2)/2, not the largest."""
    totals = [1.0, 3.0, 2.0, 2.5]
    layout = Layout(pp=4, schedule="dualpipev", num_microbatches=8)
    secs = [stage_secs(forward=t / 3, backward=2 * t / 3) for t in totals]
    time = run_step(layout, secs)
    # t − (2t/3)/2 = 2t/3, halved: t/3 per stage; mean (1 + 3 + 2 + 2.5)/3/4 = 8.5/12.
    assert time.parts["bubble"] == pytest.approx(3 * 8.5 / 12, rel=1e-12)
    assert time.parts["bubble"] != pytest.approx(3 * 3.0 / 3, rel=1e-6)  # not the max unit
    assert pipeline_s(time) == pytest.approx(8 * 3.0 + 3 * 8.5 / 12, rel=1e-12)


def test_dualpipev_bubble_fills_with_the_stage_fsdp_traffic() -> None:
    """The per-micro-batch FSDP traffic rides with the weight-gradient work: dp_comm
    fills the bubble like the backward does, so turning backward into exposed traffic one
    for one (the stage time unchanged) leaves the bubble where it was."""
    layout = Layout(pp=2, schedule="dualpipev", num_microbatches=4)
    a = stage_secs(forward=1.0, backward=2.0, tp_comm=0.5, dp_comm=1.0)  # t = 4.5
    b = stage_secs(forward=0.5, backward=1.0, dp_comm=0.5)  # t = 2
    time = run_step(layout, [a, b])
    # Units (4.5 − 3/2)/2 = 1.5 and (2 − 1.5/2)/2 = 0.625; their mean, once (pp − 1 = 1).
    assert time.parts["bubble"] == pytest.approx((1.5 + 0.625) / 2, rel=1e-12)
    # The dp_comm part is the critical stage's, m times (no per-step DP without stages).
    assert time.parts["dp_comm"] == pytest.approx(4 * 1.0, rel=1e-12)
    moved_a = stage_secs(forward=1.0, backward=1.25, tp_comm=0.5, dp_comm=1.75)
    moved = run_step(layout, [moved_a, dict(b)])
    assert moved.parts["bubble"] == pytest.approx(time.parts["bubble"], rel=1e-12)
    assert moved.step_s == pytest.approx(time.step_s, rel=1e-12)
    # Backward turned into a forward (not fill): the unit grows by half of it, halved.
    fwd_a = stage_secs(forward=1.75, backward=1.25, tp_comm=0.5, dp_comm=1.0)
    fwd = run_step(layout, [fwd_a, dict(b)])
    assert fwd.parts["bubble"] == pytest.approx(time.parts["bubble"] + 0.75 / 4 / 2, rel=1e-12)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(pp=4, num_microbatches=8),
        Layout(pp=4, vpp=2, schedule="interleaved", num_microbatches=8),
        Layout(pp=4, schedule="gpipe", num_microbatches=8),
        Layout(pp=4, schedule="dualpipev", num_microbatches=8),
        Layout(pp=1, num_microbatches=3),
    ],
)
def test_parts_sum_exactly_to_the_step(layout: Layout) -> None:
    secs = [
        stage_secs(forward=0.1 * (i + 1), backward=0.3, recompute=0.07, tp_comm=0.011,
                   cp_comm=0.013, ep_comm=0.017, pp_comm=0.019)
        for i in range(layout.pp)
    ]  # fmt: skip
    time = run_step(layout, secs, Calibration(step_overhead_s=0.123))
    assert tuple(time.parts) == TIME_PARTS
    # The step is the sum of the parts, in order: equal to the last bit.
    assert sum(time.parts.values()) == time.step_s
    assert all(v >= 0 for v in time.parts.values())
    assert time.parts["overhead"] == 0.123
    assert time.parts["optimizer"] > 0


def test_step_overhead_adds_once() -> None:
    layout = Layout(pp=2, num_microbatches=4)
    base = run_step(layout, [dict(EQUAL)] * 2)
    more = run_step(layout, [dict(EQUAL)] * 2, Calibration(step_overhead_s=0.5))
    assert math.isclose(more.step_s - base.step_s, 0.5, rel_tol=1e-12)


def test_real_stage_seconds_compose() -> None:
    """Pricing a layout end to end: stage seconds are the fixed part plus count × layer."""
    layout = Layout(tp=2, pp=2, dp=2, sp=True, num_microbatches=4, zero=1)
    ctx = make_ctx(layout)
    cm = NdplanCostModel(NO_OVERHEAD)
    stages = ctx.placement(layout)
    for stage in stages:
        assignment = [(kind, k, count, frozenset()) for kind, count, k in stage.groups]
        secs = cm.stage_seconds(ctx, layout, stage, assignment)
        fixed = cm.stage_fixed_seconds(ctx, layout, stage)
        layer = cm.layer_seconds(ctx, layout, DENSE, frozenset())
        for name in LAYER_PARTS:
            assert secs[name] == pytest.approx(fixed[name] + stage.num_layers * layer[name])
        assert secs["pp_comm"] == fixed["pp_comm"] > 0
        # ZeRO-1: no per-micro-batch DP part; no CP, so no compute hides a ring.
        assert isinstance(secs, StageSeconds)
        assert secs["dp_comm"] == 0.0
        assert secs.cp_hidden_forward == secs.cp_hidden_backward == 0.0
    seconds = [
        cm.stage_seconds(ctx, layout, s, [(k, f, c, frozenset()) for k, c, f in s.groups])
        for s in stages
    ]
    time = cm.step(ctx, layout, stages, seconds)
    assert sum(time.parts.values()) == time.step_s
    totals = [sum(s.values()) for s in seconds]
    chain = cm.fill_drain_sends_s(ctx, layout, seconds[0].pipeline_send)
    assert chain > 0
    assert math.isclose(pipeline_s(time), sum(totals) + 3 * max(totals) + chain, rel_tol=1e-12)


def test_stage_seconds_carry_the_fsdp_part_and_the_step_pays_it_every_micro_batch() -> None:
    """ZeRO-3: the stage's dp_comm is its per-micro-batch exposure; the step pays the
    critical stage's m times and nothing per step."""
    layout = Layout(dp=4, zero=3, num_microbatches=4)
    ctx = make_ctx(layout)
    cm = overlap_model(fsdp=0.0)
    (stage,) = ctx.placement(layout)
    secs = cm.stage_seconds(ctx, layout, stage, [(0, 1, 8, frozenset())])
    ((gather, scatter),) = fsdp_volumes(cm, ctx, layout)
    # Sharded gradients are reduce-scattered after every micro-batch's backward.
    assert secs["dp_comm"] == pytest.approx(2 * gather + scatter, rel=1e-12)
    time = cm.step(ctx, layout, [stage], [secs])
    assert time.parts["dp_comm"] == 4 * secs["dp_comm"]
    assert math.isclose(
        time.step_s, 4 * sum(secs.values()) + time.parts["optimizer"], rel_tol=1e-12
    )


@pytest.mark.parametrize(
    ("layout", "stretch"),
    [
        (Layout(pp=2, dp=8, zero=1, num_microbatches=4), 0.0),
        (Layout(pp=2, dp=8, zero=1, num_microbatches=4, schedule="gpipe"), 0.0),
        # An off-critical stage's windows stretch by the share of its wait (t_max − t_s)
        # the pipeline does not charge it: 1 − 1/vpp interleaved, all of it in DualPipeV.
        (Layout(pp=2, vpp=2, dp=8, zero=1, num_microbatches=4, schedule="interleaved"), 0.5),
        (Layout(pp=2, vpp=4, dp=8, zero=1, num_microbatches=4, schedule="interleaved"), 0.75),
        (Layout(pp=2, dp=8, zero=1, num_microbatches=4, schedule="dualpipev"), 1.0),
    ],
)
def test_per_step_dp_hides_under_the_shortest_stage_window(layout: Layout, stretch: float) -> None:
    """ZeRO-1: the gradient reduce-scatter hides under the shortest per-micro-batch
    backward of any stage (recompute left out), the parameter all-gather under the
    shortest forward, each less the compute already hiding that stage's CP ring and, for
    an off-critical stage of an interleaved or V schedule, plus the wait the pipeline does
    not charge it; both at the DP overlap. Under 1F1B/GPipe the two minima come from
    different stages, only one of them the critical one."""
    ctx = make_ctx(layout)
    cm = overlap_model(dp=0.8)
    vols = volumes(cm, ctx, layout)
    gather, scatter = max(v[0] for v in vols), max(v[1] for v in vols)
    assert scatter > gather > 0  # fp32 gradients, bf16 parameters
    crit = StageSeconds(
        stage_secs(forward=0.5 * gather, backward=0.5 * scatter, recompute=0.25 * scatter,
                   cp_comm=0.1 * scatter, dp_comm=0.1 * gather),
        hidden_forward=0.125 * gather, hidden_backward=0.25 * scatter,
    )  # fmt: skip
    # Windows: crit backward (0.5 − 0.25)·s = 0.25·s (its recompute left out), forward
    # (0.5 − 0.125)·g = 0.375·g; other backward (0.4 − 0.05)·s = 0.35·s, forward 0.3·g,
    # each + stretch × (t_crit − t_other) = stretch × (0.3·g + 0.45·s).
    other = StageSeconds(
        stage_secs(forward=0.3 * gather, backward=0.4 * scatter), hidden_backward=0.05 * scatter
    )
    wait = (0.6 * gather + 0.85 * scatter) - (0.3 * gather + 0.4 * scatter)
    assert sum(crit.values()) - sum(other.values()) == pytest.approx(wait, rel=1e-12)
    window_bwd = min(0.25 * scatter, 0.35 * scatter + stretch * wait)
    window_fwd = min(0.375 * gather, 0.3 * gather + stretch * wait)
    m = layout.num_microbatches
    per_step = (scatter - 0.8 * window_bwd) + (gather - 0.8 * window_fwd)
    for seconds in ([other, crit], [crit, other]):  # either stage position
        time = cm.step(ctx, layout, ctx.placement(layout), seconds)
        assert time.parts["dp_comm"] == pytest.approx(m * 0.1 * gather + per_step, rel=1e-12)
        # Not with the recompute in the backward window (min(0.5·s, 0.35·s) = 0.35·s) ...
        with_recompute = 0.72 * scatter + 0.76 * gather
        assert time.parts["dp_comm"] != pytest.approx(m * 0.1 * gather + with_recompute, rel=1e-6)
        if stretch:
            # ... and not with the off-critical stage's own, unstretched windows.
            unstretched = 0.8 * scatter + 0.76 * gather
            assert time.parts["dp_comm"] != pytest.approx(m * 0.1 * gather + unstretched, rel=1e-6)
        else:
            # ... nor the critical stage's own windows (0.25·s, 0.375·g).
            theirs = 0.8 * scatter + 0.7 * gather
            assert time.parts["dp_comm"] != pytest.approx(m * 0.1 * gather + theirs, rel=1e-6)
        for name in ("forward", "backward", "recompute", "cp_comm"):
            assert time.parts[name] == m * crit[name]
        assert sum(time.parts.values()) == time.step_s


@pytest.mark.parametrize(
    "layout",
    [
        Layout(pp=2, dp=8, zero=0, num_microbatches=4),
        Layout(pp=2, vpp=2, dp=8, zero=0, num_microbatches=4, schedule="interleaved"),
        Layout(pp=2, dp=8, zero=0, num_microbatches=4, schedule="dualpipev"),
    ],
)
def test_recompute_never_widens_the_dp_window(layout: Layout) -> None:
    """Recompute on the stage with the shortest backward lengthens that stage only and is
    not part of its window; under interleaved and V schedules it also fills the wait for
    the critical stage that stretched the window. The step grows by what the pipeline
    grows and the DP that shorter wait exposes: recompute is pure cost, which keeps
    every-layer-at-its-fastest-option a lower bound."""
    ctx = make_ctx(layout)
    cm = overlap_model(dp=0.9)
    stages = ctx.placement(layout)
    reduce = 2 * max(s for _, s in volumes(cm, ctx, layout))  # the ZeRO-0 all-reduce
    u = reduce / 8
    crit = stage_secs(forward=4 * u, backward=8 * u)  # t = 12u, window 8u
    short = stage_secs(forward=2 * u, backward=4 * u)  # t = 6u, window 4u + stretch × 6u
    recomputed = stage_secs(forward=2 * u, backward=4 * u, recompute=2 * u)  # t = 8u
    before = cm.step(ctx, layout, stages, [dict(crit), short])
    after = cm.step(ctx, layout, stages, [dict(crit), recomputed])
    # 1F1B: 8u − 0.9 × 4u either way (with the recompute in the window: 8u − 0.9 × 6u).
    # Interleaved (stretch ½): windows 4u + 3u, then 4u + 2u. DualPipeV (stretch 1):
    # 4u + 6u, then 4u + 4u, both capped by the critical stage's 8u.
    exposed = {
        "1f1b": (4.4 * u, 4.4 * u),
        "interleaved": (8 * u - 0.9 * 7 * u, 8 * u - 0.9 * 6 * u),
        "dualpipev": (8 * u - 0.9 * 8 * u, 8 * u - 0.9 * 8 * u),
    }[layout.schedule]
    assert before.parts["dp_comm"] == pytest.approx(exposed[0], rel=1e-12)
    assert after.parts["dp_comm"] == pytest.approx(exposed[1], rel=1e-12)
    # The pipeline grows by the stage's 2u (1F1B), 2u/vpp (interleaved) or, DualPipeV,
    # (pp − 1) × the mean unit: 2u/2/2.
    growth = {"1f1b": 2 * u, "interleaved": u, "dualpipev": 0.5 * u}[layout.schedule]
    assert after.parts["bubble"] == pytest.approx(before.parts["bubble"] + growth, rel=1e-9)
    dp_growth = exposed[1] - exposed[0]
    assert after.step_s == pytest.approx(before.step_s + growth + dp_growth, rel=1e-12)
    assert after.step_s > before.step_s


def test_per_step_dp_window_clamps_at_the_traffic() -> None:
    """Windows longer than the traffic hide all of it; a stage without backward leaves the
    gradient reduction fully exposed, however long the other stages' backward."""
    layout = Layout(pp=2, dp=8, zero=1, num_microbatches=2)
    ctx = make_ctx(layout)
    cm = overlap_model(dp=1.0)
    stages = ctx.placement(layout)
    vols = volumes(cm, ctx, layout)
    gather, scatter = max(v[0] for v in vols), max(v[1] for v in vols)
    long = stage_secs(forward=10 * gather, backward=10 * scatter)
    assert cm.step(ctx, layout, stages, [dict(long), dict(long)]).parts["dp_comm"] == 0.0
    no_bwd = stage_secs(forward=10 * gather)
    time = cm.step(ctx, layout, stages, [dict(long), no_bwd])
    assert time.parts["dp_comm"] == pytest.approx(scatter, rel=1e-12)


@pytest.mark.parametrize(("split", "busy"), [((1, 7), 1), ((7, 1), 0)])
def test_per_step_dp_and_optimizer_are_the_busiest_stage_whichever_stage_is_critical(
    split: tuple[int, int], busy: int
) -> None:
    """The stage holding 7 of 8 layers: its all-reduce and its update are the step's, also
    while the one-layer stage is the slowest."""
    layout = Layout(pp=2, dp=8, zero=0, num_microbatches=4, layers_per_stage=split)
    ctx = make_ctx(layout)
    cm = overlap_model(dp=0.0)
    stages = ctx.placement(layout)
    params = [NdplanMemoryModel().stage_parameters(ctx, layout, s) for s in stages]
    link = cm.links(ctx, layout).dp
    reduce = [all_reduce_s(link, dense * 4) for dense, _, _ in params]  # fp32 gradients
    update = [cm._optimizer_s(ctx, layout, dense, expert) for dense, expert, _ in params]
    assert reduce[busy] > reduce[1 - busy] and update[busy] > update[1 - busy]
    for slow in (0, 1):
        secs = [stage_secs(forward=1.0), stage_secs(forward=1.0)]
        secs[slow]["backward"] = 0.5
        time = cm.step(ctx, layout, stages, secs)
        assert time.parts["dp_comm"] == pytest.approx(reduce[busy], rel=1e-12)
        assert time.parts["optimizer"] == pytest.approx(update[busy], rel=1e-12)


# ----------------------------------------------------------------------------- overlap clamps


class FixedLayerCost(NdplanCostModel):
    """A cost model whose per-layer raw costs the test sets."""

    def __init__(self, cost: LayerCost, overlap: Overlap) -> None:
        super().__init__(Calibration(overlap={"default": overlap}))
        self.fixed = cost

    def layer_cost(self, ctx, layout, kind):
        return self.fixed


def fixed_cost(**update) -> LayerCost:
    base = LayerCost(
        ops=(
            Op("attn", 1.0, FLASH_BACKWARD_FACTOR * 1.0, frozenset({"core_attn"})),
            Op("act", 0.25, 0.5, frozenset({"act"})),
            Op("norm", 0.125, 0.25, frozenset({"norm"})),
            Op("proj", 2.0, 4.0, frozenset()),
        ),
        tp_forward_s=0.4,
        tp_backward_s=0.4,
        sp_regather_s=0.2,
        cp_forward_s=0.3,
        cp_backward_s=0.6,
        cp_ring_steps=1,
        ep_forward_s=0.5,
        ep_backward_s=0.5,
        attention_forward_s=1.0,
        launch_s=0.0,
        flops=1.0,
        recompute_flops={},
    )
    return dataclasses.replace(base, **update)


def fixed_seconds(
    cost: LayerCost, overlap: Overlap, recompute=frozenset(), job: dict | None = None, **layout_kw
):
    layout = Layout(**{"tp": 2, "cp": 2, "sp": True, "num_microbatches": 4, **layout_kw})
    ctx = make_ctx(layout, **(job or {}))
    return FixedLayerCost(cost, overlap).layer_seconds(ctx, layout, DENSE, recompute)


@pytest.mark.parametrize("tp_overlap", [0.0, 0.3, 0.5, 1.0])
def test_exposed_tp_comm_is_one_minus_overlap_of_raw(tp_overlap: float) -> None:
    secs = fixed_seconds(fixed_cost(), Overlap(tp=tp_overlap))
    assert secs["tp_comm"] == pytest.approx((1 - tp_overlap) * 0.8)
    # Full recompute re-runs the forward's exposed TP communication.
    full = fixed_seconds(fixed_cost(), Overlap(tp=tp_overlap), None)
    assert full["tp_comm"] == secs["tp_comm"]
    assert full["recompute"] == pytest.approx(
        3.375 + (1 - tp_overlap) * 0.4 + 0.5 + max(0.0, 0.3 - 1.0 / 2)
    )


@pytest.mark.parametrize(("nccl", "tp", "tp_share"), [(0.2, 0.05, 0.05), (0.2, None, 0.2)])
def test_hidden_tp_comm_slows_compute_by_its_own_share(nccl, tp, tp_share) -> None:
    """Hidden TP traffic (userbuffers: copy engines and a few SMs) charges its own share
    of itself; hidden CP and EP traffic (NCCL kernels) the shared one. Unset, TP's share
    is the shared one."""
    overlap = Overlap(tp=0.5, cp=0.0, ep=0.5)
    cm = FixedLayerCost(fixed_cost(), overlap)
    cm.calibration = Calibration(
        overlap={"default": overlap}, interference=nccl, tp_interference=tp
    )
    layout = Layout(tp=2, cp=2, sp=True, num_microbatches=4)
    secs = cm.layer_seconds(make_ctx(layout), layout, DENSE, frozenset())
    assert secs["tp_comm"] == pytest.approx(0.5 * 0.8 + tp_share * 0.5 * 0.8)
    assert secs["ep_comm"] == pytest.approx(0.5 * 1.0 + nccl * 0.5 * 1.0)
    assert secs["cp_comm"] == pytest.approx(0.9)  # no CP overlap: nothing hidden


@pytest.mark.parametrize("tp_overlap", [0.3, 1.0])
def test_a_job_without_tp_overlap_exposes_every_tp_collective(tp_overlap: float) -> None:
    off = fixed_seconds(fixed_cost(), Overlap(tp=tp_overlap), job={"tp_comm_overlap": False})
    assert off["tp_comm"] == pytest.approx(0.8)  # the raw forward + backward traffic
    on = fixed_seconds(fixed_cost(), Overlap(tp=tp_overlap), job={"tp_comm_overlap": True})
    assert on["tp_comm"] == pytest.approx((1 - tp_overlap) * 0.8)
    # full recompute re-runs the forward's collectives, all of them exposed
    full = fixed_seconds(fixed_cost(), Overlap(tp=tp_overlap), None, {"tp_comm_overlap": False})
    assert full["recompute"] == pytest.approx(3.375 + 0.4 + 0.5 + max(0.0, 0.3 - 1.0 / 2))


@pytest.mark.parametrize("stated", [None, True])
def test_without_sequence_parallelism_no_tp_collective_is_hidden(stated) -> None:
    """The overlap splits SP's all-gather and reduce-scatter around each GEMM; Megatron
    refuses --tp-comm-overlap without --sequence-parallel. With SP off the TP traffic is
    all exposed, whatever the job says, and the setting is not read (nor assumed)."""
    secs = fixed_seconds(fixed_cost(), Overlap(tp=0.8), job={"tp_comm_overlap": stated}, sp=False)
    assert secs["tp_comm"] == pytest.approx(0.8)
    layout = Layout(tp=2, sp=False, num_microbatches=4)
    ctx = make_ctx(layout)
    FixedLayerCost(fixed_cost(), Overlap(tp=0.8)).layer_seconds(ctx, layout, DENSE, frozenset())
    assert "job.tp_comm_overlap" not in [a.field for a in ctx.recorder.items]


def test_tp_overlap_is_assumed_only_where_tp_communicates() -> None:
    for tp, assumed in ((1, False), (2, True)):
        layout = Layout(tp=tp, sp=True, num_microbatches=4)
        ctx = make_ctx(layout)
        FixedLayerCost(fixed_cost(), Overlap(tp=0.5)).layer_seconds(ctx, layout, DENSE, frozenset())
        fields = [a.field for a in ctx.recorder.items]
        assert ("job.tp_comm_overlap" in fields) is assumed


@pytest.mark.parametrize(
    ("cp", "cp_fwd", "att", "overlap", "expected"),
    [
        # cp = 2, one ring step hidden behind one block (att/2) of attention:
        # max(0, f − o·att/2) + max(0, 2f − o·2.5·att/2)
        (2, 0.3, 1.0, 1.0, 0.0),  # short comm, full overlap: hidden
        (2, 0.3, 1.0, 0.0, 0.9),  # no overlap: all of it
        (2, 0.3, 0.2, 1.0, 0.2 + 0.35),  # longer than the block's attention: the excess
        (2, 0.3, 0.2, 0.5, 0.25 + 0.475),
        (2, 2.0, 1.0, 1.0, 1.5 + 2.75),
        (2, 0.0, 1.0, 1.0, 0.0),
        # cp = 4: three steps of f/3 each, behind blocks of att/4.
        (4, 0.9, 0.8, 1.0, 3 * (0.3 - 0.2) + 3 * (0.6 - 0.5)),
        (4, 0.9, 4.0, 1.0, 0.0),
        (4, 0.9, 4.0, 0.0, 2.7),
    ],
)
def test_cp_ring_exposure_clamps(
    cp: int, cp_fwd: float, att: float, overlap: float, expected: float
) -> None:
    cost = fixed_cost(
        cp_forward_s=cp_fwd, cp_backward_s=2 * cp_fwd, attention_forward_s=att,
        cp_ring_steps=cp - 1,
    )  # fmt: skip
    secs = fixed_seconds(cost, Overlap(cp=overlap), cp=cp)
    assert secs["cp_comm"] == pytest.approx(expected)
    assert secs["cp_comm"] >= 0.0
    # Full recompute re-runs the forward's exposed share only.
    full = fixed_seconds(cost, Overlap(cp=overlap, tp=1.0, ep=1.0), None, cp=cp)
    steps = cp - 1
    fwd_exposed = steps * max(0.0, cp_fwd / steps - overlap * att / cp)
    assert full["recompute"] == pytest.approx(3.375 + fwd_exposed)


def test_all_to_all_cp_is_not_hidden() -> None:
    """Ulysses all-to-alls block the attention: exposed whatever the overlap."""
    cost = fixed_cost(cp_forward_s=0.3, cp_backward_s=0.3, cp_ring_steps=0)
    assert fixed_seconds(cost, Overlap(cp=1.0))["cp_comm"] == pytest.approx(0.6)


@pytest.mark.parametrize(("cp", "tp"), [(2, 1), (4, 1), (4, 2), (8, 4)])
def test_ring_cp_merges_each_block_into_the_output_and_its_gradients(cp: int, tp: int) -> None:
    """Ring CP adds each block's partial output (forward) and dq, dK/dV (backward) into
    running sums: 3 passes (read the block's, read and write the sum) over the local
    tokens' output, q and K/V widths, cp times, at the HBM roofline. The merge is part
    of the core attention that selective recompute re-runs; no CP and all-to-all CP
    merge nothing."""
    layout = Layout(tp=tp, cp=cp, sp=tp > 1, num_microbatches=2)
    cm = NdplanCostModel(Calibration())
    ctx = make_ctx(layout)
    merge = {op.name: op for op in cm.layer_cost(ctx, layout, DENSE).ops}["cp_merge"]
    n = 4096 / cp  # local tokens of one sequence
    heads = ATTENTION.num_heads / tp
    kv_heads = max(ATTENTION.num_kv_heads, tp) / tp
    rate = H100.hbm_bytes_per_s * Calibration().default.hbm
    out = 3 * cp * 2 * n * heads * 128
    grads = 3 * cp * 2 * n * (heads * 128 + 2 * kv_heads * 128)
    assert merge.forward_s == pytest.approx(out / rate)
    assert merge.backward_s == pytest.approx(grads / rate)
    assert merge.recomputed_by == frozenset({"core_attn"})
    assert merge.kernels == cp
    for other, job in (
        (Layout(tp=tp, sp=tp > 1, num_microbatches=2), {}),
        (layout, {"cp_kind": "all_to_all"}),
    ):
        names = {op.name for op in cm.layer_cost(make_ctx(other, **job), other, DENSE).ops}
        assert "cp_merge" not in names


def test_ep_exposure_and_dualpipev_overlap() -> None:
    secs = fixed_seconds(fixed_cost(), Overlap(ep=0.25))
    assert secs["ep_comm"] == pytest.approx(0.75 * 1.0)
    dual = fixed_seconds(fixed_cost(), Overlap(ep=0.25), pp=2, schedule="dualpipev")
    assert dual["ep_comm"] == pytest.approx(0.1 * 0.75 * 1.0)
    assert fixed_seconds(fixed_cost(), Overlap(ep=1.0))["ep_comm"] == 0.0


def test_layer_seconds_forward_backward_and_launch() -> None:
    secs = fixed_seconds(fixed_cost(launch_s=0.03), Overlap())
    assert secs["forward"] == pytest.approx(3.375 + 0.01)
    assert secs["backward"] == pytest.approx(2.5 + 0.5 + 0.25 + 4.0 + 0.02)
    assert set(secs) == set(LAYER_PARTS)


def test_recompute_switches_pick_their_ops() -> None:
    ov = Overlap()
    assert fixed_seconds(fixed_cost(), ov, frozenset())["recompute"] == 0.0
    assert fixed_seconds(fixed_cost(), ov, frozenset({"core_attn"}))["recompute"] == 1.0
    assert fixed_seconds(fixed_cost(), ov, frozenset({"act", "norm"}))["recompute"] == 0.375
    # Full recompute: the whole forward plus its exposed forward communication.
    full = fixed_seconds(fixed_cost(), Overlap(tp=0.0, ep=0.0, cp=0.0), None)
    assert full["recompute"] == pytest.approx(3.375 + 0.4 + 0.5 + 0.3)


def test_sp_regather_charged_only_where_not_forced() -> None:
    """Megatron always re-gathers SP inputs (a forced switch); elsewhere choosing
    ``sp_gather`` adds the re-gather to the exposed TP communication."""
    ov = Overlap(tp=0.5)
    layout = Layout(tp=2, sp=True, num_microbatches=2)
    for framework, extra in (("megatron", 0.0), ("mindformers", 0.5 * 0.2)):
        ctx = make_ctx(layout, framework=framework)
        cm = FixedLayerCost(fixed_cost(), ov)
        base = cm.layer_seconds(ctx, layout, DENSE, frozenset())
        regather = cm.layer_seconds(ctx, layout, DENSE, frozenset({"sp_gather"}))
        assert regather["tp_comm"] - base["tp_comm"] == pytest.approx(extra)
        assert regather["recompute"] == base["recompute"] == 0.0


def test_forced_switches_recompute_with_an_empty_set() -> None:
    layout = Layout(tp=2, num_microbatches=2)
    ctx = make_ctx(layout)
    ctx.cache["framework"] = dataclasses.replace(ctx.framework, forced_switches=frozenset({"norm"}))
    secs = FixedLayerCost(fixed_cost(), Overlap()).layer_seconds(ctx, layout, DENSE, frozenset())
    assert secs["recompute"] == 0.125


# ----------------------------------------------------------------------------- DP exposure


def dp_case(
    zero: int, window_fwd: float, window_bwd: float, overlap: float = 0.9, *,
    m: int = 2, **job,
):  # fmt: skip
    """Per-step exposed DP communication and optimizer of a one-stage, dp = 4 layout."""
    layout = Layout(dp=4, num_microbatches=m, zero=zero)
    ctx = make_ctx(layout, **job)
    cm = overlap_model(dp=overlap, fsdp=overlap)
    stages = ctx.placement(layout)
    dp, opt = cm.data_parallel_and_optimizer(ctx, layout, stages, window_fwd, window_bwd)
    dense, expert, _ = NdplanMemoryModel().stage_parameters(ctx, layout, stages[0])
    link = cm.links(ctx, layout).dp
    return dp, dense, expert, link, opt


def test_dp_volumes_by_hand() -> None:
    """bf16 parameters gathered and fp32 (Megatron) gradients scattered over the DP ring;
    routed experts over the expert-DP ring."""
    layout = Layout(dp=4, num_microbatches=2)
    ctx = make_ctx(layout)
    cm = NdplanCostModel()
    ((gather, scatter),) = volumes(cm, ctx, layout)
    dense, expert, _ = NdplanMemoryModel().stage_parameters(ctx, layout, ctx.placement(layout)[0])
    assert expert == 0 and dense > 0
    assert gather == pytest.approx(3 / 4 * 2 * dense / H100_UP + 3 * H100_ALPHA, rel=1e-12)
    assert scatter == pytest.approx(3 / 4 * 4 * dense / H100_UP + 3 * H100_ALPHA, rel=1e-12)
    # bf16 gradient reduction halves the scatter's bytes.
    ctx16 = make_ctx(layout, grad_reduce_dtype="bf16")
    assert volumes(cm, ctx16, layout)[0] == pytest.approx((gather, gather), rel=1e-12)
    # MoE, dp = 8, ep = 4: experts are sharded 4 ways and replicated over expert-DP = 2.
    layout = Layout(dp=8, ep=4, num_microbatches=2)
    ctx = make_ctx(layout, moe_model())
    ((gather, scatter),) = volumes(cm, ctx, layout)
    dense, expert, _ = NdplanMemoryModel().stage_parameters(ctx, layout, ctx.placement(layout)[0])
    assert expert > 0
    links = cm.links(ctx, layout)
    assert links.dp.size == 8 and links.expert_dp.size == 2
    assert gather == pytest.approx(
        7 / 8 * 2 * dense / H100_UP + 7 * H100_ALPHA
        + 1 / 2 * 2 * expert / links.expert_dp.bytes_per_s + links.expert_dp.latency_s,
        rel=1e-12,
    )  # fmt: skip
    assert scatter == pytest.approx(
        7 / 8 * 4 * dense / H100_UP + 7 * H100_ALPHA
        + 1 / 2 * 4 * expert / links.expert_dp.bytes_per_s + links.expert_dp.latency_s,
        rel=1e-12,
    )  # fmt: skip


@pytest.mark.parametrize("zero", [1, 3])
def test_fp8_parameters_gather_a_byte_each_and_mxfp8_ones_in_bf16(zero: int) -> None:
    """With --fp8-param-gather, per-tensor fp8 linear weights are gathered as stored (one
    byte); MXFP8 ones travel in bf16 through the gradient buffer. Norms and the embedding
    stay bf16; gradients are untouched."""
    cm = NdplanCostModel()
    for model, layout in (
        (dense_model(), Layout(dp=4, zero=zero, num_microbatches=2)),
        (moe_model(), Layout(dp=8, ep=4, zero=zero, num_microbatches=2)),
    ):
        off = make_ctx(layout, model, precision="fp8", fp8_param_gather=False)
        on = make_ctx(layout, model, precision="fp8", fp8_param_gather=True)
        stage = on.placement(layout)[0]
        dense, expert, linear = NdplanMemoryModel().stage_parameters(on, layout, stage)
        links = cm.links(on, layout)
        ((gather, scatter),) = volumes(cm, on, layout)
        assert gather == pytest.approx(
            all_gather_s(links.dp, 2 * dense - (linear - expert))
            + all_gather_s(links.expert_dp, expert),
            rel=1e-12,
        )
        ((gather_off, scatter_off),) = volumes(cm, off, layout)
        assert gather < gather_off and scatter == scatter_off
        mx = make_ctx(layout, model, precision="mxfp8", fp8_param_gather=True)
        assert volumes(cm, mx, layout) == volumes(cm, off, layout)


def test_dp_all_reduce_by_hand_and_its_clamp() -> None:
    """ZeRO-0: an all-reduce (twice a reduce-scatter's bytes) under the backward window."""
    _, dense, _, link, _ = dp_case(0, 0.0, 0.0)
    assert link.size == 4 and link.bytes_per_s == pytest.approx(H100_UP)
    # fp32 main gradients (Megatron's default) over a 4-GPU NVLink ring.
    raw = 2 * 3 / 4 * dense * 4 / H100_UP + 2 * 3 * H100_ALPHA
    assert raw == pytest.approx(2 * reduce_scatter_s(link, dense * 4), rel=1e-12)
    assert dp_case(0, 0.0, 0.0)[0] == pytest.approx(raw, rel=1e-12)
    assert dp_case(0, 5.0, 0.5 * raw / 0.9)[0] == pytest.approx(0.5 * raw, rel=1e-9)
    # No parameter gather: the forward window hides nothing.
    assert dp_case(0, 100.0, 0.0)[0] == pytest.approx(raw, rel=1e-12)
    assert dp_case(0, 0.0, raw / 0.9 * 1.0001)[0] == 0.0
    assert dp_case(0, 0.0, 100.0)[0] == 0.0
    assert dp_case(0, 0.0, 100.0, overlap=0.0)[0] == pytest.approx(raw, rel=1e-12)
    # Megatron does not reduce per micro-batch: m does not multiply it.
    assert dp_case(0, 0.0, 0.0, m=6)[0] == pytest.approx(raw, rel=1e-12)


def test_distributed_optimizer_scatter_and_gather_clamp_separately() -> None:
    _, dense, _, link, _ = dp_case(1, 0.0, 0.0)
    scatter = reduce_scatter_s(link, dense * 4)
    gather = all_gather_s(link, dense * 2)
    assert dp_case(1, 0.0, 0.0)[0] == pytest.approx(scatter + gather, rel=1e-12)
    assert dp_case(1, 100.0, 0.0)[0] == pytest.approx(scatter, rel=1e-12)
    assert dp_case(1, 0.0, 100.0)[0] == pytest.approx(gather, rel=1e-12)
    assert dp_case(1, 100.0, 100.0)[0] == 0.0
    partly = dp_case(1, 0.5 * gather / 0.9, 0.25 * scatter / 0.9)[0]
    assert partly == pytest.approx(0.75 * scatter + 0.5 * gather, rel=1e-9)
    # ZeRO-1 keeps whole gradients and reduces them once per step, whatever m.
    assert dp_case(1, 0.0, 0.0, m=5)[0] == pytest.approx(scatter + gather, rel=1e-12)


@pytest.mark.parametrize("framework", ["deepspeed", "torchtitan"])
@pytest.mark.parametrize("m", [1, 3])
def test_zero2_reduces_every_micro_batch(framework: str, m: int) -> None:
    """A ZeRO-2 rank keeps only its gradient shard, so every backward reduce-scatters."""
    _, dense, _, link, _ = dp_case(2, 0.0, 0.0, m=m, framework=framework, grad_reduce_dtype="fp32")
    scatter = reduce_scatter_s(link, dense * 4)
    gather = all_gather_s(link, dense * 2)
    got = dp_case(2, 0.0, 0.0, m=m, framework=framework, grad_reduce_dtype="fp32")[0]
    assert got == pytest.approx(m * scatter + gather, rel=1e-12)
    # The m scatters hide under one backward window.
    window = 1.5 * scatter / 0.9
    got = dp_case(2, 0.0, window, m=m, framework=framework, grad_reduce_dtype="fp32")[0]
    assert got == pytest.approx(max(0.0, (m - 1.5) * scatter) + gather, rel=1e-9)


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_zero3_has_no_per_step_part(framework: str) -> None:
    dp, dense, expert, _, opt = dp_case(3, 0.0, 0.0, overlap=0.0, framework=framework)
    assert dp == 0.0
    layout = Layout(dp=4, num_microbatches=2, zero=3)
    ctx = make_ctx(layout, framework=framework)
    assert opt == pytest.approx(NdplanCostModel()._optimizer_s(ctx, layout, dense, expert))
    assert opt > 0


def test_lora_reduces_no_gradients_and_steps_no_optimizer() -> None:
    """Frozen base weights: nothing to reduce, and no optimizer state to update (the memory
    model holds none either; the adapters' few parameters are neglected in both)."""
    for zero in (0, 1, 3):
        dp, _, _, _, opt = dp_case(zero, 0.0, 0.0, overlap=0.0, finetune="lora")
        assert dp == 0.0
        assert opt == 0.0
        _, _, _, _, full_opt = dp_case(zero, 0.0, 0.0, overlap=0.0)
        assert full_opt > 0


# ----------------------------------------------------------------------------- FSDP per micro-batch


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("recompute", [frozenset(), None])
def test_fsdp_stage_part_by_hand(framework: str, overlap: float, recompute) -> None:
    """Per micro-batch: gather for the forward, hidden behind it; gather again and scatter
    the gradients, hidden behind the backward and its recompute. Each of the 9 sharded
    units (8 layers, and the embedding and output layer) is its own collective, paying
    the ring's 3 hops of latency."""
    layout = Layout(dp=4, zero=3, num_microbatches=3, mbs=1)
    ctx = make_ctx(layout, framework=framework, seq=1024)
    cm = overlap_model(fsdp=overlap)
    (stage,) = ctx.placement(layout)
    dense, _, _ = NdplanMemoryModel().stage_parameters(ctx, layout, stage)
    gather = 3 / 4 * 2 * dense / H100_UP + 9 * 3 * H100_ALPHA
    scatter = 3 / 4 * 4 * dense / H100_UP + 9 * 3 * H100_ALPHA  # fp32 gradients in both
    secs = cm.stage_seconds(ctx, layout, stage, [(0, 1, 8, recompute)])
    fwd, bwd = secs["forward"], secs["backward"] + secs["recompute"]
    expected = max(0.0, gather - overlap * fwd) + max(0.0, gather + scatter - overlap * bwd)
    assert secs["dp_comm"] == pytest.approx(expected, rel=1e-12)
    if overlap == 0.0:
        assert secs["dp_comm"] == pytest.approx(2 * gather + scatter, rel=1e-12)
    elif overlap == 1.0:
        assert 0 < secs["dp_comm"] < gather + scatter  # partly hidden
    # The other parts are the stage's without FSDP.
    plain = cm.stage_seconds(ctx, layout.model_copy(update={"zero": 1}), stage,
                             [(0, 1, 8, recompute)])  # fmt: skip
    assert plain["dp_comm"] == 0.0
    assert {k: v for k, v in secs.items() if k != "dp_comm"} == {
        k: v for k, v in plain.items() if k != "dp_comm"
    }


@pytest.mark.parametrize(("dp", "ep", "pp"), [(4, 2, 1), (8, 4, 1), (4, 2, 2)])
def test_fsdp_pays_the_ring_latency_once_per_sharded_unit(dp: int, ep: int, pp: int) -> None:
    """ZeRO-3 gathers and scatters layer by layer: beyond the one collective per group
    that the per-step volumes price, every further unit of the stage pays the data-
    parallel ring's latency again (each decoder layer; the embedding and output layer
    together one more unit), and every further MoE layer the expert-data-parallel
    ring's. Bytes are unchanged. (One node: every hop is NVLink's 3 µs.)"""
    layout = Layout(dp=dp, ep=ep, pp=pp, zero=3, num_microbatches=2 * pp)
    ctx = make_ctx(layout, moe_model(8))
    cm = overlap_model()
    links = cm.links(ctx, layout)
    assert (links.dp.size, links.expert_dp.size) == (dp, dp // ep)
    for stage, per_step, per_unit in zip(
        ctx.placement(layout), volumes(cm, ctx, layout), fsdp_volumes(cm, ctx, layout), strict=True
    ):
        moe_layers = sum(1 for i in stage.layers if i > 0)  # layer 0 is dense
        units = stage.num_layers + (stage.has_embedding or stage.has_head)
        extra = (units - 1) * (dp - 1) * H100_ALPHA + (moe_layers - 1) * (dp // ep - 1) * H100_ALPHA
        assert extra > 0
        assert per_unit[0] == pytest.approx(per_step[0] + extra, rel=1e-12)
        assert per_unit[1] == pytest.approx(per_step[1] + extra, rel=1e-12)


def test_fsdp_part_is_none_below_zero3_and_for_lora() -> None:
    for zero, job in ((0, {}), (1, {}), (2, {}), (3, {"finetune": "lora"})):
        layout = Layout(dp=4, zero=zero, num_microbatches=2)
        ctx = make_ctx(layout, **job)
        (stage,) = ctx.placement(layout)
        secs = overlap_model(fsdp=0.0).stage_seconds(ctx, layout, stage, [(0, 1, 8, frozenset())])
        assert secs["dp_comm"] == 0.0


class FixedVolumes(NdplanCostModel):
    """Layer costs and DP volumes set by the test."""

    def __init__(self, cost: LayerCost, overlap: Overlap, gather: float, scatter: float) -> None:
        super().__init__(Calibration(overlap={"default": overlap}, step_overhead_s=0.0))
        self.fixed = cost
        self.volumes = (gather, scatter)

    def layer_cost(self, ctx, layout, kind):
        return self.fixed

    def _dp_volumes(self, ctx, layout, stage):
        return self.volumes

    def _fsdp_volumes(self, ctx, layout, stage):
        return self.volumes


def test_compute_hiding_the_cp_ring_cannot_hide_the_fsdp_traffic() -> None:
    """Ring CP, cp = 2: per layer, the 0.3 s forward transfer hides behind half of the 1 s
    attention and the 0.6 s backward one behind half of its 2.5 s; that compute is
    recorded on the stage and taken out of the FSDP windows."""
    layout = Layout(cp=2, dp=2, zero=3, num_microbatches=2)
    ctx = make_ctx(layout)
    (stage,) = ctx.placement(layout)
    assignment = [(0, 1, 8, frozenset())]
    cost = fixed_cost(
        cp_forward_s=0.3, cp_backward_s=0.6, cp_ring_steps=1, attention_forward_s=1.0,
        tp_forward_s=0.0, tp_backward_s=0.0, ep_forward_s=0.0, ep_backward_s=0.0,
    )  # fmt: skip
    cm = FixedVolumes(cost, Overlap(cp=1.0, fsdp=1.0), gather=30.0, scatter=25.0)
    secs = cm.stage_seconds(ctx, layout, stage, assignment)
    assert secs["cp_comm"] == 0.0  # all hidden
    assert secs.cp_hidden_forward == pytest.approx(8 * 0.3)
    assert secs.cp_hidden_backward == pytest.approx(8 * 0.6)
    fwd, bwd = secs["forward"], secs["backward"] + secs["recompute"]
    assert fwd == pytest.approx(8 * 3.375, rel=1e-3)  # plus the real embedding and head
    expected = max(0.0, 30.0 - (fwd - 2.4)) + max(0.0, 30.0 + 25.0 - (bwd - 4.8))
    assert secs["dp_comm"] == pytest.approx(expected, rel=1e-12)
    # Half overlap: the ring's transfers are partly exposed, hiding less compute.
    cm = FixedVolumes(cost, Overlap(cp=0.5, fsdp=1.0), gather=30.0, scatter=25.0)
    ctx.cache.clear()
    secs = cm.stage_seconds(ctx, layout, stage, assignment)
    hidden_f, hidden_b = 8 * min(0.3, 0.5 * 0.5), 8 * min(0.6, 0.5 * 2.5 * 0.5)
    assert secs.cp_hidden_forward == pytest.approx(hidden_f)
    assert secs.cp_hidden_backward == pytest.approx(hidden_b)
    assert secs["cp_comm"] == pytest.approx(8 * (0.3 + 0.6) - hidden_f - hidden_b)
    fwd, bwd = secs["forward"], secs["backward"] + secs["recompute"]
    expected = max(0.0, 30.0 - (fwd - hidden_f)) + max(0.0, 55.0 - (bwd - hidden_b))
    assert secs["dp_comm"] == pytest.approx(expected, rel=1e-12)
    # The stage total is then the raw traffic: compute and ring all under the gathers.
    total = sum(secs.values())
    assert total == pytest.approx(2 * 30.0 + 25.0 + 8 * (0.3 + 0.6), rel=1e-12)


# ----------------------------------------------------------------------------- GEMM efficiency


def gemm_ctx(precision: str = "bf16", device=H100, **eff):
    layout = Layout()
    ctx = make_ctx(layout, device=device, precision=precision)
    cm = NdplanCostModel(Calibration(default=DeviceEfficiency(**eff)))
    return ctx, cm


def test_large_gemm_approaches_peak_times_efficiency() -> None:
    ctx, cm = gemm_ctx(gemm=0.8, gemm_half_gflop=1.0)
    m = k = n = 16384
    flops = 2.0 * m * k * n
    ideal = flops / (989.4e12 * 0.8)
    got = cm._gemm_s(ctx, m, k, n)
    assert got == pytest.approx(ideal * (flops + 1e9) / flops, rel=1e-12)
    assert got / ideal == pytest.approx(1.0, rel=2e-4)
    assert cm._gemm_s(ctx, m, k, n, count=3) == pytest.approx(3 * got, rel=1e-12)


@pytest.mark.parametrize("half", [0.5, 1.0, 4.0])
def test_efficiency_halves_at_the_knee(half: float) -> None:
    ctx, cm = gemm_ctx(gemm=0.8, gemm_half_gflop=half, hbm=1.0)
    # 2·m·k·n = half · 1e9 FLOPs.
    m, k, n = 500 * half, 1000, 1000
    flops = 2.0 * m * k * n
    assert flops == half * 1e9
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (989.4e12 * 0.4), rel=1e-12)


def test_grouped_gemms_use_their_own_knee() -> None:
    ctx, cm = gemm_ctx(gemm=0.8, gemm_half_gflop=0.0, grouped_gemm_half_gflop=1.0, hbm=1.0)
    m, k, n = 500, 1000, 1000  # 1 GFLOP each
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(1e9 / (989.4e12 * 0.8), rel=1e-12)
    assert cm._gemm_s(ctx, m, k, n, count=4, grouped=True) == pytest.approx(
        4 * 1e9 / (989.4e12 * 0.4), rel=1e-12
    )


def test_grouped_gemms_stop_gaining_rate_past_the_saturation_tokens() -> None:
    """Below ``grouped_gemm_saturation_tokens`` an expert's GEMM ramps with its size as
    before; past it the rate stays where it got, so time grows in proportion to tokens.
    A dense GEMM of the same size keeps ramping."""
    fit = {"gemm": 0.8, "gemm_half_gflop": 1.0, "grouped_gemm_half_gflop": 1.0, "hbm": 1.0}
    ctx, cm = gemm_ctx(**fit, grouped_gemm_saturation_tokens=1000.0)
    k = n = 1000  # 2 GFLOP per 1,000 tokens
    at_cap = cm._gemm_s(ctx, 1000, k, n, count=4, grouped=True)
    assert at_cap == pytest.approx(4 * 2e9 / (989.4e12 * 0.8 * 2 / 3), rel=1e-12)
    below = cm._gemm_s(ctx, 500, k, n, count=4, grouped=True)
    assert below == pytest.approx(4 * 1e9 / (989.4e12 * 0.4), rel=1e-12)
    for tokens in (2000, 8000):
        assert cm._gemm_s(ctx, tokens, k, n, count=4, grouped=True) == pytest.approx(
            at_cap * tokens / 1000, rel=1e-12
        )
    dense = cm._gemm_s(ctx, 8000, k, n)
    assert dense == pytest.approx(16e9 / (989.4e12 * 0.8 * 16 / 17), rel=1e-12)
    # Without the cap (the default), the grouped GEMM keeps ramping as the dense one does.
    ctx, uncapped = gemm_ctx(**fit)
    assert uncapped._gemm_s(ctx, 8000, k, n, count=4, grouped=True) == pytest.approx(
        4 * dense, rel=1e-12
    )


def test_skinny_gemm_is_memory_bound() -> None:
    ctx, cm = gemm_ctx(hbm=0.75)
    m, k, n = 1, 8192, 8192
    memory = ((m * k + k * n) * 2 + m * n * 2) / (3350e9 * 0.75)
    got = cm._gemm_s(ctx, m, k, n)
    assert got == pytest.approx(memory, rel=1e-12)
    eff = DeviceEfficiency()
    flops = 2.0 * m * k * n
    compute = flops / (989.4e12 * eff.gemm * flops / (flops + 1e9))
    assert compute < got


def test_weight_gradient_reads_and_writes_the_gradient_buffer() -> None:
    """``accumulate_bytes``: the GEMM is a weight gradient, its k×n result added into the
    gradient buffer (read and written at that many bytes an element) and its m×k, m×n
    operands read. Few tokens against a large weight make it memory-bound on that
    buffer; many tokens leave it compute-bound, as long as the forward."""
    ctx, cm = gemm_ctx(gemm=0.8, gemm_half_gflop=0.0, hbm=0.75)
    k, n = 4096, 3072
    few = 256  # 0.5 FLOP per buffer byte at 4 B read + 4 B written an element
    buffer = ((few * k + few * n) * 2 + k * n * 8) / (3350e9 * 0.75)
    assert cm._gemm_s(ctx, few, k, n, count=8, accumulate_bytes=8) == pytest.approx(
        8 * buffer, rel=1e-12
    )
    assert 8 * buffer > cm._gemm_s(ctx, few, k, n, count=8)
    many = 16384
    forward = cm._gemm_s(ctx, many, k, n)
    assert cm._gemm_s(ctx, many, k, n, accumulate_bytes=8) == pytest.approx(forward, rel=1e-12)


def expert_ops(layout: Layout, **job) -> dict[str, Op]:
    """The routed experts' GEMM ops of ``moe_model``'s MoE layer (16 experts, top 2)."""
    ctx = make_ctx(layout, moe_model(), seq=1024, **job)
    cost = NdplanCostModel().layer_cost(ctx, layout, MOE)
    return {op.name: op for op in cost.ops if op.name in ("expert_fc1", "expert_fc2")}


def test_many_local_experts_with_few_tokens_pay_their_gradient_traffic() -> None:
    """Every micro-batch adds each local expert's weight gradient into the gradient
    buffer: with all 16 experts on one rank and 128 tokens each, that traffic outweighs
    the weight-gradient FLOPs and the backward runs past twice the forward; spread over
    16 ranks (EP 16, 2,048 tokens each) it does not. A bf16 buffer moves half an fp32
    one's bytes; frozen weights (LoRA) run no weight gradient."""
    alone = expert_ops(Layout(dp=16, mbs=1, num_microbatches=4), moe_fused_grouped_mlp=True)
    assert len(alone) == 2 and all(op.backward_s > 2 * op.forward_s for op in alone.values())
    spread = expert_ops(Layout(dp=16, ep=16, mbs=1, num_microbatches=4), moe_fused_grouped_mlp=True)
    for op in spread.values():
        assert op.backward_s == pytest.approx(2 * op.forward_s, rel=1e-12)
    half = expert_ops(
        Layout(dp=16, mbs=1, num_microbatches=4),
        moe_fused_grouped_mlp=True,
        grad_reduce_dtype="bf16",
    )
    for name, op in alone.items():
        excess = op.backward_s - 2 * op.forward_s
        assert 0 < half[name].backward_s - 2 * half[name].forward_s < excess
    frozen = expert_ops(
        Layout(dp=16, mbs=1, num_microbatches=4), moe_fused_grouped_mlp=True, finetune="lora"
    )
    for op in frozen.values():
        assert op.backward_s == pytest.approx(op.forward_s, rel=1e-12)


def test_low_precision_gemm_uses_the_fp8_peak() -> None:
    m = k = n = 8192
    flops = 2.0 * m * k * n
    ctx, cm = gemm_ctx("fp8", gemm_low_precision=0.5, gemm=0.8, gemm_half_gflop=0.0)
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (1978.9e12 * 0.5), rel=1e-12)
    # The router and the head stay in bf16.
    assert cm._gemm_s(ctx, m, k, n, low_precision=False) == pytest.approx(
        flops / (989.4e12 * 0.8), rel=1e-12
    )
    for recipe in ("fp8-blockwise", "mxfp8"):
        ctx, cm = gemm_ctx(recipe, gemm_low_precision=0.5, gemm_half_gflop=0.0)
        assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (1978.9e12 * 0.5), rel=1e-12)
    ctx, cm = gemm_ctx("fp4", device=DEVICES["b200"], gemm_low_precision=0.5, gemm_half_gflop=0)
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (9000e12 * 0.5), rel=1e-12)


def test_fp4_gemms_have_their_own_efficiency() -> None:
    """fp4 GEMMs run at ``gemm_fp4`` of the fp4 peak when it is set; fp8 recipes keep
    ``gemm_low_precision`` either way."""
    m = k = n = 8192
    flops = 2.0 * m * k * n
    b200 = DEVICES["b200"]
    fit = {"gemm_low_precision": 0.5, "gemm_fp4": 0.3, "gemm_half_gflop": 0.0}
    ctx, cm = gemm_ctx("fp4", device=b200, **fit)
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (9000e12 * 0.3), rel=1e-12)
    for recipe in ("fp8", "mxfp8"):
        ctx, cm = gemm_ctx(recipe, device=b200, **fit)
        assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (4500e12 * 0.5), rel=1e-12)


def test_mxfp8_gemms_have_their_own_efficiency() -> None:
    """MXFP8 GEMMs run at ``gemm_mxfp8`` of the fp8 peak when it is set; per-tensor fp8,
    blockwise fp8 and fp4 keep theirs, and an unfitted share falls back to fp8's."""
    m = k = n = 8192
    flops = 2.0 * m * k * n
    b200 = DEVICES["b200"]
    fit = {"gemm_low_precision": 0.5, "gemm_mxfp8": 0.45, "gemm_fp4": 0.3, "gemm_half_gflop": 0.0}
    ctx, cm = gemm_ctx("mxfp8", device=b200, **fit)
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (4500e12 * 0.45), rel=1e-12)
    assert cm._gemm_s(ctx, m, k, n, routed=True) == pytest.approx(flops / (4500e12 * 0.45))
    for recipe in ("fp8", "fp8-blockwise"):
        ctx, cm = gemm_ctx(recipe, device=b200, **fit)
        assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (4500e12 * 0.5), rel=1e-12)
    ctx, cm = gemm_ctx("fp4", device=b200, **fit)
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (9000e12 * 0.3), rel=1e-12)
    ctx, cm = gemm_ctx("mxfp8", device=b200, **{**fit, "gemm_mxfp8": None})
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (4500e12 * 0.5), rel=1e-12)


def test_bf16_routed_expert_gemms_have_their_own_efficiency() -> None:
    """Routed experts' grouped GEMMs in bf16 run at ``grouped_gemm_bf16``; dense bf16
    GEMMs (the head, attention projections) and low-precision experts keep theirs."""
    m = k = n = 8192
    flops = 2.0 * m * k * n
    fit = {"gemm": 0.8, "gemm_low_precision": 0.5, "grouped_gemm_bf16": 0.4}
    fit |= {"gemm_half_gflop": 0.0, "grouped_gemm_half_gflop": 0.0}
    ctx, cm = gemm_ctx(**fit)
    assert cm._gemm_s(ctx, m, k, n, routed=True) == pytest.approx(flops / (989.4e12 * 0.4))
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (989.4e12 * 0.8))
    ctx, cm = gemm_ctx("fp8", **fit)
    assert cm._gemm_s(ctx, m, k, n, routed=True) == pytest.approx(flops / (1978.9e12 * 0.5))
    ctx, cm = gemm_ctx(**{**fit, "grouped_gemm_bf16": None})  # unfitted: the dense share
    assert cm._gemm_s(ctx, m, k, n, routed=True) == pytest.approx(flops / (989.4e12 * 0.8))


@pytest.mark.parametrize(
    ("precision", "dense_field", "peak"),
    [("fp8", "gemm_low_precision", 1978.9e12), ("mxfp8", "gemm_mxfp8", 1978.9e12)],
)
def test_low_precision_routed_expert_gemms_run_at_a_share_of_the_dense_rate(
    precision: str, dense_field: str, peak: float
) -> None:
    """Low-precision routed experts' grouped GEMMs reach ``grouped_gemm_low_precision_ratio``
    of the dense GEMM's fraction at the same recipe; dense GEMMs and bf16 experts keep
    theirs."""
    m = k = n = 8192
    flops = 2.0 * m * k * n
    fit = {"gemm": 0.8, "grouped_gemm_bf16": 0.4, dense_field: 0.5}
    fit |= {"gemm_half_gflop": 0.0, "grouped_gemm_half_gflop": 0.0}
    fit |= {"grouped_gemm_low_precision_ratio": 0.6}
    ctx, cm = gemm_ctx(precision, **fit)
    assert cm._gemm_s(ctx, m, k, n, routed=True) == pytest.approx(flops / (peak * 0.5 * 0.6))
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(flops / (peak * 0.5))
    ctx, cm = gemm_ctx(**fit)  # bf16 experts have their own figure, not the ratio
    assert cm._gemm_s(ctx, m, k, n, routed=True) == pytest.approx(flops / (989.4e12 * 0.4))


def test_low_precision_halves_the_memory_roofline_operands() -> None:
    m, k, n = 1, 8192, 8192
    ctx, cm = gemm_ctx("fp8", hbm=1.0)
    assert cm._gemm_s(ctx, m, k, n) == pytest.approx(((m * k + k * n) + m * n * 2) / 3350e9)


def test_empty_gemms_cost_nothing() -> None:
    ctx, cm = gemm_ctx()
    assert cm._gemm_s(ctx, 0, 10, 10) == 0.0
    assert cm._gemm_s(ctx, 10, 10, 10, count=0) == 0.0


# ----------------------------------------------------------------------------- real layers


def test_layer_costs_memoised_across_ep_and_expert_tp_equal_fresh_ones() -> None:
    """A layer's cost is memoised on fewer degrees than layer_key: a layer without routed
    experts on tp, cp, sp and the micro-batch only, and a MoE layer's mixer (all but its
    FFN) on those too, shared by its EP and expert-TP variants. Priced in one context, in
    an order that reuses both, every cost equals the one a fresh context computes; and a
    fresh dense layer's cost is the same whatever EP and expert TP are (why its key may
    leave them out)."""
    model = moe_model()
    layouts = [
        Layout(tp=tp, cp=cp, dp=32 // (tp * cp), ep=ep, etp=etp, mbs=mbs, sp=sp, num_microbatches=1)
        for tp in (1, 2, 4)
        for sp in ({False, tp > 1})
        for cp in (1, 2)
        for mbs in (1, 2)
        for etp in sorted({1, tp})
        for ep in (1, 2, 4, 8, 16)
        if ep * etp <= 32
    ]
    shared = make_ctx(layouts[0], model, precision="fp8")
    cm = NdplanCostModel(NO_OVERHEAD)
    dense_by_degrees: dict[tuple, LayerCost] = {}
    for layout in layouts:
        for kind in (DENSE, MOE):
            fresh = cm.layer_cost(make_ctx(layout, model, precision="fp8"), layout, kind)
            assert cm.layer_cost(shared, layout, kind) == fresh, (layout, kind.name)
        degrees = (layout.tp, layout.cp, layout.sequence_parallel, layout.mbs)
        fresh_dense = cm.layer_cost(make_ctx(layout, model, precision="fp8"), layout, DENSE)
        assert dense_by_degrees.setdefault(degrees, fresh_dense) == fresh_dense, layout
    assert len(dense_by_degrees) < len(layouts) / 4  # the EP variants did share


def test_expert_tp_gathers_the_routed_copies_over_its_own_group_by_hand() -> None:
    """Expert TP shards each expert's width, so the dispatcher all-gathers the copies every
    rank of the expert-TP group received and reduce-scatters the experts' outputs (each
    way): priced on the expert-TP group, adjacent ranks, with EP starting past it. A MoE
    layer without shared experts keeps only attention's TP pair; EP 1 pays no all-to-all."""
    cm = NdplanCostModel(NO_OVERHEAD)
    n, h, top_k = 4096, 2048, 2
    for tp, etp, ep, dp in ((1, 2, 1, 16), (1, 16, 1, 16), (2, 2, 1, 8), (4, 2, 2, 4)):
        layout = Layout(tp=tp, etp=etp, ep=ep, dp=dp, sp=tp > 1, num_microbatches=1)
        ctx = make_ctx(layout, moe_model())
        links = cm.links(ctx, layout)
        assert links.etp == group_link(ctx.cluster, cm.efficiency(ctx), etp, 1)
        assert links.ep == group_link(ctx.cluster, cm.efficiency(ctx), ep, etp)
        gathered = n / tp * top_k * etp * h * 2  # every copy the group received, bf16
        expert_tp = all_gather_s(links.etp, gathered) + reduce_scatter_s(links.etp, gathered)
        cost = cm.layer_cost(ctx, layout, MOE)
        a2a = 2 * all_to_all_s(links.ep, n / tp * top_k * h * 2) if ep > 1 else 0.0
        assert cost.ep_forward_s == pytest.approx(expert_tp + a2a, rel=1e-12), layout
        assert cost.ep_backward_s == cost.ep_forward_s
        dense = cm.layer_cost(ctx, layout, DENSE)
        assert cost.tp_forward_s == pytest.approx(dense.tp_forward_s / 2, rel=1e-12)
        assert cost.sp_regather_s == pytest.approx(dense.sp_regather_s / 2, rel=1e-12)
    # Crossing the node costs more than staying in it: 16 expert-TP ranks over two hosts
    # move each copy slower than 8 inside one.
    wide, narrow = (Layout(etp=e, dp=16, num_microbatches=1) for e in (16, 8))
    per_copy = [
        cm.layer_cost(make_ctx(lay, moe_model()), lay, MOE).ep_forward_s / lay.etp
        for lay in (wide, narrow)
    ]
    assert per_copy[0] > per_copy[1]


def test_tp_all_reduce_by_hand() -> None:
    """TP = 8 without SP on one H100 node: two all-reduces of s·b·h per layer, each way,
    all of them exposed (the TP overlap splits SP's gathers; it has none to split here)."""
    layout = Layout(tp=8, mbs=2, num_microbatches=2)
    ctx = make_ctx(layout, seq=2048)
    for overlap in (0.0, 0.25):
        cm = NdplanCostModel(Calibration(overlap={"default": Overlap(tp=overlap)}))
        ctx.cache.clear()
        cost = cm.layer_cost(ctx, layout, DENSE)
        nbytes = 2 * 2048 * 2048 * 2  # mbs · s · h · bf16
        ar = 2 * 7 / 8 * nbytes / (450e9 * 0.75) + 2 * 7 * 3e-6
        assert cost.tp_forward_s == pytest.approx(2 * ar, rel=1e-12)
        assert cost.tp_backward_s == cost.tp_forward_s
        secs = cm.layer_seconds(ctx, layout, DENSE, frozenset())
        assert secs["tp_comm"] == pytest.approx(4 * ar, rel=1e-12)


def test_sp_gathers_and_scatters_cost_the_same_as_all_reduces() -> None:
    ctx = make_ctx(Layout(tp=4, num_microbatches=2))
    cm = NdplanCostModel(NO_OVERHEAD)
    plain = cm.layer_cost(ctx, Layout(tp=4, num_microbatches=2), DENSE)
    sp = cm.layer_cost(ctx, Layout(tp=4, sp=True, num_microbatches=2), DENSE)
    assert sp.tp_forward_s == pytest.approx(plain.tp_forward_s, rel=1e-12)
    link = cm.links(ctx, Layout(tp=4)).tp
    assert sp.sp_regather_s == pytest.approx(2 * all_gather_s(link, 4096 * 2048 * 2))
    assert plain.sp_regather_s == 0.0


def test_low_precision_sp_gathers_move_one_byte_elements() -> None:
    """fp8 under SP: the forward gathers (and their backward re-gather) carry the
    quantised linear inputs; the reduce-scatters and the backward's gradient gathers
    stay bf16. bf16 moves two bytes everywhere."""
    layout = Layout(tp=4, sp=True, num_microbatches=2)
    cm = NdplanCostModel(NO_OVERHEAD)
    link = cm.links(make_ctx(layout), layout).tp
    n, h = 4096, 2048
    ag = {b: all_gather_s(link, n * h * b) for b in (1, 2)}
    rs = reduce_scatter_s(link, n * h * 2)
    fp8 = cm.layer_cost(make_ctx(layout, precision="fp8"), layout, DENSE)
    assert fp8.tp_forward_s == pytest.approx(2 * (ag[1] + rs), rel=1e-12)
    assert fp8.tp_backward_s == pytest.approx(2 * (ag[2] + rs), rel=1e-12)
    assert fp8.sp_regather_s == pytest.approx(2 * ag[1], rel=1e-12)
    bf16 = cm.layer_cost(make_ctx(layout), layout, DENSE)
    assert bf16.tp_forward_s == bf16.tp_backward_s == pytest.approx(2 * (ag[2] + rs), rel=1e-12)


def test_gathered_linear_inputs_are_quantised_on_the_rank_shard() -> None:
    """Under SP the column-parallel inputs (QKV, FC1) are cast to fp8 on the rank's
    n/t tokens before the gather; without SP every rank holds (and casts) all n. The
    row-parallel inputs are the rank's own either way."""
    cm = NdplanCostModel(Calibration(default=DeviceEfficiency(hbm=1.0)))
    ops = {}
    for sp in (True, False):
        layout = Layout(tp=4, sp=sp, num_microbatches=2)
        cost = cm.layer_cost(make_ctx(layout, precision="fp8"), layout, DENSE)
        ops[sp] = {op.name: op.forward_s for op in cost.ops}
    n, h, cast = 4096, 2048, 2 + 2  # read bf16, write two fp8 layouts
    saved = cast * (n - n / 4) * h / 3350e9
    for name in ("qkv_proj", "fc1"):
        assert ops[False][name] - ops[True][name] == pytest.approx(saved, rel=1e-9)
    for name in ("out_proj", "fc2"):
        assert ops[False][name] == pytest.approx(ops[True][name], rel=1e-12)


def test_per_tensor_fp8_casts_write_one_layout_where_any_layout_multiplies() -> None:
    """The cast of a linear input writes rowwise and columnwise fp8 on Hopper, only the
    rowwise one for per-tensor fp8 on Blackwell; MXFP8 writes both everywhere."""
    layout = Layout(tp=1, num_microbatches=2)
    cm = NdplanCostModel(Calibration(default=DeviceEfficiency(hbm=1.0, gemm_half_gflop=0.0)))
    n, h = 4096, 2048
    b200 = DEVICES["b200"]

    def qkv_s(precision: str) -> float:
        ctx = make_ctx(layout, device=b200, precision=precision)
        cost = cm.layer_cost(ctx, layout, DENSE)
        return next(op.forward_s for op in cost.ops if op.name == "qkv_proj")

    one_byte_per_element = n * h / (b200.hbm_bandwidth_gb_per_s * 1e9)
    assert qkv_s("mxfp8") - qkv_s("fp8") == pytest.approx(one_byte_per_element, rel=1e-9)


def test_cp_ring_by_hand() -> None:
    layout = Layout(cp=2, num_microbatches=2)
    ctx = make_ctx(layout, seq=8192)
    cm = NdplanCostModel(Calibration(overlap={"default": Overlap(cp=0.0)}))
    cost = cm.layer_cost(ctx, layout, DENSE)
    tokens = 8192 / 2
    kv = 2 * 4 * 128 * 2  # K and V, 4 kv heads × 128, bf16
    step = tokens * kv / (450e9 * 0.75) + 3e-6
    assert cost.cp_forward_s == pytest.approx(step, rel=1e-12)
    assert cost.cp_backward_s == pytest.approx(2 * step, rel=1e-12)
    assert cm.layer_seconds(ctx, layout, DENSE, frozenset())["cp_comm"] == pytest.approx(
        3 * step, rel=1e-12
    )
    # With full overlap the long attention hides it.
    hidden = NdplanCostModel(Calibration(overlap={"default": Overlap(cp=1.0)}))
    ctx.cache.clear()
    assert hidden.layer_cost(ctx, layout, DENSE).attention_forward_s / 2 > 2 * step
    assert hidden.layer_seconds(ctx, layout, DENSE, frozenset())["cp_comm"] == 0.0


def test_attention_rate_follows_the_keys_per_kernel_call() -> None:
    """A flash-attention call over L keys runs at L / (L + 460) of the kernel's long-sequence
    rate: the whole sequence without CP, seq/cp keys per ring step, the whole sequence
    again under all-to-all CP (it splits heads, not keys), the window if shorter."""
    cm = NdplanCostModel(Calibration())
    peak = H100.peak_flops("bf16") * DeviceEfficiency().attention

    def attention_s(layout: Layout, seq: int = 8192, model: ModelSpec | None = None, **job):
        ctx = make_ctx(layout, model, seq=seq, **job)
        kind = (model or dense_model()).kinds[0]
        return cm.layer_cost(ctx, layout, kind).attention_forward_s

    whole = attention_s(Layout())
    flops = 8192 * core_attention_flops(ATTENTION, 8192, "causal")
    assert whole == pytest.approx(flops / (peak * 8192 / (8192 + ATTENTION_HALF_KEYS)), rel=1e-12)
    for cp in (2, 4, 16):
        keys = 8192 / cp
        ring = attention_s(Layout(cp=cp, num_microbatches=2))
        slower = (8192 + ATTENTION_HALF_KEYS) / 8192 * keys / (keys + ATTENTION_HALF_KEYS)
        assert cp * ring * slower == pytest.approx(whole, rel=1e-12)
        ulysses = attention_s(Layout(cp=cp, num_microbatches=2), cp_kind="all_to_all")
        assert cp * ulysses == pytest.approx(whole, rel=1e-12)
    assert attention_s(Layout(cp=16, num_microbatches=2)) * 16 > 1.6 * whole  # 512 keys a call
    windowed = ATTENTION.model_copy(update={"sliding_window": 1024})
    kind = LayerKind(name="w", attention=windowed, ffn=DenseFFN(intermediate_size=8192))
    model = ModelSpec(
        name="windowed", hidden_size=2048, vocab_size=32000, kinds=(kind,), layers=(0,) * 8
    )
    flops_w = 8192 * core_attention_flops(windowed, 8192, "causal")
    assert attention_s(Layout(), model=model) == pytest.approx(
        flops_w / (peak * 1024 / (1024 + ATTENTION_HALF_KEYS)), rel=1e-12
    )


def test_pp_send_recv_by_hand() -> None:
    layout = Layout(pp=2, mbs=1, num_microbatches=4)
    ctx = make_ctx(layout, seq=4096)
    cm = NdplanCostModel(Calibration(overlap={"default": Overlap(pp=0.25)}))
    boundary = 4096 * 2048 * 2
    p2p = boundary / (450e9 * 0.75) + 3e-6
    for stage in ctx.placement(layout):
        fixed = cm.stage_fixed_seconds(ctx, layout, stage)
        assert fixed["pp_comm"] == pytest.approx(2 * p2p * 0.75, rel=1e-12)


def test_optimizer_step_by_hand() -> None:
    layout = Layout(num_microbatches=1)
    ctx = make_ctx(layout)
    cm = NdplanCostModel(Calibration(default=DeviceEfficiency(hbm=0.5)))
    stage = ctx.placement(layout)[0]
    dense, expert, _ = NdplanMemoryModel().stage_parameters(ctx, layout, stage)
    # Adam: read master, grad, two moments; write master, moments and the bf16 copy.
    expected = (dense + expert) * (12 + 4 + 12 + 2) / (3350e9 * 0.5)
    assert cm._optimizer_s(ctx, layout, dense, expert) == pytest.approx(expected, rel=1e-12)


def cp_forward_exposed(cost: LayerCost, overlap: float, cp: int) -> float:
    """Ring CP: each of the cp − 1 transfers hides behind one block (1/cp) of attention."""
    steps = cost.cp_ring_steps
    if not steps:
        return cost.cp_forward_s
    return steps * max(0.0, cost.cp_forward_s / steps - overlap * cost.attention_forward_s / cp)


@pytest.mark.parametrize(
    ("layout", "kind"),
    [
        (Layout(num_microbatches=2), DENSE),
        (Layout(tp=4, sp=True, num_microbatches=2), DENSE),
        (Layout(tp=2, cp=2, num_microbatches=2), DENSE),
        (Layout(dp=8, ep=4, num_microbatches=2), MOE),
        (Layout(dp=4, tp=2, ep=8, etp=1, sp=True, num_microbatches=2), MOE),
    ],
)
def test_full_recompute_is_the_forward_plus_exposed_forward_comm(layout: Layout, kind) -> None:
    ctx = make_ctx(layout, moe_model())
    ov = Overlap(tp=0.2, cp=0.5, ep=0.3)
    cm = NdplanCostModel(Calibration(overlap={"default": ov}))
    cost = cm.layer_cost(ctx, layout, kind)
    full = cm.layer_seconds(ctx, layout, kind, None)
    none = cm.layer_seconds(ctx, layout, kind, frozenset())
    exposed = (
        cost.tp_forward_s * (1 - ov.tp if layout.sequence_parallel else 1)
        + cost.ep_forward_s * (1 - ov.ep)
        + cp_forward_exposed(cost, ov.cp, layout.cp)
    )
    assert full["recompute"] == pytest.approx(full["forward"] + exposed, rel=1e-12)
    if layout.tp == layout.cp == layout.ep == 1:
        assert full["recompute"] == full["forward"]
    assert none["recompute"] == 0.0
    for name in ("forward", "backward", "tp_comm", "cp_comm", "ep_comm"):
        assert full[name] == none[name]
    assert all(v >= 0 for v in full.values())
    if kind is MOE and layout.ep > 1:
        assert cost.ep_forward_s > 0


@pytest.mark.parametrize("framework", ["megatron", "torchtitan", "mindformers", "deepspeed"])
def test_empty_recompute_set_recomputes_nothing(framework: str) -> None:
    layout = Layout(tp=2, sp=True, num_microbatches=2)
    ctx = make_ctx(layout, moe_model(), framework=framework)
    cm = NdplanCostModel()
    forced = ctx.framework.forced_switches
    for kind in (DENSE, MOE):
        cost = cm.layer_cost(ctx, layout, kind)
        expected = sum(op.forward_s for op in cost.ops if op.recomputed_by & forced)
        rec = cm.layer_seconds(ctx, layout, kind, frozenset())["recompute"]
        assert rec == expected == 0.0  # no op is re-run by the forced sp_gather


def test_selective_recompute_of_core_attention_and_experts() -> None:
    layout = Layout(dp=4, ep=4, num_microbatches=2)
    ctx = make_ctx(layout, moe_model())
    cm = NdplanCostModel()
    cost = cm.layer_cost(ctx, layout, MOE)
    att = cm.layer_seconds(ctx, layout, MOE, frozenset({"core_attn"}))
    assert att["recompute"] == cost.attention_forward_s
    experts = cm.layer_seconds(ctx, layout, MOE, frozenset({"moe_ffn"}))["recompute"]
    by_name = {op.name: op.forward_s for op in cost.ops}
    assert experts == pytest.approx(
        sum(
            by_name[n]
            for n in ("moe_sync", "permute", "expert_fc1", "expert_activation", "expert_fc2")
        )
    )


def test_each_routed_expert_layer_pays_its_fixed_overhead() -> None:
    """``moe_layer_overhead_us`` adds the same time to every MoE layer's forward and
    backward (and to its recompute when the experts are recomputed); dense layers pay none."""
    layout = Layout(dp=4, ep=4, num_microbatches=2)
    ctx, other = make_ctx(layout, moe_model()), make_ctx(layout, moe_model())  # own caches
    base = NdplanCostModel(Calibration(default=DeviceEfficiency(moe_layer_overhead_us=0.0)))
    slow = NdplanCostModel(Calibration(default=DeviceEfficiency(moe_layer_overhead_us=500.0)))
    for recompute in (None, frozenset({"moe_ffn"})):
        a = base.layer_seconds(ctx, layout, MOE, recompute)
        b = slow.layer_seconds(other, layout, MOE, recompute)
        assert b["forward"] - a["forward"] == pytest.approx(500e-6)
        assert b["backward"] - a["backward"] == pytest.approx(500e-6)
        assert b["recompute"] - a["recompute"] == pytest.approx(500e-6)
    assert slow.layer_seconds(other, layout, DENSE, None) == base.layer_seconds(
        ctx, layout, DENSE, None
    )


def test_the_fused_grouped_mlp_fills_the_device_as_one_gemm_of_every_local_expert() -> None:
    """Transformer Engine's fused grouped MLP runs the routed experts' fc1 and fc2 each as
    one persistent kernel over every local expert: a dense GEMM the size of all their
    work, at the dense GEMM's knee and fraction of peak, where the unfused path runs one
    GEMM per expert at the grouped knee and the grouped fraction. So at a fixed token
    count the experts' time no longer depends on how many experts a rank holds (EP), it
    is below the unfused time (at one local expert too: the same GEMM at the dense
    fraction), and the layer pays no host synchronisation (the expert buffers are sized
    statically)."""
    b200 = DEVICES["b200"]
    fit = {"gemm_mxfp8": 0.5, "grouped_gemm_low_precision_ratio": 0.6, "hbm": 0.75}
    fit |= {"gemm_half_gflop": 5.0, "grouped_gemm_half_gflop": 35.0}
    fit |= {"moe_layer_overhead_us": 200.0}
    cm = NdplanCostModel(Calibration(default=DeviceEfficiency(**fit)))

    def experts(ep: int, fused: bool | None) -> dict[str, float]:
        layout = Layout(dp=16, ep=ep, num_microbatches=1)
        ctx = make_ctx(
            layout, moe_model(), device=b200, precision="mxfp8", moe_fused_grouped_mlp=fused
        )
        return {op.name: op.forward_s for op in cm.layer_cost(ctx, layout, MOE).ops}

    fused = {ep: experts(ep, True) for ep in (2, 4, 8, 16)}
    unfused = {ep: experts(ep, None) for ep in (2, 4, 8, 16)}
    for ep in fused:
        assert "moe_sync" not in fused[ep]
        assert unfused[ep]["moe_sync"] == pytest.approx(200e-6)
        for name in ("expert_fc1", "expert_fc2"):
            assert fused[ep][name] == pytest.approx(fused[2][name], rel=1e-9)
            assert fused[ep][name] < unfused[ep][name]
        # Nothing else of the layer moves.
        moved = ("moe_sync", "expert_fc1", "expert_fc2")
        rest = {k: v for k, v in unfused[ep].items() if k not in moved}
        assert rest == {k: v for k, v in fused[ep].items() if k in rest}
    # The unfused path's per-expert knee makes bigger EP (bigger GEMMs per expert) faster.
    assert unfused[16]["expert_fc1"] < unfused[2]["expert_fc1"]
    # One dense GEMM of the rank's whole routed work (the dense knee and fraction), where
    # the unfused path runs a GEMM per local expert at the grouped knee and fraction; both
    # quantise the same inputs.
    layout = Layout(dp=16, ep=4, num_microbatches=1)
    ctx = make_ctx(layout, moe_model(), device=b200, precision="mxfp8")
    copies, local = 4096 * MOE.ffn.top_k, 16 // 4
    whole = cm._gemm_s(ctx, copies, 2048, 2 * 1024)
    per_expert = cm._gemm_s(ctx, copies / local, 2048, 2 * 1024, local, grouped=True, routed=True)
    cast = unfused[4]["expert_fc1"] - per_expert
    assert cast > 0
    assert fused[4]["expert_fc1"] == pytest.approx(whole + cast, rel=1e-9)
    # At one local expert the two paths run the same GEMM, at the two fractions of peak.
    dense_over_grouped = 1 / fit["grouped_gemm_low_precision_ratio"]
    one = copies / 16
    assert cm._gemm_s(ctx, one, 2048, 2 * 1024, grouped=False) == pytest.approx(
        cm._gemm_s(ctx, one, 2048, 2 * 1024, fused=True, routed=True), rel=1e-12
    )
    assert cm._gemm_s(ctx, one, 2048, 2 * 1024, routed=True) == pytest.approx(
        dense_over_grouped * cm._gemm_s(ctx, one, 2048, 2 * 1024), rel=1e-12
    )


# ----------------------------------------------------------------------------- monotone step
# Cases that broke "no stage getting slower (or device getting slower) makes the step
# faster" under the earlier composition; they hold now.


def _price(layout: Layout, device, ov: Overlap, seq: int = 1024, model: ModelSpec | None = None):
    ctx = make_ctx(layout, model, device=device, seq=seq)
    cm = NdplanCostModel(Calibration(overlap={"default": ov}, step_overhead_s=0.0))
    return Pricer(ctx, NdplanMemoryModel(), cm, DefaultKnapsackSolver()).price(layout), ctx, cm


def faster_peak(device, factor: float = 2.0):
    return device.model_copy(
        update={"peak_tflops": {k: factor * v for k, v in device.peak_tflops.items()}}
    )


@pytest.mark.parametrize("zero", [1, 3])
def test_faster_peak_with_cp_and_dp_overlap_is_not_slower(zero: int) -> None:
    """Attention time that hides the CP ring is not counted again for the DP traffic: when
    the traffic is exposed at full overlap, the step is the raw traffic whatever the peak."""
    layout = Layout(cp=2, dp=8, zero=zero, num_microbatches=1)
    ov = Overlap(cp=1.0, dp=1.0, fsdp=1.0)
    steps = []
    for device in (faster_peak(H100), H100):
        priced, ctx, cm = _price(layout, device, ov)
        ((gather, scatter),) = (volumes if zero == 1 else fsdp_volumes)(cm, ctx, layout)
        cost = cm.layer_cost(ctx, layout, DENSE)
        ring = 8 * (cost.cp_forward_s + cost.cp_backward_s)
        traffic = gather + scatter if zero == 1 else 2 * gather + scatter
        time = priced.time
        assert time.parts["dp_comm"] > 0
        assert time.step_s == pytest.approx(traffic + ring + time.parts["optimizer"], rel=1e-12)
        steps.append(time.step_s)
    assert steps[0] <= steps[1] * (1 + 1e-12)


def test_a_faster_critical_stage_does_not_switch_the_dp_stage() -> None:
    """The per-step DP traffic and the optimizer are the busiest stage's (stage 1: seven
    layers and the head) whichever stage is slowest: speeding up the slowest stage saves
    exactly its pipeline time."""
    layout = Layout(pp=2, dp=8, zero=0, num_microbatches=4, layers_per_stage=(1, 7))
    ctx = make_ctx(layout)
    cm = overlap_model(dp=0.0)
    stages = ctx.placement(layout)
    b = stage_secs(forward=1.0)
    before = cm.step(ctx, layout, stages, [stage_secs(forward=1.2), dict(b)])
    after = cm.step(ctx, layout, stages, [stage_secs(forward=1.199), dict(b)])
    for name in ("dp_comm", "optimizer"):
        assert after.parts[name] == before.parts[name] > 0
    # 1F1B: Σ t + (m − 1)·max t, both down by 0.001.
    assert after.step_s == pytest.approx(before.step_s - 4 * 0.001, rel=1e-12)


def test_a_faster_off_critical_stage_speeds_up_the_1f1b_step() -> None:
    """1F1B: an off-critical stage weighs fully in the pipeline (Σ t + (m − 1)·max t), so
    its windows get no stretch, and the DP window it narrows (at the DP overlap ≤ 1) never
    costs more than it saves."""
    before, after, u = _off_critical_stage_twice_as_fast("1f1b")
    # Windows 4u, then 2u: 8u − 0.9 × 4u, then 8u − 0.9 × 2u.
    assert before.parts["dp_comm"] == pytest.approx(4.4 * u, rel=1e-12)
    assert after.parts["dp_comm"] == pytest.approx(6.2 * u, rel=1e-12)
    # The bubble Σ t − max t: 5u, then 3u.
    assert before.parts["bubble"] == pytest.approx(5 * u, rel=1e-9)
    assert after.parts["bubble"] == pytest.approx(3 * u, rel=1e-9)
    # Net: +1.8u of DP, −2u of bubble.
    assert after.step_s == pytest.approx(before.step_s - 0.2 * u, rel=1e-12)


def test_dualpipev_bubble_does_not_jump_when_the_slowest_stage_changes() -> None:
    """The bubble unit is the mean over all stages, not the slowest stage's."""
    layout = Layout(pp=2, schedule="dualpipev", num_microbatches=4)
    b = stage_secs(forward=1.99)  # no backward to fill the bubble with
    before = run_step(layout, [stage_secs(forward=1.0, backward=1.0), dict(b)])
    after = run_step(layout, [stage_secs(forward=0.98, backward=1.0), dict(b)])
    # Units (2 − 0.5)/2 = 0.75 (then (1.98 − 0.5)/2 = 0.74) and 1.99/2 = 0.995; the slowest
    # stage changes from a (m·max t = 8) to b (7.96).
    assert before.parts["bubble"] == pytest.approx((0.75 + 0.995) / 2, rel=1e-12)
    assert after.parts["bubble"] == pytest.approx((0.74 + 0.995) / 2, rel=1e-12)
    assert pipeline_s(before) == pytest.approx(8 + 0.8725, rel=1e-12)
    assert pipeline_s(after) == pytest.approx(7.96 + 0.8675, rel=1e-12)


# ----------------------------------------------------------------------------- fixed defects
# Cases that broke "no stage getting slower, no device getting slower, makes the step
# faster" under the earlier composition (the per-step DP windows were the critical
# stage's; DualPipeV's bubble unit was the largest over stages and counted only the
# backward as fill). They hold now; the matching hypothesis counterexamples are pinned
# as @examples in test_performance_properties.py.


def test_a_stage_overtaking_the_critical_one_does_not_speed_up_the_step() -> None:
    """Stage 1 overtakes stage 0 by a hair with a long backward: the DP window stays the
    shortest stage's (stage 0, no backward), so the all-reduce stays exposed and the step
    grows by exactly the pipeline's growth."""
    layout = Layout(pp=2, dp=8, zero=0, num_microbatches=4)
    ctx = make_ctx(layout)
    cm = overlap_model(dp=1.0)
    stages = ctx.placement(layout)
    reduce = 2 * max(s for _, s in volumes(cm, ctx, layout))  # the ZeRO-0 all-reduce
    a = stage_secs(forward=2 * reduce)  # critical; no backward to hide the all-reduce
    before = cm.step(ctx, layout, stages, [dict(a), stage_secs(backward=2 * reduce * 0.999)])
    after = cm.step(ctx, layout, stages, [dict(a), stage_secs(backward=2 * reduce * 1.001)])
    assert before.parts["forward"] == 4 * 2 * reduce  # stage 0 critical ...
    assert after.parts["backward"] == 4 * 2 * reduce * 1.001  # ... then stage 1
    assert before.parts["dp_comm"] == pytest.approx(reduce, rel=1e-12)
    assert after.parts["dp_comm"] == pytest.approx(reduce, rel=1e-12)
    # 1F1B, Σ t + (m − 1)·max t: 3.998 + 3 × 2 = 9.998, then 4.002 + 3 × 2.002 = 10.008
    # (in units of the all-reduce).
    assert pipeline_s(before) == pytest.approx(9.998 * reduce, rel=1e-12)
    assert pipeline_s(after) == pytest.approx(10.008 * reduce, rel=1e-12)
    assert after.step_s == pytest.approx(before.step_s + 0.01 * reduce, rel=1e-9)


def test_dualpipev_fsdp_faster_peak_is_not_slower() -> None:
    """DualPipeV + ZeRO-3 at full FSDP overlap: a faster device turns compute into exposed
    gathers/scatters one for one, so each stage's time stays; the backward it loses is
    exposed traffic that fills the bubble as well, and only the forward it loses shrinks
    the unit. Per stage t = 2·gather + scatter + pp_comm (Megatron, m = 1) and
    bwd + dp = 2·gather + scatter − fwd, so (t − (bwd + dp)/2)/2 =
    (gather + scatter/2 + pp_comm + fwd/2)/2."""
    layout = Layout(pp=2, dp=4, zero=3, schedule="dualpipev", num_microbatches=1)
    ov = Overlap(fsdp=1.0)
    fast, ctx, cm = _price(layout, faster_peak(H100), ov)
    slow, _, _ = _price(layout, H100, ov)
    vols = fsdp_volumes(cm, ctx, layout)
    for a, b, (gather, scatter) in zip(fast.stage_seconds, slow.stage_seconds, vols, strict=True):
        assert sum(a.values()) == pytest.approx(sum(b.values()), rel=1e-12)
        for s in (a, b):
            assert sum(s.values()) == pytest.approx(2 * gather + scatter + s["pp_comm"], rel=1e-12)
            assert sum(s.values()) - (s["backward"] + s["dp_comm"]) / 2 == pytest.approx(
                gather + scatter / 2 + s["pp_comm"] + s["forward"] / 2, rel=1e-12
            )
        assert a["forward"] < b["forward"] and a["backward"] < b["backward"]
        assert a["backward"] + a["dp_comm"] == pytest.approx(
            b["backward"] + b["dp_comm"] + (b["forward"] - a["forward"]), rel=1e-12
        )
    for p in (fast, slow):
        unit = (
            sum((sum(s.values()) - (s["backward"] + s["dp_comm"]) / 2) / 2 for s in p.stage_seconds)
            / 2
        )
        chain = cm.fill_drain_sends_s(ctx, layout, p.stage_seconds[0].pipeline_send)
        # (pp − 1) × mean, plus the sends on the fill and drain chain
        assert p.time.parts["bubble"] == pytest.approx(unit + chain, rel=1e-12)
    # The bubble falls by (pp − 1) × the mean of Δforward/4: Σ Δforward/8.
    pairs = zip(fast.stage_seconds, slow.stage_seconds, strict=True)
    shorter = sum(b["forward"] - a["forward"] for a, b in pairs) / 8
    assert fast.time.parts["bubble"] == pytest.approx(slow.time.parts["bubble"] - shorter, rel=1e-9)
    assert fast.time.step_s < slow.time.step_s  # 9.494 → 9.384 ms


def test_faster_peak_switches_the_critical_stage_without_slowing_the_step() -> None:
    """A higher peak speeds up the compute-heavy head stage (218 → 165 µs backward) until
    the TP-heavy embedding stage (128 µs backward) is the critical one. The DP windows
    are the shortest stage's either way (the embedding stage's), so the exposed traffic
    grows only by what that stage's compute shrinks, and the step gets faster."""
    model = dense_model(2)
    layout = Layout(pp=2, tp=8, dp=2, zero=1, num_microbatches=1)
    results = [
        _price(layout, device, Overlap(dp=1.0), model=model) for device in (faster_peak(H100), H100)
    ]
    (fast, ctx, cm), (slow, _, _) = results
    gather, scatter = (max(v[i] for v in volumes(cm, ctx, layout)) for i in (0, 1))
    for p, _, _ in results:
        secs = p.stage_seconds
        window_bwd = min(s["backward"] for s in secs)
        window_fwd = min(s["forward"] for s in secs)
        assert window_bwd == secs[0]["backward"] and window_fwd == secs[0]["forward"]
        assert p.time.parts["dp_comm"] == pytest.approx(
            (scatter - window_bwd) + (gather - window_fwd), rel=1e-12
        )
    totals = [[sum(s.values()) for s in p.stage_seconds] for p, _, _ in results]
    assert totals[0][0] > totals[0][1] and totals[1][1] > totals[1][0]  # the switch
    assert fast.time.parts["dp_comm"] > slow.time.parts["dp_comm"]
    assert fast.time.step_s < slow.time.step_s  # 2.310 → 2.231 ms


# ----------------------------------------------------------------------------- off-critical stages
# "No stage (or device) getting faster makes the step slower" with interleaved and V
# schedules. Their pipelines weigh an off-critical stage 1/vpp (interleaved) or
# (pp − 1)/pp × (Δt − Δbwd/2)/2 (DualPipeV's bubble), less than fully; its DP windows are
# stretched by the rest of its wait for the critical stage, so a faster off-critical stage
# widens them by at least as much as its own compute narrows them beyond what the pipeline
# saves. Before the stretch both cases below were slower after the speed-up (+0.8·u and
# +1.625·a); they are kept as regressions.


def _off_critical_stage_twice_as_fast(schedule: str = "interleaved"):
    """ZeRO-0 at DP overlap 0.9, in units u of an eighth of the all-reduce: stage 0 is
    critical (forward 2u, backward 4u); stage 1 has the same 4u backward (the window),
    then gets faster: backward 2u. Interleaved with vpp = 2, or 1F1B."""
    vpp = 2 if schedule == "interleaved" else 1
    layout = Layout(pp=2, vpp=vpp, schedule=schedule, dp=8, zero=0, num_microbatches=4)
    ctx = make_ctx(layout)
    cm = overlap_model(dp=0.9)
    stages = ctx.placement(layout)
    reduce = 2 * max(s for _, s in volumes(cm, ctx, layout))  # the ZeRO-0 all-reduce
    u = reduce / 8
    a = stage_secs(forward=2 * u, backward=4 * u)  # the slowest stage, t = 6u
    before = cm.step(ctx, layout, stages, [dict(a), stage_secs(forward=u, backward=4 * u)])
    after = cm.step(ctx, layout, stages, [dict(a), stage_secs(forward=u, backward=2 * u)])
    return before, after, u


def test_a_faster_off_critical_interleaved_stage_widens_its_window_by_its_wait() -> None:
    """By hand: the off-critical stage's windows grow by (1 − 1/vpp) × (t_max − t_s)."""
    before, after, u = _off_critical_stage_twice_as_fast()
    # Backward windows min(4u, 4u + ½(6u − 5u)), then min(4u, 2u + ½(6u − 3u)) = 3.5u:
    # 8u − 0.9 × 4u, then 8u − 0.9 × 3.5u (ZeRO-0 gathers nothing under the forward).
    assert before.parts["dp_comm"] == pytest.approx(4.4 * u, rel=1e-12)
    assert after.parts["dp_comm"] == pytest.approx(4.85 * u, rel=1e-12)
    # m·max + (Σ − max)/v: the bubble 5u/2, then 3u/2.
    assert before.parts["bubble"] == pytest.approx(2.5 * u, rel=1e-9)
    assert after.parts["bubble"] == pytest.approx(1.5 * u, rel=1e-9)
    # Net: +0.45u of DP, −u of bubble.
    assert after.step_s == pytest.approx(before.step_s - 0.55 * u, rel=1e-12)


def _dualpipev_cp_stage_twice_as_fast():
    """Stage 1 on a device twice as fast: forward 2a → a and backward 5a → 2.5a, its CP
    ring (a forward, 2.5a backward transfer) hidden behind a and 2.5a of that compute,
    then only behind 0.5a and 1.25a, the rest (1.75a) exposed. Stage 0 (forward g,
    backward s, the DP volumes) is critical and its windows are the longer."""
    layout = Layout(pp=2, dp=8, zero=1, schedule="dualpipev", num_microbatches=1)
    ctx = make_ctx(layout)
    cm = overlap_model(dp=1.0)
    stages = ctx.placement(layout)
    vols = volumes(cm, ctx, layout)
    gather, scatter = max(v[0] for v in vols), max(v[1] for v in vols)
    a = 0.1 * gather
    critical = stage_secs(forward=gather, backward=scatter)
    slow = StageSeconds(
        stage_secs(forward=2 * a, backward=5 * a), hidden_forward=a, hidden_backward=2.5 * a
    )
    fast = StageSeconds(
        stage_secs(forward=a, backward=2.5 * a, cp_comm=1.75 * a),
        hidden_forward=0.5 * a,
        hidden_backward=1.25 * a,
    )
    before = cm.step(ctx, layout, stages, [dict(critical), slow])
    after = cm.step(ctx, layout, stages, [dict(critical), fast])
    return before, after, gather, scatter, a


def test_dualpipev_cp_stage_speedup_keeps_its_dp_hidden() -> None:
    """By hand: the off-critical V stage's windows grow by all its wait for stage 0, so
    the speed-up (and the ring traffic it uncovers) exposes no DP and the bubble shrinks."""
    before, after, gather, scatter, a = _dualpipev_cp_stage_twice_as_fast()
    assert max(7 * a, 5.25 * a) < gather + scatter  # stage 0 stays critical
    # Windows: stage 0's (s, g) are the shorter both times — stage 1's backward
    # 5a − 2.5a + (g + s − 7a), then 2.5a − 1.25a + (g + s − 5.25a), both above s (g = 10a);
    # its forward 2a − a + (g + s − 7a), then a − 0.5a + (g + s − 5.25a), both above g.
    assert before.parts["dp_comm"] == pytest.approx(0.0, abs=1e-12 * before.step_s)
    assert after.parts["dp_comm"] == pytest.approx(0.0, abs=1e-12 * after.step_s)
    # Bubble: the mean of stage 0's (g + s − s/2)/2 and stage 1's (7a − 2.5a)/2, then
    # (5.25a − 1.25a)/2.
    unit0 = (gather + scatter / 2) / 2
    assert before.parts["bubble"] == pytest.approx((unit0 + 2.25 * a) / 2, rel=1e-12)
    assert after.parts["bubble"] == pytest.approx((unit0 + 2.0 * a) / 2, rel=1e-12)
    assert after.step_s - before.step_s == pytest.approx(-0.125 * a, rel=1e-6)


def test_interleaved_faster_off_critical_stage_is_not_slower() -> None:
    before, after, _ = _off_critical_stage_twice_as_fast()
    assert after.step_s <= before.step_s


def test_dualpipev_faster_cp_stage_is_not_slower() -> None:
    before, after, _, _, _ = _dualpipev_cp_stage_twice_as_fast()
    assert after.step_s <= before.step_s


def test_torchtitan_per_op_policy_recomputes_k_out_and_up_projections() -> None:
    """torchtitan's per-op policy re-runs the layer's even matmuls (k, the output and the
    FFN up projection) with the norms, RoPE, the first residual add and the activation;
    the attention kernel and the odd matmuls are saved. Priced from the same ops as
    Megatron's fused layer: splitting the fused projections changes no forward time."""
    cm = NdplanCostModel(NO_OVERHEAD)
    layout = Layout(dp=8, zero=3, num_microbatches=1)
    titan = make_ctx(layout, framework="torchtitan")
    megatron = make_ctx(layout, framework="megatron")
    fused = {op.name: op.forward_s for op in cm.layer_cost(megatron, layout, DENSE).ops}
    split = cm.layer_cost(titan, layout, DENSE)
    q, kv = 16 * 128, 4 * 128
    expected = (
        fused["qkv_proj"] * kv / (q + 2 * kv)
        + fused["out_proj"]
        + fused["fc1"] / 2
        + fused["norms"]
        + fused["rope"]
        + fused["residual_adds"] / 2
        + fused["activation"]
    )
    seconds = cm.layer_seconds(titan, layout, DENSE, frozenset({"op"}))
    assert seconds["recompute"] == pytest.approx(expected, rel=1e-12)
    assert sum(op.forward_s for op in split.ops if op.name != "core_attention") == pytest.approx(
        sum(s for name, s in fused.items() if name != "core_attention"), rel=1e-12
    )
    n, h = 4096, 2048
    assert cm.recompute_flops(titan, layout, DENSE, frozenset({"op"})) == pytest.approx(
        2 * n * h * (kv + q + 8192), rel=1e-12
    )
    # torchtitan offers keep, the per-op policy, or the whole layer
    assert applicable_switches(titan, layout, DENSE) == ("op",)


def test_megatron_recomputes_a_dense_ffn_whole_and_only_routed_experts_activation() -> None:
    """Megatron-Core's --recompute-modules have no dense activation switch: moe_act reaches
    the routed experts alone, and a dense FFN is recomputed whole (its ``mlp`` module), with
    its two projections, the activation and the block's collectives (half the layer's
    forward ones). MindFormers' select_recompute reaches a dense activation, and has no
    ``mlp``."""
    layout = Layout(tp=2, sp=True, dp=4, mbs=1, num_microbatches=1)
    megatron = make_ctx(layout, moe_model(), framework="megatron")
    assert applicable_switches(megatron, layout, DENSE) == ("core_attn", "norm", "mlp")
    assert applicable_switches(megatron, layout, MOE) == ("core_attn", "norm", "act", "moe_ffn")
    mindformers = make_ctx(layout, moe_model(), framework="mindformers")
    assert applicable_switches(mindformers, layout, DENSE) == (
        "core_attn", "norm", "act", "sp_gather",
    )  # fmt: skip

    cm = NdplanCostModel(NO_OVERHEAD)
    cost = cm.layer_cost(megatron, layout, DENSE)
    forward = {op.name: op.forward_s for op in cost.ops}
    plain = cm.layer_seconds(megatron, layout, DENSE, frozenset())
    whole_ffn = cm.layer_seconds(megatron, layout, DENSE, frozenset({"mlp"}))
    assert whole_ffn["recompute"] == pytest.approx(
        forward["fc1"] + forward["activation"] + forward["fc2"], rel=1e-12
    )
    exposed = 1 - cm.tp_overlap(megatron, layout)
    assert exposed > 0
    assert whole_ffn["tp_comm"] - plain["tp_comm"] == pytest.approx(
        cost.tp_forward_s / 2 * exposed, rel=1e-12
    )
    n, h, width = 4096, 2048, 8192 / 2
    assert cm.recompute_flops(megatron, layout, DENSE, frozenset({"mlp"})) == pytest.approx(
        2 * n * h * 3 * width, rel=1e-12
    )  # fc1 (gate and up) and fc2


class WithoutModelFlops(NdplanCostModel):
    """A third-party cost model that prices time but does not count model FLOPs."""

    model_flops_per_step = None


def test_mfu_counts_the_mtp_module_whichever_cost_model_prices_the_step() -> None:
    """Without the cost model's own count, the pricer's MFU falls back to the same
    model FLOPs: decoder, logits and the MTP module, 3 × forward."""
    model = Planner().model("deepseek-v3")
    assert model.num_mtp_layers
    layout = Layout(dp=2, num_microbatches=2)
    ctx = make_ctx(layout, model, seq=1024)
    ours = NdplanCostModel(Calibration())
    theirs = Pricer(
        ctx, NdplanMemoryModel(), WithoutModelFlops(Calibration()), DefaultKnapsackSolver()
    )
    f = count_flops(model, 1024)
    by_hand = 2 * 2 * 1024 * 3 * (f.forward_flops_per_token + f.mtp_forward_flops_per_token)
    assert theirs.model_flops_per_step() == pytest.approx(by_hand, rel=1e-12)
    assert ours.model_flops_per_step(ctx) == pytest.approx(by_hand, rel=1e-12)


def test_lora_hardware_flops_leave_out_the_weight_gradients() -> None:
    """HFU counts what runs: LoRA's backward skips the weight-gradient GEMMs, a third of
    every weight GEMM's model FLOPs; core attention (no weights) runs its full backward."""
    from ndplan.core.counting import count_flops
    from ndplan.core.job import Job
    from ndplan.planner import Planner

    planner = Planner()
    model, device = planner.model("llama-3-8b"), planner.device("h100")
    layout = Layout(dp=8, mbs=1, num_microbatches=2, zero=1, recompute="none")
    plans = {}
    for finetune in ("full", "lora"):
        job = Job(global_batch_size=16, seq_length=4096, finetune=finetune)
        ctx = planner.context(model, device, 8, job)
        plans[finetune] = (ctx, planner.estimate(ctx, layout))
    ctx, full = plans["full"]
    assert full.hfu == pytest.approx(full.mfu, rel=1e-12)  # nothing recomputed
    ctx, lora = plans["lora"]
    f = count_flops(model, 4096)
    weight_share = (f.forward_flops_per_token - f.forward_parts["core_attention"]) / (
        f.training_flops_per_token
    )
    assert lora.hfu == pytest.approx(lora.mfu * (1 - weight_share), rel=1e-9)
    assert lora.time.parts["optimizer"] == 0.0


def test_a_placement_order_keeps_a_layers_groups_innermost() -> None:
    """A layer's costs are memoised on the degrees that shard it, not dp or pp, so its TP
    and CP groups must sit innermost: an order that puts dp or pp inside them (where the
    CP group's links would change with dp) is refused; dp and pp may swap."""
    for order in (("tp", "dp", "cp", "pp"), ("cp", "tp", "dp", "pp"), ("tp", "cp", "dp")):
        with pytest.raises(ValueError, match="place tp innermost, then cp"):
            NdplanCostModel(order=order)
    model = NdplanCostModel(order=("tp", "cp", "pp", "dp"))
    small, large = (
        Layout(dp=dp, tp=4, cp=2, mbs=1, num_microbatches=8) for dp in (2, 16)
    )  # 16 and 128 devices: the second spans H100 nodes with its dp
    links = [model.links(make_ctx(lay), lay) for lay in (small, large)]
    assert (links[0].tp, links[0].cp) == (links[1].tp, links[1].cp)
    assert links[0].dp != links[1].dp
