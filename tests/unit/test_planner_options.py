"""The library facade's pricing options: where each is set, that each is checked, and that
pricing one context with other ports never reads what the first ports cached."""

from __future__ import annotations

import pytest

from ndplan.bootstrap import bootstrap
from ndplan.core.errors import InvalidInputError
from ndplan.core.job import Job
from ndplan.core.layout import Layout, SearchSpace
from ndplan.core.performance import NdplanCostModel
from ndplan.planner import Planner, PricingOptions
from ndplan.plugins.hookspecs import hookimpl

LAYOUT = Layout(tp=4, pp=2, dp=8, mbs=1, num_microbatches=64, zero=1, sp=True)


class SlowTensorParallel(NdplanCostModel):
    """The analytic model with TP traffic three times as slow: a second cost model."""

    def layer_seconds(self, ctx, layout, kind, recompute):
        parts = dict(super().layer_seconds(ctx, layout, kind, recompute))
        parts["tp_comm"] *= 3.0
        return parts


class SlowTensorParallelPlugin:
    @hookimpl
    def ndplan_register_cost_models(self, registry):
        registry.add("slow-tp", SlowTensorParallel)


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner(bootstrap(extra=[SlowTensorParallelPlugin()]))


def context(planner: Planner, options: PricingOptions | None = None):
    return planner.context(
        planner.model("llama-3-8b"),
        planner.device("h100"),
        64,
        Job(global_batch_size=512, seq_length=8192),
        options=options,
    )


def step(plan) -> float:
    return plan.time.step_s


@pytest.mark.parametrize("first", ["ndplan", "slow-tp"])
def test_a_second_cost_model_on_one_context_prices_as_on_a_fresh_one(planner, first) -> None:
    fresh = {
        name: step(planner.estimate(context(planner), LAYOUT, PricingOptions(cost_model=name)))
        for name in ("ndplan", "slow-tp")
    }
    assert fresh["slow-tp"] > fresh["ndplan"]
    shared = context(planner)
    second = "slow-tp" if first == "ndplan" else "ndplan"
    for name in (first, second):
        plan = planner.estimate(shared, LAYOUT, PricingOptions(cost_model=name))
        assert step(plan) == fresh[name], name


def test_a_second_memory_model_on_one_context_prices_as_on_a_fresh_one(planner) -> None:
    fresh = planner.estimate(context(planner), LAYOUT).memory.peak_bytes
    shared = context(planner)
    planner.estimate(shared, LAYOUT, PricingOptions(memory_model="megatron"))
    assert planner.estimate(shared, LAYOUT).memory.peak_bytes == fresh


def test_a_search_with_another_cost_model_on_a_used_context(planner) -> None:
    space = SearchSpace(tp=(4,), pp=(2,))
    slow = PricingOptions(cost_model="slow-tp")
    fresh = planner.search(context(planner), space, top_k=3, options=slow).result.plans
    shared = context(planner)
    planner.search(shared, space, top_k=3)
    again = planner.search(shared, space, top_k=3, options=slow).result.plans
    assert [step(p) for p in again] == [step(p) for p in fresh]


def test_the_contexts_options_hold_for_calls_that_name_none(planner) -> None:
    slow = PricingOptions(cost_model="slow-tp")
    ctx = context(planner, slow)
    assert step(planner.estimate(ctx, LAYOUT)) == step(
        planner.estimate(context(planner), LAYOUT, slow)
    )


@pytest.mark.parametrize(
    ("name", "value"),
    [("max_mem_gib", 60.0), ("reserve_gib", 5.0), ("balance_reserve_gib", 2.0), ("memoize", False)],
)
def test_a_call_cannot_change_the_contexts_budget_fit_or_reuse(planner, name, value) -> None:
    ctx = context(planner)
    options = PricingOptions(**{name: value})
    for call in (
        lambda: planner.estimate(ctx, LAYOUT, options),
        lambda: planner.search(ctx, SearchSpace(tp=(4,), pp=(2,)), options=options),
    ):
        with pytest.raises(InvalidInputError, match=rf"^{name}: .*planner\.context"):
            call()
    # Given to the context, the same option is used.
    made = context(planner, options)
    assert planner.estimate(made, LAYOUT).memory is not None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            PricingOptions(max_mem_gib=1000),
            r"^max_mem_gib: 1000 GiB is more than the h100-sxm's 80 GiB",
        ),
        (PricingOptions(max_mem_gib=-5), r"^max_mem_gib: must be a positive number of GiB"),
        (PricingOptions(reserve_gib=-30), r"^reserve_gib: must be at least 0 GiB, got -30"),
        (PricingOptions(balance_reserve_gib=-10), r"^balance_reserve_gib: must be at least 0 GiB"),
        (PricingOptions(balance_reserve_gib=80), r"^balance_reserve_gib: 80 GiB leaves nothing"),
        (PricingOptions(reserve_gib=float("nan")), r"^reserve_gib: must be a finite number"),
        (PricingOptions(bucket_bytes=0), r"^bucket_bytes: must be at least 1"),
    ],
)
def test_pricing_options_are_checked_where_the_context_is_made(planner, options, message) -> None:
    with pytest.raises(InvalidInputError, match=message):
        context(planner, options)


