"""The search core (spec/search.md): the loop nest and its named refusals, the pricing
order (memory screen, lower bounds, best-first pricing), the accounting of every
generated candidate, the ranking, and the plugin hooks it consumes (refusal rules,
debug sinks), all through ``Planner.search`` and ``ndplan.core.search``.

Small problems only: the equivalence with an unpruned, unmemoised search lives in
tests/integration/test_search_equivalence.py."""

from __future__ import annotations

import csv
import gc
import importlib
import itertools
import json
import math
import re
import types
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ndplan.adapters.exporters.megatron import pipeline_layout
from ndplan.adapters.sinks.files import CsvSink, JsonLinesSink
from ndplan.bootstrap import bootstrap
from ndplan.core import search as core_search
from ndplan.core.context import PricingContext, head_counted_split
from ndplan.core.errors import BaselineError, InfeasibleError, InvalidInputError
from ndplan.core.job import Job
from ndplan.core.layout import Layout, SearchSpace
from ndplan.core.model import MoEFFN
from ndplan.core.search import (
    FIELDS,
    RECOMPUTES,
    SCHEDULES,
    SearchPricing,
    candidate_layout,
    divisors,
    enumerate_candidates,
    tie_key,
)
from ndplan.core.units import GiB
from ndplan.planner import Planner, PricingOptions
from ndplan.plugins.hookspecs import hookimpl

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"

# A tiny dense model whose shape trips most refusal rules on 16 devices: 12 heads (tp 8
# does not divide them), an FFN width of 1002 (tp 4 does not divide it), 4 layers
# (pp 8 and 16 exceed them).
TINY_DENSE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 768,
    "intermediate_size": 1002,
    "num_hidden_layers": 4,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
# A tiny MoE whose expert width (250) tp 4 does not divide.
TINY_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_size": 512,
    "intermediate_size": 1536,
    "moe_intermediate_size": 250,
    "shared_expert_intermediate_size": 1024,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "decoder_sparse_step": 2,
    "mlp_only_layers": [3],
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "hidden_act": "silu",
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


@pytest.fixture(scope="module")
def planner() -> Planner:
    with pytest.MonkeyPatch.context() as mp:
        for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS"):
            mp.delenv(var, raising=False)
        return Planner(bootstrap(entry_points=False))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("models")
    out = {}
    for name, cfg in (("dense", TINY_DENSE), ("moe", TINY_MOE)):
        path = folder / f"{name}.json"
        path.write_text(json.dumps(cfg), encoding="utf-8")
        out[name] = str(path)
    return out


def make_ctx(
    planner: Planner,
    model: str,
    n: int,
    gbs: int,
    seq: int = 2048,
    *,
    max_mem: float | None = None,
    memo: bool = True,
    **job,
) -> tuple[PricingContext, PricingOptions]:
    opts = PricingOptions(max_mem_gib=max_mem, memoize=memo)
    ctx = planner.context(
        planner.model(model),
        planner.device("h100"),
        n,
        Job(global_batch_size=gbs, seq_length=seq, **job),
        options=opts,
    )
    return ctx, opts


def as_candidate(d: dict) -> tuple[int, ...]:
    """The candidate tuple back from ``candidate_dict``."""
    v = dict(d)
    v["sp"] = int(d["sp"])
    v["offload_optimizer"] = int(d["offload_optimizer"])
    v["recompute"] = RECOMPUTES.index(d["recompute"])
    v["schedule"] = SCHEDULES.index(d["schedule"])
    if "split" in d and isinstance(d["split"], str):  # how layers split over chunks
        v["split"] = core_search.SPLITS.index(d["split"])
    return tuple(v[f] for f in FIELDS)


def layout_of(c: tuple[int, ...], ctx: PricingContext) -> Layout:
    """``candidate_layout``, with the context's layer splits (uneven splits)."""
    return candidate_layout(c, ctx.layer_splits)


def moe_shape(ctx: PricingContext) -> tuple[int | None, int | None]:
    for kind in ctx.model.kinds:
        if isinstance(kind.ffn, MoEFFN):
            return kind.ffn.num_experts, kind.ffn.expert_intermediate_size
    return None, None


class Recorder:
    """An in-test debug sink: the records in the order the search emits them."""

    def __init__(self) -> None:
        self.records: list[tuple[str, dict, object]] = []

    def open(self, directory) -> None:
        pass

    def memory(self, candidate, parts) -> None:
        self.records.append(("memory", dict(candidate), dict(parts)))

    def time(self, candidate, parts) -> None:
        self.records.append(("time", dict(candidate), dict(parts)))

    def refusal(self, candidate, reason) -> None:
        self.records.append(("refusal", dict(candidate), reason))

    def close(self) -> None:
        pass

    def reasons(self) -> Counter:
        return Counter(r for kind, _, r in self.records if kind == "refusal")


# ----------------------------------------------------------------------------- the loop nest


def test_divisors_are_every_divisor_in_order() -> None:
    for n in (1, 2, 12, 36, 64, 97, 360, 2048):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


def check_valid(ctx: PricingContext, c: tuple[int, ...]) -> None:
    """Every rule of spec/search.md § Candidates, checked on one generated candidate."""
    f = dict(zip(FIELDS, c, strict=True))
    tp, pp, cp, dp, ep, etp, vpp = (f[k] for k in ("tp", "pp", "cp", "dp", "ep", "etp", "vpp"))
    mbs, m, zero, sp, offload = (
        f[k] for k in ("mbs", "num_microbatches", "zero", "sp", "offload_optimizer")
    )
    rec, sched, split = f["recompute"], f["schedule"], f["split"]
    uneven = split == core_search.SPLITS.index("embedding+loss as layers")
    n, gbs, seq = ctx.cluster.num_devices, ctx.job.global_batch_size, ctx.job.seq_length
    heads, kv = ctx.model.head_count_for_tp
    layers = ctx.model.num_layers
    experts, expert_width = moe_shape(ctx)
    assert tp * pp * cp * dp == n, c
    assert dp * mbs * m == gbs, c
    assert tp <= ctx.cluster.scale_up_domain, c
    assert heads % tp == 0 and (kv % tp == 0 or tp % kv == 0), c
    for kind in ctx.model.kinds:
        if not isinstance(kind.ffn, MoEFFN):
            assert kind.ffn.intermediate_size % tp == 0, c
    assert pp <= layers, c
    assert cp == 1 or seq % (2 * cp) == 0, c
    schedule = SCHEDULES[sched]
    if pp == 1:
        assert (vpp, schedule) == (1, "1f1b"), c
    if vpp > 1:
        assert schedule == "interleaved", c
        assert m % pp == 0, c
        # an even split, or (where the framework allows) embedding, loss and MTP as a layer
        # each, or an MTP model's room for MTP and the loss on the last chunk
        held = 1 + 2 * ctx.model.num_mtp_layers if ctx.model.num_mtp_layers else 0
        even = layers % (pp * vpp) == 0 or (held and (layers + held) % (pp * vpp) == 0)
        if uneven:
            assert_head_counted(ctx, pp, vpp, layout_of(c, ctx).layers_per_stage, c)
        elif split == core_search.SPLITS.index("balanced"):  # beside either, at no vpp of its own
            own = core_search.SPLITS.index("embedding+loss as layers")
            assert even or layout_of((*c[:-1], own), ctx).layers_per_stage is not None, c
        else:
            assert even, c
    else:
        assert schedule != "interleaved" and not uneven, c
    if split == core_search.SPLITS.index("balanced"):
        # only where layers may sit unevenly, on a pipeline, and it is a split of its own
        assert ctx.framework.uneven_pipeline and pp > 1 and schedule != "dualpipev", c
        counts = layout_of(c, ctx).layers_per_stage
        assert counts is not None and sum(counts) == layers and len(counts) == pp * vpp, c
    if experts is None:
        assert (ep, etp) == (1, tp), c
    else:
        assert experts % ep == 0 and (dp * cp * tp) % (ep * etp) == 0, c
        assert expert_width % etp == 0, c
        if tp > 1 and ctx.framework.name == "megatron":
            assert sp, c  # Megatron's MoE needs SP with TP
    assert zero in ctx.framework.zero_stages, c
    assert not sp or tp > 1, c
    assert RECOMPUTES[rec] in ("none", "selective", "full", "auto") and offload in (0, 1)


