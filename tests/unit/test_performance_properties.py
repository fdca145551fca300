"""Invariants of the step-time model on random dense/MoE shapes, layouts and devices.

On every case: the parts are non-negative and sum exactly to the step; the step's
``dp_comm`` is m × the critical stage's ZeRO-3/FSDP part plus the per-step exposed DP
communication (none under ZeRO-3), hidden under the shortest stage's whole backward
(recompute left out) and forward, each less the compute hiding the CP ring and, for an
off-critical interleaved or V stage, plus the share of its wait for the critical stage
the pipeline does not charge it; DualPipeV's bubble is (pp − 1) × the mean over stages of
max(0, t_s − (bwd_s + dp_comm_s)/2)/2. No recompute choice is faster than none: random
per-layer options, priced through ``stage_seconds`` and ``step``, never beat all-none
(the search's bound); full recompute is never faster than none. More micro-batches of
the same size leave the bubble unchanged (or smaller, where a once-per-step ZeRO-3
scatter spreads), so its share of the step falls.

Monotonicity (every stage, the pipeline and the whole step): more scale-up, scale-out or
HBM bandwidth, or a higher peak, never makes any of them slower, on even and uneven splits
on every schedule; a stage getting slower never makes the step faster, also when it
becomes the critical stage. Layouts split their layers evenly or, in half of the
pipelined cases, unevenly (down to chunks without layers). Counterexamples hypothesis
found under earlier compositions are pinned with ``@example`` as regressions.

One known defect, a strict xfail pinned with ``@example``: DualPipeV + ZeRO-3 + ring CP —
a higher peak uncovering ring traffic can shrink the bubble's fill (backward + exposed
FSDP traffic) and grow the bubble, a small effect (0.28 % pinned) independent of the
per-step windows.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from ndplan.adapters.devices.catalog import builtin_devices
from ndplan.core.calibration import Calibration, Overlap
from ndplan.core.cluster import Cluster, DeviceSpec
from ndplan.core.context import PricingContext
from ndplan.core.frameworks import FRAMEWORKS
from ndplan.core.job import Job
from ndplan.core.kernels.knapsack import DefaultKnapsackSolver
from ndplan.core.layout import Layout
from ndplan.core.memory import NdplanMemoryModel
from ndplan.core.model import (
    DenseFFN,
    LatentAttention,
    LayerKind,
    ModelSpec,
    MoEFFN,
    StandardAttention,
)
from ndplan.core.performance import TIME_PARTS, NdplanCostModel, StageSeconds
from ndplan.core.plan import TimeBreakdown
from ndplan.core.pricing import PricedLayout, Pricer
from ndplan.core.recompute import applicable_switches

FAST = settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
DEVICES = tuple(builtin_devices())
REL = 1e-9


@dataclass(frozen=True)
class Case:
    model: ModelSpec
    layout: Layout
    device: DeviceSpec
    seq: int
    precision: str
    framework: str
    calibration: Calibration
    defer_wgrad: bool = False
    """Megatron's deferred output-layer weight gradient (off: the composition alone)."""


@st.composite
def kind_st(draw, name: str, h: int, heads: int, kv: int, moe: bool) -> LayerKind:
    if draw(st.integers(0, 4)) == 0:
        attention = LatentAttention(
            num_heads=heads,
            q_lora_rank=draw(st.none() | st.sampled_from([64, 256])),
            kv_lora_rank=draw(st.sampled_from([64, 256])),
            qk_nope_head_dim=draw(st.sampled_from([32, 64])),
            qk_rope_head_dim=draw(st.sampled_from([16, 32])),
            v_head_dim=draw(st.sampled_from([32, 64])),
        )
    else:
        attention = StandardAttention(
            num_heads=heads, num_kv_heads=kv, head_dim=draw(st.sampled_from([32, 64, 128]))
        )
    if moe:
        experts = draw(st.sampled_from([4, 8, 16, 32]))
        ffn = MoEFFN(
            num_experts=experts,
            top_k=draw(st.integers(1, min(4, experts))),
            expert_intermediate_size=draw(st.sampled_from([128, 256, 512, 1024])),
            shared_intermediate_size=draw(st.sampled_from([0, 0, 512, 2048])),
        )
    else:
        ffn = DenseFFN(
            intermediate_size=draw(st.sampled_from([512, 1024, 2816, 4096])),
            gated=draw(st.booleans()),
        )
    return LayerKind(name=name, attention=attention, ffn=ffn)


