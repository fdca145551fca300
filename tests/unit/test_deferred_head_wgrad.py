"""Megatron's deferred output-layer weight gradient (--defer-embedding-wgrad-compute).

The last pipeline stage skips the logits GEMM's weight gradient for up to
``wgrad_deferral_limit`` micro-batches, buffers their inputs and logit gradients, and
runs those GEMMs once its last backward is done, while the stages before it drain.
"""

from __future__ import annotations

import pytest

from ndplan.core.calibration import Calibration
from ndplan.core.cluster import Cluster
from ndplan.core.context import PricingContext
from ndplan.core.job import Job
from ndplan.core.kernels.knapsack import DefaultKnapsackSolver
from ndplan.core.layout import Layout
from ndplan.core.memory import NdplanMemoryModel
from ndplan.core.model import DenseFFN, LayerKind, ModelSpec, StandardAttention
from ndplan.core.performance import LAYER_PARTS, NdplanCostModel, StageSeconds
from ndplan.core.pricing import Pricer
from ndplan.planner import Planner

NO_OVERHEAD = Calibration(step_overhead_s=0.0)
KIND = LayerKind(
    name="dense",
    attention=StandardAttention(num_heads=16, num_kv_heads=4, head_dim=128),
    ffn=DenseFFN(intermediate_size=8192),
)
MODEL = ModelSpec(name="dense", hidden_size=2048, vocab_size=32000, kinds=(KIND,), layers=(0,) * 8)
H100 = Planner().device("h100")


def make_ctx(layout: Layout, **job) -> PricingContext:
    return PricingContext(
        model=MODEL,
        cluster=Cluster(device=H100, num_devices=layout.devices),
        job=Job(
            global_batch_size=layout.dp * layout.mbs * layout.num_microbatches,
            seq_length=4096,
            **job,
        ),
    )


def priced(layout: Layout, **job):
    ctx = make_ctx(layout, **job)
    cm = NdplanCostModel(NO_OVERHEAD)
    return ctx, cm, Pricer(ctx, NdplanMemoryModel(), cm, DefaultKnapsackSolver()).price(layout)


PP4 = Layout(pp=4, num_microbatches=8)


@pytest.mark.parametrize(("limit", "deferred"), [(0, 8), (3, 3), (22, 8)])
def test_deferred_micro_batches_follow_the_limit(limit: int, deferred: int) -> None:
    ctx = make_ctx(PP4, defer_embedding_wgrad=True, wgrad_deferral_limit=limit)
    assert ctx.deferred_head_wgrads(PP4) == deferred
    assert make_ctx(PP4, defer_embedding_wgrad=False).deferred_head_wgrads(PP4) == 0
    assert make_ctx(PP4).deferred_head_wgrads(PP4) == 0  # off unless stated, as in Megatron


@pytest.mark.parametrize(
    ("layout", "job"),
    [
        (Layout(dp=4, num_microbatches=8), {}),  # no pipeline, no drain
        (Layout(pp=4, num_microbatches=8, schedule="gpipe"), {}),
        (Layout(pp=2, num_microbatches=8, schedule="dualpipev"), {}),
        (PP4, {"finetune": "lora"}),  # a frozen output layer has no weight gradient
    ],
)
def test_no_deferral_where_the_option_does_not_apply(layout: Layout, job: dict) -> None:
    ctx = make_ctx(layout, defer_embedding_wgrad=True, **job)
    assert ctx.deferred_head_wgrads(layout) == 0
    # Nor is the setting assumed where nothing reads it.
    assert not any("wgrad" in a.field for a in ctx.recorder.items)


@pytest.mark.parametrize("limit", [0, 3])
def test_the_head_stage_backward_sheds_the_deferred_weight_gradients(limit: int) -> None:
    """Per micro-batch, the head stage's backward loses deferred/m of one logits GEMM;
    its forward and every other stage keep their seconds."""
    ctx_on, cm, on = priced(PP4, defer_embedding_wgrad=True, wgrad_deferral_limit=limit)
    _, _, off = priced(PP4, defer_embedding_wgrad=False)
    share = ctx_on.deferred_head_wgrads(PP4) / PP4.num_microbatches
    logits = cm.head_logits_s(ctx_on, PP4)
    for stage, a, b in zip(on.stages, on.stage_seconds, off.stage_seconds, strict=True):
        assert a["forward"] == pytest.approx(b["forward"], rel=1e-12)
        if stage.has_head:
            assert b["backward"] - a["backward"] == pytest.approx(share * logits, rel=1e-9)
            assert a.deferred_wgrad == pytest.approx(share * PP4.num_microbatches * logits)
        else:
            assert a["backward"] == pytest.approx(b["backward"], rel=1e-12)
            assert a.deferred_wgrad == 0.0


