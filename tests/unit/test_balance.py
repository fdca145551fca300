"""The pipeline balancer (core/balance.py): per-chunk layer counts for one layout."""

from __future__ import annotations

import pytest

from ndplan.adapters.exporters.megatron import pipeline_layout
from ndplan.core.balance import balance
from ndplan.core.context import chunk_stage
from ndplan.core.errors import InvalidInputError
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.planner import Planner, PricingOptions


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def context(planner: Planner, name: str, n: int, gbs: int, seq: int, **options):
    job = Job(global_batch_size=gbs, seq_length=seq, framework=options.pop("framework", "megatron"))
    return planner.context(
        planner.model(name), planner.device("h100"), n, job, options=PricingOptions(**options)
    )


def score(priced) -> tuple:
    return (not priced.fits, priced.time.step_s)


@pytest.mark.parametrize(
    "layout",
    [
        Layout(pp=16, num_microbatches=64, recompute="auto"),
        Layout(pp=4, dp=4, num_microbatches=16),
        Layout(pp=4, vpp=2, dp=4, num_microbatches=16, schedule="interleaved", recompute="full"),
        Layout(pp=8, dp=2, num_microbatches=32, schedule="dualpipev"),
    ],
    ids=["1f1b-pp16-auto", "1f1b-pp4", "interleaved-pp4x2", "dualpipev-pp8"],
)
def test_the_balancer_never_returns_a_worse_placement_and_places_every_layer(
    planner: Planner, layout: Layout
) -> None:
    ctx = context(planner, "llama-3-8b", 16, 64, 8192)
    pricer = planner.pricer(ctx)
    found = balance(pricer, layout)
    counts = found.best.layout.layers_per_stage
    assert counts is not None and len(counts) == layout.chunks and sum(counts) == 32
    assert min(counts) >= 0
    assert score(found.best) <= score(found.start)
    again = balance(planner.pricer(ctx), layout)  # deterministic
    assert again.best.layout == found.best.layout and again.priced == found.priced
    # Each stage holds what the counts say.
    held = [0] * layout.pp
    for chunk, n in enumerate(counts):
        held[chunk_stage(layout, chunk)] += n
    placed = [sum(c.stop - c.start for c in s.chunks) for s in ctx.placement(found.best.layout)]
    assert placed == held


def test_a_heavy_output_layer_is_balanced_off_the_last_stage(planner: Planner) -> None:
    """Llama 3 8B at pp 16: the 128k-word output layer is about two layers of work. The
    balancer beats the even split by more than 15 % and is no slower than the balanced
    split the search tries, nor than the FLOP-balanced one."""
    ctx = context(planner, "llama-3-8b", 16, 64, 8192)
    layout = Layout(pp=16, num_microbatches=64, recompute="auto")
    found = planner.balance(ctx, layout)
    assert found.balanced.time.step_s < 0.85 * found.start.time.step_s
    assert found.balanced.layout.layers_per_stage[-1] < 2  # the head takes a layer's room
    for counts in (ctx.layer_splits.for_layout(layout, 2), (2,) * 13 + (3, 3, 0)):
        tried = planner.estimate(ctx, layout.model_copy(update={"layers_per_stage": counts}))
        assert found.balanced.time.step_s <= tried.time.step_s
    assert found.moved > 0 and found.priced > 1


def test_on_two_stages_the_balancer_finds_the_best_of_every_split(planner: Planner) -> None:
    """pp 2 has one boundary: every split can be priced, and the local search must land
    on the best of them."""
    ctx = context(planner, "llama-3-8b", 16, 64, 8192)
    layout = Layout(pp=2, dp=8, num_microbatches=8, recompute="auto")
    pricer = planner.pricer(ctx)
    every = [
        pricer.price(layout.model_copy(update={"layers_per_stage": (k, 32 - k)})) for k in range(33)
    ]
    best = min(every, key=lambda p: (score(p), p.peak_bytes, p.layout.layers_per_stage))
    found = balance(pricer, layout)
    assert score(found.best) == score(best)


def test_a_layout_over_memory_is_moved_under_it(planner: Planner) -> None:
    """With no recompute, stage 0 of the even split holds 16 micro-batches of two layers
    each and is over a 50 GiB budget; moving layers to the later stages (fewer in flight)
    makes it fit."""
    ctx = context(planner, "llama-3-8b", 16, 64, 8192, max_mem_gib=50)
    layout = Layout(pp=16, num_microbatches=64, recompute="none")
    found = planner.balance(ctx, layout)
    assert not found.start.memory.fits
    assert found.balanced.memory.fits
    stage0 = found.balanced.layout.layers_per_stage[0]
    assert stage0 < 2


def test_no_balancing_without_a_pipeline_or_uneven_placement(planner: Planner) -> None:
    ctx = context(planner, "llama-3-8b", 16, 64, 8192)
    with pytest.raises(InvalidInputError, match="one pipeline stage"):
        planner.balance(ctx, Layout(dp=16, num_microbatches=4))
    deepspeed = context(planner, "llama-3-8b", 16, 64, 8192, framework="deepspeed")
    with pytest.raises(InvalidInputError, match="deepspeed splits layers evenly"):
        planner.balance(deepspeed, Layout(pp=4, dp=4, num_microbatches=16))


def test_megatron_pipeline_layout_string(planner: Planner) -> None:
    """Chunks in order split by |: E on the first, t per decoder layer, m per MTP layer
    and L on the last (Megatron-Core's --pipeline-model-parallel-layout)."""
    dense = planner.model("llama-3-8b")
    lay = Layout(pp=4, vpp=2, dp=2, num_microbatches=8, schedule="interleaved")
    assert pipeline_layout(dense, lay) == "Etttt|" + "tttt|" * 6 + "ttttL"
    uneven = lay.model_copy(update={"layers_per_stage": (3, 4, 4, 5, 4, 4, 5, 3)})
    assert pipeline_layout(dense, uneven) == "Ettt|tttt|tttt|ttttt|tttt|tttt|ttttt|tttL"
    mtp = planner.model("deepseek-v3")  # 61 layers, one MTP layer: 16/16/16/13
    assert pipeline_layout(mtp, Layout(pp=4, ep=8, dp=8, num_microbatches=8)) == (
        "E" + "t" * 16 + "|" + "t" * 16 + "|" + "t" * 16 + "|" + "t" * 13 + "mL"
    )
