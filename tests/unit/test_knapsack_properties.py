"""Properties of the recompute knapsack on random instances (hypothesis).

The numba engine must equal the numpy reference exactly (time bit for bit,
memory, assignment) on every input; the results must be well formed and
consistent across ``choose``, ``least_times`` and ``suffix_times``. Instances
are small (tiny buckets), so thousands of them run in seconds; ties in memory
and time are drawn on purpose.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ndplan.core.kernels.knapsack import (
    LayerGroup,
    LayerOption,
    StageChoice,
    choose,
    least_times,
    pareto_front,
    suffix_times,
)

ENGINES = ("python", "numba")
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

times_st = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5]),  # ties on purpose
    st.floats(0.0, 2.0, allow_nan=False, allow_infinity=False),
)


@st.composite
def option_st(draw, name: str, k: int, bucket: int) -> LayerOption:
    per_mb = draw(st.one_of(st.sampled_from([0, bucket, 2 * bucket]), st.integers(0, 12 * bucket)))
    once = draw(st.one_of(st.just(0), st.integers(0, 3 * bucket)))
    excess = ()
    if draw(st.booleans()):
        excess = ((k, draw(st.integers(0, k * per_mb + once))),)
    return LayerOption(name, per_mb, draw(times_st), draw(times_st), once, excess)


@st.composite
def group_st(draw, index: int, bucket: int, max_count: int = 8) -> LayerGroup:
    k = draw(st.integers(1, 4))
    n = draw(st.integers(1, 6))
    options = tuple(draw(option_st(f"g{index}o{j}", k, bucket)) for j in range(n))
    return LayerGroup(f"kind{index}", options, draw(st.integers(0, max_count)), k)


def memory_range(groups) -> tuple[int, int]:
    """Exact memory with every layer at its lightest option, and at its heaviest."""
    lo = sum(g.count * min(o.memory(g.in_flight) for o in g.options) for g in groups if g.count)
    hi = sum(g.count * max(o.memory(g.in_flight) for o in g.options) for g in groups if g.count)
    return lo, hi


@st.composite
def stage_st(draw, max_groups: int = 4):
    bucket = draw(st.sampled_from([1, 3, 16, 64]))
    n = draw(st.integers(0, max_groups))
    groups = [draw(group_st(i, bucket)) for i in range(n)]
    lo, hi = memory_range(groups)
    budget = draw(
        st.one_of(
            st.integers(max(lo - bucket, -2), hi + bucket),
            st.sampled_from([-1, 0, lo, hi, (lo // bucket + 1) * bucket]),
        )
    )
    return groups, budget, bucket


def fastest(o: LayerOption, k: int) -> tuple[float, int]:
    return (o.time, o.memory(k))


def check(choice: StageChoice | None, groups, budget: int, bucket: int) -> None:
    """Well formed, within the budget; None only when nothing fits."""
    lightest = sum(
        g.count * min(-(-o.memory(g.in_flight) // bucket) for o in g.options)
        for g in groups
        if g.count
    )
    all_fastest = sum(
        g.count * min(fastest(o, g.in_flight) for o in g.options)[1] for g in groups if g.count
    )
    if choice is None:
        assert budget < 0 or (all_fastest > budget and lightest > budget // bucket)
        return
    assert budget >= 0
    assert len(choice.groups) == len(groups)
    memory = 0
    for gc, g in zip(choice.groups, groups, strict=True):
        assert (gc.kind, gc.in_flight) == (g.kind, g.in_flight)
        assert sum(n for _, n in gc.counts) == g.count
        assert all(n > 0 for _, n in gc.counts)
        assert len({name for name, _ in gc.counts}) == len(gc.counts)
        by_name = {o.name: o for o in g.options}
        times = [by_name[name].time for name, _ in gc.counts]
        assert times == sorted(times, reverse=True)
        memory += sum(n * by_name[name].memory(g.in_flight) for name, n in gc.counts)
    assert choice.memory_bytes == memory <= budget
    if all_fastest <= budget:  # step 2: every layer at its fastest
        for gc, g in zip(choice.groups, groups, strict=True):
            if g.count:
                best = min(fastest(o, g.in_flight) for o in g.options)
                ((name, _),) = gc.counts
                assert fastest(next(o for o in g.options if o.name == name), g.in_flight) == best


@settings(FAST, max_examples=1500)
@given(stage_st())
def test_engines_agree_on_choose(stage):
    groups, budget, bucket = stage
    by_python = choose(groups, budget, bucket, "python")
    by_numba = choose(groups, budget, bucket, "numba")
    assert by_python == by_numba  # time bit for bit, memory, assignment
    check(by_python, groups, budget, bucket)


@settings(FAST, max_examples=300)
@given(stage_st(max_groups=3), st.lists(st.integers(-3, 3000), min_size=1, max_size=8))
def test_least_times_agree_and_equal_choose(stage, budgets):
    groups, budget, bucket = stage
    budgets = [budget, *budgets]
    by_python = least_times(groups, budgets, bucket, "python")
    by_numba = least_times(groups, budgets, bucket, "numba")
    assert np.array_equal(by_python, by_numba)
    for b, t in zip(budgets, by_python, strict=True):
        c = choose(groups, b, bucket, "numba")
        assert t == (math.inf if c is None else c.time_s)
    ordered = by_python[np.argsort(budgets, kind="stable")].tolist()
    assert all(a >= b for a, b in itertools.pairwise(ordered)), "more memory is never slower"


@st.composite
def layers_st(draw):
    bucket = draw(st.sampled_from([1, 3, 16]))
    n = draw(st.integers(0, 10))
    layers = []
    for i in range(n):
        g = draw(group_st(i, bucket, max_count=1))
        layers.append((g.options, g.in_flight))
    budgets = []
    for i in range(n):
        lo, hi = memory_range([LayerGroup("", o, 1, k) for o, k in layers[i:]])
        budgets.append(draw(st.integers(max(lo - bucket, -2), hi + bucket)))
    return layers, budgets, bucket


@settings(FAST, max_examples=300)
@given(layers_st())
def test_suffix_times_agree_and_equal_choose(instance):
    layers, budgets, bucket = instance
    by_python = suffix_times(layers, budgets, bucket, "python")
    by_numba = suffix_times(layers, budgets, bucket, "numba")
    assert np.array_equal(by_python, by_numba)
    for i, t in enumerate(by_python):
        groups = [LayerGroup(f"l{j}", o, 1, k) for j, (o, k) in enumerate(layers[i:])]
        c = choose(groups, budgets[i], bucket, "python")
        if c is None:
            assert t == math.inf
        else:
            # Suffixes are summed last layer first, choose first layer first.
            assert math.isclose(t, c.time_s, rel_tol=1e-12, abs_tol=1e-12)


@settings(FAST, max_examples=300)
@given(stage_st(max_groups=3), st.data())
def test_useless_options_change_nothing(stage, data):
    """Appending options that are heavier and slower than an existing one leaves the answer alone."""
    groups, budget, bucket = stage
    padded = []
    for g in groups:
        extra = []
        for o in g.options:
            if data.draw(st.booleans()):
                extra.append(
                    LayerOption(
                        o.name + "+",
                        o.memory_per_micro_batch + data.draw(st.integers(0, 2 * bucket)),
                        o.forward_time,
                        o.backward_time + data.draw(st.sampled_from([0.0, 0.5, 1.0])),
                        o.memory_once,
                        o.excess,
                    )
                )
        padded.append(LayerGroup(g.kind, g.options + tuple(extra), g.count, g.in_flight))
    for engine in ENGINES:
        assert choose(padded, budget, bucket, engine) == choose(groups, budget, bucket, engine)


@settings(FAST, max_examples=200)
@given(stage_st(max_groups=3))
def test_finer_buckets_are_never_slower(stage):
    groups, budget, bucket = stage
    coarse = choose(groups, budget, bucket, "numba")
    fine = choose(groups, budget, 1, "numba")
    if coarse is not None:
        assert fine is not None
        assert fine.time_s <= coarse.time_s + 1e-9 * max(1.0, coarse.time_s)


@settings(FAST, max_examples=300)
@given(
    st.integers(1, 4).flatmap(
        lambda k: st.tuples(
            st.lists(option_st("o", k, 4), min_size=0, max_size=8),
            st.lists(st.integers(1, 4), max_size=3),
        )
    )
)
def test_pareto_front(instance):
    options, counts = instance
    options = [
        LayerOption(
            f"o{i}", o.memory_per_micro_batch, o.forward_time, o.backward_time, o.memory_once, ()
        )
        for i, o in enumerate(options)
    ]

    def key(o):
        return (o.memory_per_micro_batch, o.memory_once, *(o.memory(k) for k in counts))

    def beats_or_equals(a, b):
        return a.time <= b.time and all(x <= y for x, y in zip(key(a), key(b), strict=True))

    front = pareto_front(options, counts)
    assert len({id(o) for o in front}) == len(front)
    for o in front:
        assert not any(
            beats_or_equals(p, o) and (p.time, key(p)) != (o.time, key(o)) for p in options
        )
    for o in options:
        assert any(beats_or_equals(p, o) for p in front)
    assert [(o.time, key(o)) for o in front] == sorted((o.time, key(o)) for o in front)
    if options:
        assert min(options, key=lambda o: (o.time, key(o))) in front
        assert min(options, key=lambda o: (key(o), o.time)) in front