@st.composite
def case_st(draw, uneven: bool = True, schedules: tuple[str, ...] | None = None) -> Case:
    """A random case; with ``uneven``, half of the pipelined layouts set their own
    layers per chunk, down to chunks without layers (a stage of embedding and head).
    ``schedules`` restricts the pipeline schedule (pp > 1 unless it holds 1F1B)."""
    h = draw(st.sampled_from([256, 512, 1024, 2048]))
    kv = draw(st.sampled_from([1, 2, 4, 8]))
    heads = kv * draw(st.sampled_from([1, 2, 4]))
    is_moe = draw(st.booleans())
    kinds = [draw(kind_st("dense", h, heads, kv, False))]
    if is_moe:
        kinds.append(draw(kind_st("moe", h, heads, kv, True)))
    num_layers = draw(st.integers(2, 8))
    if is_moe:
        first_dense = draw(st.integers(0, num_layers - 1))
        layers = (0,) * first_dense + (1,) * (num_layers - first_dense)
        if first_dense == 0:
            kinds = kinds[1:]
            layers = (0,) * num_layers
    else:
        layers = (0,) * num_layers
    model = ModelSpec(
        name="random", hidden_size=h, vocab_size=draw(st.integers(1000, 60000)),
        kinds=tuple(kinds), layers=layers,
    )  # fmt: skip

    tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if heads % t == 0]))
    allowed = schedules or ("1f1b", "interleaved", "gpipe", "dualpipev")

    def schedules_for(p: int) -> list[str]:
        if p == 1:
            return ["1f1b"] if "1f1b" in allowed else []
        # DualPipeV needs two chunks per stage, interleaving at least two (vpp ≥ 2).
        return [s for s in allowed if s not in ("dualpipev", "interleaved") or 2 * p <= num_layers]

    pps = [p for p in (1, 2, 4) if p <= num_layers and schedules_for(p)]
    assume(pps)  # DualPipeV alone needs two layers per chunk
    pp = draw(st.sampled_from(pps))
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    schedule = draw(st.sampled_from(schedules_for(pp)))
    vpp = 1
    if schedule == "interleaved":
        vpp = draw(st.sampled_from([v for v in (2, 4) if pp * v <= num_layers]))
    ep, etp = 1, None
    experts = next((k.ffn.num_experts for k in kinds if isinstance(k.ffn, MoEFFN)), None)
    if experts is not None:
        etp = draw(st.sampled_from([None, 1]))
        etp_eff = tp if etp is None else etp
        group = dp * cp * tp
        ep = draw(
            st.sampled_from(
                [e for e in (1, 2, 4, 8, 16) if experts % e == 0 and group % (e * etp_eff) == 0]
            )
        )
    layout = Layout(
        tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, vpp=vpp, schedule=schedule,
        mbs=draw(st.sampled_from([1, 2])),
        # DualPipeV runs only with m ≥ 2·pp (its step asserts it), interleaved only with m a
        # multiple of pp (Megatron groups the micro-batches by pp); check_layout and the
        # search refuse the rest. A hypothesis run found a 0.016 % non-monotone step at
        # interleaved pp 2, m 1: both DP windows grew by almost the critical stage's
        # growth while the pipeline grew by it once.
        num_microbatches=(
            pp * draw(st.integers(1, 4))
            if schedule == "interleaved"
            else draw(st.integers(2 * pp if schedule == "dualpipev" else 1, 8))
        ),
        zero=draw(st.sampled_from([0, 1, 2, 3])),
        sp=draw(st.booleans()),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        offload_optimizer=draw(st.booleans()) and draw(st.booleans()),
    )  # fmt: skip
    if uneven and pp > 1 and draw(st.booleans()):
        n = layout.chunks - 1
        cuts = sorted(draw(st.lists(st.integers(0, num_layers), min_size=n, max_size=n)))
        bounds = (0, *cuts, num_layers)
        per_chunk = tuple(b - a for a, b in itertools.pairwise(bounds))
        layout = layout.model_copy(update={"layers_per_stage": per_chunk})
    device = draw(st.sampled_from(DEVICES))
    precisions = ["bf16"] + (["fp8", "mxfp8"] if device.supports("fp8") else [])
    overlap = Overlap(
        tp=draw(st.sampled_from([0.0, 0.5])),
        cp=draw(st.sampled_from([0.0, 0.7, 1.0])),
        ep=draw(st.sampled_from([0.0, 0.5])),
        pp=draw(st.sampled_from([0.0, 0.8])),
        dp=draw(st.sampled_from([0.0, 0.9, 1.0])),
        fsdp=draw(st.sampled_from([0.0, 0.8, 1.0])),
    )
    return Case(
        model=model,
        layout=layout,
        device=device,
        seq=draw(st.sampled_from([256, 1024, 4096])),
        precision=draw(st.sampled_from(precisions)),
        # torchtitan reduces gradients every micro-batch (ZeRO-2 × m, FSDP scatter per
        # micro-batch); Megatron once per step.
        framework=draw(st.sampled_from(["megatron", "torchtitan"])),
        defer_wgrad=draw(st.booleans()),
        calibration=Calibration(
            overlap={"default": overlap},
            step_overhead_s=draw(st.sampled_from([0.0, 0.05])),
            # Hidden communication still slowing the compute it hides behind.
            interference=draw(st.sampled_from([0.0, 0.0, 0.1])),
        ),
    )


def make_pricer(case: Case, device: DeviceSpec | None = None, layout: Layout | None = None):
    layout = layout or case.layout
    # Only a framework that has the deferral may be asked for it (others refuse the job).
    defer = case.defer_wgrad if FRAMEWORKS[case.framework].deferred_embedding_wgrad else None
    ctx = PricingContext(
        model=case.model,
        cluster=Cluster(device=device or case.device, num_devices=layout.devices),
        job=Job(
            global_batch_size=layout.dp * layout.mbs * layout.num_microbatches,
            seq_length=case.seq,
            precision=case.precision,
            framework=case.framework,
            defer_embedding_wgrad=defer,
            # Below some drawn micro-batch counts, above others.
            wgrad_deferral_limit=3 if defer else None,
        ),
    )
    return Pricer(
        ctx, NdplanMemoryModel(), NdplanCostModel(case.calibration), DefaultKnapsackSolver()
    )


def price(case: Case, *, device: DeviceSpec | None = None, layout: Layout | None = None):
    layout = layout or case.layout
    priced = make_pricer(case, device, layout).price(layout)
    assert priced.time is not None
    return priced


