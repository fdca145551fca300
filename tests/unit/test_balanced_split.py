"""The balanced layer split: the last stage lighter by the output layer's work.

Checked as properties over real presets and pipeline shapes: the split places every layer,
its slowest stage (in forward FLOPs, the output layer on the last stage) is never slower
than the default split's, the surplus goes to the stages nearest the end, and the search
offers it beside the even split and prices it as placed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ndplan.adapters.sinks.files import NullSink
from ndplan.core.context import MIN_BALANCE_GAIN, balanced_split, default_split, place_layers
from ndplan.core.counting import count_flops
from ndplan.core.job import Job
from ndplan.core.layout import Layout, SearchSpace
from ndplan.core.search import SPLITS
from ndplan.planner import Planner

DENSE = ("llama-3-8b", "llama-3-70b", "llama-3.1-405b", "gpt3-175b", "qwen3-30b-a3b")


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def stage_loads(model, seq: int, pp: int, counts: tuple[int, ...]) -> list[float]:
    """Forward FLOPs per token of each stage in mean decoder layers, the output layer on
    the last stage."""
    flops = count_flops(model, seq)
    logits = flops.forward_parts["logits"]
    head = logits / ((flops.forward_flops_per_token - logits) / model.num_layers)
    loads = [0.0] * pp
    for chunk, n in enumerate(counts):
        loads[chunk % pp] += n
    loads[-1] += head
    return loads


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(DENSE),
    pp=st.integers(2, 16),
    vpp=st.integers(1, 6),
    seq=st.sampled_from([2048, 8192, 32768]),
)
def test_the_balanced_split_places_every_layer_and_never_slows_the_slowest_stage(
    planner: Planner, name: str, pp: int, vpp: int, seq: int
) -> None:
    model = planner.model(name)
    if pp * vpp > model.num_layers:
        return
    counts = balanced_split(model, seq, pp, vpp)
    default = default_split(model.num_layers, pp * vpp)
    if counts is None:  # the default split is already the balanced one
        return
    assert len(counts) == pp * vpp and sum(counts) == model.num_layers
    assert min(counts) >= 0
    balanced, even = stage_loads(model, seq, pp, counts), stage_loads(model, seq, pp, default)
    assert max(balanced) <= (1 - MIN_BALANCE_GAIN) * max(even) + 1e-9
    per_stage = [round(x) for x in balanced[:-1]]
    # The surplus sits on the later stages, which hold fewer micro-batches in flight.
    assert per_stage == sorted(per_stage) and per_stage[-1] - per_stage[0] <= 1


def test_a_heavy_output_layer_moves_layers_off_the_last_stage(planner: Planner) -> None:
    """Llama 3 8B's 128k-word output layer is about two layers of GEMM: at pp 16 the
    last stage keeps no decoder layer, and the slowest stage drops from 4.1 to 3 layers."""
    model = planner.model("llama-3-8b")
    counts = balanced_split(model, 8192, 16, 1)
    assert counts == (2,) * 13 + (3, 3, 0)
    assert max(stage_loads(model, 8192, 16, counts)) == pytest.approx(3.0)


def test_no_balanced_split_where_it_cannot_apply_or_gains_too_little(planner: Planner) -> None:
    dense = planner.model("llama-3-70b")
    assert balanced_split(dense, 8192, 1, 1) is None  # one stage
    # Llama 3 70B at pp 4: 21 layers against 20 + 1.1 on the slowest stage, under 1 %.
    assert balanced_split(dense, 8192, 4, 1) is None
    assert balanced_split(dense, 8192, 16, 1) is not None  # 6 against 5 + 1.1
    assert balanced_split(planner.model("deepseek-v3"), 4096, 4, 1) is None  # MTP's own rule
    # 126 layers at pp 2: 63 + 63 + 0.6 is already the best integer split.
    assert balanced_split(planner.model("llama-3.1-405b"), 8192, 2, 1) is None


class SplitsPriced(NullSink):
    """A debug sink noting the layer splits of the candidates the search priced."""

    name = "splits"

    def __init__(self) -> None:
        self.splits: set[str] = set()

    def memory(self, candidate, parts) -> None:
        self.splits.add(candidate["split"])


def test_the_search_offers_the_balanced_split_and_prices_it_as_placed(planner: Planner) -> None:
    """Llama 3 8B on 16 H100 at pp 16: the balanced split is a candidate of its own beside
    the even one, with the head weighed as the cost model prices it; the plan carries its
    layer counts, and it is faster, being priced on the stages it places. The ranking
    holds the layout once, at that faster split: the even one is priced and dropped."""
    model = planner.model("llama-3-8b")
    job = Job(global_batch_size=64, seq_length=8192)
    ctx = planner.context(model, planner.device("h100"), 16, job)
    space = SearchSpace(pp=(16,), vpp=(1,), tp=(1,), mbs=(1,), recompute=("full",))
    sink = SplitsPriced()
    found = planner.search(ctx, space, top_k=10, sinks=[sink])
    assert sink.splits == {"even", "balanced"}
    assert [cand["split"] for cand, _ in found.ranking] == ["balanced"] * len(found.ranking)
    best = found.result.plans[0]
    even_layout = best.layout.model_copy(update={"layers_per_stage": None})
    head = planner.pricer(ctx).head_weight(even_layout)
    # Under full recompute a layer costs about 4/3 of its forward and backward: the
    # 128k-word head weighs under two of them, so the last stage keeps one layer.
    assert 1.0 < head < 2.0
    counts = balanced_split(model, 8192, 16, 1, round(head, 2))
    assert best.layout.layers_per_stage == counts == (2,) * 14 + (3, 1)
    stages = place_layers(model, best.layout)
    assert [c.stop - c.start for s in stages for c in s.chunks] == list(counts)
    even = planner.estimate(ctx, even_layout)
    assert best.time.step_s < even.time.step_s
    assert SPLITS.index("balanced") == 2


def test_a_plan_states_the_split_it_was_priced_on(planner: Planner) -> None:
    """A plan's chunk counts are the split priced: the layout's own, else the default one,
    which for DeepSeek-V3 (61 layers, an MTP block) over 16 chunks keeps the last light
    (Megatron-Bridge's 4 ×15 + 1) and is uneven; Llama 3 8B's 32 over 4 stages is not."""
    job = Job(global_batch_size=1024, seq_length=4096, precision="fp8")
    dsv3 = planner.context(planner.model("deepseek-v3"), planner.device("h800"), 2048, job)
    layout = Layout(
        tp=2,
        pp=8,
        vpp=2,
        dp=128,
        ep=256,
        etp=1,
        num_microbatches=8,
        sp=True,
        schedule="interleaved",
    )
    plan = planner.estimate(dsv3, layout)
    assert plan.chunk_layers() == (4,) * 15 + (1,) == default_split(61, 16, 1)
    assert plan.uneven_split()
    llama = planner.context(planner.model("llama-3-8b"), planner.device("h100"), 16, job)
    even = planner.estimate(llama, Layout(pp=4, dp=4, num_microbatches=256))
    assert even.chunk_layers() == (8, 8, 8, 8) and not even.uneven_split()


def head_weight(planner: Planner, layout: Layout, **job) -> float:
    job = Job(global_batch_size=256, seq_length=8192, **job)
    ctx = planner.context(planner.model("llama-3-70b"), planner.device("gb300"), 64, job)
    return planner.pricer(ctx).head_weight(layout)


PP4 = Layout(pp=4, vpp=5, dp=16, num_microbatches=16, schedule="interleaved", recompute="auto")


def test_the_head_weighs_what_the_cost_model_charges_for_it(planner: Planner) -> None:
    """The head's weight follows the physics the time model prices, not its FLOPs: the
    logits GEMM stays in bf16 while FP8 layers speed up, a deferred weight gradient leaves
    the micro-batch's path, and a recomputed layer costs more, so the head weighs less."""
    bf16 = head_weight(planner, PP4, precision="bf16")
    fp8 = head_weight(planner, PP4, precision="fp8")
    assert fp8 > 1.3 * bf16
    deferred = head_weight(planner, PP4, precision="fp8", defer_embedding_wgrad=True)
    assert deferred < fp8
    full = head_weight(planner, PP4.model_copy(update={"recompute": "full"}), precision="fp8")
    assert full < fp8
    assert head_weight(planner, Layout(dp=64, num_microbatches=4), precision="fp8") is None


def test_a_fine_grained_moe_head_weighs_by_its_expert_parallelism(planner: Planner) -> None:
    """Qwen3-30B-A3B's 128 small experts run far faster spread over EP ranks, so its
    head weighs several times more layers at ep 8 than at ep 1; the split the search
    tries is weighed at the candidate's own EP."""
    model = planner.model("qwen3-30b-a3b")
    ctx = planner.context(
        model, planner.device("h100"), 64, Job(global_batch_size=256, seq_length=4096)
    )
    pricer = planner.pricer(ctx)
    at = {ep: Layout(pp=4, dp=16, ep=ep, num_microbatches=16, recompute="auto") for ep in (1, 8)}
    assert pricer.head_weight(at[8]) > 2 * pricer.head_weight(at[1])
    for ep, layout in at.items():
        weight = ctx.layer_splits.head_weight(1, 1, ep, 1, 1, 4, 16, 1, "1f1b", "auto")
        assert weight == pytest.approx(pricer.head_weight(layout), abs=0.005)


def test_an_fp8_head_is_balanced_where_its_flops_alone_would_not_be(planner: Planner) -> None:
    """Llama 3 70B at pp 4 × vpp 5 in FP8 on GB300: by FLOPs the output layer is 1.1
    layers, under the 1 % bar, but in bf16 against FP8 layers it takes about 1.7 layers'
    time. The search offers the balanced split, and it prices faster than the even one."""
    model = planner.model("llama-3-70b")
    assert balanced_split(model, 8192, 4, 5) is None
    job = Job(global_batch_size=256, seq_length=8192, precision="fp8")
    ctx = planner.context(model, planner.device("gb300"), 64, job)
    space = SearchSpace(tp=(1,), pp=(4,), vpp=(5,), mbs=(1,), zero=(1,))
    found = planner.search(ctx, space, top_k=5)
    assert found.ranking[0][0]["split"] == "balanced"
    best = found.result.plans[0]
    assert best.layout.layers_per_stage is not None
    per_stage = [sum(best.layout.layers_per_stage[s::4]) for s in range(4)]
    assert per_stage[-1] < 20 < max(per_stage)
    even = planner.estimate(ctx, best.layout.model_copy(update={"layers_per_stage": None}))
    assert best.time.step_s < 0.99 * even.time.step_s


class HeadAsLayers:
    """A cost model whose head costs exactly ``k`` decoder layers (the port's two per-
    micro-batch methods are all the weight reads)."""

    def __init__(self, k: float) -> None:
        self.k = k

    def layer_seconds(self, ctx, layout, kind, recompute):
        return {"forward": 1.0, "backward": 2.0, "recompute": 0.0}

    def stage_seconds(self, ctx, layout, stage, assignment):
        head = 3.0 * self.k if stage.has_head else 0.0
        return {"forward": 0.5 + head / 3, "backward": 1.0 + 2 * head / 3, "recompute": 0.0}

    def step(self, ctx, layout, stages, seconds):  # not read by the weight
        raise NotImplementedError


def test_a_plugged_in_cost_model_weighs_the_head_of_the_split(planner: Planner) -> None:
    """The balanced split reads the head's weight through the CostModel port: a cost
    model that charges the head as 1.5 layers gets the split for 1.5 layers, not its FLOPs (2.1)."""
    from ndplan.core.pricing import Pricer

    model = planner.model("llama-3-8b")
    ctx = planner.context(
        model, planner.device("h100"), 16, Job(global_batch_size=64, seq_length=8192)
    )
    default = planner.pricer(ctx)
    pricer = Pricer(ctx, default.memory, HeadAsLayers(1.5), default.solver)
    layout = Layout(pp=16, num_microbatches=64)
    assert pricer.head_weight(layout) == pytest.approx(1.5)
    assert ctx.layer_splits.for_layout(layout, 2) == balanced_split(model, 8192, 16, 1, 1.5)
    assert ctx.layer_splits.for_layout(layout, 2) != balanced_split(model, 8192, 16, 1)


def test_frameworks_without_uneven_pipelines_get_only_even_splits(planner: Planner) -> None:
    model = planner.model("llama-3-8b")
    job = Job(global_batch_size=64, seq_length=8192, framework="deepspeed")
    ctx = planner.context(model, planner.device("h100"), 16, job)
    found = planner.search(ctx, SearchSpace(pp=(16,), tp=(1,), mbs=(1,)), top_k=10)
    assert found.ranking and {cand["split"] for cand, _ in found.ranking} == {"even"}
    assert all(p.layout.layers_per_stage is None for p in found.result.plans)
    assert Layout().layers_per_stage is None


def test_nothing_is_weighed_where_no_balanced_split_applies(planner: Planner) -> None:
    """MTP models keep their own split, so the enumeration asks the cost model for no head
    weight there (for DeepSeek-V3 on 2,048 devices that was most of the search's time);
    a dense model's pipelines are weighed."""
    from ndplan.core.search import enumerate_candidates

    calls = []

    def counting(layout: Layout) -> float:
        calls.append(layout)
        return 1.0

    for name, expect_calls in (("deepseek-v3", False), ("llama-3-8b", True)):
        calls.clear()
        job = Job(global_batch_size=256, seq_length=4096)
        ctx = planner.context(planner.model(name), planner.device("h100"), 64, job)
        ctx.layer_splits.weigh_head_with(counting)
        assert enumerate_candidates(ctx, SearchSpace(pp=(4,))).candidates
        assert bool(calls) is expect_calls
