"""The pipeline balancer: per-chunk layer counts for one layout, each candidate priced.

An even split leaves the last stage with the output layer and the loss on top of a full
share of layers, and the first stage with the most micro-batches in flight, so the one
sets the pipeline's pace and the other runs out of memory first. The balancer moves
layers between stages and prices every placement it tries exactly (memory per stage,
the per-layer recompute knapsack within what is left, the pipeline's step time), so
recompute is chosen jointly with the placement.

The search is a deterministic local search. It starts from the better of the layout's
own split and the balanced split the search tries (``context.balanced_split``, the
head weighed by the cost model). Each round tries moving one layer off the stages that
bind: the two slowest (per micro-batch) and the one nearest its memory limit, onto
every other stage. It takes the best move while it improves: first fitting, then the
least over-memory, then the shortest step, then the lowest peak. A round prices at
most ``3·(pp − 1)`` placements.
"""

from __future__ import annotations

from dataclasses import dataclass

from .context import chunk_stage, layer_counts
from .errors import InvalidInputError
from .layout import Layout
from .pricing import PricedLayout, Pricer

MAX_ROUNDS = 10_000
"""A bound on rounds; each round moves one layer and strictly improves the score, so
the search ends well before it (at most a few layers per stage move in practice)."""


@dataclass(frozen=True, slots=True)
class Balanced:
    """The layout as given and the balancer's placement of it."""

    start: PricedLayout
    best: PricedLayout
    moved: int
    """Layers that sit on another stage than in the starting split."""
    priced: int
    """Placements priced on the way."""


def balance(pricer: Pricer, layout: Layout, *, max_rounds: int = MAX_ROUNDS) -> Balanced:
    """Per-chunk layer counts for ``layout`` that make its step fastest within memory."""
    ctx = pricer.ctx
    if layout.pp < 2:
        raise InvalidInputError(
            "balance: the layout has one pipeline stage (pp 1), nothing to balance; give --pp 2 or more"
        )
    if not ctx.framework.uneven_pipeline:
        raise InvalidInputError(
            f"balance: {ctx.framework.name} splits layers evenly; use another --framework"
        )
    model = ctx.model
    chunks = layout.chunks
    own = layer_counts(model, layout)
    cache: dict[tuple[int, ...], tuple[tuple, PricedLayout]] = {}

    def price(counts: tuple[int, ...]) -> tuple[tuple, PricedLayout]:
        found = cache.get(counts)
        if found is None:
            priced = pricer.price(layout.model_copy(update={"layers_per_stage": counts}))
            over = max(0, priced.peak_bytes - ctx.budget_bytes)
            step = priced.time.step_s if priced.time is not None else float("inf")
            score = (not priced.fits, over, step, priced.peak_bytes, counts)
            found = cache[counts] = (score, priced)
        return found

    starts = [own]
    balanced = None
    if layout.schedule != "dualpipev":
        balanced = ctx.layer_splits.for_layout(layout, 2)
    if balanced is not None and balanced != own:
        starts.append(balanced)
    current = min(starts, key=lambda c: price(c)[0])
    stage_of = [chunk_stage(layout, c) for c in range(chunks)]
    for _ in range(max_rounds):
        score, priced = price(current)
        moves = _moves(current, priced, stage_of, layout.pp, ctx.budget_bytes)
        if not moves:
            break
        # The counts only break ties between moves: a move must gain something real.
        best = min(moves, key=lambda c: price(c)[0])
        if price(best)[0][:-1] >= score[:-1]:
            break
        current = best
    moved = sum(
        max(0, a - b)
        for a, b in zip(
            _per_stage(own, stage_of, layout.pp),
            _per_stage(current, stage_of, layout.pp),
            strict=True,
        )
    )
    # The start as given: the same placement, its layout still saying "the default split".
    start = price(own)[1] if layout.layers_per_stage is not None else pricer.price(layout)
    return Balanced(start=start, best=price(current)[1], moved=moved, priced=len(cache))


def _per_stage(counts: tuple[int, ...], stage_of: list[int], pp: int) -> list[int]:
    out = [0] * pp
    for chunk, n in enumerate(counts):
        out[stage_of[chunk]] += n
    return out


def _moves(
    counts: tuple[int, ...], priced: PricedLayout, stage_of: list[int], pp: int, budget: int
) -> list[tuple[int, ...]]:
    """One layer off each binding stage onto each other stage: from the binding stage's
    fullest chunk (the last of equals) to the other's emptiest (the first of equals)."""
    totals = [sum(s.values()) for s in priced.stage_seconds]
    by_time = sorted(range(pp), key=lambda s: (-totals[s], s))
    memory = priced.totals
    by_memory = min(range(pp), key=lambda s: (budget - memory[s], s))
    sources = list(dict.fromkeys([*by_time[:2], by_memory]))
    chunks_of: list[list[int]] = [[] for _ in range(pp)]
    for chunk, stage in enumerate(stage_of):
        chunks_of[stage].append(chunk)
    out = []
    for source in sources:
        if not any(counts[c] for c in chunks_of[source]):
            continue
        take = max(chunks_of[source], key=lambda c: (counts[c], c))
        for target in range(pp):
            if target == source:
                continue
            give = min(chunks_of[target], key=lambda c: (counts[c], c))
            moved = list(counts)
            moved[take] -= 1
            moved[give] += 1
            out.append(tuple(moved))
    return out