def scaled(device: DeviceSpec, up: float = 1.0, out: float = 1.0, hbm: float = 1.0) -> DeviceSpec:
    return device.model_copy(
        update={
            "scale_up": device.scale_up.model_copy(
                update={"bandwidth_gb_per_s": device.scale_up.bandwidth_gb_per_s * up}
            ),
            "scale_out": device.scale_out.model_copy(
                update={"bandwidth_gb_per_s": device.scale_out.bandwidth_gb_per_s * out}
            ),
            "hbm_bandwidth_gb_per_s": device.hbm_bandwidth_gb_per_s * hbm,
        }
    )


def faster_peak(device: DeviceSpec, factor: float) -> DeviceSpec:
    return device.model_copy(
        update={"peak_tflops": {p: v * factor for p, v in device.peak_tflops.items()}}
    )


def not_slower(fast: float, slow: float) -> bool:
    return fast <= slow * (1 + REL)


FACTOR = st.sampled_from([1.0, 1.0, 1.25, 2.0, 10.0])
PEAK = st.sampled_from([1.1, 2.0, 8.0])


def critical(seconds) -> int:
    """The slowest stage (ties to the first), whose parts the step reports m times."""
    totals = [sum(s.values()) for s in seconds]
    return max(range(len(totals)), key=lambda i: (totals[i], -i))


def per_step_dp(layout: Layout, seconds, time: TimeBreakdown) -> float:
    """The step's DP communication less the m per-micro-batch FSDP parts of the critical
    stage: what is exposed once per step (ZeRO-0/1/2 reduction and gathers)."""
    return time.parts["dp_comm"] - layout.num_microbatches * seconds[critical(seconds)]["dp_comm"]


def pipeline_s(priced: PricedLayout) -> float:
    """The step less what is paid once per step (DP communication, optimizer, overhead)."""
    time = priced.time
    p = time.parts
    once = per_step_dp(priced.layout, priced.stage_seconds, time) + p["optimizer"] + p["overhead"]
    return time.step_s - once


def fill_drain_s(case: Case, priced: PricedLayout) -> float:
    """The bubble's sends on the fill and drain chain (checked by hand in
    test_performance.py); what is left of the bubble is the stages' compute."""
    lay = priced.layout
    if lay.pp == 1:
        return 0.0
    hops = {"interleaved": lay.pp * lay.vpp - 1, "dualpipev": 2 * lay.pp - 2}.get(
        lay.schedule, lay.pp - 1
    )
    exposed = 1 - case.calibration.overlap["default"].pp
    send = priced.stage_seconds[0].pipeline_send
    assert all(s.pipeline_send == send > 0 for s in priced.stage_seconds)
    return 2 * (hops - (lay.pp - 1) * exposed) * send


def deferred_exposed_s(priced: PricedLayout) -> float:
    """The deferred output-layer weight gradients that outlast the drain (checked by hand
    in test_deferred_head_wgrad.py): the head stage's, less the backward phase (its time
    less its forward) of every other stage, one chunk's when interleaved."""
    seconds = priced.stage_seconds
    deferred = [s.deferred_wgrad for s in seconds]
    if max(deferred) == 0.0:
        return 0.0
    head = deferred.index(max(deferred))
    lay = priced.layout
    weight = 1 / lay.vpp if lay.schedule == "interleaved" else 1.0
    window = weight * sum(
        sum(s.values()) - s["forward"] for i, s in enumerate(seconds) if i != head
    )
    return max(0.0, deferred[head] - window)


# ----------------------------------------------------------------------------- structure


