"""Numba engine of the recompute knapsack: the DP of ``reference.py``, compiled.

Same arrays in, same results out, bit for bit: every table entry it computes is
the same ``min`` over the same ``best[w - weight] + time`` sums as in the reference (no
``fastmath``, so no re-association), and ties go to the lowest option index the
same way (a later option replaces the minimum only when strictly better).

What makes it faster than the reference, without changing any entry that can
reach the answer:

- It keeps only the table's non-dominated entries: those faster than
  every entry at a lower ``w`` (a frontier of a few hundred to a few thousand
  entries where the dense table spans tens of thousands of buckets). A dominated
  entry never lies on the answer's path: the entry dominating it, completed the
  same way, would reach the same or a lower time at fewer buckets. And a
  non-dominated entry's minimum never comes from a dominated one (else it would
  be dominated too), so every entry kept has the reference's value and pick, and
  the backtrack through each entry's option and parent gives the reference's
  answer, bit for bit. Adding a layer merges the frontier shifted by each option,
  lightest option first (so on equal ``w`` and time the lower index stays).
- ``dp_least`` and ``dp_suffix`` build the same frontier: its times fall as ``w``
  grows, so the least time within a budget is the heaviest entry that fits.
- Entries above the cap less the lightest weights of the layers still to come
  are dropped: no answer can use them.

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
def _lightest_total(weights, ptr, counts):  # pragma: no cover
    total = 0
    for g in range(counts.size):
        if counts[g] > 0:
            total += counts[g] * weights[ptr[g]]
    return total


@njit(cache=True)
def _grown(array, used, size):  # pragma: no cover
    """``array``'s first ``used`` entries in a new array of ``size``."""
    out = np.empty(size, dtype=array.dtype)
    out[:used] = array[:used]
    return out


@njit(cache=True)
def _merge_shifted(
    mw, mt, mj, mp, m, cw, ct, size, wj, tj, j, limit, ow, ot, oj, op
):  # pragma: no cover
    """Merge a frontier under construction (``m`` entries, options before ``j``) with the
    previous frontier shifted by option ``j``; write the non-dominated entries within
    ``limit`` to ``o*`` and return their count.

    Equal ``w``: the smaller time wins, and on equal time the entry already built (a
    lower option index), as in the dense table. An entry no faster than one at a lower
    ``w`` is dominated and dropped."""
    x = 0
    y = 0
    n = 0
    last = np.inf
    while True:
        ry = y < size and cw[y] + wj <= limit
        if x < m and ry:
            yw = cw[y] + wj
            if mw[x] < yw:
                take_x = True
            elif mw[x] > yw:
                take_x = False
            else:
                take_x = mt[x] <= ct[y] + tj
                if take_x:
                    y += 1  # the same w, no faster: dropped
                else:
                    x += 1
        elif x < m:
            take_x = True
        elif ry:
            take_x = False
        else:
            return n
        if take_x:
            w = mw[x]
            t = mt[x]
            pick = mj[x]
            parent = mp[x]
            x += 1
        else:
            w = cw[y] + wj
            t = ct[y] + tj
            pick = j
            parent = y
            y += 1
        if t < last:  # strictly faster than every lighter entry: not dominated
            ow[n] = w
            ot[n] = t
            oj[n] = pick
            op[n] = parent
            n += 1
            last = t


@njit(cache=True)
def _add_layer(cw, ct, weights, times, a, b, limit):  # pragma: no cover
    """The frontier after one more layer with options ``a..b-1``, within ``limit`` buckets:
    per entry its ``w``, time, option (from ``a``) and parent's index in ``cw``."""
    size = cw.size
    room = max(0, min(size * (b - a), limit + 1))  # distinct w in 0..limit, at most
    aw = np.empty(room, dtype=np.int64)
    at = np.empty(room)
    aj = np.empty(room, dtype=np.uint8)
    ap = np.empty(room, dtype=np.int64)
    bw = np.empty(room, dtype=np.int64)
    bt = np.empty(room)
    bj = np.empty(room, dtype=np.uint8)
    bp = np.empty(room, dtype=np.int64)
    m = _merge_shifted(
        aw, at, aj, ap, 0, cw, ct, size, weights[a], times[a], 0, limit, bw, bt, bj, bp
    )
    for j in range(1, b - a):
        aw, bw = bw, aw
        at, bt = bt, at
        aj, bj = bj, aj
        ap, bp = bp, ap
        m = _merge_shifted(
            aw, at, aj, ap, m, cw, ct, size, weights[a + j], times[a + j], j, limit, bw, bt, bj, bp
        )
    return bw[:m], bt[:m], bj[:m], bp[:m]