def test_top_k_is_named_as_the_library_spells_it(planner) -> None:
    with pytest.raises(InvalidInputError, match=r"^top_k: must be at least 1, got 0"):
        planner.search(context(planner), SearchSpace(), top_k=0)


def test_the_public_names_resolve_from_the_package() -> None:
    import ndplan

    public = set(ndplan.__all__) - {"__version__"}
    assert public == set(ndplan._PUBLIC)
    for name in public:
        assert getattr(ndplan, name).__name__ == name


def test_planner_layout_fills_in_the_degrees_as_estimate_does(planner) -> None:
    ctx = context(planner)  # llama-3-8b, 64 × H100, GBS 512
    layout = planner.layout(ctx, tp=4, pp=2, vpp=2)
    assert (layout.dp, layout.num_microbatches, layout.mbs) == (8, 64, 1)
    assert layout.zero == 1 and layout.sp and layout.schedule == "interleaved"
    assert "layout.zero" in [a.field for a in ctx.recorder.items]  # the framework's, assumed
    assert planner.layout(ctx, tp=1).sp is False  # SP means nothing at tp 1
    with pytest.raises(InvalidInputError, match=r"does not divide devices\(64\)"):
        planner.layout(ctx, tp=3)
    with pytest.raises(InvalidInputError, match=r"^layout: zero: Input should be less"):
        planner.layout(ctx, zero=7)


def test_planner_export_writes_what_export_writes_and_refuses_what_it_refuses(
    planner, tmp_path
) -> None:
    from ndplan.cli.app import run
    from ndplan.core.errors import InfeasibleError

    ctx = context(planner)  # llama-3-8b, 64 × H100, GBS 512, seq 8192
    plan = planner.estimate(ctx, planner.layout(ctx, tp=2, pp=2, recompute="auto"))
    made = planner.export(ctx, plan, "megatron")
    out = tmp_path / "plan.sh"
    argv = ["estimate", "-m", "llama-3-8b", "-d", "h100", "-n", "64", "--gbs", "512",
            "-s", "8192", "--tp", "2", "--pp", "2", "--recompute", "auto",
            "--export", "megatron", "--out", str(out)]  # fmt: skip
    assert run(argv) == 0
    assert made.text == out.read_text()
    with pytest.raises(InvalidInputError, match=r"^torchtitan: the plan is priced for megatron"):
        planner.export(ctx, plan, "torchtitan")
    with pytest.raises(InvalidInputError, match=r"^yaml: unknown format"):
        planner.export(ctx, plan, "yaml")
    tight = context(planner, PricingOptions(max_mem_gib=20))
    big = planner.estimate(tight, planner.layout(tight, tp=1))
    assert not big.memory.fits
    with pytest.raises(InfeasibleError, match=r"^megatron: the plan does not fit"):
        planner.export(tight, big, "megatron")


@pytest.mark.parametrize("degree", ["tp", "pp", "cp", "mbs", "dp", "vpp"])
def test_planner_layout_refuses_a_degree_below_one_by_name(planner, degree) -> None:
    with pytest.raises(InvalidInputError, match=rf"^{degree}: must be at least 1, got 0"):
        planner.layout(context(planner), **{degree: 0})


def test_planner_layout_leaves_sp_off_beside_cp_where_the_framework_does(planner) -> None:
    ctx = planner.context(
        planner.model("llama-3-8b"), planner.device("h100"), 16,
        Job(global_batch_size=32, seq_length=4096, framework="deepspeed"),
    )  # fmt: skip
    assert planner.layout(ctx, tp=2, cp=2).sp is False  # Megatron-DeepSpeed cannot combine
    assert planner.layout(ctx, tp=2).sp is True
    assert planner.estimate(ctx, planner.layout(ctx, tp=2, cp=2)).time.step_s > 0


def test_a_context_made_directly_takes_the_options_of_the_call(planner) -> None:
    from ndplan.core.context import PricingContext

    made = context(planner)
    direct = PricingContext(
        model=made.model, cluster=made.cluster, job=made.job, calibration=made.calibration,
        memoize=False,
    )  # fmt: skip
    options = PricingOptions(memoize=False, cost_model="slow-tp")
    assert step(planner.estimate(direct, LAYOUT, options)) == step(
        planner.estimate(context(planner), LAYOUT, PricingOptions(cost_model="slow-tp"))
    )


def test_a_misspelt_calibration_family_is_refused(planner) -> None:
    h100 = planner.device("h100")
    device = h100.model_copy(update={"id": "lab", "aliases": (), "calibration_family": "hoper"})
    ctx = planner.context(
        planner.model("llama-3-8b"), device, 8, Job(global_batch_size=64, seq_length=4096)
    )
    with pytest.raises(InvalidInputError, match=r"calibration_family 'hoper' has no fit.*hopper"):
        planner.estimate(ctx, planner.layout(ctx))
