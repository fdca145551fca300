"""Search quality: where published production layouts land in ndplan's own ranking.

For each published dense layout in the measured runs (NVIDIA NeMo / Megatron-Bridge
performance tables, the Megatron-LM README, Korthikanti et al.), ndplan searches
every layout for the same model, hardware, device count, batch, sequence and
precision, and reports the published layout's rank and how far its predicted step
time is from the predicted best. Writes ``docs/search-quality.md``.
"""

from __future__ import annotations

import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from ndplan.adapters.measured import RunInterpreter, read_rows
from ndplan.core.errors import BaselineError, NdplanError
from ndplan.core.layout import SearchSpace, layout_label
from ndplan.core.plan import largest_difference
from ndplan.planner import Planner
from ndplan.validation import price_case

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "shared" / "measured_runs.csv"
OUT = REPO / "docs" / "search-quality.md"
SOURCES = ("nemo", "megatron-bridge", "megatron-lm", "korthikanti-2022")
TOP = 10
"""The headline's top: a published layout counts where it ranks among these."""
GRID_TOP = 20
"""Grids ranked (each by its fastest layout): a wider search prices far more layouts."""


def published_runs(planner: Planner) -> list:
    """Every measured production run of the sources (read and interpreted once a run)."""
    found, _ = RunInterpreter(planner.components.presets, planner.components.devices).interpret_all(
        read_rows(RUNS)
    )
    return [c for c in found if c.source in SOURCES and not c.check and c.job.finetune == "full"]


def problem_key(c) -> tuple:
    """What a search is given: model, hardware, device count, batch, sequence, precision."""
    return (
        c.model_label,
        c.hardware,
        c.num_devices,
        c.job.global_batch_size,
        c.job.seq_length,
        c.job.precision,
    )


def layout_key(c) -> tuple:
    """The problem and the layout run on it: what one release spread is measured over."""
    return (*problem_key(c), c.layout.label)


def cases(runs: Iterable, moe: bool = False):
    """One published layout per problem, dense or (``moe``) mixture-of-experts."""
    seen = set()
    for c in runs:
        key = problem_key(c)
        if c.moe == moe and key not in seen:
            seen.add(key)
            yield c


def release_spreads(runs: Iterable[tuple[tuple, str, float]]) -> dict[tuple, tuple[float, int]]:
    """For each ``(key, release, measured step)`` key measured in two or more releases:
    slowest over fastest measured step − 1, and how many releases. With the key a
    problem and its layout, this is how far one layout's measured speed moves with the
    software alone, the resolution the published runs themselves have."""
    steps: dict[tuple, list[float]] = defaultdict(list)
    releases: dict[tuple, set[str]] = defaultdict(set)
    for key, release, step_s in runs:
        steps[key].append(step_s)
        releases[key].add(release)
    return {
        key: (max(found) / min(found) - 1, len(releases[key]))
        for key, found in steps.items()
        if len(releases[key]) >= 2
    }


def layout_spreads(runs: Iterable, moe: bool) -> dict[tuple, tuple[float, int]]:
    """``release_spreads`` of the published runs, keyed by problem and layout."""
    return release_spreads(
        (layout_key(c), c.release, c.measured_step_s) for c in runs if c.moe == moe
    )


def evaluate(planner: Planner, case, calibration) -> dict:
    """The published layout's rank and gap. A degree the source does not state (the
    Megatron-LM README gives neither micro-batch nor VPP) is free: the published layout
    is every layout with the stated degrees, and the best of them counts."""
    ctx = planner.context(case.model, case.device, case.num_devices, case.job)
    lay = case.layout
    free = set(case.unstated)
    want = {
        "tp": lay.tp,
        "pp": lay.pp,
        "vpp": lay.vpp,
        "cp": lay.cp,
        "dp": lay.dp,
        "mbs": lay.mbs,
        "zero": lay.zero,
        "offload_optimizer": False,
    }
    published_grid: tuple[int, ...] = (lay.tp, lay.pp, lay.cp, lay.dp)
    if case.moe:
        want["ep"] = lay.ep
        published_grid += (lay.ep,)
        if lay.etp is not None and "etp" not in free:  # unstated: the search's free rule
            want["etp"] = lay.etp
            published_grid += (lay.etp,)
    for name in free:
        want.pop(name, None)
    schedules = ("1f1b", "interleaved")
    space = SearchSpace(recompute=("auto",), schedule=schedules)
    # The published layout as a baseline: its exact rank (every faster layout priced),
    # and its gap to the best (search --baseline).
    outside = ""
    try:
        placed = planner.search(ctx, space, top_k=TOP, baseline=want).result
    except BaselineError as exc:  # not a layout ndplan's search offers: say why
        refused = re.search(r"refused \((\w+)", exc.detail)
        outside = f"refused: {refused.group(1)}" if refused else "not in the search space"
        placed = planner.search(ctx, space, top_k=TOP).result
        own = rank = gap = None
    else:
        own, rank, gap = placed.baseline.plan, placed.baseline.rank, placed.baseline.gap
        if own is None:  # the published run fitted; ndplan's memory model says it does not
            over = re.search(r"over by ([\d.]+ GiB on stage \d+)", placed.baseline.miss or "")
            outside = f"over memory by {over.group(1)}" if over else "over memory"
    best = placed.plans[0]
    # How far apart the 10 best are: the precision a top-10 rank asks of the step-time model.
    span = placed.plans[-1].time.step_s / best.time.step_s - 1 if len(placed.plans) == TOP else None
    # The published device grid among the best layout of each grid (search --distinct).
    grids = planner.search(ctx, space, top_k=GRID_TOP, distinct=True).result.plans
    grid_rank = next(
        (p.rank for p in grids if p.layout.shape[: len(published_grid)] == published_grid),
        None,
    )
    try:  # how well ndplan prices the published layout as it was run
        error = price_case(planner, case, calibration).error
    except NdplanError:
        error = None
    return {
        "row": case.row_id,
        "source": case.source,
        "model": case.model_label,
        "hardware": case.hardware,
        "devices": case.num_devices,
        "gbs": case.job.global_batch_size,
        "seq": case.job.seq_length,
        "precision": case.job.precision,
        "published": published_label(lay, free),
        "best": layout_label(best.layout.model_dump()),
        "rank": rank,
        "grid_rank": grid_rank,
        "gap": gap,
        "span": span,
        "error": error,
        "where": where_the_gap_is(own, best) if own is not None and gap and gap > 0 else "",
        "outside": outside,
    }