@FAST
@given(case_st())
def test_parts_nonnegative_and_sum_exactly_to_the_step(case: Case) -> None:
    pricer = make_pricer(case)
    layout = case.layout
    priced = pricer.price(layout)
    time = priced.time
    assert time is not None
    assert tuple(time.parts) == TIME_PARTS
    assert all(v >= 0 and math.isfinite(v) for v in time.parts.values()), time.parts
    # The step is the in-order sum of its parts, to the last bit.
    assert sum(time.parts.values()) == time.step_s
    assert time.step_s > 0
    for secs in priced.stage_seconds:
        assert isinstance(secs, StageSeconds)
        assert all(v >= 0 and math.isfinite(v) for v in secs.values()), secs
        assert secs.cp_hidden_forward >= 0.0 and secs.cp_hidden_backward >= 0.0
        if layout.cp == 1:
            assert secs.cp_hidden_forward == secs.cp_hidden_backward == 0.0
        # The FSDP part is a stage's own only under ZeRO-3.
        if layout.zero < 3:
            assert secs["dp_comm"] == 0.0
    # The DP part: m × the critical stage's FSDP part, plus the per-step exposure
    # (none under ZeRO-3, whose traffic is all per micro-batch) ...
    dp_step = per_step_dp(layout, priced.stage_seconds, time)
    assert dp_step >= -1e-12 * time.step_s
    if layout.zero >= 3:
        assert dp_step == 0.0
    # ... hidden under the shortest backward (its recompute left out) and forward of any
    # stage, less the compute hiding its CP ring; interleaved and DualPipeV stretch an
    # off-critical stage's windows by the share of its wait the pipeline does not charge it.
    seconds = priced.stage_seconds
    totals = [sum(s.values()) for s in seconds]
    slowest = max(range(len(totals)), key=lambda i: (totals[i], -i))
    share = {"interleaved": 1 - 1 / layout.vpp, "dualpipev": 1.0}.get(layout.schedule, 0.0)
    stretch = [0.0 if i == slowest else share * (totals[slowest] - t) for i, t in enumerate(totals)]
    window_bwd = min(
        s["backward"] - s.cp_hidden_backward + w for s, w in zip(seconds, stretch, strict=True)
    )
    window_fwd = min(
        s["forward"] - s.cp_hidden_forward + w for s, w in zip(seconds, stretch, strict=True)
    )
    dp, optimizer = pricer.cost.data_parallel_and_optimizer(
        pricer.ctx, layout, priced.stages, window_fwd, window_bwd
    )
    assert math.isclose(dp_step, dp, rel_tol=1e-9, abs_tol=1e-12 * time.step_s)
    assert time.parts["optimizer"] == optimizer
    # The pipeline part: the slowest stage m times, plus the bubble.
    m = layout.num_microbatches
    totals = [sum(s.values()) for s in seconds]
    p = time.parts
    assert math.isclose(pipeline_s(priced), m * max(totals) + p["bubble"], rel_tol=1e-9)
    bubble = p["bubble"] - fill_drain_s(case, priced) - deferred_exposed_s(priced)
    if not case.defer_wgrad or case.framework != "megatron":
        assert all(s.deferred_wgrad == 0.0 for s in seconds)
    if layout.pp == 1:
        # pipeline − m·t computed by subtraction: zero up to rounding.
        assert p["bubble"] <= 1e-12 * time.step_s
        assert p["pp_comm"] == 0.0
        assert all(s.pipeline_send == 0.0 for s in seconds)
    elif layout.schedule in ("1f1b", "gpipe"):
        assert math.isclose(bubble, sum(totals) - max(totals), rel_tol=1e-9, abs_tol=1e-15)
    elif layout.schedule == "interleaved":
        assert math.isclose(
            bubble, (sum(totals) - max(totals)) / layout.vpp, rel_tol=1e-9, abs_tol=1e-15
        )
    else:  # dualpipev: the mean unit, the FSDP traffic filling like the backward
        unit = (
            sum(
                max(0.0, t - (s["backward"] + s["dp_comm"]) / 2) / 2
                for t, s in zip(totals, seconds, strict=True)
            )
            / layout.pp
        )
        assert math.isclose(bubble, (layout.pp - 1) * unit, rel_tol=1e-9, abs_tol=1e-15)


# ----------------------------------------------------------------------------- monotonicity


def assert_not_slower(fast: PricedLayout, slow: PricedLayout) -> None:
    """Every stage's per-micro-batch time, the pipeline part and the whole step."""
    for a, b in zip(fast.stage_seconds, slow.stage_seconds, strict=True):
        assert not_slower(sum(a.values()), sum(b.values())), (a, b)
    assert not_slower(pipeline_s(fast), pipeline_s(slow)), (fast.time.parts, slow.time.parts)
    assert not_slower(fast.time.step_s, slow.time.step_s), (fast.time.parts, slow.time.parts)


H100 = next(d for d in DEVICES if d.id == "h100-sxm")


def dense_model(layers: int, vocab: int = 32000) -> ModelSpec:
    kind = LayerKind(
        name="dense",
        attention=StandardAttention(num_heads=16, num_kv_heads=4, head_dim=128),
        ffn=DenseFFN(intermediate_size=8192),
    )
    return ModelSpec(
        name="dense", hidden_size=2048, vocab_size=vocab, kinds=(kind,), layers=(0,) * layers
    )


def h100_case(model: ModelSpec, layout: Layout, overlap: Overlap, device=H100) -> Case:
    return Case(
        model=model, layout=layout, device=device, seq=1024, precision="bf16",
        framework="megatron", calibration=Calibration(overlap={"default": overlap}),
    )  # fmt: skip


# Counterexamples hypothesis found under the earlier composition, reduced; regressions now.
# DualPipeV + ZeRO-3 at full FSDP overlap: a faster device turns backward compute into
# exposed FSDP traffic one for one (same stage time), and the old bubble unit
# max_s(t_s − bwd_s/2)/2 counted only the backward as fill, so the bubble grew
# (peak ×2: 10.51 → 10.76 ms; with the optimizer offloaded, HBM ×2: 111.76 → 111.82 ms).
DUALPIPEV_FSDP = h100_case(
    dense_model(8),
    Layout(pp=2, dp=4, zero=3, schedule="dualpipev", num_microbatches=1),
    Overlap(fsdp=1.0),
)
DUALPIPEV_FSDP_OFFLOAD = dataclasses.replace(
    DUALPIPEV_FSDP, layout=DUALPIPEV_FSDP.layout.model_copy(update={"offload_optimizer": True})
)
# The per-step DP windows were the critical stage's: a faster device made a stage with
# less backward the critical one and less DP traffic hid (peak ×2: 2.208 → 2.231 ms;
# HBM ×4 with a 128k vocabulary: 7.983 → 8.007 ms).
CRITICAL_SWITCH_PEAK = h100_case(
    dense_model(2), Layout(pp=2, tp=8, dp=2, zero=1, num_microbatches=1), Overlap(dp=1.0)
)
CRITICAL_SWITCH_HBM = h100_case(
    dense_model(3, vocab=128000),
    Layout(pp=2, tp=8, dp=16, zero=1, num_microbatches=1),
    Overlap(dp=1.0, tp=0.5),
)


def dualpipev_zero3_ring_cp(case: Case) -> bool:
    """The region of the known DualPipeV + ZeRO-3 + ring CP defect (see below)."""
    layout = case.layout
    return layout.schedule == "dualpipev" and layout.zero >= 3 and layout.cp > 1


