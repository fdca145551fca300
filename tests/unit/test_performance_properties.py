"""Invariants of the step-time model on random dense/MoE shapes, layouts and devices.

On every case: the parts are non-negative and sum exactly to the step; the step's
``dp_comm`` is m × the critical stage's ZeRO-3/FSDP part plus the per-step exposed DP
communication (none under ZeRO-3), hidden under share × the shortest stage windows
(share 1 for 1F1B/GPipe, 1/vpp interleaved, (pp − 1)/(4·pp) DualPipeV); DualPipeV's
bubble is (pp − 1) × the mean over stages of max(0, t_s − (bwd_s + dp_comm_s)/2)/2.
Monotonicity, of every stage, the pipeline and the whole step, everywhere: more scale-up,
scale-out or HBM bandwidth, or a higher peak, never makes any of them slower; full
recompute is never faster than none; a stage getting slower never makes the step faster,
also when it becomes the critical stage. More micro-batches of the same size leave the
bubble unchanged (or smaller, where a once-per-step ZeRO-3 scatter spreads), so its
share of the step falls.

Layouts split their layers evenly or, in half of the pipelined cases, unevenly (down to
chunks without layers). The counterexamples hypothesis found under the earlier
composition (DualPipeV + ZeRO-3 with a bubble unit counting only the backward as fill;
per-step DP windows taken from the critical stage) are pinned with ``@example`` as
regressions. One known defect remains, a strict xfail pinned with ``@example``: with an
uneven DualPipeV split and ring CP, a higher peak can still slow the step (the CP-hiding
compute a faster device loses narrows the DP windows by more than the bubble shrinks);
the higher-peak property holds everywhere on even splits.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ndplan.adapters.devices.catalog import builtin_devices
from ndplan.core.calibration import Calibration, Overlap
from ndplan.core.cluster import Cluster, DeviceSpec
from ndplan.core.context import PricingContext
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
def case_st(draw, uneven: bool = True) -> Case:
    """A random case; with ``uneven``, half of the pipelined layouts set their own
    layers per chunk, down to chunks without layers (a stage of embedding and head)."""
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
    pp = draw(st.sampled_from([p for p in (1, 2, 4) if p <= num_layers]))
    cp = draw(st.sampled_from([1, 1, 2, 4]))
    dp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    schedules = ["1f1b"]
    if pp > 1:
        schedules += ["interleaved", "gpipe", "dualpipev"]
        if 2 * pp > num_layers:
            schedules.remove("dualpipev")
    schedule = draw(st.sampled_from(schedules))
    vpp = 1
    if schedule == "interleaved":
        vpp = draw(st.sampled_from([v for v in (1, 2, 4) if pp * v <= num_layers]))
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
        num_microbatches=draw(st.integers(1, 8)),
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
        calibration=Calibration(
            overlap={"default": overlap},
            step_overhead_s=draw(st.sampled_from([0.0, 0.05])),
            # Hidden communication still slowing the compute it hides behind.
            interference=draw(st.sampled_from([0.0, 0.0, 0.1])),
        ),
    )


def make_pricer(case: Case, device: DeviceSpec | None = None, layout: Layout | None = None):
    layout = layout or case.layout
    ctx = PricingContext(
        model=case.model,
        cluster=Cluster(device=device or case.device, num_devices=layout.devices),
        job=Job(
            global_batch_size=layout.dp * layout.mbs * layout.num_microbatches,
            seq_length=case.seq,
            precision=case.precision,
            framework=case.framework,
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


# ----------------------------------------------------------------------------- structure


def dp_share(layout: Layout) -> float:
    """The share of the shortest stage window the per-step DP traffic hides under."""
    if layout.schedule == "interleaved":
        return 1 / layout.vpp
    if layout.schedule == "dualpipev":
        return (layout.pp - 1) / (4 * layout.pp)
    return 1.0


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
    # ... hidden under share × the shortest backward (+ recompute) and forward of any
    # stage, less the compute hiding its CP ring.
    seconds = priced.stage_seconds
    share = dp_share(layout)
    window_bwd = share * min(s["backward"] + s["recompute"] - s.cp_hidden_backward for s in seconds)
    window_fwd = share * min(s["forward"] - s.cp_hidden_forward for s in seconds)
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
    if layout.pp == 1:
        # pipeline − m·t computed by subtraction: zero up to rounding.
        assert p["bubble"] <= 1e-12 * time.step_s
        assert p["pp_comm"] == 0.0
    elif layout.schedule in ("1f1b", "gpipe"):
        assert math.isclose(p["bubble"], sum(totals) - max(totals), rel_tol=1e-9, abs_tol=1e-15)
    elif layout.schedule == "interleaved":
        assert math.isclose(
            p["bubble"], (sum(totals) - max(totals)) / layout.vpp, rel_tol=1e-9, abs_tol=1e-15
        )
    else:  # dualpipev: the mean unit, the FSDP traffic filling like the backward
        unit = (
            sum(
                max(0.0, t - (s["backward"] + s["dp_comm"]) / 2) / 2
                for t, s in zip(totals, seconds, strict=True)
            )
            / layout.pp
        )
        assert math.isclose(p["bubble"], (layout.pp - 1) * unit, rel_tol=1e-9, abs_tol=1e-15)


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


@FAST
@example(case=DUALPIPEV_FSDP_OFFLOAD, up=1.0, out=1.0, hbm=2.0)
@example(case=CRITICAL_SWITCH_HBM, up=1.0, out=1.0, hbm=4.0)
@given(case_st(), FACTOR, FACTOR, FACTOR)
def test_more_bandwidth_never_slower(case: Case, up: float, out: float, hbm: float) -> None:
    fast = price(case, device=scaled(case.device, up, out, hbm))
    assert_not_slower(fast, price(case))


@FAST
@example(case=DUALPIPEV_FSDP, factor=2.0)
@example(case=CRITICAL_SWITCH_PEAK, factor=2.0)
@given(case_st(uneven=False), PEAK)
def test_higher_peak_never_slower(case: Case, factor: float) -> None:
    """Everywhere on the default (even) layer split; uneven splits: the xfail below."""
    fast = price(case, device=faster_peak(case.device, factor))
    assert_not_slower(fast, price(case))


# A remaining counterexample (brute force over uneven DualPipeV splits with ring CP; see
# the reason below). Stage 0 holds the embedding and the head alone, memory-bound, and is
# critical whatever the peak; stage 1 holds all four layers.
DUALPIPEV_CP_HEAD_STAGE = Case(
    model=ModelSpec(
        name="dense",
        hidden_size=256,
        vocab_size=60000,
        kinds=(
            LayerKind(
                name="dense",
                attention=StandardAttention(num_heads=8, num_kv_heads=8, head_dim=128),
                ffn=DenseFFN(intermediate_size=1024),
            ),
        ),
        layers=(0,) * 4,
    ),
    layout=Layout(
        pp=2, cp=2, dp=2, zero=1, schedule="dualpipev", num_microbatches=1,
        layers_per_stage=(0, 2, 2, 0),
    ),
    device=H100, seq=4096, precision="bf16", framework="megatron",
    calibration=Calibration(overlap={"default": Overlap(cp=1.0, dp=1.0)}),
)  # fmt: skip


@pytest.mark.xfail(
    strict=True,
    reason="DualPipeV with ring CP: a faster device shortens a stage's attention, so less "
    "of its CP ring hides (cp_comm grows by the hiding compute lost) and its DP windows "
    "(backward and forward less that compute) shrink by the stage's whole saving Δt, at "
    "share (pp − 1)/(4·pp); but its bubble unit (t − (bwd + dp_comm)/2)/2 falls only by "
    "(Δt − Δbwd/2)/2, under Δt/4 when Δbwd > Δt. With a critical stage the peak does not "
    "speed up, the exposed DP grows more than the pipeline shrinks. Pinned: H100, dense "
    "4×256 (8 heads × 128, FFN 1024), vocab 60000, seq 4096, pp 2 DualPipeV with "
    "layers_per_stage (0, 2, 2, 0), cp 2, dp 2, ZeRO-1, m 1, cp and dp overlap 1, peak ×2: "
    "2.1735 → 2.1798 ms (DP 317.3 → 336.9 µs, bubble 446.8 → 433.5 µs)",
)
@FAST
@example(case=DUALPIPEV_CP_HEAD_STAGE, factor=2.0)
@given(case_st(), PEAK)
def test_higher_peak_never_slower_with_uneven_stages(case: Case, factor: float) -> None:
    fast = price(case, device=faster_peak(case.device, factor))
    assert_not_slower(fast, price(case))


@FAST
@given(case_st())
def test_full_recompute_never_faster_than_none(case: Case) -> None:
    none = price(case, layout=case.layout.model_copy(update={"recompute": "none"}))
    full = price(case, layout=case.layout.model_copy(update={"recompute": "full"}))
    assert none.time.parts["recompute"] == 0.0
    assert full.time.parts["recompute"] > 0.0
    assert_not_slower(none, full)


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
    slower = StageSeconds(secs, secs.cp_hidden_forward, secs.cp_hidden_backward)
    slower[part] += extra
    seconds[index] = slower
    return seconds


@FAST
@example(
    # Was a counterexample: on the 2×-peak H100 stage 0 (embedding, TP-heavy, 128 µs
    # backward) is critical by 1 µs over stage 1 (head, 165 µs backward); stage 1's sends
    # grow by that 1 µs and it becomes critical. With the critical stage's windows the
    # step fell 2.231 → 2.169 ms (DP 1023 → 960 µs); with the shortest stage's it grows.
    case=dataclasses.replace(CRITICAL_SWITCH_PEAK, device=faster_peak(H100, 2.0)),
    which=1, part="pp_comm", grow=1.0, overtake=1e-6,
)  # fmt: skip
@given(case_st(), st.integers(0, 3), SLOWER_PART, GROW, OVERTAKE)
def test_a_slower_stage_never_makes_the_step_faster(
    case: Case, which: int, part: str, grow: float, overtake: float | None
) -> None:
    """One stage's part grows (by a fraction of its time, or to just past the slowest
    stage, so that it becomes the critical one): neither the pipeline nor the whole step
    shrinks."""
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
@given(case_st(), st.integers(1, 8))
def test_more_micro_batches_shrink_the_bubble_share(case: Case, extra: int) -> None:
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
        assert a.parts["bubble"] / pipeline_s(pa) <= (pp - 1) / (m + pp - 1) * (1 + REL)