def even_vpps(layers: int, pp: int, mtp: int = 0) -> list[int]:
    """VPPs whose chunks split exactly the layers, or the layers with the embedding, the
    loss and the MTP blocks as a layer each, or (MTP models) the layers with the last
    chunk's room for the MTP blocks and the loss (two layers each, one more)."""
    held = 1 + 2 * mtp if mtp else 0

    def exact(slots: int, chunks: int, last: int) -> bool:
        return slots % chunks == 0 and slots // chunks >= last

    return [
        v
        for v in range(2, layers + held + 3)
        if layers % (pp * v) == 0
        or (held and exact(layers + held, pp * v, held))
        or exact(layers + 2 + mtp, pp * v, 1 + mtp)
    ]


def assert_head_counted(
    ctx: PricingContext, pp: int, vpp: int, counts, c, listed: bool = False
) -> None:
    """Counting the embedding, the loss and each MTP block as a layer each, the chunks hold
    equal slots or one fewer, no stage is more than one slot lighter than the fullest,
    and a split that is not exact is offered only at a depth where no VPP splits the
    layers exactly (or the user ``listed`` VPPs)."""
    layers, chunks, mtp = ctx.model.num_layers, pp * vpp, ctx.model.num_mtp_layers
    assert counts is not None and len(counts) == chunks and sum(counts) == layers, c
    slots = list(counts)
    slots[0] += 1
    slots[-1] += 1 + mtp
    assert max(slots) - min(slots) <= 1, c
    stages = [sum(slots[s::pp]) for s in range(pp)]
    assert max(stages) - min(stages) <= 1, c
    if (layers + 2 + mtp) % chunks:
        assert listed or not even_vpps(layers, pp, mtp), c
    else:  # exact: every chunk holds the same slots
        assert len(set(slots)) == 1, c


@pytest.mark.parametrize(
    ("model", "n", "gbs", "seq"),
    [
        ("dense", 16, 12, 2050),
        ("moe", 8, 8, 2048),
        ("llama-3-8b", 16, 64, 4096),
        ("mixtral-8x7b", 16, 32, 4096),
        ("deepseek-v2-lite", 8, 16, 4096),
    ],
)
def test_the_loop_nest_builds_only_valid_candidates_and_counts_every_refusal(
    planner, tiny, model, n, gbs, seq
) -> None:
    ctx, _ = make_ctx(planner, tiny.get(model, model), n, gbs, seq)
    space = SearchSpace(recompute=("auto", "none"), schedule=tuple(ctx.framework.schedules))
    enum = enumerate_candidates(ctx, space, record=True)
    assert enum.candidates
    assert len(set(enum.candidates)) == len(enum.candidates), "a candidate generated twice"
    for c in enum.candidates:
        check_valid(ctx, c)
    # Every generated candidate is either kept or refused under exactly one named reason.
    assert enum.generated == sum(enum.refused.values()) + len(enum.candidates)
    assert Counter(reason for _, reason in enum.refusals) == enum.refused
    assert all(isinstance(r, str) and r for r in enum.refused)


def test_the_loop_nest_misses_no_valid_layout(planner) -> None:
    """Against a brute force over every integer degree and micro-batch size."""
    n, gbs, seq = 16, 32, 4096
    ctx, _ = make_ctx(planner, "llama-3-8b", n, gbs, seq)
    space = SearchSpace(
        zero=(1,), offload_optimizer=(False,), recompute=("none",), vpp=(1,), sp=(True,)
    )
    got = {(c[0], c[1], c[2], c[3], c[7]) for c in enumerate_candidates(ctx, space).candidates}
    heads, kv = ctx.model.head_count_for_tp
    want = set()
    for tp, pp, cp in itertools.product(range(1, n + 1), repeat=3):
        if n % (tp * pp * cp):
            continue
        dp = n // (tp * pp * cp)
        if tp > 8 or heads % tp or (kv % tp and tp % kv) or 14336 % tp:
            continue
        if pp > ctx.model.num_layers or (cp > 1 and seq % (2 * cp)):
            continue
        want |= {(tp, pp, cp, dp, mbs) for mbs in range(1, gbs + 1) if gbs % (dp * mbs) == 0}
    assert got == want


def test_fixed_and_listed_values_are_all_that_is_generated(planner) -> None:
    ctx, _ = make_ctx(planner, "llama-3-8b", 16, 64, 4096)
    enum = enumerate_candidates(ctx, SearchSpace(tp=(8,)))
    assert enum.candidates and {c[0] for c in enum.candidates} == {8}
    space = SearchSpace(tp=(2, 4), pp=(1, 2), mbs=(2,), zero=(3,), recompute=("full",))
    enum = enumerate_candidates(ctx, space)
    assert {(c[0], c[1]) for c in enum.candidates} == {(2, 1), (2, 2), (4, 1), (4, 2)}
    assert {(c[7], c[9], RECOMPUTES[c[12]]) for c in enum.candidates} == {(2, 3, "full")}


def _dp(d: dict, n: int) -> int:
    return d.get("dp") or n // (d["tp"] * d["pp"] * d["cp"])


# (model, devices, gbs, seq, reason, what every refused record shows, the same for candidates)
REASONS = [
    ("dense", 16, 12, 2050, "tp_beyond_scale_up_domain", lambda d, n: d["tp"] > 8),
    ("dense", 16, 12, 2050, "tp_not_dividing_heads", lambda d, n: 12 % d["tp"] != 0),
    ("dense", 16, 12, 2050, "tp_not_dividing_ffn", lambda d, n: 1002 % d["tp"] != 0),
    ("dense", 16, 12, 2050, "pp_exceeds_layers", lambda d, n: d["pp"] > 4),
    ("dense", 16, 12, 2050, "cp_not_dividing_sequence", lambda d, n: 2050 % (2 * d["cp"]) != 0),
    ("dense", 16, 12, 2050, "batch_not_divisible_by_dp", lambda d, n: 12 % _dp(d, n) != 0),
    (
        "llama-3-8b",
        16,
        24,
        2048,
        "interleaved_needs_microbatches_multiple_of_pp",
        lambda d, n: d["num_microbatches"] % d["pp"] != 0 and d.get("vpp", 2) > 1,
    ),
    ("moe", 8, 8, 2048, "moe_tp_needs_sp", lambda d, n: d["tp"] > 1 and not d["sp"]),
    (
        "moe",
        8,
        8,
        2048,
        "ep_etp_not_dividing_group",
        lambda d, n: (_dp(d, n) * d["cp"] * d["tp"]) % (d["ep"] * d["etp"]) != 0,
    ),
    ("moe", 8, 8, 2048, "etp_not_dividing_expert_ffn", lambda d, n: 250 % d["etp"] != 0),
]


@pytest.mark.parametrize(("model", "n", "gbs", "seq", "reason", "shows"), REASONS)
def test_each_refusal_is_counted_under_its_name_and_means_what_it_says(
    planner, tiny, model, n, gbs, seq, reason, shows
) -> None:
    ctx, _ = make_ctx(planner, tiny.get(model, model), n, gbs, seq)
    # A free expert TP always takes a value the group allows (free_etp): only listed
    # values can break the group rule.
    etp = (1, 2, 4, 8) if reason == "ep_etp_not_dividing_group" else None
    space = SearchSpace(recompute=("auto",), etp=etp, sp=None)
    enum = enumerate_candidates(ctx, space, record=True)
    refused = [d for d, r in enum.refusals if r == reason]
    assert enum.refused[reason] == len(refused) > 0
    for degrees in refused:
        assert shows(degrees, n), (reason, degrees)
    # ... and nothing it should have refused got through.
    for c in enum.candidates:
        d = dict(zip(FIELDS, c, strict=True))
        if reason == "moe_tp_needs_sp":
            d["sp"] = bool(d["sp"])
        if reason == "interleaved_needs_microbatches_multiple_of_pp":
            assert not (d["vpp"] > 1 and d["num_microbatches"] % d["pp"]), c
            continue
        assert not shows(d, n), (reason, c)