MONOTONE_CASES = st.one_of(case_st(uneven=False), case_st(schedules=("1f1b", "gpipe")))
"""Even splits on every schedule; uneven ones on 1F1B/GPipe (interleaved and DualPipeV with
uneven stages: their own tests below)."""
UNEVEN_V_CASES = case_st(schedules=("interleaved", "dualpipev")).filter(
    lambda c: not dualpipev_zero3_ring_cp(c)
)
"""Interleaved and DualPipeV, uneven splits included, outside the known DualPipeV + ZeRO-3 +
ring CP defect (its strict xfail below); a hypothesis run drew one (A100, cp 4, m 4) there."""


@FAST
@example(case=DUALPIPEV_FSDP_OFFLOAD, up=1.0, out=1.0, hbm=2.0)
@example(case=CRITICAL_SWITCH_HBM, up=1.0, out=1.0, hbm=4.0)
@given(MONOTONE_CASES, FACTOR, FACTOR, FACTOR)
def test_more_bandwidth_never_slower(case: Case, up: float, out: float, hbm: float) -> None:
    fast = price(case, device=scaled(case.device, up, out, hbm))
    assert_not_slower(fast, price(case))


@FAST
@example(case=DUALPIPEV_FSDP, factor=2.0)
@example(case=CRITICAL_SWITCH_PEAK, factor=2.0)
@given(MONOTONE_CASES.filter(lambda c: not dualpipev_zero3_ring_cp(c)), PEAK)
def test_higher_peak_never_slower(case: Case, factor: float) -> None:
    """Even splits on every schedule (but DualPipeV + ZeRO-3 + ring CP, the xfail below),
    uneven ones on 1F1B/GPipe."""
    fast = price(case, device=faster_peak(case.device, factor))
    assert_not_slower(fast, price(case))


def head_stage_model(heads: int = 8) -> ModelSpec:
    """Dense 4 × 256 (``heads`` × 128, 8 KV heads, FFN 1024), vocabulary 60000: a head
    heavy enough to make a layer-less stage critical."""
    return ModelSpec(
        name="dense",
        hidden_size=256,
        vocab_size=60000,
        kinds=(
            LayerKind(
                name="dense",
                attention=StandardAttention(num_heads=heads, num_kv_heads=8, head_dim=128),
                ffn=DenseFFN(intermediate_size=1024),
            ),
        ),
        layers=(0,) * 4,
    )


def head_stage_case(schedule: str, heads: int = 8, cp: int = 1) -> Case:
    """H100, ``head_stage_model(heads)``, seq 1024, pp 2, dp 16, ZeRO-1, m 1, DP overlap 1
    (and CP overlap 1): one stage holds the head (DualPipeV: and the embedding) without
    layers, the other all four layers. With 8 heads the head stage is the critical one,
    memory-bound (its logits GEMM included), and the layer stage has the DP windows; with
    32 heads the other way round."""
    model = head_stage_model(heads)
    split = {"dualpipev": (0, 2, 2, 0), "interleaved": (2, 0, 2, 0), "1f1b": (4, 0)}[schedule]
    layout = Layout(
        pp=2, vpp=2 if schedule == "interleaved" else 1, cp=cp, dp=16, zero=1,
        schedule=schedule, num_microbatches=1, layers_per_stage=split,
    )  # fmt: skip
    return Case(
        model=model, layout=layout, device=H100, seq=1024, precision="bf16",
        framework="megatron", calibration=Calibration(overlap={"default": Overlap(cp=1.0, dp=1.0)}),
    )  # fmt: skip


# Uneven interleaved and DualPipeV stages. Their pipelines weigh an off-critical stage 1/vpp
# (interleaved) or (pp − 1)/pp × (Δt − Δbwd/2)/2 (DualPipeV's bubble); before its DP
# windows were stretched by the rest of its wait for the critical stage, a faster device
# that sped up the off-critical stage with the shortest windows more than the critical one
# made the step slower. Pinned (head_stage_case), peak ×2, the memory-bound head stage
# critical and unchanged: DualPipeV 1.1913 → 1.2502 ms, interleaved vpp 2 1.0938 →
# 1.1290 ms; and head_stage_case('dualpipev', heads=32), HBM ×2: 1.2976 → 1.3879 ms.
@FAST
@example(case=head_stage_case("dualpipev"), factor=2.0)
@example(case=head_stage_case("interleaved"), factor=2.0)
@given(UNEVEN_V_CASES, PEAK)
def test_higher_peak_never_slower_with_uneven_interleaved_or_dualpipev_stages(
    case: Case, factor: float
) -> None:
    fast = price(case, device=faster_peak(case.device, factor))
    assert_not_slower(fast, price(case))


@FAST
@example(case=head_stage_case("dualpipev", heads=32), up=1.0, out=1.0, hbm=2.0)
@given(UNEVEN_V_CASES, FACTOR, FACTOR, FACTOR)
def test_more_bandwidth_never_slower_with_uneven_interleaved_or_dualpipev_stages(
    case: Case, up: float, out: float, hbm: float
) -> None:
    fast = price(case, device=scaled(case.device, up, out, hbm))
    assert_not_slower(fast, price(case))


