"""Activation offload as an option of the per-layer recompute choice (spec/recompute.md:
an option's ``offload_bytes`` go to host memory after the forward and come back before
the backward, priced against the host link)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ndplan.core.errors import InfeasibleError
from ndplan.core.job import Job
from ndplan.core.layout import Layout, SearchSpace
from ndplan.core.memory import NdplanMemoryModel
from ndplan.core.performance import NdplanCostModel
from ndplan.core.ports import REFETCH_PART
from ndplan.core.recompute import OFFLOADED, kind_options
from ndplan.planner import Planner, PricingOptions


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def context(
    planner: Planner,
    layout: Layout | None = None,
    *,
    gbs: int | None = None,
    seq: int = 4096,
    host_gb_per_s: float | None = None,
    options: PricingOptions | None = None,
    **job,
):
    """Llama-3-8B on H100s: ``layout``'s devices and batch (8 devices when none is given),
    optionally another host link."""
    device = planner.device("h100")
    if host_gb_per_s is not None:
        link = device.host_link.model_copy(update={"bandwidth_gb_per_s": host_gb_per_s})
        device = device.model_copy(update={"host_link": link})
    if gbs is None:
        gbs = layout.dp * layout.mbs * layout.num_microbatches
    return planner.context(
        planner.model("llama-3-8b"),
        device,
        layout.devices if layout is not None else 8,
        Job(global_batch_size=gbs, seq_length=seq, **job),
        options=options,
    )


LAYOUT = Layout(dp=2, tp=2, pp=2, num_microbatches=4, recompute="auto")


@pytest.mark.parametrize(
    ("job", "offered"),
    [
        ({"activation_offload": True}, True),
        ({"activation_offload": False}, False),
        ({}, False),  # off unless asked for, as in Megatron
        ({"activation_offload": False, "framework": "torchtitan"}, False),
    ],
)
def test_offload_is_an_option_only_where_the_framework_and_the_job_offer_it(
    planner: Planner, job: dict, offered: bool
) -> None:
    ctx = context(planner, LAYOUT, **job)
    kind = ctx.model.kinds[0]
    names = [
        o.name for o, _ in kind_options(ctx, LAYOUT, kind, NdplanMemoryModel(), NdplanCostModel())
    ]
    assert ("offload" in names) is offered
    assert {"none", "full"} <= set(names)
    # The setting is an assumption only where a framework could offload.
    fields = [a.field for a in ctx.recorder.items]
    assert ("job.activation_offload" in fields) is ("activation_offload" not in job)


@pytest.mark.parametrize("host_gb_per_s", [1.0, 20.0, 55.0, 1e6])
def test_an_offloaded_layer_keeps_nothing_and_pays_the_copy_the_next_layer_does_not_hide(
    planner: Planner, host_gb_per_s: float
) -> None:
    ctx = context(planner, LAYOUT, host_gb_per_s=host_gb_per_s, activation_offload=True)
    kind = ctx.model.kinds[0]
    memory, cost = NdplanMemoryModel(), NdplanCostModel()
    assert memory.layer_activation_bytes(ctx, LAYOUT, kind, OFFLOADED) == 0
    saved = memory.layer_activation_bytes(ctx, LAYOUT, kind, frozenset())
    plain = cost.layer_seconds(ctx, LAYOUT, kind, frozenset())
    offloaded = cost.layer_seconds(ctx, LAYOUT, kind, OFFLOADED)
    copy = saved / (host_gb_per_s * 1e9)
    exposed = max(0.0, copy - plain["forward"]) + max(0.0, copy - plain["backward"])
    assert offloaded["offload"] == pytest.approx(exposed, rel=1e-12)
    assert {k: v for k, v in offloaded.items() if k != "offload"} == {
        k: v for k, v in plain.items() if k != "offload"
    }  # it recomputes nothing
    assert (exposed > 0) is (host_gb_per_s < 100)
    assert sum(offloaded.values()) >= sum(plain.values())  # never faster than keeping them


def test_offload_fits_what_full_recompute_cannot(planner: Planner) -> None:
    """A stage too small for fully recomputed layers fits with offloaded ones: the search
    finds plans that offload, and says so when even offload is not enough."""
    space = SearchSpace(tp=(8,), pp=(1,), cp=(1,), mbs=(1,), zero=(1,), recompute=("auto",),
                        offload_optimizer=(False,))  # fmt: skip
    opts = PricingOptions(max_mem_gib=24.5)

    def search(**job):
        ctx = context(planner, gbs=8, seq=16384, options=opts, **job)
        return planner.search(ctx, space, top_k=3, options=opts)

    with pytest.raises(InfeasibleError, match="even with full recompute"):
        search()
    plans = search(activation_offload=True).result.plans
    assert plans and all(p.memory.fits for p in plans)
    best = plans[0]
    assert best.time.parts["offload"] > 0
    assert any(r.option == "offload" for r in best.recompute)
    too_small = PricingOptions(max_mem_gib=24)
    ctx = context(planner, gbs=8, seq=16384, options=too_small, activation_offload=True)
    with pytest.raises(InfeasibleError, match="even with activation offload"):
        planner.search(ctx, space, top_k=3, options=too_small)
    # No recompute, layers offloaded where needed: the same miss, named as such.
    none = space.model_copy(update={"recompute": ("none",)})
    with pytest.raises(InfeasibleError, match=r"recompute none, activations offloaded\)"):
        planner.search(ctx, none, top_k=3, options=too_small)
    offloading = search(activation_offload=True)  # a search that keeps none finds them too
    ctx = context(planner, gbs=8, seq=16384, options=opts, activation_offload=True)
    kept = planner.search(ctx, none, top_k=3, options=opts).result.plans
    assert kept and all({r.option for r in p.recompute} <= {"none", "offload"} for p in kept)
    assert kept[0].time.step_s >= offloading.result.plans[0].time.step_s


def test_no_recompute_offloads_only_the_layers_that_do_not_fit(planner: Planner) -> None:
    """Megatron runs `--cpu-offloading-num-layers` with no recompute: under the none policy
    with offload offered, the fewest layers that make the stage fit are offloaded and the
    rest kept; nothing is recomputed. Too little memory even then: priced all offloaded."""
    layout = Layout(tp=8, num_microbatches=1, recompute="none")

    def estimate(max_mem: float, **job):
        opts = PricingOptions(max_mem_gib=max_mem)
        ctx = context(planner, layout, seq=16384, options=opts, **job)
        return planner.estimate(ctx, layout, options=opts)

    def offloaded_layers(plan) -> int:
        assert {r.option for r in plan.recompute} <= {"none", "offload"}  # never recompute
        return sum(r.stop - r.start for r in plan.recompute if r.option == "offload")

    kept, same = estimate(80.0), estimate(80.0, activation_offload=True)
    assert kept.memory.fits and offloaded_layers(same) == 0  # room for all: none offloaded
    assert same.time.step_s == kept.time.step_s
    # Nothing offloaded, nothing to bring back: no working room reserved for it.
    assert same.memory.stages[0].parts == kept.memory.stages[0].parts
    assert REFETCH_PART not in same.memory.stages[0].parts
    counts = []
    for max_mem in (40.0, 30.0, 25.0):
        plain, plan = estimate(max_mem), estimate(max_mem, activation_offload=True)
        assert not plain.memory.fits and plan.memory.fits
        n = offloaded_layers(plan)
        # Offloading reserves the room to bring one layer's tensors back, as a recomputing
        # policy reserves it to re-run one forward.
        refetch = plan.memory.stages[0].parts[REFETCH_PART]
        assert refetch > 0
        kept_per_layer = (plain.memory.peak_bytes + refetch - plan.memory.peak_bytes) / n
        # The fewest: keeping one more layer would not fit.
        assert plan.memory.peak_bytes + kept_per_layer > max_mem * 2**30
        assert plan.time.parts["offload"] > 0 and plan.time.parts["recompute"] == 0
        counts.append(n)
    assert counts == sorted(counts) and counts[0] < counts[-1]
    too_small = estimate(20.0, activation_offload=True)
    assert not too_small.memory.fits and offloaded_layers(too_small) == 32


@pytest.mark.parametrize("host_gb_per_s", [1.0, 55.0])
@pytest.mark.parametrize("max_mem", [40.0, 30.0, 25.0])
def test_the_search_bound_stays_below_auto_when_none_would_offload(
    planner: Planner, host_gb_per_s: float, max_mem: float
) -> None:
    """The bound of an auto layout keeps every layer at its fastest option; the none
    policy's own offload choice is no bound (on a slow host link auto recomputes instead,
    for less)."""
    layout = Layout(tp=8, num_microbatches=1, recompute="auto")
    opts = PricingOptions(max_mem_gib=max_mem)
    ctx = context(planner, layout, seq=16384, host_gb_per_s=host_gb_per_s, options=opts,
                  activation_offload=True)  # fmt: skip
    pricer = planner.pricer(ctx, opts)
    auto = pricer.price(layout)
    assert auto.fits
    assert pricer.auto_lower_bound(layout) <= auto.time.step_s * (1 + 1e-12)


@settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(
    host_gb_per_s=st.floats(min_value=1.0, max_value=1000.0),
    max_mem=st.floats(min_value=30.0, max_value=60.0),
    tp=st.sampled_from([4, 8]),
)
def test_a_faster_host_link_never_makes_the_per_layer_choice_slower(
    planner: Planner, host_gb_per_s: float, max_mem: float, tp: int
) -> None:
    """Offloaded layers only get cheaper as the host link speeds up, so the exact knapsack
    can only find a step as fast or faster; the memory it needs does not change."""
    layout = Layout(tp=tp, dp=8 // tp, num_microbatches=2, recompute="auto")
    opts = PricingOptions(max_mem_gib=max_mem)
    steps = []
    for bandwidth in (host_gb_per_s, 2 * host_gb_per_s):
        ctx = context(planner, layout, seq=8192, host_gb_per_s=bandwidth, options=opts,
                      activation_offload=True)  # fmt: skip
        plan = planner.estimate(ctx, layout, options=opts)
        steps.append((plan.memory.fits, plan.time.step_s))
    (fits_slow, slow), (fits_fast, fast) = steps
    assert fits_slow == fits_fast
    if fits_slow:
        assert fast <= slow * (1 + 1e-12)