def test_a_free_expert_tp_follows_tp_and_folds_where_ep_spans_the_tp_ranks(planner, tiny) -> None:
    """The spec carves EP out of dp·cp·tp: an EP wider than dp·cp reaches into the TP
    group, so the experts fold over the TP ranks with a smaller expert TP (1 at full span,
    as NVIDIA's Qwen3 235B recipes run TP 2 with ETP 1). Before, expert TP stayed at TP and
    every such EP was refused (ep_etp_not_dividing_group)."""
    ctx, _ = make_ctx(planner, tiny["moe"], 8, 8, 2048)
    space = SearchSpace(recompute=("auto",), sp=None)
    enum = enumerate_candidates(ctx, space, record=True)
    assert "ep_etp_not_dividing_group" not in enum.refused
    seen = set()
    for c in enum.candidates:
        d = dict(zip(FIELDS, c, strict=True))
        group = d["dp"] * d["cp"] * d["tp"]
        if d["ep"] * d["tp"] <= d["dp"] * d["cp"] * d["tp"] and group % (d["ep"] * d["tp"]) == 0:
            assert d["etp"] == d["tp"], d  # room for the experts at TP's own width: kept
        else:
            assert d["etp"] < d["tp"] and group % (d["ep"] * d["etp"]) == 0, d
            # ... the widest expert TP that leaves the EP room
            assert group % (d["ep"] * d["etp"] * 2) != 0 or d["tp"] % (d["etp"] * 2) != 0, d
        seen.add((d["tp"], d["dp"] * d["cp"], d["ep"], d["etp"]))
    # tp 2, dp 4 (8 devices): ep 8 folds to expert TP 1, ep 4 keeps TP's 2
    assert (2, 4, 8, 1) in seen and (2, 4, 4, 2) in seen
    assert len({k[:3] for k in seen}) == len(seen)  # one expert TP per (tp, dp·cp, ep)


# ----------------------------------------------------------------------------- bounds


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_bounds_never_exceed_the_priced_step_time(planner, zero: int) -> None:
    """Bounding is only exact if the cheap bound ≤ the cost model's step floor ≤ the
    exact bound ≤ the step time for every candidate, every schedule (1F1B/GPipe and
    interleaved/DualPipeV formulas). The floor adds the optimizer step and overhead, and
    the data-parallel traffic (per step, or ZeRO-3's per micro-batch) no stage hides.
    Where every layer at its fastest overflows, the exact bound claims the least
    recompute time that saves the excess, and rises above the all-fastest step."""
    ctx, opts = make_ctx(planner, "llama-3-8b", 8, 32, 4096, max_mem=30)
    space = SearchSpace(
        recompute=("auto", "full"),
        zero=(zero,),
        offload_optimizer=(False,),
        schedule=tuple(ctx.framework.schedules),
    )
    outcome = planner.search(ctx, space, top_k=5, options=opts, bounding=False, collect_parts=True)
    assert outcome.result.summary.bounded == 0
    seen = Counter()
    fresh, _ = make_ctx(planner, "llama-3-8b", 8, 32, 4096, max_mem=30)
    pricing = SearchPricing(planner.pricer(fresh, opts))
    for d, priced in outcome.ranking:
        c = as_candidate(d)
        quick = pricing.quick_bound(c)
        floor = pricing.floor_bound(c, quick)
        (screened,) = pricing.screen([c])
        assert screened.fits
        tol = 1e-12 * priced.step_s
        assert quick < floor <= screened.bound_s + tol, (d, quick, floor, screened.bound_s)
        # The floor adds at least the optimizer step and overhead the step itself
        # charges, and more where there is data-parallel traffic to hide.
        fixed = priced.time_parts["optimizer"] + priced.time_parts["overhead"]
        assert priced.time_parts["overhead"] > 0
        assert floor - quick >= fixed * (1 - 1e-9), (d, floor - quick, fixed)
        seen["traffic_floor"] += floor - quick > fixed * (1 + 1e-9)
        assert screened.bound_s <= priced.step_s + tol, (d, screened.bound_s, priced.step_s)
        seen[d["schedule"]] += 1
        if d["recompute"] == "auto":
            layout = candidate_layout(c, fresh.layer_splits)
            fastest = pricing.pricer.price(layout.model_copy(update={"recompute": "none"}))
            if screened.bound_s > fastest.time.step_s + tol:
                seen["raised"] += 1
                assert not fastest.fits and zero < 3
    assert set(seen) >= {"1f1b", "interleaved"} | (
        {"gpipe"} if "gpipe" in ctx.framework.schedules else set()
    )
    assert (seen["raised"] > 0) == (zero < 3)
    # ZeRO-0 fits 30 GiB only unreplicated (dp = cp = 1): nothing to reduce.
    assert (seen["traffic_floor"] > 0) == (zero > 0)


def test_the_recompute_bound_saves_the_excess_cheapest_first_and_stays_below_the_knapsack(
    planner,
) -> None:
    """Where every layer at its fastest overflows a stage, the bound claims the least time
    of saving the excess with options taken fractionally: the cheapest savings (the
    norms) as far as they go, then the dearer ones (a whole FFN, full recompute). That is
    at least the single cheapest rate for every byte (the looser bound it replaced) and
    at most what the knapsack's own choice adds to the stage."""
    ctx, opts = make_ctx(planner, "llama-3-8b", 8, 32, 4096, max_mem=30)
    pricer = planner.pricer(ctx, opts)
    space = SearchSpace(recompute=("auto",), zero=(1,), offload_optimizer=(False,))
    tighter = checked = 0
    for c in core_search.enumerate_candidates(ctx, space, ()).candidates:
        layout = candidate_layout(c, ctx.layer_splits)
        auto = pricer.price(layout)
        kept = layout.model_copy(update={"recompute": "none"})
        fastest = pricer.price(kept)
        if not auto.fits or fastest.fits:
            continue
        for i, stage in enumerate(fastest.stages):
            excess = fastest.static_totals[i] + fastest.activations[i] - ctx.budget_bytes
            if excess <= 0:
                continue
            segments = pricer._saving_segments(layout, stage)
            rates = [rate for rate, _ in segments]
            assert rates == sorted(rates)
            claimed = pricer._least_saving_time(layout, stage, excess)
            single_rate = excess * rates[0]
            added = sum(auto.stage_seconds[i].values()) - sum(fastest.stage_seconds[i].values())
            assert single_rate <= claimed * (1 + 1e-12)
            assert claimed <= added * (1 + 1e-9), (c, i, claimed, added)
            tighter += claimed > single_rate * (1 + 1e-6)
            checked += 1
    assert checked > 20 and tighter > 0


