"""Numba engine of the recompute knapsack: the DP of ``reference.py``, compiled.

Same arrays in, same results out, bit for bit: every table entry is the same
``min`` over the same ``best[w - weight] + time`` sums as in the reference (no
``fastmath``, so no re-association), and ties go to the lowest option index the
same way (a later option replaces the minimum only when strictly better).

What makes it faster than the reference, without changing any entry that can
reach the answer:

- one fused pass per option over ``w``, no temporaries;
- a window ``[lo, hi]`` per layer: below ``lo`` (all layers so far at their
  lightest) nothing is reachable, and above ``hi`` an entry is either
  unreachable (all layers at their heaviest) or useless, because the layers
  still to come add at least their lightest weights and the answer must stay
  within the cap. Entries outside the window are never read.

Only this module imports numba; importing it first points numba's cache at a
writable folder (``_numba_cache``).
"""

from __future__ import annotations

from ndplan.core.kernels._numba_cache import configure_numba_cache

configure_numba_cache()

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

__all__ = ["dp_choose", "dp_least", "dp_suffix"]


@njit(cache=True)
def _add_layer_pick(prev, nxt, row, lo, hi, nlo, nhi, weights, times, a, b):  # pragma: no cover
    """``nxt[w] = min_j prev[w - weights[j]] + times[j]`` on ``[nlo, nhi]``; ``row[w]`` = the pick."""
    for w in range(nlo, nhi + 1):
        nxt[w] = np.inf
    for j in range(a, b):
        wj = weights[j]
        tj = times[j]
        start = max(nlo, lo + wj)
        stop = min(nhi, hi + wj)
        if start > stop:
            continue  # (a negative slice end would wrap around)
        jj = np.uint8(j - a)
        # Slices and selects instead of a branch: LLVM vectorises this loop.
        src = prev[start - wj : stop + 1 - wj]
        dst = nxt[start : stop + 1]
        pick = row[start : stop + 1]
        for k in range(src.size):
            v = src[k] + tj
            c = dst[k]
            better = v < c  # strict: on a tie the lighter option stays
            dst[k] = v if better else c
            pick[k] = jj if better else pick[k]


@njit(cache=True)
def _add_layer(prev, nxt, lo, hi, nlo, nhi, weights, times, a, b):  # pragma: no cover
    """As ``_add_layer_pick`` without recording the picks."""
    for w in range(nlo, nhi + 1):
        nxt[w] = np.inf
    for j in range(a, b):
        wj = weights[j]
        tj = times[j]
        start = max(nlo, lo + wj)
        stop = min(nhi, hi + wj)
        if start > stop:
            continue  # (a negative slice end would wrap around)
        src = prev[start - wj : stop + 1 - wj]
        dst = nxt[start : stop + 1]
        for k in range(src.size):
            v = src[k] + tj
            c = dst[k]
            dst[k] = v if v < c else c


@njit(cache=True)
def _lightest_total(weights, ptr, counts):  # pragma: no cover
    total = 0
    for g in range(counts.size):
        if counts[g] > 0:
            total += counts[g] * weights[ptr[g]]
    return total


@njit(cache=True)
def dp_choose(weights, times, ptr, counts, cap):  # pragma: no cover
    """Least time within ``cap`` buckets, the least ``w`` reaching it, the per-layer picks."""
    n_layers = 0
    for g in range(counts.size):
        n_layers += counts[g]
    picks = np.zeros(n_layers, dtype=np.int64)
    rem = _lightest_total(weights, ptr, counts)
    if cap < 0 or rem > cap:
        return np.inf, -1, picks[:0]
    prev = np.empty(cap + 1)
    nxt = np.empty(cap + 1)
    prev[0] = 0.0
    table = np.empty((n_layers, cap + 1), dtype=np.uint8)
    lo = 0
    hi = 0
    layer = 0
    for g in range(counts.size):
        if counts[g] == 0:
            continue
        a = ptr[g]
        b = ptr[g + 1]
        wmin = weights[a]
        wmax = weights[b - 1]
        for _ in range(counts[g]):
            rem -= wmin
            nlo = lo + wmin
            nhi = min(hi + wmax, cap - rem)
            _add_layer_pick(prev, nxt, table[layer], lo, hi, nlo, nhi, weights, times, a, b)
            prev, nxt = nxt, prev
            lo = nlo
            hi = nhi
            layer += 1
    w_star = lo
    best = prev[lo]
    for w in range(lo + 1, hi + 1):
        if prev[w] < best:
            best = prev[w]
            w_star = w
    w = w_star
    layer = n_layers - 1
    for g in range(counts.size - 1, -1, -1):
        a = ptr[g]
        for _ in range(counts[g]):
            j = np.int64(table[layer, w])
            picks[layer] = j
            w -= weights[a + j]
            layer -= 1
    return best, w_star, picks


@njit(cache=True)
def dp_least(weights, times, ptr, counts, cap):  # pragma: no cover
    """``out[w]`` = least time keeping at most ``w`` buckets, for ``w`` in ``0..cap``."""
    out = np.full(cap + 1, np.inf)
    rem = _lightest_total(weights, ptr, counts)
    if rem > cap:
        return out
    prev = np.empty(cap + 1)
    nxt = np.empty(cap + 1)
    prev[0] = 0.0
    lo = 0
    hi = 0
    for g in range(counts.size):
        if counts[g] == 0:
            continue
        a = ptr[g]
        b = ptr[g + 1]
        wmin = weights[a]
        wmax = weights[b - 1]
        for _ in range(counts[g]):
            rem -= wmin
            nlo = lo + wmin
            nhi = min(hi + wmax, cap - rem)
            _add_layer(prev, nxt, lo, hi, nlo, nhi, weights, times, a, b)
            prev, nxt = nxt, prev
            lo = nlo
            hi = nhi
    running = np.inf
    for w in range(lo, hi + 1):
        if prev[w] < running:
            running = prev[w]
        out[w] = running
    for w in range(hi + 1, cap + 1):
        out[w] = running
    return out


@njit(cache=True)
def dp_suffix(weights, times, ptr, caps):  # pragma: no cover
    """Least time of every suffix ``i..end`` within ``caps[i]`` buckets (``caps[i] < 0``: not asked)."""
    n = caps.size
    out = np.full(n, np.inf)
    first = -1
    top = -1
    for i in range(n):
        if caps[i] >= 0:
            if first < 0:
                first = i
            top = max(top, caps[i])
    if first < 0:
        return out
    # need[i]: the highest entry after adding layer i that an answer can use,
    # now (caps[i]) or later, once the lighter-than-lightest layers before it
    # in model order are added (caps[k] minus their lightest weights).
    need = np.empty(n, dtype=np.int64)
    need[first] = caps[first]
    for i in range(first + 1, n):
        need[i] = max(caps[i], need[i - 1] - weights[ptr[i - 1]])
    prev = np.empty(top + 1)
    nxt = np.empty(top + 1)
    prev[0] = 0.0
    lo = 0
    hi = 0
    for i in range(n - 1, first - 1, -1):
        a = ptr[i]
        b = ptr[i + 1]
        nlo = lo + weights[a]
        nhi = min(hi + weights[b - 1], need[i])
        _add_layer(prev, nxt, lo, hi, nlo, nhi, weights, times, a, b)
        prev, nxt = nxt, prev
        lo = nlo
        hi = nhi
        if caps[i] >= 0:
            best = np.inf
            for w in range(lo, min(hi, caps[i]) + 1):
                if prev[w] < best:
                    best = prev[w]
            out[i] = best
    return out