def where_the_gap_is(own, best) -> str:
    """The step-time part that differs most between the published layout and the best
    (compute = forward + backward + recompute)."""
    name, delta = largest_difference(own, best)
    return f"{name} {delta:+.2f} s"


def published_label(lay, free: set[str]) -> str:
    """The layout's label with ``?`` for the degrees the source leaves free."""
    label = lay.label
    if "vpp" in free:
        label = label.replace(f" pp{lay.pp} ", f" pp{lay.pp}×? ", 1)
    if "mbs" in free:
        label = label.replace(f" mbs{lay.mbs} ", " mbs? ", 1)
    return label


def main() -> list[dict]:
    planner = Planner()
    calibration = planner.calibration(None)
    start = time.perf_counter()
    runs = published_runs(planner)
    spreads = {moe: layout_spreads(runs, moe) for moe in (False, True)}

    def evaluated(c) -> dict:
        found = spreads[c.moe].get(layout_key(c))
        return {**evaluate(planner, c, calibration), "release_spread": found}

    results = [evaluated(c) for c in cases(runs)]
    moe = [evaluated(c) for c in cases(runs, moe=True)]
    for kind, found in (("dense", results), ("MoE", moe)):
        top10, close, both, grids = headline_counts(found)
        print(
            f"search quality, {kind}: {len(found)} published layouts; top 10: {top10}; within 10% of "
            f"the predicted best: {close}; both: {both}; published grid among the 10 best grids "
            f"and within 10%: {grids}"
        )
    print(f"search quality: {time.perf_counter() - start:.0f} s")
    OUT.write_text(markdown(results, moe, spreads[False], spreads[True]), encoding="utf-8")
    return results + moe


def headline_counts(results: list[dict]) -> tuple[int, int, int, int]:
    """Published layouts in the top 10; within 10 % of the best; both; and published
    grids among the 10 best grids with the layout within 10 %."""

    def within(r: dict) -> bool:
        return r["gap"] is not None and r["gap"] <= 0.10

    def among_10(rank: int | None) -> bool:
        return rank is not None and rank <= TOP

    return (
        sum(among_10(r["rank"]) for r in results),
        sum(within(r) for r in results),
        sum(among_10(r["rank"]) and within(r) for r in results),
        sum(among_10(r["grid_rank"]) and within(r) for r in results),
    )