def test_bounds_follow_the_cost_models_own_overhead(planner) -> None:
    """The fixed overhead in the bounds is the one the cost model charges, not the
    context's calibration's: a plugged-in or differently calibrated model may charge
    less, and a bound that took the calibration's rose above the step itself, so
    bounding could skip layouts that belong in the top K."""
    from ndplan.core.performance import NdplanCostModel
    from ndplan.core.pricing import Pricer

    ctx, opts = make_ctx(planner, "llama-3-8b", 8, 32, 4096, max_mem=30)
    shipped = planner.pricer(ctx, opts)
    own = NdplanCostModel(ctx.calibration)  # charges the shipped 0.09 s overhead
    ctx.calibration = ctx.calibration.model_copy(update={"step_overhead_s": 30.0})
    pricing = SearchPricing(Pricer(ctx, shipped.memory, own, shipped.solver))
    candidates = core_search.enumerate_candidates(ctx, SearchSpace(), ()).candidates
    checked = 0
    for c in candidates[:: max(1, len(candidates) // 1000)]:
        priced = pricing.pricer.price(candidate_layout(c, ctx.layer_splits))
        if not priced.fits:
            continue
        quick = pricing.quick_bound(c)
        floor = pricing.floor_bound(c, quick)
        (screened,) = pricing.screen([c])
        tol = 1e-12 * priced.time.step_s
        assert quick <= floor <= screened.bound_s + tol <= priced.time.step_s + 2 * tol, c
        checked += 1
    assert checked > 100


def test_quick_bounds_of_a_batch_are_each_candidates_own(planner) -> None:
    """The batch form, which looks a layer sum up once per layer key, gives every
    candidate the very float the one-candidate form gives, in order."""
    ctx, opts = make_ctx(planner, "llama-3-8b", 16, 64, 4096)
    candidates = core_search.enumerate_candidates(ctx, SearchSpace(), ()).candidates
    assert len(candidates) > 100
    batch = SearchPricing(planner.pricer(ctx, opts)).quick_bounds(candidates)
    fresh, _ = make_ctx(planner, "llama-3-8b", 16, 64, 4096)
    one = SearchPricing(planner.pricer(fresh, opts))
    assert batch == [one.quick_bound(c) for c in candidates]


@pytest.mark.parametrize(
    ("model", "job"),
    [("llama-3-8b", {}), ("qwen3-30b-a3b", {"moe_a2a_overlap": True})],
    ids=["dense", "moe-a2a-overlap"],
)
def test_quick_bounds_equal_the_unmemoised_ones(planner, model: str, job: dict) -> None:
    """W is memoised twice (on the degrees within a batch, and in the shared cache); each
    candidate's bound must be the one computed with no memo at all. A key that leaves
    out an input W reads hands one candidate another's W: under the combined 1F1B
    schedule a layer's time moves with the unpaired share, which pp, vpp and m set, so
    dropping it from the keys fails here (bounding tests alone may not notice, as long
    as the wrong bound stays below the K-th step)."""
    ctx, opts = make_ctx(planner, model, 16, 64, 4096, **job)
    candidates = core_search.enumerate_candidates(ctx, SearchSpace(), ()).candidates
    assert len(candidates) > 100
    batch = SearchPricing(planner.pricer(ctx, opts)).quick_bounds(candidates)
    cold, cold_opts = make_ctx(planner, model, 16, 64, 4096, memo=False, **job)
    unmemoised = SearchPricing(planner.pricer(cold, cold_opts))
    sample = range(0, len(candidates), max(1, len(candidates) // 400))
    assert [batch[i] for i in sample] == [unmemoised.quick_bound(candidates[i]) for i in sample]
    if job:  # the case exercises the share: several per layer degrees, so keys must hold it
        shares: dict[tuple, set] = {}
        for c in candidates:
            d = dict(zip(FIELDS, c, strict=True))
            degrees = (d["tp"], d["cp"], d["ep"], d["etp"], d["mbs"], d["schedule"])
            shares.setdefault(degrees, set()).add(unmemoised._unpaired_share(c))
        assert max(len(s) for s in shares.values()) > 2


def test_a_quick_bound_failure_names_its_candidate(planner) -> None:
    """The bound pass prices every candidate's layers in the main process; a cost model
    that raises there is named with the candidate, as in the screen and the pricing."""
    from ndplan.adapters.executors.faults import GuardedPricing, describe_candidate
    from ndplan.core.errors import InternalError
    from ndplan.core.pricing import Pricer

    ctx, opts = make_ctx(planner, "llama-3-8b", 16, 64, 4096)
    pricer = planner.pricer(ctx, opts)
    # Enumerated with the working cost model (which weighs the balanced split's head).
    candidates = core_search.enumerate_candidates(ctx, SearchSpace(), ()).candidates

    class Raising(type(pricer.cost)):
        def layer_seconds(self, ctx, layout, kind, recompute):
            if layout.tp == 4 and layout.cp == 2:
                raise ValueError("no tp 4 with cp 2")
            return super().layer_seconds(ctx, layout, kind, recompute)

    pricer = Pricer(ctx, pricer.memory, Raising(ctx.calibration), pricer.solver)
    first = next(c for c in candidates if c[0] == 4 and c[2] == 2)
    with pytest.raises(InternalError) as caught:
        GuardedPricing(SearchPricing(pricer)).quick_bounds(candidates)
    assert str(caught.value).startswith(f"candidate {describe_candidate(first)}: internal error")
    assert "ValueError: no tp 4 with cp 2" in str(caught.value)


def test_a_head_weighing_failure_in_the_enumeration_is_named(planner) -> None:
    """The enumeration asks the cost model for the output layer's weight (the balanced
    split); a cost model raising there is named with the degrees and classified, not left
    as a traceback."""
    from ndplan.adapters.executors.faults import GuardedPricing
    from ndplan.core.errors import InternalError
    from ndplan.core.pricing import Pricer

    ctx, opts = make_ctx(planner, "llama-3-8b", 16, 64, 4096)
    pricer = planner.pricer(ctx, opts)

    class Raising(type(pricer.cost)):
        def layer_seconds(self, ctx, layout, kind, recompute):
            if layout.pp == 4:
                raise ValueError("no pp 4")
            return super().layer_seconds(ctx, layout, kind, recompute)

    raising = Pricer(ctx, pricer.memory, Raising(ctx.calibration), pricer.solver)
    GuardedPricing(SearchPricing(raising))
    with pytest.raises(InternalError) as caught:
        core_search.enumerate_candidates(ctx, SearchSpace(), ())
    line = str(caught.value)
    assert line.startswith("weighing the output layer at tp=") and " pp=4 " in line
    assert "internal error: ValueError: no pp 4" in line


# ----------------------------------------------------------------------------- accounting


def layout_key(candidate: dict) -> tuple:
    """A priced candidate as the ranking counts it: its layout, whatever its layer split."""
    return tuple(sorted((k, v) for k, v in candidate.items() if k != "split"))


ACCOUNTING = [
    # model, devices, gbs, seq, max-mem, space, bounding
    ("llama-3-8b", 8, 32, 4096, 30, SearchSpace(recompute=("auto",)), True),
    ("llama-3-8b", 8, 32, 4096, 30, SearchSpace(recompute=("auto",), zero=(1,)), False),
    ("llama-3-70b", 8, 16, 4096, None, SearchSpace(recompute=("none", "full")), True),
    ("mixtral-8x7b", 8, 16, 4096, None, SearchSpace(recompute=("auto",)), True),
    ("deepseek-v2-lite", 8, 16, 4096, 40, SearchSpace(recompute=("selective",)), True),
]


@pytest.mark.parametrize(("model", "n", "gbs", "seq", "max_mem", "space", "bounding"), ACCOUNTING)
def test_every_generated_candidate_is_accounted_for_once(
    planner, model, n, gbs, seq, max_mem, space, bounding
) -> None:
    """From the code: generated = Σ refused + |candidates|, and each candidate is either
    over memory at the screen, never examined (bounded), or priced — and a priced one
    that does not fit is counted over memory too. So, exactly,
        generated = Σ refused + over_memory + bounded + (priced − priced over memory).
    Pricing never finds an overflow the screen missed, so the summary's plain sum
    generated = Σ refused + over_memory + bounded + priced holds, and the priced that fit
    are the priced; the ranking (``outcome.ranking``) holds each of their layouts once,
    at its faster layer split."""
    ctx, opts = make_ctx(planner, model, n, gbs, seq, max_mem=max_mem)
    rec = Recorder()
    outcome = planner.search(ctx, space, top_k=5, options=opts, bounding=bounding, sinks=[rec])
    s = outcome.result.summary
    assert s.generated == sum(s.refused.values()) + s.over_memory + s.bounded + s.priced
    assert s.priced > 0 and (s.bounded > 0) == bounding  # each case really prunes, or not
    # The same accounting, record by record (the sinks see every one).
    reasons = rec.reasons()
    assert {r: reasons[r] for r in s.refused} == s.refused
    assert sum(v for r, v in reasons.items() if r.startswith("over_memory (")) == s.over_memory
    assert reasons["bounded"] == s.bounded
    assert sum(reasons.values()) == sum(s.refused.values()) + s.over_memory + s.bounded
    memory_rows = [c for kind, c, _ in rec.records if kind == "memory"]
    time_rows = [c for kind, c, _ in rec.records if kind == "time"]
    assert len(memory_rows) == s.priced and memory_rows == time_rows
    assert len({tuple(sorted(c.items())) for c in memory_rows}) == s.priced
    ranked = {tuple(sorted(d.items())) for d, _ in outcome.ranking}
    assert ranked <= {tuple(sorted(c.items())) for c in memory_rows}
    assert len(outcome.ranking) == len({layout_key(c) for c in memory_rows})
    by_candidate = {
        (layout_key(c), c["split"]): parts["step"]
        for kind, c, parts in rec.records
        if kind == "time"
    }
    for d, p in outcome.ranking:  # the ranked split is its layout's fastest
        splits = [c for c in memory_rows if layout_key(c) == layout_key(d)]
        assert all(by_candidate[layout_key(c), c["split"]] >= p.step_s for c in splits)


# ----------------------------------------------------------------------------- ranking


def test_the_ranking_is_by_step_then_peak_then_degrees_and_plans_match_estimate(planner) -> None:
    ctx, opts = make_ctx(planner, "llama-3-70b", 8, 31, 4096)  # dp 1 only: many near-ties
    outcome = planner.search(ctx, SearchSpace(recompute=("auto",)), top_k=8, options=opts)
    keys = [(p.step_s, p.peak_bytes, tie_key(as_candidate(d))) for d, p in outcome.ranking]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    plans = outcome.result.plans
    assert [p.rank for p in plans] == list(range(1, 9))
    for plan, (d, priced) in zip(plans, outcome.ranking, strict=False):
        dumped = plan.layout.model_dump()
        assert {k: dumped[k] for k in d if k in dumped} == {k: d[k] for k in d if k in dumped}
        assert set(d) - set(dumped) <= {"split"}
        assert plan.time.step_s == priced.step_s
        assert plan.memory.peak_bytes == priced.peak_bytes
        assert plan.memory.fits
    # A plan is what `estimate` prices for its layout (fresh caches).
    fresh, _ = make_ctx(planner, "llama-3-70b", 8, 31, 4096)
    for plan in plans[:3]:
        again = planner.estimate(fresh, plan.layout, opts)
        assert again.time.step_s == plan.time.step_s
        assert again.memory == plan.memory
        assert again.recompute == plan.recompute


def test_the_same_search_twice_gives_the_same_result(planner) -> None:
    runs = []
    for _ in range(2):
        ctx, opts = make_ctx(planner, "qwen3-30b-a3b", 8, 16, 4096, max_mem=70)
        out = planner.search(ctx, SearchSpace(recompute=("auto",)), top_k=5, options=opts)
        runs.append(out)
    a, b = (r.result.model_dump(exclude={"summary": {"seconds"}}) for r in runs)
    assert a == b
    assert [d for d, _ in runs[0].ranking] == [d for d, _ in runs[1].ranking]


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_paused_during_a_search_and_restored_after(
    planner, tiny, enabled_before: bool
) -> None:
    """The search runs with the cyclic collector off (it only slowed the search) and
    leaves it as it found it, also when the search raises."""
    seen = []
    was = gc.isenabled()
    try:
        (gc.enable if enabled_before else gc.disable)()
        ctx, opts = make_ctx(planner, tiny["dense"], 16, 32)
        planner.search(
            ctx,
            SearchSpace(),
            top_k=3,
            options=opts,
            progress=lambda *_: seen.append(gc.isenabled()),
        )
        assert seen and not any(seen)
        assert gc.isenabled() is enabled_before
        with core_search.collector_paused():
            with core_search.collector_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer pause still holds
        assert gc.isenabled() is enabled_before
        ctx, opts = make_ctx(planner, tiny["dense"], 16, 32, max_mem=0.01)
        with pytest.raises(InfeasibleError):
            planner.search(ctx, SearchSpace(), top_k=3, options=opts)
        assert gc.isenabled() is enabled_before
    finally:
        (gc.enable if was else gc.disable)()


def test_progress_is_reported_from_the_start_phase_by_phase_and_changes_nothing(
    planner, monkeypatch
) -> None:
    """The progress hook hears of the enumeration, then of the quick bounds chunk by
    chunk, then of the candidates settled in bound order (taken, or ruled out by the
    K-th best plan's bound), so a terminal's bar moves from the first second
    (DeepSeek-V3 on 2,048 devices was silent for 9 s of 15: until its first candidate
    was priced) and fills as the search ends. The result is the same with or without
    it."""
    monkeypatch.setattr(core_search, "QUICK_CHUNK", 1000)  # several chunks on this problem
    calls: list[tuple[str, int, int]] = []
    ctx, opts = make_ctx(planner, "llama-3-8b", 64, 256, 4096)
    heard = planner.search(
        ctx, SearchSpace(), top_k=5, options=opts, progress=lambda *a: calls.append(a)
    )
    ctx, opts = make_ctx(planner, "llama-3-8b", 64, 256, 4096)
    silent = planner.search(ctx, SearchSpace(), top_k=5, options=opts)
    exclude = {"summary": {"seconds"}}
    assert heard.result.model_dump(exclude=exclude) == silent.result.model_dump(exclude=exclude)

    phases = [phase for phase, _, _ in calls]
    assert phases[0] == "enumerate"
    runs = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert runs == ["enumerate", "bound", "price"]
    by_phase = {p: [(d, t) for q, d, t in calls if q == p] for p in runs}
    summary = heard.result.summary
    examined = summary.generated - sum(summary.refused.values())
    enumerate_total = {t for _, t in by_phase["enumerate"]}
    assert len(enumerate_total) == 1 and by_phase["enumerate"][0][0] == 0
    assert all(d < t for d, t in by_phase["enumerate"])
    bound = by_phase["bound"]
    assert [d for d, _ in bound] == [min(examined, 1000 * k) for k in range(1, len(bound) + 1)]
    assert {t for _, t in bound} == {examined} and len(bound) > 2
    # Candidates settled: taken, or ruled out by the K-th best's bound; it fills.
    done = [d for d, _ in by_phase["price"]]
    assert done == sorted(done) and done[0] > 0 and done[-1] == examined
    assert done[-2] > summary.priced + summary.over_memory  # ruled-out ones count
    assert {t for _, t in by_phase["price"]} == {examined}


# ----------------------------------------------------------------------------- no plan


def _over(record_reason: str) -> tuple[int, float]:
    m = re.fullmatch(r"over_memory \(stage (\d+) by (\d+\.\d\d) GiB\)", record_reason)
    assert m, record_reason
    return int(m.group(1)), float(m.group(2))


@pytest.mark.parametrize("policies", [("auto",), ("none", "selective")])
def test_over_memory_records_and_the_closest_miss_match_pricing(planner, policies) -> None:
    """Each "over_memory (stage k by X GiB)" is what pricing the layout gives (at full
    recompute when RECOMPUTE is searched, else as stated), and the error names the
    smallest miss, with enough of the layout to price it again."""
    ctx, opts = make_ctx(planner, "llama-3-70b", 8, 16, 4096, max_mem=12)
    rec = Recorder()
    space = SearchSpace(recompute=policies, mbs=(1,), vpp=(1,), cp=(1, 2))
    with pytest.raises(InfeasibleError) as err:
        planner.search(ctx, space, top_k=3, options=opts, sinks=[rec])
    over = [(c, r) for kind, c, r in rec.records if kind == "refusal" and r.startswith("over_")]
    assert over and not [r for kind, _, r in rec.records if kind == "memory"]
    fresh, _ = make_ctx(planner, "llama-3-70b", 8, 16, 4096, max_mem=12)
    pricer = planner.pricer(fresh, opts)
    best = None
    for candidate, reason in over:
        stage, by = _over(reason)
        layout = layout_of(as_candidate(candidate), fresh)
        if layout.recompute == "auto":
            layout = layout.model_copy(update={"recompute": "full"})
        priced = pricer.price(layout)
        over_bytes = priced.peak_bytes - fresh.budget_bytes
        assert not priced.fits
        assert (priced.peak_stage, f"{over_bytes / GiB:.2f}") == (stage, f"{by:.2f}"), candidate
        if best is None or over_bytes < best[0]:
            best = (over_bytes, stage, candidate)
    message = str(err.value)
    assert "\n" not in message
    over_bytes, stage, candidate = best
    assert f"is over by {over_bytes / GiB:.2f} GiB on stage {stage}" in message
    m = re.search(r"closest: (.*) \((.*)\) is over", message)
    assert m, message
    degrees = dict(zip(m.group(1).split()[::2], map(int, m.group(1).split()[1::2]), strict=True))
    assert degrees == {k: candidate[k] for k in degrees}
    assert set(degrees) >= {"tp", "pp", "vpp", "cp", "dp", "ep", "etp", "mbs", "zero"}
    extras = m.group(2).split(", ")
    assert extras[0] == f"sp {'on' if candidate['sp'] else 'off'}"
    assert extras[1] == candidate["schedule"]
    policy = "full" if candidate["recompute"] == "auto" else candidate["recompute"]
    assert extras[2] == f"recompute {policy}"
    assert ("optimizer offloaded" in extras) == candidate["offload_optimizer"]
    assert ("even with full recompute" in message) == (policies == ("auto",))


@pytest.mark.parametrize(
    ("model", "n", "gbs", "space"),
    [
        ("llama-3-8b", 8, 7, SearchSpace(dp=(2,))),  # a prime batch, dp fixed
        ("llama-3-8b", 8, 4, SearchSpace(tp=(1,), pp=(1,), cp=(1,))),  # dp 8 > gbs 4
        # tp 16 is refused (beyond the scale-up domain) before the batch check: this
        # exited 1, "no layout survived the refusal rules".
        ("llama-3-8b", 16, 7, SearchSpace(dp=(2,))),
        # only tp 1 divides 25 heads: the reachable list offered 3 itself (via dp 1).
        ("gpt2-xl", 8, 3, SearchSpace(pp=(1,), cp=(1,))),
        # dp 64: the list of reachable batches was empty.
        ("llama-3-8b", 64, 7, SearchSpace(tp=(1,), pp=(1,), cp=(1,))),
    ],
)
def test_an_unreachable_batch_is_invalid_input_listing_reachable_ones(
    planner, model, n, gbs, space
) -> None:
    ctx, opts = make_ctx(planner, model, n, gbs)
    with pytest.raises(InvalidInputError) as err:
        planner.search(ctx, space, options=opts)
    message = str(err.value)
    assert "\n" not in message and f"global batch {gbs}" in message
    listed = [int(v) for v in message.split("reachable batches near it: ")[1].split(", ")]
    assert listed and listed == sorted(listed) and gbs not in listed
    for value in listed:  # every value offered really is reachable with the same space
        ctx_v, _ = make_ctx(planner, model, n, value)
        enum = enumerate_candidates(ctx_v, space)
        assert enum.candidates, value
    # The listed values are the nearest reachable ones: none closer was left out.
    reach = (
        [
            v
            for v in range(1, max(listed) + 1)
            if enumerate_candidates(make_ctx(planner, model, n, v)[0], space).candidates
        ]
        if n <= 16
        else listed
    )
    assert sorted(reach, key=lambda v: (abs(v - gbs), v))[: len(listed)] == sorted(
        listed, key=lambda v: (abs(v - gbs), v)
    )


@pytest.mark.parametrize(
    "space", [SearchSpace(tp=(3,)), SearchSpace(dp=(16,)), SearchSpace(zero=(2,))]
)
def test_a_space_no_layout_satisfies_is_invalid_input(planner, space) -> None:
    ctx, opts = make_ctx(planner, "llama-3-8b", 8, 8)
    with pytest.raises(InvalidInputError):
        planner.search(ctx, space, options=opts)


# ----------------------------------------------------------------------------- plugins


def test_a_third_party_refusal_rule_refuses_and_is_counted_by_name(planner) -> None:
    calls = []

    def no_pipeline(layout, context):
        calls.append((type(layout), type(context)))
        return "pipelines are off limits" if layout.pp > 1 else None

    @hookimpl
    def ndplan_register_refusal_rules(registry):
        registry.add("test_no_pipeline", no_pipeline)

    plugin = types.SimpleNamespace(
        __name__="test-search-rules", ndplan_register_refusal_rules=ndplan_register_refusal_rules
    )
    ruled = Planner(bootstrap(entry_points=False, extra=[plugin]))
    assert [n for n, _ in ruled.components.refusal_rules.rules] == ["test_no_pipeline"]
    ctx, opts = make_ctx(planner, "llama-3-8b", 8, 32, 4096)
    space = SearchSpace(recompute=("auto",), zero=(1,))
    free = enumerate_candidates(ctx, space)
    with_pp = sum(1 for c in free.candidates if c[1] > 1)
    assert with_pp > 0
    ctx, opts = make_ctx(ruled, "llama-3-8b", 8, 32, 4096)
    outcome = ruled.search(ctx, space, top_k=5, options=opts)
    s = outcome.result.summary
    assert s.refused["test_no_pipeline"] == with_pp
    assert s.generated == free.generated
    assert {k: v for k, v in s.refused.items() if k != "test_no_pipeline"} == dict(free.refused)
    assert all(d["pp"] == 1 for d, _ in outcome.ranking)
    assert set(calls) == {(Layout, type(ctx))}
    assert len(calls) == len(free.candidates)  # asked once per candidate that got that far


def _csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _as_csv(row: dict, header: list[str], missing: object = "") -> dict[str, str]:
    out = {}
    for key in header:
        value = row.get(key, missing)
        out[key] = repr(value) if isinstance(value, float) else str(value)
    return out


def _merged(candidate: dict, parts: dict, kind: str) -> dict:
    return {**candidate, **{(f"{kind}.{k}" if k in candidate else k): v for k, v in parts.items()}}


def assert_same_stream(records: list[tuple[str, dict, object]], folder: Path) -> None:
    """A sink's record stream equals what the CSV sink (debug_mem/perf/refusals.csv) and
    the JSON-lines sink (debug.jsonl) wrote into ``folder``."""
    for kind, name in (("memory", "debug_mem.csv"), ("time", "debug_perf.csv")):
        rows = _csv_rows(folder / name)
        header = list(rows[0]) if rows else []
        # A part a record lacks (another stage's, another layout's traffic) is written 0.
        mine = [_as_csv(_merged(c, p, k), header, 0) for k, c, p in records if k == kind]
        assert rows == mine, name
        if rows:
            assert header[: len(FIELDS)] == list(FIELDS)
            # every field is the candidate's (a part with a field's name is prefixed)
            fields = [{f: r[f] for f in FIELDS} for r in rows]
            want = [_as_csv(c, list(FIELDS)) for k, c, _ in records if k == kind]
            assert fields == want, name
    rows = _csv_rows(folder / "debug_refusals.csv")
    header = list(rows[0])
    assert header[0] == "reason"
    mine = [_as_csv({**c, "reason": r}, header) for k, c, r in records if k == "refusal"]
    assert rows == mine
    lines = (folder / "debug.jsonl").read_text(encoding="utf-8").splitlines()
    jsonl = [json.loads(line) for line in lines]
    mine_json = [
        {"record": k, "candidate": c, "parts": p}
        if k != "refusal"
        else {"record": k, "candidate": c, "reason": p}
        for k, c, p in records
    ]
    assert jsonl == json.loads(json.dumps(mine_json))


def test_a_third_party_debug_sink_receives_what_the_builtin_sinks_write(
    planner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    search_sink = importlib.import_module("search_sink")
    components = bootstrap(entry_points=False, extra=[search_sink])
    sinks = [components.debug_sinks.get(name)() for name in ("csv", "jsonl", "recorder")]
    assert isinstance(sinks[0], CsvSink) and isinstance(sinks[1], JsonLinesSink)
    for sink in sinks:
        sink.open(tmp_path)
    planner_p = Planner(components)
    ctx, opts = make_ctx(planner_p, "llama-3-8b", 8, 32, 4096, max_mem=30)
    outcome = planner_p.search(
        ctx, SearchSpace(recompute=("auto",)), top_k=3, options=opts, sinks=sinks
    )
    for sink in sinks:
        sink.close()
    records = sinks[2].records
    s = outcome.result.summary
    assert sum(1 for k, *_ in records if k == "memory") == s.priced > 0
    kinds = Counter(r for k, _, r in records if k == "refusal")
    assert kinds["bounded"] == s.bounded > 0
    assert sum(v for r, v in kinds.items() if r.startswith("over_memory (")) == s.over_memory > 0
    assert_same_stream(records, tmp_path)
    # Memory parts sum to the peak, on the peak stage; time parts carry the step. A priced
    # layer split that is not ranked is slower than the one of its layout that is.
    kept = {tuple(sorted(d.items())): p for d, p in outcome.ranking}
    by_layout = {layout_key(d): p for d, p in outcome.ranking}
    dropped = 0
    for kind, c, parts in records:
        p = kept.get(tuple(sorted(c.items())))
        if kind in ("memory", "time") and p is None:
            dropped += kind == "time"
            assert kind == "memory" or parts["step"] >= by_layout[layout_key(c)].step_s
        elif kind == "memory":
            assert parts["total"] == p.peak_bytes and parts["stage"] == p.peak_stage
            assert sum(v for k, v in parts.items() if k not in ("total", "stage")) == p.peak_bytes
        elif kind == "time":
            assert parts["step"] == p.step_s
            assert math.isclose(sum(v for k, v in parts.items() if k != "step"), parts["step"])
    assert dropped + len(kept) == s.priced


def test_embedding_and_loss_may_take_a_chunk_of_their_own(planner) -> None:
    """Counting the embedding and the loss as layers, 126 layers run as pp 16 × vpp 8 (the
    published GB200 Llama 3.1 405B layout): the first chunk holds only the embedding, the
    last only the loss, every other chunk one decoder layer."""
    ctx, _ = make_ctx(planner, "llama-3.1-405b", 256, 1536, 8192)
    space = SearchSpace(tp=(4,), pp=(16,), cp=(1,), mbs=(1,), zero=(1,), schedule=("interleaved",))
    enum = enumerate_candidates(ctx, space)
    by_vpp = {dict(zip(FIELDS, c, strict=True))["vpp"]: c for c in enum.candidates}
    assert 8 in by_vpp and 9 not in by_vpp
    layout = candidate_layout(by_vpp[8], ctx.layer_splits)
    assert layout.layers_per_stage == (0,) + (1,) * 126 + (0,)
    stages = ctx.placement(layout)
    assert stages[0].chunks[0].stop == stages[0].chunks[0].start  # embedding only
    assert stages[0].has_embedding and stages[-1].has_head
    assert stages[-1].chunks[-1].stop == stages[-1].chunks[-1].start  # loss only
    assert sum(s.num_layers for s in stages) == 126


def test_layers_that_split_evenly_at_no_depth_interleave_one_slot_short(planner) -> None:
    """Kimi K2's 61 layers (no MTP) split evenly over no chunk count, even with the
    embedding and the loss counted (63). Chunks of equal slots or one fewer, no stage more
    than a slot lighter, still interleave: 64 slots as pp 4 × vpp 2, 4 or 8 (Megatron-
    Bridge runs pp 4 × vpp 4) and pp 8 × vpp 2 or 4; 12 chunks of 6 (72 slots) leave
    nine empty, more than pp 4 has stages, so vpp 3 is not offered."""
    ctx, _ = make_ctx(planner, "kimi-k2", 256, 1024, 4096)
    space = SearchSpace(
        tp=(1,), pp=(4, 8), cp=(1,), ep=(8,), mbs=(1,), zero=(1,), schedule=("interleaved",)
    )
    enum = enumerate_candidates(ctx, space)
    fields = [dict(zip(FIELDS, c, strict=True)) for c in enum.candidates]
    assert {(f["pp"], f["vpp"]) for f in fields} == {(4, 2), (4, 4), (4, 8), (8, 2), (8, 4)}
    head_counted = core_search.SPLITS.index("embedding+loss as layers")
    assert {f["split"] for f in fields} == {head_counted, core_search.SPLITS.index("balanced")}
    for c, f in zip(enum.candidates, fields, strict=True):
        if f["split"] == head_counted:
            assert_head_counted(ctx, f["pp"], f["vpp"], layout_of(c, ctx).layers_per_stage, c)
    c = next(
        c
        for c, f in zip(enum.candidates, fields, strict=True)
        if f["pp"] == f["vpp"] == 4 and f["split"] == head_counted
    )
    layout = layout_of(c, ctx)
    # The embedding with 3 layers, then 14 chunks of 4, the loss with 2: the empty slot
    # on the last stage, beside the loss.
    assert layout.layers_per_stage == (3,) + (4,) * 14 + (2,)
    assert ctx.placement(layout)[-1].has_head
    assert planner.estimate(ctx, layout).time.step_s > 0


@given(
    layers=st.integers(1, 200),
    pp=st.integers(2, 32),
    vpp=st.integers(2, 16),
    mtp=st.integers(0, 2),
)
def test_a_head_counted_split_is_one_slot_short_per_stage_at_most(layers, pp, vpp, mtp) -> None:
    """Every layer placed, chunks of equal slots or one fewer (the embedding, the loss and
    each MTP block a slot each, the last two on the last chunk), at most one short slot
    per stage; None exactly where that cannot be."""
    chunks = pp * vpp
    counts = head_counted_split(layers, pp, chunks, mtp)
    slots = layers + 2 + mtp
    per_chunk = -(-slots // chunks)
    short = per_chunk * chunks - slots
    last_slots = per_chunk - (short > 0)  # the last chunk is the first one short
    if chunks > slots or short >= pp or last_slots < 1 + mtp:
        assert counts is None
        return
    assert (
        counts is not None and len(counts) == chunks and sum(counts) == layers and min(counts) >= 0
    )
    full = [n + (i == 0) + (1 + mtp) * (i == chunks - 1) for i, n in enumerate(counts)]
    assert set(full) <= {max(full), max(full) - 1}
    assert all(sum(full[s::pp]) >= vpp * max(full) - 1 for s in range(pp))
    if short == 0:  # an exact split: every chunk the same
        assert len(set(full)) == 1


def test_near_even_chunks_only_where_no_vpp_splits_evenly_or_the_user_lists_them(
    planner,
) -> None:
    """Llama 3 70B's 80 layers split evenly at pp 4 (vpp 2, 4, 5, 10, 20), so the 84
    slots of pp 4 × vpp 3 (82 filled) are not offered unless the user lists vpp 3."""
    ctx, _ = make_ctx(planner, "llama-3-70b", 64, 256, 4096)
    space = SearchSpace(tp=(4,), pp=(4,), cp=(1,), mbs=(1,), zero=(1,), schedule=("interleaved",))
    enum = enumerate_candidates(ctx, space)
    vpps = {dict(zip(FIELDS, c, strict=True))["vpp"] for c in enum.candidates}
    assert vpps == set(even_vpps(80, 4)) == {2, 4, 5, 10, 20}
    listed = space.model_copy(update={"vpp": (3, 7)})
    c = enumerate_candidates(ctx, listed).candidates
    assert {dict(zip(FIELDS, x, strict=True))["vpp"] for x in c} == {3, 7}
    for x in c:
        f = dict(zip(FIELDS, x, strict=True))
        if f["split"] == core_search.SPLITS.index("embedding+loss as layers"):
            counts = layout_of(x, ctx).layers_per_stage
            assert_head_counted(ctx, 4, f["vpp"], counts, x, listed=True)


def test_an_mtp_model_interleaves_over_chunks_that_leave_room_for_mtp(planner) -> None:
    """DeepSeek-V3's 61 layers split evenly over no chunk count; with MTP and the loss
    holding three layers' room on the last chunk, 64 slots run as pp 4 × vpp 4 (4×15 + 1,
    Megatron-Bridge's layout) and pp 8 × vpp 2. 32 chunks leave the last one 2 slots, too
    few for that room: there the embedding, the MTP block and the loss count as a layer
    each, Megatron-Bridge's H100 layout ``Et|(tt|)*30mL`` at pp 8 × vpp 4."""
    ctx, _ = make_ctx(planner, "deepseek-v3", 256, 1024, 4096)
    space = SearchSpace(
        tp=(1,), pp=(4, 8), cp=(1,), ep=(8,), mbs=(1,), zero=(1,), schedule=("interleaved",)
    )
    enum = enumerate_candidates(ctx, space)
    fields = [dict(zip(FIELDS, c, strict=True)) for c in enum.candidates]
    head_counted = core_search.SPLITS.index("embedding+loss as layers")
    by_degrees = {(f["pp"], f["vpp"]): f["split"] for f in fields}
    assert by_degrees == {
        (4, 2): 0,
        (4, 4): 0,
        (8, 2): 0,
        (4, 8): head_counted,
        (8, 4): head_counted,
    }
    for c, f in zip(enum.candidates, fields, strict=True):
        if f["split"] == head_counted:
            assert_head_counted(ctx, f["pp"], f["vpp"], layout_of(c, ctx).layers_per_stage, c)
    c = next(c for c, f in zip(enum.candidates, fields, strict=True) if f["pp"] == f["vpp"] == 4)
    layout = candidate_layout(c, ctx.layer_splits)
    counts = [ch.stop - ch.start for s in ctx.placement(layout) for ch in s.chunks]
    assert sorted(counts) == [1] + [4] * 15 and ctx.placement(layout)[-1].has_mtp
    c = next(
        c for c, f in zip(enum.candidates, fields, strict=True) if (f["pp"], f["vpp"]) == (8, 4)
    )
    layout = candidate_layout(c, ctx.layer_splits)
    assert layout.layers_per_stage == (1,) + (2,) * 30 + (0,)
    assert pipeline_layout(ctx.model, layout) == "Et|" + "tt|" * 30 + "mL"
    last = ctx.placement(layout)[-1]
    assert last.has_mtp and last.has_head
    assert planner.estimate(ctx, layout).time.step_s > 0


def test_dualpipev_needs_twice_pp_micro_batches(planner) -> None:
    """DualPipeV's step asserts num_chunks >= 2·num_ranks: fewer micro-batches are
    refused under their own name, and estimate refuses such a layout."""
    ctx, _ = make_ctx(planner, "llama-3-8b", 16, 32, 4096)
    space = SearchSpace(schedule=("dualpipev",), recompute=("full",))
    enum = enumerate_candidates(ctx, space, record=True)
    refused = [d for d, r in enum.refusals if r == "dualpipev_needs_microbatches_at_least_2pp"]
    assert refused and all(d["num_microbatches"] < 2 * d["pp"] for d in refused)
    dual = [dict(zip(FIELDS, c, strict=True)) for c in enum.candidates]
    dual = [d for d in dual if SCHEDULES[d["schedule"]] == "dualpipev"]
    assert dual and all(d["num_microbatches"] >= 2 * d["pp"] for d in dual)
    layout = Layout(dp=4, pp=4, mbs=2, num_microbatches=4, schedule="dualpipev", recompute="full")
    with pytest.raises(InvalidInputError, match=r"needs at least 2·pp = 8 micro-batches"):
        planner.estimate(ctx, layout)


def test_interleaved_needs_micro_batches_in_multiples_of_pp(planner) -> None:
    """Megatron's interleaved schedule groups the micro-batches by pp: the search refuses
    other counts under their own name, and estimate refuses such a layout."""
    ctx, _ = make_ctx(planner, "llama-3-8b", 16, 24, 4096)
    space = SearchSpace(schedule=("interleaved",), recompute=("full",))
    enum = enumerate_candidates(ctx, space, record=True)
    refused = [d for d, r in enum.refusals if r == "interleaved_needs_microbatches_multiple_of_pp"]
    assert refused and all(d["num_microbatches"] % d["pp"] for d in refused)
    layout = Layout(dp=4, pp=4, vpp=2, num_microbatches=6, schedule="interleaved", recompute="full")
    with pytest.raises(
        InvalidInputError, match=r"micro-batches \(6\) to be a multiple of pp \(4\)"
    ):
        planner.estimate(ctx, layout)
    runnable = layout.model_copy(update={"dp": 2, "tp": 2, "num_microbatches": 12})
    assert planner.estimate(ctx, runnable).time.step_s > 0


def test_one_replica_is_ranked_under_one_zero_stage(planner, tiny) -> None:
    """With a single data-parallel replica every ZeRO stage shards over one rank, so the
    layout is generated once (the framework's default stage) — unless the user fixes the
    stage, or experts still have a data-parallel group to shard over."""
    ctx, _ = make_ctx(planner, "llama-3-8b", 8, 8, 4096)
    enum = enumerate_candidates(ctx, SearchSpace(tp=(8,), pp=(1,), recompute=("full",)))
    assert {c[9] for c in enum.candidates} == {1}
    enum = enumerate_candidates(ctx, SearchSpace(tp=(8,), pp=(1,), zero=(3,), recompute=("full",)))
    assert {c[9] for c in enum.candidates} == {3}
    enum = enumerate_candidates(ctx, SearchSpace(tp=(4,), pp=(1,), recompute=("full",)))
    assert {c[9] for c in enum.candidates} == {0, 1, 3}  # dp 2: the stages differ
    moe, _ = make_ctx(planner, tiny["moe"], 2, 8, 2048)
    space = SearchSpace(tp=(2,), pp=(1,), ep=(1,), recompute=("full",))
    # tp 2, ep 1, etp 2: the experts have no replica either ...
    enum = enumerate_candidates(moe, space.model_copy(update={"etp": (2,)}))
    assert {c[9] for c in enum.candidates} == {1}
    # ... but with etp 1 each expert is replicated over the two TP ranks.
    enum = enumerate_candidates(moe, space.model_copy(update={"etp": (1,)}))
    assert {c[9] for c in enum.candidates} == {0, 1, 3}


def test_a_baseline_no_layout_has_is_a_baseline_error(planner) -> None:
    """A library caller learns the stated baseline is at fault from the type: a
    BaselineError (an InvalidInputError) whose detail a front end can name its own way."""
    ctx, _ = make_ctx(planner, "llama-3-8b", 8, 8, 4096)
    with pytest.raises(BaselineError) as caught:
        planner.search(ctx, SearchSpace(recompute=("full",)), top_k=1, baseline={"tp": 3})
    assert isinstance(caught.value, InvalidInputError)
    assert str(caught.value) == f"baseline: {caught.value.detail}"
    assert "no layout of 8 devices" in caught.value.detail


# (model, devices, gbs, seq, max-mem GiB, job settings, schedules): every schedule, ZeRO
# stage, CP, EP, offload and fine-tuning mode the floor's parts depend on.
FLOOR_CASES = {
    "dense-megatron": ("llama-3-8b", 16, 32, 8192, 40, {}, ("1f1b", "interleaved")),
    "dense-deepspeed-zero2": ("llama-3-8b", 16, 64, 4096, 40, {"framework": "deepspeed"}, None),
    "dense-lora": ("llama-3-8b", 8, 32, 4096, 30, {"finetune": "lora"}, None),
    "moe-ep": ("qwen3-30b-a3b", 8, 32, 4096, None, {}, None),
    "mla-dualpipev": ("deepseek-v2-lite", 8, 64, 4096, None, {}, ("dualpipev",)),
    # The combined 1F1B schedule: a layer's time depends on the candidate's unpaired share.
    "moe-a2a-overlap": (
        "qwen3-30b-a3b",
        16,
        64,
        4096,
        None,
        {"moe_a2a_overlap": True},
        ("1f1b", "interleaved"),
    ),
}


@pytest.mark.parametrize("case", FLOOR_CASES, ids=list(FLOOR_CASES))
def test_the_cost_models_step_floor_never_exceeds_a_priced_step(planner, case) -> None:
    """The floor rules most layouts out before the memory check, so it must hold for
    every layout the exhaustive search prices: quick ≤ floor ≤ exact bound ≤ step."""
    model, n, gbs, seq, max_mem, job, schedules = FLOOR_CASES[case]
    opts = PricingOptions(max_mem_gib=max_mem)
    ctx = planner.context(
        planner.model(model),
        planner.device("h100"),
        n,
        Job(global_batch_size=gbs, seq_length=seq, **job),
        options=opts,
    )
    space = SearchSpace(
        recompute=("auto", "full"),
        mbs=(1, 2),
        schedule=schedules or tuple(ctx.framework.schedules),
    )
    outcome = planner.search(ctx, space, top_k=5, options=opts, bounding=False)
    pricing = SearchPricing(planner.pricer(ctx, opts))
    seen = Counter()
    for d, priced in outcome.ranking:
        c = as_candidate(d)
        quick = pricing.quick_bound(c)
        floor = pricing.floor_bound(c, quick)
        (screened,) = pricing.screen([c])
        tol = 1e-12 * priced.step_s
        assert quick <= floor <= screened.bound_s + tol <= priced.step_s + 2 * tol, (
            d,
            quick,
            floor,
            screened.bound_s,
            priced.step_s,
        )
        seen[d["schedule"], d["zero"]] += 1
    # Each case reaches the schedules and ZeRO stages it is for.
    assert {schedule for schedule, _ in seen} == set(space.schedule)
    assert {zero for _, zero in seen} == set(ctx.framework.zero_stages)