@njit(cache=True)
def _start():  # pragma: no cover
    """No layer yet: one entry, zero buckets, zero time."""
    return np.zeros(1, dtype=np.int64), np.zeros(1)


@njit(cache=True)
def _least_within(cw, ct, cap):  # pragma: no cover
    """The least time within ``cap`` buckets: the heaviest entry that fits (times fall with w)."""
    k = np.searchsorted(cw, cap, side="right")
    return ct[k - 1] if k > 0 else np.inf


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
    cw, ct = _start()
    # Per layer, each frontier entry's option and its parent's index in the frontier before.
    starts = np.zeros(n_layers + 1, dtype=np.int64)
    hist_pick = np.empty(1024, dtype=np.uint8)
    hist_parent = np.empty(1024, dtype=np.int64)
    layer = 0
    for g in range(counts.size):
        a = ptr[g]
        for _ in range(counts[g]):
            rem -= weights[a]
            # The layers still to come add at least their lightest weights.
            cw, ct, pick, parent = _add_layer(cw, ct, weights, times, a, ptr[g + 1], cap - rem)
            start = starts[layer]
            if start + cw.size > hist_pick.size:
                grown = max(2 * hist_pick.size, start + cw.size)
                hist_pick = _grown(hist_pick, start, grown)
                hist_parent = _grown(hist_parent, start, grown)
            hist_pick[start : start + cw.size] = pick
            hist_parent[start : start + cw.size] = parent
            starts[layer + 1] = start + cw.size
            layer += 1
    # The last entry is the fastest, and the lightest of the fastest.
    k = cw.size - 1
    best = ct[k]
    w_star = cw[k]
    for layer in range(n_layers - 1, -1, -1):
        picks[layer] = hist_pick[starts[layer] + k]
        k = hist_parent[starts[layer] + k]
    return best, w_star, picks


@njit(cache=True)
def dp_least(weights, times, ptr, counts, cap):  # pragma: no cover
    """``out[w]`` = least time keeping at most ``w`` buckets, for ``w`` in ``0..cap``."""
    out = np.full(cap + 1, np.inf)
    rem = _lightest_total(weights, ptr, counts)
    if rem > cap:
        return out
    cw, ct = _start()
    for g in range(counts.size):
        a = ptr[g]
        for _ in range(counts[g]):
            rem -= weights[a]
            cw, ct, _pick, _parent = _add_layer(cw, ct, weights, times, a, ptr[g + 1], cap - rem)
    # A step function: each entry's time holds from its w up to the next entry's.
    for k in range(cw.size):
        stop = cw[k + 1] if k + 1 < cw.size else cap + 1
        out[cw[k] : stop] = ct[k]
    return out


@njit(cache=True)
def dp_suffix(weights, times, ptr, caps):  # pragma: no cover
    """Least time of every suffix ``i..end`` within ``caps[i]`` buckets (``caps[i] < 0``: not asked)."""
    n = caps.size
    out = np.full(n, np.inf)
    first = -1
    for i in range(n):
        if caps[i] >= 0:
            first = i
            break
    if first < 0:
        return out
    # need[i]: the highest entry after adding layer i that an answer can use,
    # now (caps[i]) or later, once the lighter-than-lightest layers before it
    # in model order are added (caps[k] minus their lightest weights).
    need = np.empty(n, dtype=np.int64)
    need[first] = caps[first]
    for i in range(first + 1, n):
        need[i] = max(caps[i], need[i - 1] - weights[ptr[i - 1]])
    cw, ct = _start()
    for i in range(n - 1, first - 1, -1):
        cw, ct, _pick, _parent = _add_layer(cw, ct, weights, times, ptr[i], ptr[i + 1], need[i])
        if caps[i] >= 0:
            out[i] = _least_within(cw, ct, caps[i])
    return out
