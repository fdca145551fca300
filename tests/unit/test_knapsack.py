"""The recompute knapsack (recompute.md 'The stage knapsack'): examples, edge cases, oracles.

Every solver test runs on both engines. Optimality is checked against brute
force (small instances, the same bucket-rounded weights) and against an integer
programme solved by HiGHS through ``scipy.optimize.milp`` (medium instances).
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from ndplan.core.kernels import reference
from ndplan.core.kernels.knapsack import (
    DefaultKnapsackSolver,
    GroupChoice,
    LayerGroup,
    LayerOption,
    PipelineChoice,
    StageChoice,
    choose,
    engine_name,
    least_times,
    pareto_front,
    pp_lite,
    suffix_times,
)

ENGINES = ["python", "numba"]
MiB = 2**20


def opt(name: str, per_mb: int, time: float, once: int = 0, excess=()) -> LayerOption:
    """An option whose forward takes a quarter of its time (exact for dyadic times)."""
    return LayerOption(name, per_mb, time / 4, time - time / 4, once, tuple(excess))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---------------------------------------------------------------- oracles


def brute_force(groups, budget, bucket):
    """(least time, least bucketed weight among those), over every per-layer option.

    All options are enumerated (not only the useful ones), the time is summed
    layer by layer in group order like the DP, and the all-fastest shortcut of
    step 2 uses exact memory. None when nothing fits.
    """
    if budget < 0:
        return None
    layers = [(g.options, g.in_flight) for g in groups for _ in range(g.count)]
    fastest = [min(o, key=lambda x: (x.time, x.memory(k))) for o, k in layers]
    if sum(o.memory(k) for o, (_, k) in zip(fastest, layers, strict=True)) <= budget:
        t = 0.0
        for o in fastest:
            t += o.time
        return t, None
    cap = budget // bucket
    best = None
    for combo in itertools.product(*(opts for opts, _ in layers)):
        w = sum(ceil_div(o.memory(k), bucket) for o, (_, k) in zip(combo, layers, strict=True))
        if w > cap:
            continue
        t = 0.0
        for o in combo:
            t += o.time
        if best is None or (t, w) < best:
            best = (t, w)
    return best


def bucketed_weight(choice: StageChoice, groups, bucket: int) -> int:
    total = 0
    for gc, g in zip(choice.groups, groups, strict=True):
        by_name = {o.name: o for o in g.options}
        for name, n in gc.counts:
            total += n * ceil_div(by_name[name].memory(g.in_flight), bucket)
    return total


def exact_memory(choice: StageChoice, groups) -> int:
    total = 0
    for gc, g in zip(choice.groups, groups, strict=True):
        by_name = {o.name: o for o in g.options}
        total += sum(n * by_name[name].memory(g.in_flight) for name, n in gc.counts)
    return total


def check_well_formed(choice: StageChoice, groups, budget: int) -> None:
    assert len(choice.groups) == len(groups)
    for gc, g in zip(choice.groups, groups, strict=True):
        assert (gc.kind, gc.in_flight) == (g.kind, g.in_flight)
        assert sum(n for _, n in gc.counts) == g.count
        assert all(n > 0 for _, n in gc.counts)
        by_name = {o.name: o for o in g.options}
        times = [by_name[name].time for name, _ in gc.counts]
        assert times == sorted(times, reverse=True), "slower options first"
    assert choice.memory_bytes == exact_memory(choice, groups)
    assert choice.memory_bytes <= budget


def random_groups(rng, n_groups, max_count, n_options, max_weight, bucket, dyadic=False):
    """Random groups; memory per layer below ``max_weight`` buckets, 1–3 micro-batches in flight."""
    groups = []
    for g in range(n_groups):
        k = int(rng.integers(1, 4))
        options = []
        for j in range(int(rng.integers(1, n_options + 1))):
            per_mb = int(rng.integers(0, max_weight * bucket // k))
            once = int(rng.integers(0, bucket)) if rng.random() < 0.3 else 0
            excess = (
                ((k, int(rng.integers(0, k * per_mb + once + 1))),) if rng.random() < 0.2 else ()
            )
            time = int(rng.integers(1, 4096)) / 1024 if dyadic else float(rng.uniform(0.001, 2.0))
            options.append(opt(f"g{g}o{j}", per_mb, time, once, excess))
        groups.append(
            LayerGroup(f"kind{g}", tuple(options), int(rng.integers(0, max_count + 1)), k)
        )
    return groups


def fastest_memory(groups) -> int:
    """Exact memory of every layer at its fastest option (the step-2 test)."""
    return sum(
        g.count * min((o.time, o.memory(g.in_flight)) for o in g.options)[1]
        for g in groups
        if g.count
    )


def budget_between(rng, groups, bucket):
    """A budget between all-lightest and all-fastest, where the DP has work to do."""
    lo = sum(g.count * min(o.memory(g.in_flight) for o in g.options) for g in groups)
    hi = sum(g.count * max(o.memory(g.in_flight) for o in g.options) for g in groups)
    return int(rng.integers(max(lo - bucket, 0), hi + bucket + 1))


# ---------------------------------------------------------------- data types


def test_option_memory_time_and_excess():
    o = LayerOption("attn", 100, 1.0, 2.5, memory_once=7, excess=((2, 30), (4, 50)))
    assert o.memory(1) == 107
    assert o.memory(2) == 200 + 7 - 30
    assert o.memory(4) == 400 + 7 - 50
    assert o.time == 3.5


def test_data_types_are_frozen_and_hashable():
    o = opt("a", 1, 1.0)
    with pytest.raises(AttributeError):
        o.name = "b"  # type: ignore[misc]
    g = LayerGroup("k", (o,), 2, 1)
    assert hash(g) == hash(LayerGroup("k", (o,), 2, 1))


# ---------------------------------------------------------------- fronts


def test_pareto_front_drops_dominated_and_orders_by_time():
    plain = opt("none", 100, 1.0)
    attn = opt("attn", 60, 1.2)
    worse = opt("worse", 70, 1.3)  # beaten by attn: more memory, more time
    full = opt("full", 10, 2.0)
    assert pareto_front([full, worse, attn, plain], [1, 4]) == (plain, attn, full)


def test_pareto_front_uses_every_in_flight_count():
    # Equally fast; b is heavier per micro-batch but its excess makes it lighter at k=4.
    a = opt("a", 100, 1.0)
    b = opt("b", 101, 1.0, excess=((4, 50),))
    assert pareto_front([b, a], [1]) == (a,)
    assert pareto_front([b, a], [4]) == (a, b)  # neither beats the other
    assert pareto_front([b, a], [1, 4]) == (a, b)
    assert pareto_front([b, a], []) == (a,)


def test_pareto_front_rules():
    a = opt("a", 100, 1.0)
    c = opt("c", 100, 1.0, once=1)  # beaten by a: one byte more once
    assert pareto_front([c, a], [2]) == (a,)
    twin = opt("twin", 100, 1.0)  # equal in every respect: the first listed stays
    assert pareto_front([twin, a], [1]) == (twin,)
    assert pareto_front([], [1]) == ()
    # The fastest and the lightest are always on the front.
    rng = np.random.default_rng(0)
    for _ in range(50):
        options = [
            opt(f"o{i}", int(rng.integers(0, 50)), float(rng.integers(1, 9))) for i in range(6)
        ]
        front = pareto_front(options, [1, 2])
        assert min(options, key=lambda o: (o.time, o.memory_per_micro_batch)) in front
        assert min(options, key=lambda o: (o.memory_per_micro_batch, o.time)) in front
        keys = [(o.time, o.memory_per_micro_batch) for o in front]
        assert keys == sorted(keys)


# ---------------------------------------------------------------- choose: edge cases

PLAIN = opt("none", 8 * MiB, 1.0)
ATTN = opt("attn", 5 * MiB, 1.25)
FULL = opt("full", 2 * MiB, 2.0)
DENSE = (PLAIN, ATTN, FULL)


@pytest.mark.parametrize("engine", ENGINES)
def test_negative_budget_is_none(engine):
    assert choose([LayerGroup("d", DENSE, 2, 1)], -1, engine=engine) is None
    assert choose([], -1, engine=engine) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_zero_budget(engine):
    free = opt("free", 0, 3.0)
    assert choose([LayerGroup("d", DENSE, 1, 1)], 0, engine=engine) is None
    c = choose([LayerGroup("d", (*DENSE, free), 2, 1)], 0, engine=engine)
    assert c == StageChoice((GroupChoice("d", 1, (("free", 2),)),), 0, 6.0)
    assert choose([], 0, engine=engine) == StageChoice((), 0, 0.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_budget_exactly_at_a_bucket_boundary(engine):
    groups = [LayerGroup("d", DENSE, 3, 1)]
    # 2 plain + 1 attn = 21 MiB exactly; all plain (24 MiB) does not fit.
    c = choose(groups, 21 * MiB, engine=engine)
    assert c is not None
    assert c.groups[0].counts == (("attn", 1), ("none", 2))
    assert c.memory_bytes == 21 * MiB
    assert c.time_s == 3.25
    # One byte less loses a bucket: 1 plain + 2 attn = 18 MiB.
    c = choose(groups, 21 * MiB - 1, engine=engine)
    assert c is not None
    assert c.groups[0].counts == (("attn", 2), ("none", 1))
    assert c.memory_bytes == 18 * MiB


@pytest.mark.parametrize("engine", ENGINES)
def test_rounding_up_never_exceeds_the_budget(engine):
    # 1.5 MiB (2 buckets) or 0.5 MiB (1 bucket) per layer, budget 4 MiB. Exactly,
    # 2 half + 1 light = 3.5 MiB would fit; in buckets it is 5 > 4, so given up.
    half = opt("half", 3 * MiB // 2, 1.0)
    light = opt("light", MiB // 2, 2.0)
    c = choose([LayerGroup("d", (half, light), 3, 1)], 4 * MiB, engine=engine)
    assert c is not None
    assert c.groups[0].counts == (("light", 2), ("half", 1))
    assert c.memory_bytes == 5 * MiB // 2
    assert c.time_s == 5.0


@pytest.mark.parametrize("engine", ENGINES)
def test_group_of_count_zero(engine):
    groups = [LayerGroup("none-here", DENSE, 0, 2), LayerGroup("d", DENSE, 2, 1)]
    c = choose(groups, 13 * MiB, engine=engine)
    assert c is not None
    assert c.groups[0] == GroupChoice("none-here", 2, ())
    assert c.groups[1].counts == (("attn", 1), ("none", 1))
    empty_options = [LayerGroup("nothing", (), 0, 1), *groups]
    assert choose(empty_options, 13 * MiB, engine=engine).groups[1:] == c.groups


@pytest.mark.parametrize("engine", ENGINES)
def test_every_fastest_fits(engine):
    groups = [LayerGroup("d", DENSE, 4, 2), LayerGroup("e", (FULL,), 1, 1)]
    c = choose(groups, 4 * 16 * MiB + 2 * MiB, engine=engine)
    assert c == StageChoice(
        (GroupChoice("d", 2, (("none", 4),)), GroupChoice("e", 1, (("full", 1),))),
        4 * 16 * MiB + 2 * MiB,
        6.0,
    )


def test_fast_path_imports_no_numba():
    """``import ndplan`` and the all-fastest shortcut leave numba alone; the DP loads it."""
    code = (
        "import sys, ndplan, ndplan.core, ndplan.core.kernels as k\n"
        "assert 'numba' not in sys.modules, 'import'\n"
        "a, b = k.LayerOption('a', 10, 1.0, 1.0), k.LayerOption('b', 5, 1.0, 2.0)\n"
        "c = k.choose([k.LayerGroup('g', (a, b), 3, 1)], 30, engine='numba')\n"
        "assert c.groups[0].counts == (('a', 3),), c\n"
        "assert 'numba' not in sys.modules, 'fast path'\n"
        "c = k.choose([k.LayerGroup('g', (a, b), 3, 1)], 29, bucket_bytes=1)\n"
        "assert c.groups[0].counts == (('b', 1), ('a', 2)), c\n"
        "assert 'numba' in sys.modules, 'the DP runs on numba'\n"
    )
    env = {
        key: v for key, v in os.environ.items() if key not in ("NDPLAN_ENGINE", "NUMBA_DISABLE_JIT")
    }
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.parametrize("engine", ENGINES)
def test_nothing_fits(engine):
    groups = [LayerGroup("d", DENSE, 3, 1)]
    assert choose(groups, 6 * MiB - 1, engine=engine) is None
    assert choose(groups, 6 * MiB, engine=engine).groups[0].counts == (("full", 3),)


@pytest.mark.parametrize("engine", ENGINES)
def test_ties(engine):
    # Same memory and time under two names: the one listed first is used.
    twin_a, twin_b = opt("twin-a", 5 * MiB, 1.25), opt("twin-b", 5 * MiB, 1.25)
    for options, name in (
        ((PLAIN, twin_a, twin_b, FULL), "twin-a"),
        ((twin_b, twin_a, PLAIN, FULL), "twin-b"),
    ):
        c = choose([LayerGroup("d", options, 2, 1)], 13 * MiB, engine=engine)
        assert c.groups[0].counts == ((name, 1), ("none", 1))
    # Same time, different memory: the lighter is the only useful one.
    heavy_twin = opt("heavy", 6 * MiB, 1.25)
    c = choose([LayerGroup("d", (heavy_twin, PLAIN, ATTN, FULL), 2, 1)], 14 * MiB, engine=engine)
    assert c.groups[0].counts == (("attn", 1), ("none", 1))
    # Equal time and buckets, different splits: x + z = y + y = 3.0 s in 4
    # buckets. The DP's rule decides: at equal time for the same w, a layer
    # takes its lightest option, so the last layer takes z and the first x.
    x, y, z = opt("x", 3 * MiB, 1.0), opt("y", 2 * MiB, 1.5), opt("z", 1 * MiB, 2.0)
    c = choose([LayerGroup("d", (x, y, z), 2, 1)], 4 * MiB, engine=engine)
    assert c.time_s == 3.0
    assert c.memory_bytes == 4 * MiB
    assert c.groups[0].counts == (("z", 1), ("x", 1))


@pytest.mark.parametrize("engine", ENGINES)
def test_least_memory_among_the_fastest(engine):
    # Within 7 buckets, u + v (7 buckets) and s + s (6 buckets) both take 3.0 s.
    u, s, v = opt("u", 5 * MiB, 1.0), opt("s", 3 * MiB, 1.5), opt("v", 2 * MiB, 2.0)
    c = choose([LayerGroup("d", (u, s, v), 2, 1)], 7 * MiB, engine=engine)
    assert c == StageChoice((GroupChoice("d", 1, (("s", 2),)),), 6 * MiB, 3.0)
    # An equally fast but heavier option is never used.
    fat = opt("fat", 9 * MiB, 1.0)
    c = choose([LayerGroup("d", (fat, PLAIN, ATTN, FULL), 2, 1)], 17 * MiB, engine=engine)
    assert c.groups[0].counts == (("none", 2),)
    c = choose([LayerGroup("d", (fat, PLAIN, ATTN, FULL), 2, 1)], 15 * MiB, engine=engine)
    assert c.groups[0].counts == (("attn", 1), ("none", 1))


@pytest.mark.parametrize("engine", ENGINES)
def test_single_option(engine):
    g = LayerGroup("d", (FULL,), 5, 3)
    assert choose([g], 30 * MiB, engine=engine).groups[0].counts == (("full", 5),)
    assert choose([g], 30 * MiB - 1, engine=engine) is None


@pytest.mark.parametrize("engine", ENGINES)
def test_in_flight_count_and_excess_are_used(engine):
    a = opt("a", 4 * MiB, 1.0, once=MiB)
    b = opt("b", 3 * MiB, 1.5, excess=((4, 3 * MiB),))
    g = LayerGroup("d", (a, b), 2, 4)  # a keeps 17 MiB, b keeps 9 MiB at k=4
    c = choose([g], 26 * MiB, engine=engine)
    assert c.groups[0].counts == (("b", 1), ("a", 1))
    assert c.memory_bytes == 26 * MiB


@pytest.mark.parametrize("engine", ENGINES)
def test_invalid_inputs(engine):
    with pytest.raises(ValueError, match="bucket"):
        choose([LayerGroup("d", DENSE, 1, 1)], 10, bucket_bytes=0, engine=engine)
    with pytest.raises(ValueError, match="no options"):
        choose([LayerGroup("d", (), 1, 1)], 10, engine=engine)
    with pytest.raises(ValueError, match="count"):
        choose([LayerGroup("d", DENSE, -1, 1)], 10, engine=engine)
    with pytest.raises(ValueError, match="time"):
        choose([LayerGroup("d", (opt("bad", 1, math.nan),), 1, 1)], 10, engine=engine)
    with pytest.raises(ValueError, match="bytes"):
        bad = LayerOption("bad", 1, 1.0, 1.0, excess=((1, 5),))
        choose([LayerGroup("d", (bad,), 1, 1)], 10, engine=engine)
    with pytest.raises(ValueError, match="NaN"):
        choose([LayerGroup("d", DENSE, 1, 1)], math.nan, engine=engine)
    with pytest.raises(ValueError, match="engine"):
        choose([LayerGroup("d", DENSE, 1, 1)], 10, engine="fortran")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="coarser"):
        choose([LayerGroup("d", DENSE, 1000, 1)], 1000 * 6 * MiB, bucket_bytes=1, engine=engine)


# ---------------------------------------------------------------- optimality


@pytest.mark.parametrize("seed", range(60))
def test_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    bucket = int(rng.choice([1, 7, 64]))
    n_groups = int(rng.integers(1, 4))
    groups = random_groups(rng, n_groups, 6 // n_groups, 4, 12, bucket, dyadic=seed % 2 == 0)
    for budget in [budget_between(rng, groups, bucket) for _ in range(4)]:
        expected = brute_force(groups, budget, bucket)
        results = [choose(groups, budget, bucket, engine) for engine in ENGINES]
        assert results[0] == results[1]
        c = results[0]
        if expected is None:
            assert c is None
            continue
        time, weight = expected
        assert c is not None
        check_well_formed(c, groups, budget)
        assert c.time_s == time  # bit for bit: the same sums in the same order
        if weight is not None:
            assert bucketed_weight(c, groups, bucket) == weight


def milp_optimum(groups, cap, bucket, time_limit=None):
    """(least time, least weight at that time) by HiGHS; the options of a group as integer counts."""
    cols = [(gi, o) for gi, g in enumerate(groups) if g.count for o in g.options]
    weights = np.array([ceil_div(o.memory(groups[gi].in_flight), bucket) for gi, o in cols], float)
    times = np.array([o.time for _, o in cols])
    a_eq = np.array(
        [[1.0 if gi == gj else 0.0 for gj, _ in cols] for gi, g in enumerate(groups) if g.count]
    )
    counts = np.array([g.count for g in groups if g.count], float)
    base = [
        LinearConstraint(a_eq, counts, counts),
        LinearConstraint(weights[None, :], -np.inf, cap),
    ]
    opts = {"mip_rel_gap": 0.0}
    ones = np.ones(len(cols))
    first = milp(times, constraints=base, integrality=ones, bounds=Bounds(0, np.inf), options=opts)
    if first.status == 2:  # infeasible
        return None
    assert first.success, first.message
    t_star = float(np.round(first.x) @ times)  # exact for dyadic times
    # Least weight among the optimal: times are multiples of 2**-10, so a
    # margin of 2**-12 admits the optimal ones and no other.
    second = milp(
        weights,
        constraints=[*base, LinearConstraint(times[None, :], -np.inf, t_star + 2**-12)],
        integrality=ones,
        bounds=Bounds(0, np.inf),
        options=opts,
    )
    assert second.success, second.message
    return t_star, round(float(np.round(second.x) @ weights))


@pytest.mark.parametrize("seed", range(12))
def test_equals_integer_programme(seed):
    rng = np.random.default_rng(1000 + seed)
    bucket = 4096
    # Dyadic times: every sum is exact, so "least weight among the fastest" is exact too.
    groups = random_groups(rng, int(rng.integers(2, 5)), 40, 8, 300, bucket, dyadic=True)
    fastest = fastest_memory(groups)
    for budget in (budget_between(rng, groups, bucket), int(0.7 * fastest)):
        results = [choose(groups, budget, bucket, engine) for engine in ENGINES]
        assert results[0] == results[1]
        c = results[0]
        if budget >= fastest:
            continue  # step 2, not an optimisation
        expected = milp_optimum(groups, budget // bucket, bucket)
        if expected is None:
            assert c is None
            continue
        assert c is not None
        check_well_formed(c, groups, budget)
        assert c.time_s == pytest.approx(expected[0], rel=1e-12, abs=1e-12)
        assert c.time_s == expected[0]  # dyadic: exact
        assert bucketed_weight(c, groups, bucket) == expected[1]


@pytest.mark.parametrize("seed", range(4))
def test_equals_integer_programme_random_floats(seed):
    rng = np.random.default_rng(2000 + seed)
    bucket = 4096
    groups = random_groups(rng, 3, 30, 7, 300, bucket)
    budget = min(budget_between(rng, groups, bucket), fastest_memory(groups) - 1)
    c = choose(groups, budget, bucket)
    expected = milp_optimum(groups, budget // bucket, bucket)
    if expected is None:
        assert c is None
    else:
        assert c is not None
        assert c.time_s == pytest.approx(expected[0], rel=1e-12)


# ---------------------------------------------------------------- many budgets


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("seed", range(8))
def test_least_times_equals_repeated_choose(engine, seed):
    rng = np.random.default_rng(3000 + seed)
    bucket = int(rng.choice([1, 16, 256]))
    groups = random_groups(rng, int(rng.integers(1, 4)), 8, 5, 40, bucket)
    budgets = [budget_between(rng, groups, bucket) for _ in range(30)]
    budgets += [-1, 0, bucket, 10**15]
    times = least_times(groups, budgets, bucket, engine)
    assert times.shape == (len(budgets),)
    for budget, t in zip(budgets, times, strict=True):
        c = choose(groups, budget, bucket, engine)
        assert t == (math.inf if c is None else c.time_s)  # exactly: the same DP sums
    assert np.array_equal(times, least_times(groups, np.array(budgets, float), bucket, engine))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dyadic", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_suffix_times_equal_repeated_choose(engine, dyadic, seed):
    rng = np.random.default_rng(4000 + seed)
    bucket = int(rng.choice([1, 16, 256]))
    n = int(rng.integers(1, 14))
    layers = []
    for _ in range(n):
        (g,) = random_groups(rng, 1, 1, 5, 40, bucket, dyadic=dyadic)
        layers.append((g.options, g.in_flight))
    budgets = []
    for i in range(n):
        groups = [LayerGroup(f"l{j}", layers[j][0], 1, layers[j][1]) for j in range(i, n)]
        budgets.append(budget_between(rng, groups, bucket) if rng.random() < 0.9 else -1)
    times = suffix_times(layers, budgets, bucket, engine)
    for i in range(n):
        groups = [LayerGroup(f"l{j}", layers[j][0], 1, layers[j][1]) for j in range(i, n)]
        c = choose(groups, budgets[i], bucket, engine)
        if c is None:
            assert times[i] == math.inf
        elif dyadic:
            assert times[i] == c.time_s  # exact sums in any order
        else:
            assert times[i] == pytest.approx(c.time_s, rel=1e-13)


@pytest.mark.parametrize("engine", ENGINES)
def test_many_budget_edges(engine):
    groups = [LayerGroup("d", DENSE, 3, 1)]
    budgets = [-1, 0, 6 * MiB - 1, 6 * MiB, 21 * MiB - 1, 21 * MiB, 24 * MiB, 10**12]
    expected = [math.inf, math.inf, math.inf, 6.0, 3.5, 3.25, 3.0, 3.0]
    assert least_times(groups, budgets, engine=engine).tolist() == expected
    assert least_times([], [-5, 0, 5], engine=engine).tolist() == [math.inf, 0.0, 0.0]
    layers = [(DENSE, 1)] * 3
    assert suffix_times(layers, [21 * MiB, 0, 10**9], engine=engine).tolist() == [
        3.25,
        math.inf,
        1.0,
    ]
    assert suffix_times([], [], engine=engine).shape == (0,)
    with pytest.raises(ValueError, match="budgets"):
        suffix_times(layers, [1, 2], engine=engine)


# ---------------------------------------------------------------- pipeline and port


@pytest.mark.parametrize("engine", ENGINES)
def test_pp_lite(engine):
    g = [LayerGroup("d", DENSE, 3, 1)]
    p = pp_lite([(g, 24 * MiB, 0.25), (g, 18 * MiB, 0.0), (g, 24 * MiB, 0.5)], engine=engine)
    assert p.slowest_stage == 1  # 3.5 s; the others 3.25 s and 3.5 s (a tie: the first)
    assert p.time_s == 3.5 == choose(g, 18 * MiB, engine=engine).time_s
    assert p.stages[0] == choose(g, 24 * MiB, engine=engine)
    p = pp_lite([(g, 24 * MiB, 0.0), (g, MiB, 0.0), (g, -1, 0.0)], engine=engine)
    assert p == PipelineChoice(math.inf, (choose(g, 24 * MiB), None, None), 1)
    with pytest.raises(ValueError):
        pp_lite([], engine=engine)


def test_default_solver_is_the_functions():
    solver = DefaultKnapsackSolver(bucket_bytes=MiB // 2, engine="python")
    g = [LayerGroup("d", DENSE, 3, 1)]
    assert solver.choose(g, 20 * MiB) == choose(g, 20 * MiB, MiB // 2, "python")
    assert solver.least_times(g, [20 * MiB]).tolist() == [solver.choose(g, 20 * MiB).time_s]
    assert solver.suffix_times([(DENSE, 1)], [MiB]).tolist() == [math.inf]
    assert solver.pp_lite([(g, 20 * MiB, 1.0)]).time_s == solver.choose(g, 20 * MiB).time_s + 1.0
    assert solver.pareto_front(DENSE, [1]) == DENSE
    assert "bucket_bytes=524288" in repr(solver)
    with pytest.raises(ValueError):
        DefaultKnapsackSolver(engine="gpu")  # type: ignore[arg-type]


# ---------------------------------------------------------------- engines


def test_engine_selection(monkeypatch):
    monkeypatch.delenv("NDPLAN_ENGINE", raising=False)
    monkeypatch.delenv("NUMBA_DISABLE_JIT", raising=False)
    assert engine_name() == "numba"
    assert engine_name("python") == "python"
    monkeypatch.setenv("NDPLAN_ENGINE", "python")
    assert engine_name() == "python"
    assert engine_name("numba") == "numba"  # an explicit argument wins
    monkeypatch.setenv("NDPLAN_ENGINE", "numba")
    assert engine_name() == "numba"
    monkeypatch.setenv("NDPLAN_ENGINE", "cobol")
    with pytest.raises(ValueError, match="NDPLAN_ENGINE"):
        engine_name()
    monkeypatch.delenv("NDPLAN_ENGINE")
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "1")
    assert engine_name() == "python"
    monkeypatch.setenv("NUMBA_DISABLE_JIT", "0")
    assert engine_name() == "numba"


def test_numba_cache_folder(tmp_path, monkeypatch):
    """A read-only kernel folder sends numba's cache to $XDG_CACHE_HOME/ndplan/numba."""
    import numba.core.config

    from ndplan.core.kernels import _numba_cache

    monkeypatch.setattr(numba.core.config, "CACHE_DIR", numba.core.config.CACHE_DIR)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    source = tmp_path / "kernels"
    source.mkdir()
    assert _numba_cache.source_folder_is_writable(source)
    assert _numba_cache.configure_numba_cache(source) is None
    source.chmod(0o555)  # a-w: read-only, even for root
    try:
        assert not _numba_cache.source_folder_is_writable(source)
        chosen = _numba_cache.configure_numba_cache(source)
    finally:
        source.chmod(0o755)
    assert chosen == str(tmp_path / "xdg" / "ndplan" / "numba")
    assert os.environ["NUMBA_CACHE_DIR"] == chosen == numba.core.config.CACHE_DIR
    # A user's NUMBA_CACHE_DIR always wins.
    assert _numba_cache.configure_numba_cache(source) is None
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _numba_cache.user_cache_folder() == tmp_path / "home" / ".cache" / "ndplan" / "numba"


