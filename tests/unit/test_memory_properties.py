"""Invariants of the memory model on random valid layouts (hypothesis, issue 4).

At a fixed device count:

- more TP, CP, EP or a higher ZeRO stage never raises the per-device weight, gradient
  and optimizer bytes (optimizer state shards over DP × CP, expert state over
  ``dp·cp·tp/(ep·etp)``) — with one stated exception: when the parameters themselves
  are sharded over DP × CP (ZeRO-3 / FSDP), the TP-replicated parameters (norms, the
  router, MLA's down-projections) shard over a smaller group as TP grows, so there only
  the per-TP-rank state (the device's state times dp·cp) never rises;
- full recompute never keeps more activation bytes than none, and recomputing more
  switches never keeps more (any layer kind, any degrees);
- stage 0 of 1F1B holds the most micro-batches in flight; interleaved 1F1B's stage 0
  holds ``min(pp·vpp + pp − 1, m·vpp)`` chunk-forwards — Megatron's factor
  ``1 + (pp − 1)/(pp·vpp)`` on top of pp micro-batches once ``m·vpp`` allows it —
  checked against an independent replay of Megatron's schedule table;
- every stage's parts sum to its total, and the peak is the largest stage total.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cache
from itertools import combinations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ndplan.core.context import PricingContext, interleaved_in_flight, place_layers
from ndplan.core.errors import InvalidInputError
from ndplan.core.frameworks import FRAMEWORKS, SWITCHES
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.memory import MegatronMemoryModel, NdplanMemoryModel
from ndplan.core.model import ModelSpec, MoEFFN
from ndplan.planner import Planner, PricingOptions, validate_layout

FAST = settings(
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
DEVICES = 64
GLOBAL_BATCH = 256
SEQ = 4096
MODELS = ("llama-3.1-8b", "mixtral-8x7b", "deepseek-v2-lite", "qwen3-next-80b-a3b", "gpt3-5b")
MOE_MODELS = ("mixtral-8x7b", "deepseek-v2-lite", "qwen3-next-80b-a3b")
STATE_PARTS = ("weights", "gradients", "optimizer")


@cache
def planner() -> Planner:
    return Planner()


@cache
def model(name: str) -> ModelSpec:
    return planner().model(name)


@cache
def context(name: str, framework: str, devices: int = DEVICES, **job) -> PricingContext:
    p = planner()
    return p.context(
        model(name),
        p.device("h100-sxm"),
        devices,
        Job(global_batch_size=GLOBAL_BATCH, seq_length=SEQ, framework=framework, **job),
    )


def is_valid(ctx: PricingContext, layout: Layout) -> bool:
    try:
        validate_layout(ctx, layout)
    except InvalidInputError:
        return False
    return True


def is_moe(name: str) -> bool:
    return any(isinstance(k.ffn, MoEFFN) for k in model(name).kinds)


def stage_states(ctx: PricingContext, layout: Layout) -> list[int]:
    mm = NdplanMemoryModel()
    out = []
    for stage in ctx.placement(layout):
        parts = mm.stage_static_bytes(ctx, layout, stage)
        out.append(sum(parts.get(k, 0) for k in STATE_PARTS))
    return out


def params_sharded(ctx: PricingContext, layout: Layout) -> bool:
    """ZeRO-3, or FSDP keeping sharded fp32 parameters (torchtitan from stage 2)."""
    return layout.zero >= 3 or (ctx.framework.fsdp_fp32_params and layout.zero >= 2)


@st.composite
def layouts(draw, names=MODELS):
    """A valid layout on DEVICES devices: (model name, framework, layout)."""
    name = draw(st.sampled_from(names))
    framework = draw(st.sampled_from(["megatron", "torchtitan", "deepspeed"]))
    fw = FRAMEWORKS[framework]
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    cp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 4]))
    assume(DEVICES % (tp * cp * pp) == 0)
    dp = DEVICES // (tp * cp * pp)
    ep = draw(st.sampled_from([1, 2, 4, 8])) if is_moe(name) else 1
    etp = draw(st.sampled_from([None, 1])) if fw.expert_tp and is_moe(name) else None
    layout = Layout(
        dp=dp,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        etp=etp,
        mbs=1,
        num_microbatches=GLOBAL_BATCH // dp,
        zero=draw(st.sampled_from(fw.zero_stages)),
        sp=draw(st.booleans()),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
    )
    ctx = context(name, framework)
    assume(is_valid(ctx, layout))
    return name, framework, layout


def _more(layout: Layout, **update) -> Layout:
    dp = update.get("dp", layout.dp)
    return layout.model_copy(update={**update, "num_microbatches": GLOBAL_BATCH // dp})


# ----------------------------------------------------------------------------- state bytes


@FAST
@given(layouts())
def test_more_tp_never_raises_the_state_a_device_holds(case) -> None:
    name, framework, layout = case
    assume(layout.dp % 2 == 0)
    ctx = context(name, framework)
    more = _more(layout, tp=layout.tp * 2, dp=layout.dp // 2)
    assume(is_valid(ctx, more))
    before, after = stage_states(ctx, layout), stage_states(ctx, more)
    if not params_sharded(ctx, layout):
        assert all(b <= a for a, b in zip(before, after, strict=True)), (before, after)
    else:
        # Sharded parameters: TP-replicated ones shard over dp·cp, which shrinks; the
        # state of one TP rank (summed over its DP×CP shard group) still never rises.
        group0, group1 = layout.dp * layout.cp, more.dp * more.cp
        slack = 3 * group0  # each part rounds up to a whole byte per device
        for a, b in zip(before, after, strict=True):
            assert b * group1 <= a * group0 + slack, (before, after)


@FAST
@given(layouts())
def test_more_cp_never_raises_the_state_a_device_holds(case) -> None:
    name, framework, layout = case
    assume(layout.dp % 2 == 0)
    ctx = context(name, framework)
    more = _more(layout, cp=layout.cp * 2, dp=layout.dp // 2)
    assume(is_valid(ctx, more))
    before, after = stage_states(ctx, layout), stage_states(ctx, more)
    # The optimizer shards over DP × CP: trading DP for CP leaves it unchanged.
    assert all(b <= a for a, b in zip(before, after, strict=True)), (before, after)


@FAST
@given(layouts())
def test_a_higher_zero_stage_never_raises_the_state_a_device_holds(case) -> None:
    name, framework, layout = case
    stages = FRAMEWORKS[framework].zero_stages
    assume(layout.zero != stages[-1])
    ctx = context(name, framework)
    more = layout.model_copy(update={"zero": stages[stages.index(layout.zero) + 1]})
    before, after = stage_states(ctx, layout), stage_states(ctx, more)
    assert all(b <= a for a, b in zip(before, after, strict=True)), (before, after)


@FAST
@given(layouts(names=MOE_MODELS))
def test_more_ep_never_raises_the_state_a_device_holds(case) -> None:
    name, framework, layout = case
    ctx = context(name, framework)
    more = layout.model_copy(update={"ep": layout.ep * 2})
    assume(is_valid(ctx, more))
    before, after = stage_states(ctx, layout), stage_states(ctx, more)
    assert all(b <= a for a, b in zip(before, after, strict=True)), (before, after)


def test_the_stated_exception_tp_replicated_parameters_under_zero_3() -> None:
    """Under ZeRO-3, tp 1 → 2 at 64 devices adds exactly 18 B × the TP-replicated
    parameters (the norms) × (1/32 − 1/64): they shard over dp·cp, which halves."""
    ctx = context("llama-3.1-8b", "megatron")
    spec = model("llama-3.1-8b")
    one = Layout(dp=64, zero=3, num_microbatches=4)
    two = Layout(dp=32, tp=2, zero=3, num_microbatches=8)
    (before,), (after,) = stage_states(ctx, one), stage_states(ctx, two)
    norms = spec.num_layers * ctx.kind_params[0].norms + spec.hidden_size  # + the final norm
    assert after > before
    assert abs((after - before) - 18 * norms * (1 / 32 - 1 / 64)) <= 3


# ----------------------------------------------------------------------------- recompute


@st.composite
def activation_cases(draw):
    name = draw(st.sampled_from(MODELS))
    framework = draw(st.sampled_from(["megatron", "torchtitan", "mindformers"]))
    eager = draw(st.booleans())
    dropout = draw(st.sampled_from([0.0, 0.1]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    cp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([1, 2, 4])) if is_moe(name) else 1
    layout = Layout(
        tp=tp,
        cp=cp,
        ep=ep,
        etp=draw(st.sampled_from([None, 1])) if is_moe(name) else None,
        dp=max(ep, 1),
        mbs=draw(st.sampled_from([1, 2, 4])),
        sp=draw(st.booleans()),
    )
    ctx = context(
        name,
        framework,
        attention_kernel="eager" if eager else "flash",
        dropout=dropout,
        precision=draw(st.sampled_from(["bf16", "fp8", "mxfp8"])),
    )
    return ctx, layout


DROP_SWITCHES = tuple(s for s in SWITCHES if s != "op")
"""Switches that only drop tensors. ``op`` is torchtitan's per-op policy: it also saves
tensors a plain backward discards (the down projection's output, the reduce-scatter
outputs), so it does not nest with the others — {core_attn, norm} ∪ {op} can keep more
than {core_attn, norm}, a combination no framework runs. Alone it keeps between full
recompute and nothing."""


@FAST
@given(
    activation_cases(),
    st.sets(st.sampled_from(DROP_SWITCHES)),
    st.sets(st.sampled_from(DROP_SWITCHES)),
)
def test_recomputing_more_never_keeps_more(case, some, more) -> None:
    ctx, layout = case
    mm = NdplanMemoryModel()
    a, b = frozenset(some), frozenset(some) | frozenset(more)
    for kind in ctx.model.kinds:
        none = mm.layer_activation_bytes(ctx, layout, kind, frozenset())
        full = mm.layer_activation_bytes(ctx, layout, kind, None)
        selective = mm.layer_activation_bytes(ctx, layout, kind, ctx.framework.selective)
        per_op = mm.layer_activation_bytes(ctx, layout, kind, frozenset({"op"}))
        fewer = mm.layer_activation_bytes(ctx, layout, kind, a)
        most = mm.layer_activation_bytes(ctx, layout, kind, b)
        assert 0 < full <= selective <= none
        assert full <= per_op <= none
        assert full <= most <= fewer <= none


@FAST
@given(layouts())
def test_full_recompute_never_keeps_more_activations_on_a_stage(case) -> None:
    name, framework, layout = case
    ctx = context(name, framework)
    pricer = planner().pricer(ctx)
    none = pricer.price(layout.model_copy(update={"recompute": "none"}), with_time=False)
    full = pricer.price(layout.model_copy(update={"recompute": "full"}), with_time=False)
    assert all(f <= n for f, n in zip(full.activations, none.activations, strict=True))


def test_every_switch_subset_is_monotone_on_every_kind() -> None:
    """Exhaustively, on one layout per model: A ⊆ B ⇒ kept(B) ≤ kept(A)."""
    mm = NdplanMemoryModel()
    layout = Layout(tp=2, cp=2, sp=True, mbs=2)
    subsets = [frozenset(c) for r in range(len(SWITCHES) + 1) for c in combinations(SWITCHES, r)]
    for name in MODELS:
        ctx = context(name, "megatron", attention_kernel="eager", dropout=0.1)
        for kind in ctx.model.kinds:
            kept = {s: mm.layer_activation_bytes(ctx, layout, kind, s) for s in subsets}
            for small in subsets:
                for big in subsets:
                    if small <= big:
                        assert kept[big] <= kept[small]
            assert mm.layer_activation_bytes(ctx, layout, kind, None) <= min(kept.values())


# ----------------------------------------------------------------------------- schedules


def megatron_forwards_before_first_backward(pp: int, vpp: int, m: int, rank: int) -> list[int]:
    """Replay of Megatron-Core's interleaved schedule: warm-up forwards
    ``2·(pp − rank − 1) + (vpp − 1)·pp`` (all of them when that reaches m·vpp), then one
    steady-state forward; the order comes from ``get_schedule_table`` with micro-batch
    groups of pp (the last group takes what is left)."""
    table = []
    for first in range(0, m, pp):
        last = m if first + pp >= m else first + pp
        table += [(mb, chunk) for chunk in range(vpp) for mb in range(first, last)]
    total = m * vpp
    warmup = 2 * (pp - rank - 1) + (vpp - 1) * pp
    held = total if warmup >= total else warmup + 1
    counts = [0] * vpp
    for _, chunk in table[:held]:
        counts[chunk] += 1
    return counts


@settings(deadline=None, max_examples=300)
@given(st.integers(2, 8), st.integers(2, 6), st.integers(1, 6), st.integers(0, 40))
def test_interleaved_in_flight_replays_megatrons_schedule(pp, vpp, factor, extra) -> None:
    m = pp + (extra % (factor * pp))  # m ≥ pp, Megatron's requirement for interleaving
    for rank in range(pp):
        assert list(interleaved_in_flight(pp, vpp, m, rank)) == (
            megatron_forwards_before_first_backward(pp, vpp, m, rank)
        )


@settings(deadline=None, max_examples=300)
@given(st.integers(2, 8), st.integers(2, 6), st.integers(0, 64))
def test_interleaved_stage_0_totals(pp, vpp, extra) -> None:
    m = pp + extra
    counts = interleaved_in_flight(pp, vpp, m, 0)
    assert sum(counts) == min(pp * vpp + pp - 1, m * vpp)
    if m * vpp >= pp * vpp + pp - 1:  # e.g. m ≥ 2·pp: Megatron's factor exactly
        assert sum(counts) == pp * vpp + pp - 1
        assert Fraction(sum(counts), vpp) == pp * (1 + Fraction(pp - 1, pp * vpp))
    else:  # few micro-batches: every forward runs before the first backward
        assert sum(counts) == m * vpp
    assert all(c <= m for c in counts)
    totals = [sum(interleaved_in_flight(pp, vpp, m, s)) for s in range(pp)]
    assert totals[0] == max(totals)
    if pp * vpp <= model("llama-3.1-8b").num_layers:  # and place_layers uses them
        layout = Layout(pp=pp, vpp=vpp, num_microbatches=m, schedule="interleaved")
        stages = place_layers(model("llama-3.1-8b"), layout)
        assert tuple(c.in_flight for c in stages[0].chunks) == counts


@settings(deadline=None, max_examples=200)
@given(st.integers(1, 16), st.integers(1, 64), st.sampled_from(["1f1b", "gpipe"]))
def test_stage_0_holds_the_most_in_flight(pp, m, schedule) -> None:
    """(DualPipeV is not monotone: its stages hold 2·pp chunk-forwards each, fewer where m caps
    chunk 0 — which hits stage 0 first; its counts are checked in test_memory.py.)"""
    stages = place_layers(
        model("llama-3.1-8b"), Layout(pp=pp, num_microbatches=m, schedule=schedule)
    )
    if schedule == "1f1b":
        assert [s.max_in_flight for s in stages] == [min(pp - i, m) for i in range(pp)]
    held = [sum(c.in_flight for c in s.chunks) for s in stages]
    assert held[0] == max(held)


# ----------------------------------------------------------------------------- totals


@st.composite
def priced_layouts(draw):
    name, framework, layout = draw(layouts())
    fw = FRAMEWORKS[framework]
    schedule = draw(st.sampled_from(fw.schedules))
    if schedule != "1f1b" and layout.pp == 1:
        schedule = "1f1b"
    vpp = draw(st.sampled_from([2, 4])) if schedule == "interleaved" else 1
    layout = layout.model_copy(
        update={
            "schedule": schedule,
            "vpp": vpp,
            "recompute": draw(st.sampled_from(["none", "selective", "full", "auto"])),
            "offload_optimizer": draw(st.booleans()),
        }
    )
    ctx = context(name, framework)
    assume(is_valid(ctx, layout))
    return ctx, layout


@FAST
@given(priced_layouts(), st.sampled_from([None, 40.0, 80.0]))
def test_parts_sum_to_the_total_and_the_peak_is_the_largest(case, max_mem) -> None:
    ctx, layout = case
    if max_mem is not None:
        ctx = planner().context(
            ctx.model,
            ctx.device,
            ctx.cluster.num_devices,
            ctx.job,
            options=PricingOptions(max_mem_gib=max_mem),
        )
    pricer = planner().pricer(ctx)
    plan = pricer.plan(pricer.price(layout))
    mem = plan.memory
    assert len(mem.stages) == layout.pp
    for stage in mem.stages:
        assert all(isinstance(v, int) and v >= 0 for v in stage.parts.values()), stage.parts
        assert stage.total_bytes == sum(stage.parts.values())
    assert mem.peak_bytes == max(s.total_bytes for s in mem.stages)
    assert mem.stages[mem.peak_stage].total_bytes == mem.peak_bytes
    assert mem.fits == (mem.peak_bytes <= mem.budget_bytes)
    if layout.offload_optimizer:
        assert all(s.parts.get("optimizer", 0) == 0 for s in mem.stages)


@FAST
@given(layouts())
def test_megatron_mode_parts_sum_to_the_total(case) -> None:
    name, _, layout = case
    ctx = context(name, "megatron")
    assume(is_valid(ctx, layout))
    mem = MegatronMemoryModel().breakdown(ctx, layout)
    for stage in mem.stages:
        assert stage.total_bytes == sum(stage.parts.values())
    assert mem.peak_bytes == max(s.total_bytes for s in mem.stages)
