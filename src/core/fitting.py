"""Error statistics and a small bounded optimiser for calibration fits.

No scipy at run time: the fit is a coordinate search on a handful of bounded,
physically meaningful parameters, each of which moves one part of the step time.
A parameter may carry a Gaussian prior (what kernel benchmarks and datasheets say
it should be, and how sure that is), so that where the measured rows barely
constrain it the fit stays near the physical value instead of drifting along a
flat valley of the loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class ErrorStats:
    """|predicted/measured − 1| statistics over a set of rows."""

    count: int
    mape: float
    median: float
    p90: float
    bias: float
    """Median signed error: > 0 means predictions are slow."""

    @classmethod
    def of(cls, errors: Sequence[float]) -> ErrorStats:
        if not errors:
            return cls(0, math.nan, math.nan, math.nan, math.nan)
        arr = np.asarray(errors, dtype=float)
        absolute = np.abs(arr)
        return cls(
            len(arr),
            float(absolute.mean()),
            float(np.median(absolute)),
            float(np.quantile(absolute, 0.9)),
            float(np.median(arr)),
        )


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Rank correlation (average ranks for ties)."""
    if len(a) < 2:
        return math.nan

    def ranks(x: Sequence[float]) -> np.ndarray:
        arr = np.asarray(x, dtype=float)
        order = arr.argsort(kind="stable")
        r = np.empty(len(arr))
        r[order] = np.arange(len(arr))
        for value in np.unique(arr):
            idx = arr == value
            r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass(frozen=True, slots=True)
class Prior:
    """A Gaussian belief about a parameter before the measured rows: ``centre`` ± ``width``."""

    centre: float
    width: float


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    low: float
    high: float
    prior: Prior | None = None


def prior_penalty(x: np.ndarray, params: Sequence[Parameter]) -> float:
    """Σ z² over the parameters that have a prior, z = (value − centre) / width: twice the
    negative log prior, up to a constant."""
    total = 0.0
    for value, p in zip(x, params, strict=True):
        if p.prior is not None:
            total += ((float(value) - p.prior.centre) / p.prior.width) ** 2
    return total


def coordinate_search(
    objective: Callable[[np.ndarray], float],
    start: np.ndarray,
    params: Sequence[Parameter],
    *,
    sweeps: int = 3,
    steps: int = 12,
    tolerance: float = 0.0,
    on_sweep: Callable[[int, float], None] | None = None,
) -> tuple[np.ndarray, float]:
    """Minimise ``objective`` one bounded parameter at a time (golden-section per
    coordinate), at most ``sweeps`` times over all coordinates; stop early once a sweep
    lowers the objective by no more than ``tolerance`` of its value. ``on_sweep(n,
    objective)`` hears each finished sweep. Deterministic."""
    x = np.clip(np.asarray(start, dtype=float), [p.low for p in params], [p.high for p in params])
    best = objective(x)
    ratio = (math.sqrt(5) - 1) / 2
    for sweep in range(sweeps):
        before = best
        improved = False
        for i, p in enumerate(params):
            lo, hi = p.low, p.high

            def f(value: float, i: int = i) -> float:
                trial = x.copy()
                trial[i] = value
                return objective(trial)

            a, b = lo, hi
            c, d = b - ratio * (b - a), a + ratio * (b - a)
            fc, fd = f(c), f(d)
            for _ in range(steps):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - ratio * (b - a)
                    fc = f(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + ratio * (b - a)
                    fd = f(d)
            value, score = (c, fc) if fc < fd else (d, fd)
            if score < best - 1e-12:
                x[i] = value
                best = score
                improved = True
        if on_sweep is not None:
            on_sweep(sweep + 1, best)
        if not improved or before - best <= tolerance * abs(before):
            break
    return x, best