def test_head_stage_case_on_1f1b_exposes_at_most_what_the_pipeline_saves() -> None:
    """The pinned uneven case on 1F1B: the pipeline weighs the layer stage fully, so the
    faster device's shorter windows expose at most what the pipeline saves (62.5 µs more
    DP against 76.2 µs), and the step falls by the difference."""
    case = head_stage_case("1f1b")
    slow = price(case)
    fast = price(case, device=faster_peak(H100, 2.0))
    assert_not_slower(fast, slow)
    saved = sum(slow.stage_seconds[0].values()) - sum(fast.stage_seconds[0].values())
    assert sum(fast.stage_seconds[1].values()) == sum(slow.stage_seconds[1].values())
    exposed = fast.time.parts["dp_comm"] - slow.time.parts["dp_comm"]
    assert saved == pytest.approx(76.17e-6, rel=1e-3)
    assert exposed == pytest.approx(62.46e-6, rel=1e-3)
    assert fast.time.step_s == pytest.approx(slow.time.step_s - (saved - exposed), rel=1e-9)


# The earlier uneven-DualPipeV counterexample (ring CP, the head stage critical), with DP
# windows at the (pp − 1)/(4·pp) share: peak ×2 made the step 2.1735 → 2.1798 ms. With
# the whole windows its DP traffic hides entirely (at any peak), and the step gets faster.
DUALPIPEV_CP_HEAD_STAGE = Case(
    model=head_stage_model(8),
    layout=Layout(
        pp=2, cp=2, dp=2, zero=1, schedule="dualpipev", num_microbatches=1,
        layers_per_stage=(0, 2, 2, 0),
    ),
    device=H100, seq=4096, precision="bf16", framework="megatron",
    calibration=Calibration(overlap={"default": Overlap(cp=1.0, dp=1.0)}),
)  # fmt: skip


def test_former_dualpipev_cp_head_stage_counterexample_is_not_slower() -> None:
    slow = price(DUALPIPEV_CP_HEAD_STAGE)
    fast = price(DUALPIPEV_CP_HEAD_STAGE, device=faster_peak(H100, 2.0))
    assert slow.time.parts["dp_comm"] == fast.time.parts["dp_comm"] == 0.0
    assert_not_slower(fast, slow)
    # The pinned steps, plus the fill and drain sends they did not charge then (re-pinned
    # when the ring CP merges were priced, and when the weight gradients' accumulation
    # traffic was: at 2,048 tokens a GEMM of this small model, its buffer's bytes count).
    chain = fill_drain_s(DUALPIPEV_CP_HEAD_STAGE, fast)
    assert chain == fill_drain_s(DUALPIPEV_CP_HEAD_STAGE, slow) > 0
    assert fast.time.step_s - chain == pytest.approx(1.8776e-3, rel=1e-4)
    assert slow.time.step_s - chain == pytest.approx(2.0783e-3, rel=1e-4)


# DualPipeV + ZeRO-3 + ring CP (unchanged by the per-step windows: ZeRO-3 has no per-step
# DP part). Ascend 910B, dense 4 × 1024 (32 heads × 128, 8 KV heads, plain FFN 512),
# vocabulary 1000, seq 2048, pp 2, cp 4, dp 1, ZeRO-3, m 1, CP and FSDP overlap 1. (At
# seq 4096 and cp 2 it was the counterexample until the ring's merges were priced: their
# HBM time, the same at any peak, now outweighs the ring traffic a faster device uncovers.)
DUALPIPEV_ZERO3_RING_CP = Case(
    model=ModelSpec(
        name="dense",
        hidden_size=1024,
        vocab_size=1000,
        kinds=(
            LayerKind(
                name="dense",
                attention=StandardAttention(num_heads=32, num_kv_heads=8, head_dim=128),
                ffn=DenseFFN(intermediate_size=512, gated=False),
            ),
        ),
        layers=(0,) * 4,
    ),
    layout=Layout(pp=2, cp=4, zero=3, schedule="dualpipev", num_microbatches=1),
    device=next(d for d in DEVICES if d.id == "ascend-910b"),
    seq=2048, precision="bf16", framework="megatron",
    calibration=Calibration(overlap={"default": Overlap(cp=1.0, fsdp=1.0)}),
)  # fmt: skip


@st.composite
def dualpipev_zero3_ring_cp_st(draw) -> Case:
    case = draw(case_st(schedules=("dualpipev",)))
    update = {"zero": 3, "cp": max(2, case.layout.cp)}
    return dataclasses.replace(case, layout=case.layout.model_copy(update=update))


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="DualPipeV + ZeRO-3 with ring CP, gathers exposed at full FSDP overlap: the first stage's "
    "time is 2·gather + scatter + the raw ring + sends whatever the peak. A faster device "
    "turns forward compute Δf into exposed gathers (fill: backward + dp_comm grows by Δf) "
    "but uncovers ring traffic, the hiding compute Δh it loses turned into cp_comm (not "
    "fill: backward + dp_comm falls by Δh); where Δh > Δf (the backward ring hides behind "
    "2.5× the attention) the unit (t − (bwd + dp_comm)/2)/2 grows by (Δh − Δf)/4. Pinned: "
    "DUALPIPEV_ZERO3_RING_CP, peak ×2: the stages 3219.6 and 2983.7 µs either way, the bubble "
    "1140.8 → 1167.1 µs (194.2 µs of it the fill and drain sends), the step 4.5177 → "
    "4.5440 ms (+0.58 %)",
)
@FAST
@example(case=DUALPIPEV_ZERO3_RING_CP, factor=2.0)
@given(dualpipev_zero3_ring_cp_st(), PEAK)
def test_higher_peak_never_slower_dualpipev_zero3_ring_cp(case: Case, factor: float) -> None:
    fast = price(case, device=faster_peak(case.device, factor))
    assert_not_slower(fast, price(case))