def markdown(
    results: list[dict],
    moe: list[dict],
    dense_spreads: dict[tuple, tuple[float, int]],
    moe_spreads: dict[tuple, tuple[float, int]],
) -> str:
    lines = [
        "# Search quality",
        "",
        "Generated by `make bench` (`benchmarks/search_quality.py`); do not edit by hand.",
        "",
        "For each published dense production layout (one per model, hardware, device count, batch, sequence and "
        "precision), ndplan searched every layout for the same inputs (recompute chosen per layer; activation "
        "offload among the options for Megatron-Bridge's Megatron-FSDP rows, whose recipes offload) and ranked "
        "them. "
        "*rank* is the published layout's place among every layout ranked, exact (`ndplan search --baseline`: "
        "the search prices every layout that could be faster; — when it does not fit; each layout ranked "
        "once, at the faster of the layer splits ndplan tries for it: even, the embedding and the loss counted "
        "as layers, or balanced, the last stage lighter by the output layer); *grid rank* the place of its device grid (tp·pp·cp·dp) when each grid is "
        "represented by its fastest layout, as `ndplan search --distinct` lists them (layouts of one grid "
        "differ only in VPP, micro-batch size, ZeRO stage, offload, recompute or split, so the rank can be "
        f"much larger; — beyond the {GRID_TOP} best grids); *gap* its predicted step time over "
        "the predicted best (— when ndplan predicts it does not fit). A degree the source does not state (shown "
        "as ?, e.g. the Megatron-LM README's micro-batch and VPP) is left free: the best layout with the stated "
        "degrees counts, at its faster split like every layout, though the published runs split their layers "
        "evenly or as their recipe states. *error* is how ndplan prices the published layout as it was run (predicted / measured "
        "step time − 1, as in accuracy.md); *where* is the step-time part that differs most between the "
        "published layout and ndplan's best (compute = forward + backward + recompute); *outside* says why a "
        "published layout has no rank. *top-10 span* is how much slower ndplan's 10th best layout is "
        "predicted than its best; *releases* how much the published layout's measured step time moved "
        "between the software releases it was measured in (slowest over fastest − 1; their number in "
        "brackets), as far as the measured runs hold it more than once.",
        "",
        _headline(results),
        "",
        _resolution(results, dense_spreads),
        "",
        *_case_table(results),
        "",
        "## Mixture-of-experts layouts",
        "",
        "The same for each published MoE layout (Megatron-Bridge's DeepSeek-V3, Kimi K2, Qwen3 and GPT OSS, "
        "NeMo's Mixtral), its expert-parallel degree stated too (an expert TP the source does not state is "
        "free), and *grid* including EP (and a stated expert TP). These are kept apart from the headline above: "
        "the MoE step-time model is the less accurate one (accuracy.md), and one layout's measured speed moves "
        "by up to a third between software releases. "
        "An MTP model's chunks leave the last one room for the MTP block and the loss (three layers' "
        "worth: 61 layers and that room make 64 slots, 4 a chunk at pp 4 × vpp 4), or, where that room "
        "does not divide them, count the embedding, the MTP block and the loss as a layer each "
        "(Megatron-Bridge's DeepSeek-V3 on H100 at pp 8 × vpp 4: `Et|(tt|)*30mL`). The 61 "
        "layers of DeepSeek-V3 without MTP and of Kimi K2 split evenly at no pipeline depth; there "
        "ndplan offers chunks one slot short, at most one per stage, the embedding and the loss counted "
        "as layers, which is how those rows are placed. "
        "*refused: ep_not_dividing_expert_group*: the row's EP is wider than the ranks of one pipeline "
        "stage, so the row contradicts itself.",
        "",
        _headline(moe),
        "",
        _resolution(moe, moe_spreads),
        "",
        *_case_table(moe),
    ]
    return "\n".join(lines) + "\n"


def _headline(results: list[dict]) -> str:
    top10, close, both, grids = headline_counts(results)
    return (
        f"Of {len(results)} published layouts: {top10} rank in the top 10, {close} are predicted within "
        f"10% of the best, {both} both. Counting device grids instead (`--distinct`): {grids} published "
        "grids rank among the 10 best grids with the published layout within 10% of the best."
    )


def _resolution(results: list[dict], spreads: dict[tuple, tuple[float, int]]) -> str:
    """The predicted top 10's span beside how far one layout's measured speed moves
    between releases: a top-10 rank asks the model to order layouts that finely."""
    spans = [r["span"] for r in results if r["span"] is not None]
    moved = [spread for spread, _ in spreads.values()]
    if not spans or not moved:
        return ""
    return (
        f"ndplan's 10 best layouts span a median {100 * statistics.median(spans):.1f}% of step time "
        f"(at most {100 * max(spans):.1f}%). The {len(moved)} published layouts measured in two or more "
        f"software releases (same inputs, same layout) moved by a median {100 * statistics.median(moved):.1f}% "
        f"between releases (at most {100 * max(moved):.1f}%)."
    )


def _percent(value: float | None) -> str:
    return f"{100 * value:+.1f}%" if value is not None else "—"


def _case_table(results: list[dict]) -> list[str]:
    lines = [
        "| row | source | model | hardware | N | gbs | seq | prec | published | rank | grid rank | gap | "
        "top-10 span | error | releases | where | ndplan's best | outside |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rank = str(r["rank"]) if r["rank"] is not None else "—"
        shapes = str(r["grid_rank"]) if r["grid_rank"] is not None else "—"
        moved = r["release_spread"]
        releases = f"{100 * moved[0]:.1f}% ({moved[1]})" if moved is not None else "—"
        span = f"{100 * r['span']:.1f}%" if r["span"] is not None else "—"
        lines.append(
            f"| {r['row']} | {r['source']} | {r['model']} | {r['hardware']} | {r['devices']} | {r['gbs']} | "
            f"{r['seq']} | {r['precision']} | {r['published']} | {rank} | {shapes} | {_percent(r['gap'])} | "
            f"{span} | {_percent(r['error'])} | {releases} | {r['where']} | "
            f"{r['best']} | {r['outside']} |"
        )
    return lines


if __name__ == "__main__":
    main()
