"""Bounding and memoisation change nothing (issue 7, spec/search.md § Speed), and the
same inputs give the same bytes in two processes.

- The default search (bounded, memoised) lists exactly the top K of an unpruned,
  unmemoised search — the same layouts, step times (float equality) and peaks — for a
  dense model, two MoEs, and an MLA model, at 8–64 devices, with RECOMPUTE searched
  and with fixed policies; and switching reuse off changes no priced candidate at all
  (a memo key that leaves out an input shows up as a different step or peak). The
  ranking holds each layout once, at its faster layer split.
- With ``distinct`` (one plan per shape), bounding on the K-th best shape lists the
  fastest layout of each of the exhaustive ranking's K best shapes.
- ``ndplan search --json`` (apart from ``summary.seconds``) and ``--ranking-csv`` are
  byte-identical across two processes with different hash seeds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ndplan.bootstrap import bootstrap
from ndplan.core.job import Job
from ndplan.core.layout import SearchSpace
from ndplan.core.performance import NdplanCostModel
from ndplan.core.search import FIELDS
from ndplan.planner import Planner, PricingOptions
from ndplan.plugins.hookspecs import hookimpl

TOP = 10
FIXED = {"zero": (1,), "offload_optimizer": (False,)}


@pytest.fixture(scope="module")
def planner() -> Planner:
    with pytest.MonkeyPatch.context() as mp:
        for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS"):
            mp.delenv(var, raising=False)
        return Planner(bootstrap(entry_points=False))


def run_search(
    planner,
    model,
    n,
    gbs,
    seq,
    max_mem,
    space,
    *,
    bounding=True,
    memo=True,
    job=None,
    distinct=False,
    baseline=None,
):
    opts = PricingOptions(max_mem_gib=max_mem, memoize=memo)
    ctx = planner.context(
        planner.model(model),
        planner.device("h100"),
        n,
        Job(global_batch_size=gbs, seq_length=seq, **(job or {})),
        options=opts,
    )
    # PricingOptions.memoize acts through the context: the caches must really be off.
    assert ctx.memoize is memo and (type(ctx.cache) is dict) is memo
    return planner.search(
        ctx,
        space,
        top_k=TOP,
        options=opts,
        bounding=bounding,
        distinct=distinct,
        baseline=baseline,
    )


def first_of_each_shape(ranked: list[tuple], k: int) -> list[tuple]:
    """The first ``k`` entries of ``kept`` whose device grids differ."""
    seen, out = set(), []
    for entry in ranked:
        shape = grid(entry)
        if shape not in seen:
            seen.add(shape)
            out.append(entry)
    return out[:k]


STATED = tuple(f for f in FIELDS if f not in ("num_microbatches", "split"))
"""Every degree a baseline can state (the micro-batch count follows from dp and mbs; the
layer split is the search's own choice)."""


def grid(entry: tuple) -> tuple[int, ...]:
    degrees = dict(entry[0])
    return tuple(degrees[d] for d in FIELDS[:6])  # tp, pp, cp, dp, ep, etp


def kept(outcome) -> list[tuple]:
    """Every kept plan: its layout, step time, peak and peak stage, in rank order."""
    return [
        (tuple(sorted(d.items())), p.step_s, p.peak_bytes, p.peak_stage) for d, p in outcome.ranking
    ]


# (model, devices, gbs, seq, max-mem GiB, space): small spaces, since pricing without
# reuse is slow; memory is tight where noted so the per-layer knapsack picks mixes.
CASES = {
    "dense-auto-tight": (
        "llama-3-8b",
        8,
        32,
        4096,
        26,
        SearchSpace(recompute=("auto",), zero=(1, 3), offload_optimizer=(False,)),
    ),
    "dense-fixed-policies": (
        "llama-3-8b",
        16,
        64,
        4096,
        40,
        SearchSpace(recompute=("none", "selective", "full"), mbs=(1, 2), **FIXED),
    ),
    "dense-64-devices": (
        "llama-3-8b",
        64,
        128,
        8192,
        40,
        SearchSpace(recompute=("auto",), mbs=(1,), vpp=(1,), **FIXED),
    ),
    "dense-70b-all-schedules": (
        "llama-3-70b",
        32,
        64,
        4096,
        None,
        SearchSpace(
            recompute=("auto",),
            mbs=(1,),
            tp=(4, 8),
            schedule=("1f1b", "interleaved", "gpipe"),
            **FIXED,
        ),
    ),
    "moe-mixtral-auto": (
        "mixtral-8x7b",
        16,
        32,
        4096,
        None,
        SearchSpace(recompute=("auto",), mbs=(1,), vpp=(1,), **FIXED),
    ),
    "moe-qwen3-auto-tight": (
        "qwen3-30b-a3b",
        8,
        16,
        4096,
        75,
        SearchSpace(recompute=("auto",), mbs=(1, 2), vpp=(1,), **FIXED),
    ),
    "moe-qwen3-fixed": (
        "qwen3-30b-a3b",
        16,
        32,
        4096,
        None,
        SearchSpace(recompute=("full", "selective"), mbs=(1,), vpp=(1,), **FIXED),
    ),
    "dense-zero-offload-tight": (
        "llama-3-8b",
        8,
        32,
        4096,
        20,
        SearchSpace(recompute=("auto",), mbs=(1,), vpp=(1,)),  # ZeRO 0/1/3, offload on/off
    ),
    "moe-mixtral-etp": (
        "mixtral-8x7b",
        32,
        64,
        4096,
        60,
        SearchSpace(recompute=("auto",), mbs=(1,), vpp=(1,), etp=(1, 2, 4, 8), pp=(1, 2), **FIXED),
    ),
    "mla-deepseek-auto": (
        "deepseek-v2-lite",
        8,
        16,
        4096,
        50,
        SearchSpace(recompute=("auto",), **FIXED),
    ),
    "dense-activation-offload-tight": (  # 6 of the top 10 offload some layers
        "llama-3-8b",
        8,
        32,
        4096,
        24,
        SearchSpace(
            recompute=("auto",), mbs=(1, 2), vpp=(1,), zero=(1, 3), offload_optimizer=(False,)
        ),
    ),
    "mla-deepseek-fixed": (
        "deepseek-v2-lite",
        16,
        32,
        4096,
        None,
        SearchSpace(recompute=("none", "full"), mbs=(1,), vpp=(1,), **FIXED),
    ),
    "moe-qwen3-a2a-overlap-tight": (  # the combined 1F1B schedule's EP exposure
        "qwen3-30b-a3b",
        16,
        32,
        4096,
        60,
        SearchSpace(recompute=("auto",), mbs=(1, 2), vpp=(1, 2), **FIXED),
    ),
    # --recompute stated: the fastest setting the framework's config states, per layout
    # (Megatron: modules on every layer or the first N layers of each chunk whole).
    "dense-stated-tight": (
        "llama-3-8b",
        8,
        32,
        4096,
        28,
        SearchSpace(recompute=("auto", "stated"), mbs=(1, 2), vpp=(1, 2), **FIXED),
    ),
    "dense-stated-torchtitan-tight": (  # torchtitan: one layer in every N whole
        "llama-3-8b",
        8,
        32,
        4096,
        28,
        SearchSpace(recompute=("stated",), mbs=(1, 2), offload_optimizer=(False,)),
    ),
    "mla-deepseek-stated": (
        "deepseek-v2-lite",
        8,
        16,
        4096,
        50,
        SearchSpace(recompute=("stated",), **FIXED),
    ),
}
JOBS = {
    "dense-stated-torchtitan-tight": {"framework": "torchtitan"},
    "moe-qwen3-a2a-overlap-tight": {"moe_a2a_overlap": True},
    "dense-activation-offload-tight": {"activation_offload": True},
    "dense-70b-all-schedules": {"defer_embedding_wgrad": True, "wgrad_deferral_limit": 4},
}
"""Job settings of the cases that need them (layers may offload their activations; the last
stage defers its output-layer weight gradients, for some micro-batch counts all of them)."""


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bounding_and_memoisation_change_nothing(planner, case) -> None:
    model, n, gbs, seq, max_mem, space = CASES[case]
    job = JOBS.get(case)
    default = run_search(planner, model, n, gbs, seq, max_mem, space, job=job)
    exhaustive = run_search(
        planner, model, n, gbs, seq, max_mem, space, bounding=False, memo=False, job=job
    )
    reused = run_search(planner, model, n, gbs, seq, max_mem, space, bounding=False, job=job)
    ds, es = default.result.summary, exhaustive.result.summary
    # Every priced layout that fits is ranked once, at its faster layer split.
    assert es.bounded == 0 and es.priced >= len(exhaustive.ranking) >= TOP
    layouts = [tuple(d[f] for f in FIELDS if f != "split") for d, _ in exhaustive.ranking]
    assert len(set(layouts)) == len(layouts)
    # The same candidates, accounted the same way.
    assert (ds.generated, ds.refused) == (es.generated, es.refused)
    assert ds.over_memory + ds.bounded + ds.priced == es.over_memory + es.priced
    # Reuse changes no priced candidate (the whole ranking, not just the top).
    assert kept(reused) == kept(exhaustive)
    assert reused.result.model_dump(exclude={"summary": {"seconds"}}) == (
        exhaustive.result.model_dump(exclude={"summary": {"seconds"}})
    )
    # Bounding keeps exactly the top K: layouts, step times, peaks, and the whole plans.
    assert kept(default)[:TOP] == kept(exhaustive)[:TOP]
    assert default.result.plans == exhaustive.result.plans
    assert len(default.result.plans) == TOP
    # One plan per shape: bounded on the K-th best shape, it lists the fastest layout of
    # each of the K best shapes of the exhaustive ranking.
    distinct = run_search(planner, model, n, gbs, seq, max_mem, space, job=job, distinct=True)
    expected = first_of_each_shape(kept(exhaustive), TOP)
    assert first_of_each_shape(kept(distinct), TOP) == expected
    plans = distinct.result.plans
    assert [p.rank for p in plans] == list(range(1, len(expected) + 1))
    assert [(p.time.step_s, p.memory.peak_bytes) for p in plans] == [e[1:3] for e in expected]
    assert len({p.layout.shape for p in plans}) == len(plans)
    assert distinct.result.summary.distinct is True and ds.distinct is None
    # A baseline (the user's layout, fully or partly stated) is placed exactly: its rank
    # and the grids ahead of it are the exhaustive ranking's, and the top K does not move.
    ranked = kept(exhaustive)
    for at, names in (
        (TOP + 1, STATED),
        (len(ranked) // 2, STATED),
        (len(ranked), STATED),
        (len(ranked) // 3, ("tp", "pp")),
    ):
        degrees = dict(ranked[at - 1][0])
        stated = {name: degrees[name] for name in names}
        out = run_search(planner, model, n, gbs, seq, max_mem, space, job=job, baseline=stated)
        rank = 1 + next(
            i for i, e in enumerate(ranked) if all(dict(e[0])[k] == v for k, v in stated.items())
        )
        placed = out.result.baseline
        assert placed.rank == rank <= at and placed.plan.rank == rank
        assert (placed.plan.time.step_s, placed.plan.memory.peak_bytes) == ranked[rank - 1][1:3]
        assert placed.gap == ranked[rank - 1][1] / ranked[0][1] - 1
        assert placed.grids_ahead == len(
            {grid(e) for e in ranked[: rank - 1]} - {grid(ranked[rank - 1])}
        )
        assert out.result.plans == default.result.plans
        # What it priced beyond the search without it is counted as the baseline's.
        summary = out.result.summary
        assert summary.priced - summary.priced_for_baseline == ds.priced
        assert ds.priced_for_baseline is None


def test_the_cases_exercise_pruning_and_the_knapsack(planner) -> None:
    """Guards the cases above against going vacuous: bounding prunes in some, and the
    top plans mix recompute options per layer in some."""
    pruned = mixed = 0
    for case in CASES.values():
        out = run_search(planner, *case)
        pruned += out.result.summary.bounded > 0
        mixed += any(len({r.option for r in p.recompute}) > 1 for p in out.result.plans)
    assert pruned >= 4 and mixed >= 2


BOUNDING_ONLY = {
    # Larger spaces (every dimension searched); with reuse on, to keep them quick.
    "dense-8": ("llama-3-8b", 8, 32, 4096, 24, SearchSpace(recompute=("auto",))),
    "moe-qwen3-8": ("qwen3-30b-a3b", 8, 16, 4096, None, SearchSpace(recompute=("auto",))),
    "mla-8": ("deepseek-v2-lite", 8, 16, 4096, None, SearchSpace(recompute=("auto",))),
}


@pytest.mark.parametrize("case", BOUNDING_ONLY, ids=list(BOUNDING_ONLY))
def test_bounding_keeps_the_top_k_of_every_dimension_searched(planner, case) -> None:
    default = run_search(planner, *BOUNDING_ONLY[case])
    exhaustive = run_search(planner, *BOUNDING_ONLY[case], bounding=False)
    assert default.result.summary.bounded > default.result.summary.priced  # it pruned a lot
    assert kept(default)[:TOP] == kept(exhaustive)[:TOP]
    assert default.result.plans == exhaustive.result.plans


class _TpCommScaled(NdplanCostModel):
    """A user's cost model as docs/architecture.md shows it: the analytic one, subclassed,
    with TP communication scaled (as a profiler might have measured it)."""

    factor = 1.0

    def layer_seconds(self, ctx, layout, kind, recompute):
        parts = dict(super().layer_seconds(ctx, layout, kind, recompute))
        parts["tp_comm"] *= self.factor
        return parts


@pytest.mark.parametrize("factor", [0.25, 4.0])
def test_a_subclassed_cost_model_prices_and_bounds_with_its_own_layer_times(
    planner, factor
) -> None:
    """The override reaches the step (stage_seconds sums layer_seconds), and the search's
    bounds, built from the same layer_seconds, keep the exhaustive top K."""
    model = type("Scaled", (_TpCommScaled,), {"factor": factor})

    class Plugin:
        @hookimpl
        def ndplan_register_cost_models(self, registry):
            registry.add("ndplan", model, replace=True)

    custom = Planner(bootstrap(extra=[Plugin()], entry_points=False))
    # Memory is tight: TP layouts lead, and their order moves with the TP traffic.
    case = ("llama-3-8b", 8, 32, 4096, 24, SearchSpace(recompute=("auto",)))
    default = run_search(custom, *case)
    exhaustive = run_search(custom, *case, bounding=False)
    assert default.result.summary.bounded > 0
    assert default.result.plans == exhaustive.result.plans
    # Its step times are its own: a TP plan's TP communication scales by the factor.
    builtin = run_search(planner, *case)
    assert [p.layout for p in builtin.result.plans] != [p.layout for p in default.result.plans]
    own = default.result.plans[0]
    assert own.layout.tp > 1
    job = Job(global_batch_size=32, seq_length=4096)
    opts = PricingOptions(max_mem_gib=24)
    priced = {}
    for name, p in (("custom", custom), ("builtin", planner)):
        ctx = p.context(p.model("llama-3-8b"), p.device("h100"), 8, job, options=opts)
        priced[name] = p.estimate(ctx, own.layout, opts)
    assert priced["custom"].time.step_s == own.time.step_s  # the search priced it so
    ratio = priced["custom"].time.parts["tp_comm"] / priced["builtin"].time.parts["tp_comm"]
    assert (ratio > 1) if factor > 1 else (ratio < 1)


# ----------------------------------------------------------------------------- two processes

CLI = [
    *("search", "-m", "qwen3-30b-a3b", "-d", "h100", "-n", "8", "--gbs", "16", "-s", "4096"),
    *("--max-mem", "75", "-j", "1", "--top", "12"),
]
MAIN = "from ndplan.cli.app import main; main()"
SECONDS = re.compile(r'"seconds": \{[^{}]*\}')


def run_cli(tmp_path: Path, name: str, seed: str) -> tuple[str, bytes]:
    out = tmp_path / f"{name}.csv"
    env = {**os.environ, "PYTHONHASHSEED": seed, "NDPLAN_NO_PROGRESS": "1"}
    for var in ("NDPLAN_PLUGINS", "NDPLAN_DISABLE_PLUGINS", "NDPLAN_DEBUG", "NDPLAN_JOBS"):
        env.pop(var, None)
    proc = subprocess.run(
        [sys.executable, "-c", MAIN, *CLI, "--json", "--ranking-csv", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, out.read_bytes()


@pytest.mark.slow
def test_the_same_inputs_give_the_same_bytes_in_two_processes(tmp_path: Path) -> None:
    json_a, csv_a = run_cli(tmp_path, "a", "1")
    json_b, csv_b = run_cli(tmp_path, "b", "4242")
    data = json.loads(json_a)
    assert set(data["summary"]["seconds"]) == {"enumerate", "memory", "bound", "price", "total"}
    assert len(data["plans"]) == 12 and data["summary"]["bounded"] > 0
    # Only the wall times may differ.
    assert SECONDS.sub('"seconds": {}', json_a) == SECONDS.sub('"seconds": {}', json_b)
    assert len(SECONDS.findall(json_a)) == 1
    assert csv_a == csv_b
    # The plans ranked exactly: at least the 12 listed, at most every one priced.
    assert 12 <= csv_a.count(b"\n") - 1 <= data["summary"]["priced"]
