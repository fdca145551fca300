"""Speed of the recompute knapsack (recompute.md) on a realistic, binding stage.

Run as ``python -m benchmarks.bench_knapsack``. In one process it measures:

- ``choose`` on the numba kernel vs the numpy reference (warm, median of runs);
- ``least_times`` for 50 budgets vs ``choose`` once per budget;
- ``suffix_times`` for every suffix vs ``choose`` once per suffix;
- the all-fastest shortcut of ``choose`` (no DP), per call.

The stage: 64 layers (48 dense attention + SwiGLU layers with 8 recompute
options, 16 MoE layers with 6), 4 micro-batches in flight, an 80 GiB budget at
1 MiB buckets. Every layer at its fastest would keep about 250 GiB, so the
budget binds: the reference's dense table spans ~80k buckets, of which the
kernel's ``choose`` keeps only the entries faster than every lighter one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ndplan.core.kernels.knapsack import (
    LayerGroup,
    LayerOption,
    choose,
    engine_name,
    least_times,
    suffix_times,
)

MiB = 2**20
GiB = 2**30
BUDGET = 80 * GiB
BUCKET = MiB
IN_FLIGHT = 4


def _options(
    switches: list[tuple[str, int, float]], plain_bytes: int, once: int, fwd: float, bwd: float
) -> tuple[LayerOption, ...]:
    """Options from additive recompute switches: (name, bytes saved per micro-batch, recompute seconds)."""
    options = [LayerOption("none", plain_bytes, fwd, bwd, once)]
    saved = 0
    extra = 0.0
    names: list[str] = []
    for name, bytes_saved, seconds in switches:
        saved += bytes_saved
        extra += seconds
        names.append(name)
        options.append(LayerOption("+".join(names), plain_bytes - saved, fwd, bwd + extra, once))
    return tuple(options)


def stage() -> list[LayerGroup]:
    """48 dense layers (8 options) and 16 MoE layers (6 options), 4 micro-batches in flight."""
    dense = _options(
        [
            ("norm", 96 * MiB, 0.0002),
            ("act", 224 * MiB, 0.0006),
            ("sp-gather", 160 * MiB, 0.0009),
            ("core-attn", 288 * MiB, 0.0031),
            ("qkv", 128 * MiB, 0.0024),
            ("mlp", 160 * MiB, 0.0041),
            ("full", 48 * MiB, 0.0030),
        ],
        plain_bytes=1168 * MiB,
        once=24 * MiB,
        fwd=0.0102,
        bwd=0.0205,
    )
    moe = _options(
        [
            ("norm", 96 * MiB, 0.0002),
            ("act", 352 * MiB, 0.0011),
            ("core-attn", 288 * MiB, 0.0031),
            ("experts", 960 * MiB, 0.0083),
            ("full", 224 * MiB, 0.0052),
        ],
        plain_bytes=2016 * MiB,
        once=96 * MiB,
        fwd=0.0177,
        bwd=0.0361,
    )
    return [LayerGroup("dense", dense, 48, IN_FLIGHT), LayerGroup("moe", moe, 16, IN_FLIGHT)]


def _median_seconds(fn: Callable[[], Any], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(runs: int = 7) -> dict[str, float]:
    """Measure and print; return the figures (seconds unless named otherwise)."""
    groups = stage()
    fastest_memory = sum(g.count * g.options[0].memory(g.in_flight) for g in groups)
    lightest_memory = sum(g.count * g.options[-1].memory(g.in_flight) for g in groups)
    assert fastest_memory > BUDGET > lightest_memory, "the budget must bind"

    start = time.perf_counter()
    choose(groups, BUDGET, BUCKET, "numba")
    first_call = time.perf_counter() - start  # numba import + cache load (or compile)

    numba_s = _median_seconds(lambda: choose(groups, BUDGET, BUCKET, "numba"), runs)
    python_s = _median_seconds(lambda: choose(groups, BUDGET, BUCKET, "python"), max(3, runs // 2))
    assert choose(groups, BUDGET, BUCKET, "numba") == choose(groups, BUDGET, BUCKET, "python")

    # Many budgets: one DP pass vs one choose per budget.
    budgets = np.linspace(lightest_memory, BUDGET, 50).astype(np.int64)
    least_s = _median_seconds(lambda: least_times(groups, budgets, BUCKET, "numba"), runs)
    per_budget_s = _median_seconds(
        lambda: [choose(groups, int(b), BUCKET, "numba") for b in budgets], max(3, runs // 2)
    )
    by_pass = least_times(groups, budgets, BUCKET, "numba")
    by_choose = [choose(groups, int(b), BUCKET, "numba") for b in budgets]
    assert by_pass.tolist() == [c.time_s for c in by_choose]

    # Every suffix of the stage's layers, each with its share of the budget.
    layers = [(g.options, g.in_flight) for g in groups for _ in range(g.count)]
    n = len(layers)
    suffix_budgets = [BUDGET * (n - i) // n for i in range(n)]
    suffix_s = _median_seconds(lambda: suffix_times(layers, suffix_budgets, BUCKET, "numba"), runs)

    def per_suffix() -> list[Any]:
        return [
            choose(
                [LayerGroup(f"l{j}", o, 1, k) for j, (o, k) in enumerate(layers[i:])],
                suffix_budgets[i],
                BUCKET,
                "numba",
            )
            for i in range(n)
        ]

    per_suffix_s = _median_seconds(per_suffix, max(3, runs // 2))

    # The common case in a search: everything fits, no DP.
    fits = 2 * fastest_memory
    shortcut_s = _median_seconds(lambda: [choose(groups, fits) for _ in range(1000)], runs) / 1000

    figures = {
        "first_call_s": first_call,
        "choose_numba_s": numba_s,
        "choose_python_s": python_s,
        "choose_speedup": python_s / numba_s,
        "least_times_50_s": least_s,
        "choose_x50_s": per_budget_s,
        "least_times_speedup": per_budget_s / least_s,
        "suffix_times_s": suffix_s,
        "choose_per_suffix_s": per_suffix_s,
        "suffix_times_speedup": per_suffix_s / suffix_s,
        "choose_all_fastest_fit_us": shortcut_s * 1e6,
        "layers": float(n),
        "buckets": float(BUDGET // BUCKET),
    }
    rows = [
        ("choose, numba kernel", f"{numba_s * 1e3:9.2f} ms", ""),
        (
            "choose, numpy reference",
            f"{python_s * 1e3:9.2f} ms",
            f"kernel {python_s / numba_s:5.1f}x faster",
        ),
        ("least_times, 50 budgets", f"{least_s * 1e3:9.2f} ms", ""),
        (
            "choose x 50 budgets",
            f"{per_budget_s * 1e3:9.2f} ms",
            f"one pass {per_budget_s / least_s:5.1f}x faster",
        ),
        (f"suffix_times, {n} suffixes", f"{suffix_s * 1e3:9.2f} ms", ""),
        (
            f"choose x {n} suffixes",
            f"{per_suffix_s * 1e3:9.2f} ms",
            f"one pass {per_suffix_s / suffix_s:5.1f}x faster",
        ),
        ("choose, all fastest fit", f"{shortcut_s * 1e6:9.2f} us", "no DP, no numba"),
        ("first call (import + cache)", f"{first_call * 1e3:9.2f} ms", ""),
    ]
    print(
        f"recompute knapsack: {n} layers, {BUDGET // GiB} GiB budget, "
        f"{BUCKET // MiB} MiB buckets ({BUDGET // BUCKET} buckets), engine auto = {engine_name()}"
    )
    width = max(len(r[0]) for r in rows)
    for label, value, note in rows:
        print(f"  {label:<{width}}  {value}  {note}".rstrip())
    return figures


if __name__ == "__main__":
    main()