def test_the_logits_gemm_is_the_output_layers_shape_in_bf16() -> None:
    layout = Layout(tp=2, pp=4, sp=True, mbs=2, num_microbatches=8)
    ctx = make_ctx(layout, precision="fp8")
    cm = NdplanCostModel(NO_OVERHEAD)
    # 2 × 4096 tokens by hidden 2048 by 32000 / 2 vocabulary columns, not quantised.
    expected = cm._gemm_s(ctx, 8192, 2048, 16000, low_precision=False)
    assert cm.head_logits_s(ctx, layout) == pytest.approx(expected, rel=1e-12)


def secs(backward: float, deferred: float = 0.0) -> StageSeconds:
    parts = dict.fromkeys((*LAYER_PARTS, "pp_comm", "dp_comm"), 0.0)
    parts.update(forward=1.0, backward=backward, tp_comm=0.25, pp_comm=0.25)
    return StageSeconds(parts, deferred_wgrad=deferred)


@pytest.mark.parametrize(
    ("schedule", "vpp", "deferred", "exposed"),
    [
        # The drain is 3 backward phases of 2 s plus 0.5 s of exposed communication.
        ("1f1b", 1, 7.0, 0.0),  # 7.5 s hides 7 s
        ("1f1b", 1, 9.0, 1.5),
        ("interleaved", 2, 5.0, 1.25),  # one chunk's backward phase per stage: 3.75 s
    ],
)
def test_what_outlasts_the_drain_is_exposed(
    schedule: str, vpp: int, deferred: float, exposed: float
) -> None:
    layout = Layout(pp=4, vpp=vpp, schedule=schedule, num_microbatches=8)
    ctx = make_ctx(layout)
    cm = NdplanCostModel(NO_OVERHEAD)
    stages = ctx.placement(layout)
    plain = [secs(2.0) for _ in stages]
    with_deferral = [secs(2.0, deferred if s.has_head else 0.0) for s in stages]
    base = cm.step(ctx, layout, stages, plain)
    time = cm.step(ctx, layout, stages, with_deferral)
    assert time.parts["bubble"] - base.parts["bubble"] == pytest.approx(exposed, abs=1e-12)


def test_more_recompute_elsewhere_never_speeds_the_step_through_the_window() -> None:
    """A longer backward on another stage widens the window but lengthens the bubble by
    at least as much; recompute that hides as much exposed communication (Megatron-FSDP's
    gathers) leaves the stage, the window and the step as they were."""
    layout = Layout(pp=4, num_microbatches=8)
    ctx = make_ctx(layout)
    cm = NdplanCostModel(NO_OVERHEAD)
    stages = ctx.placement(layout)
    steps, hidden = [], []
    for extra in (0.0, 0.5, 1.0, 3.0):
        stage_secs = [secs(2.0, 12.0 if s.has_head else 0.0) for s in stages]
        stage_secs[0]["recompute"] = extra
        steps.append(cm.step(ctx, layout, stages, stage_secs).step_s)
        stage_secs[0]["dp_comm"] = 3.0 - extra  # the gathers the recompute hides
        hidden.append(cm.step(ctx, layout, stages, stage_secs).step_s)
    assert steps == sorted(steps) and steps[0] < steps[-1]
    assert hidden == pytest.approx([hidden[0]] * 4, rel=1e-12)


@pytest.mark.parametrize("limit", [0, 3])
def test_the_head_stage_buffers_each_deferred_input_and_logit_gradient(limit: int) -> None:
    """d × (its SP-sharded input, n·h/tp, and its logit gradient, n·vocab/tp) in bf16."""
    layout = Layout(tp=2, pp=4, sp=True, num_microbatches=8)
    ctx = make_ctx(layout, defer_embedding_wgrad=True, wgrad_deferral_limit=limit)
    mm = NdplanMemoryModel()
    d = ctx.deferred_head_wgrads(layout)
    n = 4096
    for stage in ctx.placement(layout):
        parts = mm.stage_static_bytes(ctx, layout, stage)
        if stage.has_head:
            expected = d * 2 * (n * 2048 / 2 + n * 32000 / 2)
            assert parts["deferred_wgrad_buffers"] == pytest.approx(expected, abs=1)
        else:
            assert "deferred_wgrad_buffers" not in parts
    off = make_ctx(layout, defer_embedding_wgrad=False)
    head = ctx.placement(layout)[-1]
    assert "deferred_wgrad_buffers" not in mm.stage_static_bytes(off, layout, head)