def test_engines_agree_on_the_dp_arrays():
    """The engine functions themselves, per layer: same time, same w, same picks, same tables.

    Unlike the wrapper's input, options here may tie in weight and in time.
    """
    from ndplan.core.kernels import _knapsack_nb

    rng = np.random.default_rng(7)
    for _ in range(400):
        n_groups = int(rng.integers(1, 5))
        sizes = rng.integers(1, 6, n_groups)
        ptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        weights = np.concatenate([np.sort(rng.integers(0, 30, s)) for s in sizes]).astype(np.int64)
        times = np.concatenate(
            [np.sort(rng.choice([0.0, 0.5, 0.75, 1.0, 1.5, 2.0], s))[::-1] for s in sizes]
        )
        counts = rng.integers(0, 6, n_groups).astype(np.int64)
        cap = int(rng.integers(-1, 120))
        t_ref, w_ref, p_ref = reference.dp_choose(weights, times, ptr, counts, cap)
        t_nb, w_nb, p_nb = _knapsack_nb.dp_choose(weights, times, ptr, counts, cap)
        assert (t_ref, w_ref) == (t_nb, w_nb)
        assert p_ref.tolist() == p_nb.tolist()
        if cap >= 0:
            assert np.array_equal(
                reference.dp_least(weights, times, ptr, counts, cap),
                _knapsack_nb.dp_least(weights, times, ptr, counts, cap),
            )
        caps = rng.integers(-1, 60, n_groups).astype(np.int64)
        assert np.array_equal(
            reference.dp_suffix(weights, times, ptr, caps),
            _knapsack_nb.dp_suffix(weights, times, ptr, caps),
        )


@pytest.mark.slow
def test_kernels_stay_in_bounds(tmp_path):
    """The test above again, with numba's bounds checks compiled in (a fresh cache).

    A stray index in a kernel is otherwise a silent overwrite or a crash at exit.
    """
    env = {**os.environ, "NUMBA_BOUNDSCHECK": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    test = f"{__file__}::test_engines_agree_on_the_dp_arrays"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 passed" in run.stdout