@FAST
@given(case_st())
def test_full_recompute_never_faster_than_none(case: Case) -> None:
    none = price(case, layout=case.layout.model_copy(update={"recompute": "none"}))
    full = price(case, layout=case.layout.model_copy(update={"recompute": "full"}))
    assert none.time.parts["recompute"] == 0.0
    assert all(s["recompute"] == 0.0 for s in none.stage_seconds)
    # Every stage with layers re-runs their forward (the critical stage may hold none:
    # an uneven split can leave it only embedding and head).
    for stage, secs in zip(full.stages, full.stage_seconds, strict=True):
        assert (secs["recompute"] > 0.0) == (stage.num_layers > 0)
    assert_not_slower(none, full)


def recompute_choices(pricer: Pricer, layout: Layout, kind_index: int) -> list:
    """Every per-layer option the search weighs for a kind: none, each combination of the
    framework's applicable switches, full."""
    kind = pricer.ctx.model.kinds[kind_index]
    switches = applicable_switches(pricer.ctx, layout, kind)
    subsets = [
        frozenset(c) for size in range(1, len(switches) + 1)
        for c in itertools.combinations(switches, size)
    ]  # fmt: skip
    return [frozenset(), *subsets, None]


@FAST
@given(
    case_st().flatmap(
        lambda c: st.sampled_from(["megatron", "torchtitan", "mindformers"]).map(
            lambda fw: dataclasses.replace(c, framework=fw)
        )
    ),
    st.data(),
)
def test_no_recompute_choice_is_faster_than_none(case: Case, data: st.DataObject) -> None:
    """The search's bound: every layer at its fastest option (none) is a lower bound on
    the step. Random per-layer options (sets of switches, full, none; Megatron, torchtitan
    and MindFormers, whose ``sp_gather`` re-gathers at a TP cost), priced through the cost
    model's ``stage_seconds`` and ``step``, never beat all-none: not a stage, not the
    pipeline, not the step (which is what the search screens with)."""
    pricer = make_pricer(case)
    ctx, cost = pricer.ctx, pricer.cost
    layout = case.layout.model_copy(update={"recompute": "none"})
    stages = ctx.placement(layout)
    choices = {k: recompute_choices(pricer, layout, k) for k in range(len(ctx.model.kinds))}
    plain, mixed = [], []
    for stage in stages:
        plain.append(tuple((kind, k, count, frozenset()) for kind, count, k in stage.groups))
        groups: dict[tuple, int] = {}
        for kind, count, k in stage.groups:
            for _ in range(count):
                rec = data.draw(st.sampled_from(choices[kind]))
                groups[kind, k, rec] = groups.get((kind, k, rec), 0) + 1
        mixed.append(tuple((kind, k, n, rec) for (kind, k, rec), n in groups.items()))
    none_s = [cost.stage_seconds(ctx, layout, s, a) for s, a in zip(stages, plain, strict=True)]
    any_s = [cost.stage_seconds(ctx, layout, s, a) for s, a in zip(stages, mixed, strict=True)]
    none = cost.step(ctx, layout, stages, none_s)
    chosen = cost.step(ctx, layout, stages, any_s)
    # All-none is what the search prices the bound with.
    bound = price(case, layout=layout)
    assert math.isclose(none.step_s, bound.time.step_s, rel_tol=1e-12)
    for a, b in zip(none_s, any_s, strict=True):
        assert not_slower(sum(a.values()), sum(b.values())), (a, b)
        assert a["recompute"] <= b["recompute"]
    fast = dataclasses.replace(bound, stage_seconds=tuple(none_s), time=none)
    slow = dataclasses.replace(bound, stage_seconds=tuple(any_s), time=chosen)
    assert not_slower(pipeline_s(fast), pipeline_s(slow)), (none.parts, chosen.parts)
    assert not_slower(none.step_s, chosen.step_s), (mixed, none.parts, chosen.parts)
    # The per-step DP exposure does not depend on the recompute under 1F1B/GPipe. Under
    # interleaved and V schedules it can move either way — recompute on an off-critical
    # stage fills some of the wait that stretched its windows, or makes that stage the
    # critical one and stretches the former critical stage's — but the step, asserted
    # above, never gets faster. The optimizer does not depend on it at all.
    if layout.schedule not in ("interleaved", "dualpipev"):
        assert per_step_dp(layout, none_s, none) == pytest.approx(
            per_step_dp(layout, any_s, chosen), rel=1e-9, abs=1e-15
        )
    assert none.parts["optimizer"] == chosen.parts["optimizer"]


