"""The refetch working set: the room a stage's backward needs to re-run one layer's
forward, or bring its tensors back from the host. A stage whose layers all keep their
activations does neither, so the per-layer choice (``auto``) charges it nothing there:
such a stage is priced as the ``none`` policy prices it, and keeping every layer is open
to ``auto`` wherever it fits without that room."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.ports import REFETCH_PART
from ndplan.core.units import GiB
from ndplan.planner import Planner, PricingOptions

LAYOUTS = {
    "pp1": Layout(dp=4, tp=2, num_microbatches=4, zero=1, sp=True, recompute="auto"),
    "pp2": Layout(dp=2, tp=2, pp=2, num_microbatches=8, zero=1, sp=True, recompute="auto"),
}


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def estimate(planner: Planner, layout: Layout, max_mem: float | None = None, **job):
    """Llama-3-8B, seq 4,096, on H100s: ``layout``'s devices and batch."""
    opts = PricingOptions(max_mem_gib=max_mem)
    ctx = planner.context(
        planner.model("llama-3-8b"),
        planner.device("h100"),
        layout.devices,
        Job(
            global_batch_size=layout.dp * layout.mbs * layout.num_microbatches,
            seq_length=4096,
            **job,
        ),
        options=opts,
    )
    return ctx, planner.estimate(ctx, layout, options=opts)


def refetch_bytes(planner: Planner, layout: Layout) -> list[int]:
    """Per stage, the refetch part the memory model states for ``layout``."""
    ctx, _ = estimate(planner, layout)
    pricer = planner.pricer(ctx, PricingOptions())
    return [
        pricer.memory.stage_static_bytes(ctx, layout, stage).get(REFETCH_PART, 0)
        for stage in ctx.placement(layout)
    ]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_auto_keeping_every_layer_is_priced_as_the_none_policy(planner: Planner, name: str) -> None:
    auto_layout = LAYOUTS[name]
    none_layout = auto_layout.model_copy(update={"recompute": "none"})
    assert all(refetch_bytes(planner, auto_layout))  # the model states the room
    _, auto = estimate(planner, auto_layout)
    _, plain = estimate(planner, none_layout)
    assert {r.option for r in auto.recompute} == {"none"}  # 80 GB: every layer kept
    assert all(REFETCH_PART not in s.parts for s in auto.memory.stages)
    assert auto.memory.model_dump() == plain.memory.model_dump()
    assert auto.time.step_s == plain.time.step_s


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_auto_keeps_every_layer_where_only_the_refetch_room_was_missing(
    planner: Planner, name: str
) -> None:
    """Budgets between the none policy's peak and that peak plus the refetch room: every
    layer kept still fits, so ``auto`` keeps them all (a recomputing choice would need the
    room on top of what it saves)."""
    auto_layout = LAYOUTS[name]
    none_layout = auto_layout.model_copy(update={"recompute": "none"})
    ctx, plain = estimate(planner, none_layout)
    peak_stage = plain.memory.peak_stage
    room = refetch_bytes(planner, auto_layout)[peak_stage]
    # Both the budget and the peak are bytes; put the budget mid-way into the room.
    slack = ctx.device_capacity_bytes - ctx.budget_bytes
    max_mem = (plain.memory.peak_bytes + room // 2 + slack) / GiB
    ctx, auto = estimate(planner, auto_layout, max_mem)
    assert plain.memory.peak_bytes <= ctx.budget_bytes < plain.memory.peak_bytes + room
    assert auto.memory.fits
    assert {r.option for r in auto.recompute} == {"none"}
    assert auto.time.step_s == plain.time.step_s


@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(max_mem=st.floats(min_value=20.0, max_value=80.0), name=st.sampled_from(sorted(LAYOUTS)))
def test_auto_is_never_slower_than_the_none_policy_where_none_fits(
    planner: Planner, max_mem: float, name: str
) -> None:
    """``none`` is one of ``auto``'s choices on every stage, refetch room and all."""
    auto_layout = LAYOUTS[name]
    _, plain = estimate(planner, auto_layout.model_copy(update={"recompute": "none"}), max_mem)
    _, auto = estimate(planner, auto_layout, max_mem)
    if plain.memory.fits:
        assert auto.memory.fits
        assert auto.time.step_s <= plain.time.step_s * (1 + 1e-12)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_a_stage_that_recomputes_is_charged_the_room(planner: Planner, name: str) -> None:
    """Under full recompute every stage re-runs its layers: the room is in every stage's
    parts and in its total."""
    full_layout = LAYOUTS[name].model_copy(update={"recompute": "full"})
    _, full = estimate(planner, full_layout)
    rooms = refetch_bytes(planner, full_layout)
    for stage, room in zip(full.memory.stages, rooms, strict=True):
        assert stage.parts[REFETCH_PART] == room > 0
        assert stage.total_bytes == sum(stage.parts.values())
