"""Reference engine of the recompute knapsack: plain numpy, the oracle and the fallback.

The dynamic programme of ``recompute.md`` ("The stage knapsack", step 3, and its
two relatives ``least_times`` / ``suffix_times``), written to be read. The
numba engine (``_knapsack_nb``) computes the same table with the same float
operations in the same order, so the two agree bit for bit; tests check it.

Both engines take the same arrays, built by the wrapper (``knapsack.py``):

- ``weights`` (int64) and ``times`` (float64): the useful options of every
  group (or layer), each group's options in ascending memory, so ascending
  weight and descending time; weights are in whole buckets (rounded up).
- ``ptr`` (int64, one more than the groups): group ``g``'s options are
  ``ptr[g]:ptr[g + 1]``.
- ``counts`` (int64): how many identical layers each group holds. Layers are
  added in order: group 0's layers, then group 1's, ...

The table ``best[w]`` is the least time of the layers added so far keeping
exactly ``w`` buckets (``inf`` when no choice keeps exactly ``w``). Adding a layer
maps it to ``new[w] = min_j (best[w - weight_j] + time_j)``. Ties: the option
with the lowest index (the lightest, most recomputing one) wins, because a later
option replaces the running minimum only when strictly better.
"""

from __future__ import annotations

import numpy as np

__all__ = ["add_layer", "dp_choose", "dp_least", "dp_suffix"]

_NO_PICKS = np.zeros(0, dtype=np.int64)


def add_layer(
    best: np.ndarray, weights: np.ndarray, times: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Add one layer: ``new[w] = min_j best[w - weights[j]] + times[j]``.

    Returns the new table and the option picked at every ``w`` (meaningful
    where ``new[w]`` is finite). ``weights`` must be ascending.
    """
    size = best.size
    new = np.full(size, np.inf)
    pick = np.zeros(size, dtype=np.uint8)
    for j in range(weights.size):
        w = int(weights[j])
        if w >= size:
            break  # this option and the heavier ones exceed the table
        candidate = best[: size - w] + times[j]
        better = candidate < new[w:]  # strict: on a tie the lighter option stays
        new[w:][better] = candidate[better]
        pick[w:][better] = j
    return new, pick


def _empty_table(cap: int) -> np.ndarray:
    best = np.full(cap + 1, np.inf)
    best[0] = 0.0  # no layer yet: zero time, zero buckets
    return best


def dp_choose(
    weights: np.ndarray, times: np.ndarray, ptr: np.ndarray, counts: np.ndarray, cap: int
) -> tuple[float, int, np.ndarray]:
    """Least time within ``cap`` buckets, the least ``w`` reaching it, and the per-layer picks.

    Returns ``(time, w, picks)`` where ``picks[l]`` is layer ``l``'s option index
    within its group; ``(inf, -1, [])`` when no choice fits.
    """
    if cap < 0:
        return np.inf, -1, _NO_PICKS
    best = _empty_table(cap)
    table = []  # one row per layer: the option picked at each w
    layer_group = []
    for g in range(counts.size):
        lo, hi = ptr[g], ptr[g + 1]
        for _ in range(counts[g]):
            best, pick = add_layer(best, weights[lo:hi], times[lo:hi])
            table.append(pick)
            layer_group.append(g)
    w = int(np.argmin(best))  # the first minimum: least memory among the fastest
    time = float(best[w])
    if time == np.inf:
        return np.inf, -1, _NO_PICKS
    w_star = w
    picks = np.zeros(len(table), dtype=np.int64)
    for layer in range(len(table) - 1, -1, -1):  # backtrack, last layer first
        j = int(table[layer][w])
        picks[layer] = j
        w -= int(weights[ptr[layer_group[layer]] + j])
    return time, w_star, picks


def dp_least(
    weights: np.ndarray, times: np.ndarray, ptr: np.ndarray, counts: np.ndarray, cap: int
) -> np.ndarray:
    """``out[w]`` = least time keeping at most ``w`` buckets, for ``w`` in ``0..cap``."""
    best = _empty_table(cap)
    for g in range(counts.size):
        lo, hi = ptr[g], ptr[g + 1]
        for _ in range(counts[g]):
            best, _pick = add_layer(best, weights[lo:hi], times[lo:hi])
    return np.minimum.accumulate(best)


def dp_suffix(
    weights: np.ndarray, times: np.ndarray, ptr: np.ndarray, caps: np.ndarray
) -> np.ndarray:
    """Least time of every suffix of layers: ``out[i]`` for layers ``i..end`` within ``caps[i]`` buckets.

    One group per layer, in model order; the DP adds them from the last to the
    first. ``caps[i] < 0`` means "not asked" (``out[i] = inf``).
    """
    n = caps.size
    out = np.full(n, np.inf)
    asked = np.flatnonzero(caps >= 0)
    if asked.size == 0:
        return out
    best = _empty_table(int(caps.max()))
    for i in range(n - 1, int(asked[0]) - 1, -1):
        lo, hi = ptr[i], ptr[i + 1]
        best, _pick = add_layer(best, weights[lo:hi], times[lo:hi])
        if caps[i] >= 0:
            out[i] = best[: caps[i] + 1].min()
    return out