SLOWER_PART = st.sampled_from(
    ["forward", "backward", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm"]
)
GROW = st.sampled_from([1e-3, 0.1, 0.5, 1.0, 4.0])
"""A stage's part grows by this fraction of the stage's time."""
OVERTAKE = st.sampled_from([None, None, 1e-6, 1e-3])
"""Or the stage grows to just past the slowest one (by this fraction of its time)."""


def slow_down(priced: PricedLayout, index: int, part: str, grow: float, overtake: float | None):
    seconds = list(priced.stage_seconds)
    secs = seconds[index]
    totals = [sum(s.values()) for s in seconds]
    if overtake is None:
        extra = grow * totals[index]
    else:
        extra = max(totals) - totals[index] + overtake * max(totals)
    slower = StageSeconds(
        secs, secs.cp_hidden_forward, secs.cp_hidden_backward, secs.pipeline_send,
        secs.deferred_wgrad,
    )  # fmt: skip
    slower[part] += extra
    seconds[index] = slower
    return seconds


def assert_slower_stage_not_faster(
    case: Case, which: int, part: str, grow: float, overtake: float | None
) -> None:
    pricer = make_pricer(case)
    layout = case.layout
    priced = pricer.price(layout)
    index = which % layout.pp
    seconds = slow_down(priced, index, part, grow, overtake)
    after = pricer.cost.step(pricer.ctx, layout, priced.stages, seconds)
    slower = dataclasses.replace(priced, stage_seconds=tuple(seconds), time=after)
    assert not_slower(pipeline_s(priced), pipeline_s(slower)), (
        index,
        priced.time.parts,
        after.parts,
    )
    assert not_slower(priced.time.step_s, after.step_s), (index, priced.time.parts, after.parts)


@FAST
@example(
    # Was a counterexample: on the 2×-peak H100 stage 0 (embedding, TP-heavy, 128 µs
    # backward) is critical by 1 µs over stage 1 (head, 165 µs backward); stage 1's sends
    # grow by that 1 µs and it becomes critical. With the critical stage's windows the
    # step fell 2.231 → 2.169 ms (DP 1023 → 960 µs); with the shortest stage's it grows.
    case=dataclasses.replace(CRITICAL_SWITCH_PEAK, device=faster_peak(H100, 2.0)),
    which=1, part="pp_comm", grow=1.0, overtake=1e-6,
)  # fmt: skip
@given(case_st(schedules=("1f1b", "gpipe")), st.integers(0, 3), SLOWER_PART, GROW, OVERTAKE)
def test_a_slower_stage_never_makes_the_step_faster(
    case: Case, which: int, part: str, grow: float, overtake: float | None
) -> None:
    """One stage's part grows (by a fraction of its time, or to just past the slowest
    stage, so that it becomes the critical one): neither the pipeline nor the whole step
    shrinks. 1F1B/GPipe (and no pipeline): the pipeline grows by at least the stage's
    growth, the DP windows by at most that; interleaved and DualPipeV: the test below."""
    assert_slower_stage_not_faster(case, which, part, grow, overtake)


# Former counterexamples for interleaved and DualPipeV (even splits, H100, dense 4 × 2048,
# dp 8, ZeRO-1, m 1, DP overlap 1): the stage off the critical path, whose backward is the
# shortest (the DP window), gets 10 % of its time slower in the backward. Without the
# stretch the exposed DP fell by the overlap × that and the pipeline grew by less:
# interleaved 4.979 → 4.897 ms, DualPipeV 6.003 → 5.860 ms.
INTERLEAVED_OFF_CRITICAL = h100_case(
    dense_model(4),
    Layout(pp=2, vpp=2, schedule="interleaved", dp=8, zero=1, num_microbatches=1),
    Overlap(dp=1.0),
)
DUALPIPEV_OFF_CRITICAL = h100_case(
    dense_model(4),
    Layout(pp=2, schedule="dualpipev", dp=8, zero=1, num_microbatches=1),
    Overlap(dp=1.0),
)


@FAST
@example(case=INTERLEAVED_OFF_CRITICAL, which=0, part="backward", grow=0.1, overtake=None)
@example(case=DUALPIPEV_OFF_CRITICAL, which=1, part="backward", grow=0.1, overtake=None)
@given(
    case_st(schedules=("interleaved", "dualpipev")),
    st.integers(0, 3),
    SLOWER_PART,
    GROW,
    OVERTAKE,
)
def test_a_slower_stage_never_makes_the_interleaved_or_dualpipev_step_faster(
    case: Case, which: int, part: str, grow: float, overtake: float | None
) -> None:
    assert_slower_stage_not_faster(case, which, part, grow, overtake)


@FAST
@given(case_st(), st.integers(1, 8))
def test_more_micro_batches_shrink_the_bubble_share(case: Case, extra: int) -> None:
    # Without the deferred output-layer weight gradients, whose count (and so the head
    # stage's backward and what outlasts the drain) follows the micro-batch count.
    case = dataclasses.replace(case, defer_wgrad=False)
    layout = case.layout
    more = layout.model_copy(update={"num_microbatches": layout.num_microbatches + extra})
    pa, pb = price(case, layout=layout), price(case, layout=more)
    a, b = pa.time, pb.time
    assert b.step_s > a.step_s
    # The same micro-batch: the same per-stage seconds — except that a ZeRO-3 gradient
    # scatter synced once per step spreads over more micro-batches.
    spread = layout.zero >= 3 and case.framework == "megatron"
    for sa, sb in zip(pa.stage_seconds, pb.stage_seconds, strict=True):
        if spread:
            assert sb["dp_comm"] <= sa["dp_comm"] * (1 + REL)
            assert sb.keys() == sa.keys()
            assert all(sb[k] == sa[k] for k in sa if k != "dp_comm")
        else:
            assert sb == sa
    if layout.pp == 1:
        return  # no bubble (up to rounding, see above)
    if not spread:
        # ... so the same bubble ...
        assert math.isclose(a.parts["bubble"], b.parts["bubble"], rel_tol=1e-9)
    # ... a smaller share of a longer step.
    assert a.parts["bubble"] > 0
    assert b.parts["bubble"] / b.step_s < a.parts["bubble"] / a.step_s
    # 1F1B: (pp − 1)/(m + pp − 1) of the pipeline for equal stages, less for unequal ones.
    m, pp = layout.num_microbatches, layout.pp
    if layout.schedule in ("1f1b", "gpipe"):
        compute_bubble = a.parts["bubble"] - fill_drain_s(case, pa)
        assert compute_bubble / pipeline_s(pa) <= (pp - 1) / (m + pp - 1) * (1 + REL)
