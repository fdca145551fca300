"""Leave-one-source-out accuracy: how the calibration prices a source it never saw.

The shipped calibration's test rows (odd ``row_id``) share sources, releases and often
layouts with its fit rows (even ``row_id``), so their error is what ndplan makes on
runs like the ones it was fitted on. A run from elsewhere shares less. Here each source
is held out whole in turn: a calibration is fitted on the even rows of every other
source, exactly as ``make calibrate`` fits the shipped one, and prices every row of the
held-out source. Beside it, the same rows under the shipped calibration, which saw the
source's even rows. Holding out Megatron-Bridge removes every Blackwell Ultra row (GB300,
B300: priced from the datasheet at the fitted generations' mean efficiencies; NeMo's B200
and GB200 rows still fit Blackwell) and every MoE row with an even ``row_id`` (the routed
experts' own parameters are then pulled by their priors alone).

``make holdout`` (about 45 minutes on two cores: one fit per source, in parallel) writes
``docs/holdout.md``.
"""

from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from ndplan.adapters.measured import RunCase, RunInterpreter, read_rows
from ndplan.core.calibration import Calibration
from ndplan.core.fitting import ErrorStats
from ndplan.planner import Planner
from ndplan.validation import compare, fit_calibration

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "shared" / "measured_runs.csv"
OUT = REPO / "docs" / "holdout.md"


def _cases(planner: Planner) -> list[RunCase]:
    cases, _skips = RunInterpreter(
        planner.components.presets, planner.components.devices
    ).interpret_all(read_rows(RUNS))
    return [c for c in cases if not c.check]


def held_out_errors(source: str) -> tuple[str, dict[int, float], float]:
    """Fit on the even rows of every source but ``source``; the error of each of its rows
    (by ``row_id``) under that fit, and the fit's seconds. Runs in a worker process."""
    planner = Planner()
    cases = _cases(planner)
    train = [c for c in cases if c.source != source and c.row_id % 2 == 0]
    start = time.perf_counter()
    calibration, _ = fit_calibration(
        planner, train, Calibration(), source=f"every source but {source}, even rows"
    )
    seconds = time.perf_counter() - start
    results = compare(planner, [c for c in cases if c.source == source], calibration)
    return source, {r.row_id: r.error for r in results}, seconds


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _cells(stats: ErrorStats) -> list[str]:
    return [_pct(stats.median), _pct(stats.mape), _pct(stats.p90), f"{100 * stats.bias:+.1f}%"]


def main(out: Path = OUT, workers: int | None = None) -> dict[str, ErrorStats]:
    start = time.perf_counter()
    planner = Planner()
    cases = _cases(planner)
    shipped = {r.row_id: r.error for r in compare(planner, cases, planner.calibration(None))}
    moe = {c.row_id: c.moe for c in cases}
    by_source: dict[str, list[int]] = defaultdict(list)
    for c in cases:
        by_source[c.source].append(c.row_id)
    # The largest sources first, so the longest fits do not start last.
    order = sorted(by_source, key=lambda s: (-len(by_source[s]), s))
    workers = workers or min(len(order), os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        folds = list(pool.map(held_out_errors, order))

    table, pooled = [], defaultdict(list)
    for source, errors, _seconds in folds:
        for kind in ("dense", "MoE"):
            ids = [i for i in by_source[source] if moe[i] == (kind == "MoE") and i in errors]
            if not ids:
                continue
            held = ErrorStats.of([errors[i] for i in ids])
            seen = ErrorStats.of([shipped[i] for i in ids if i in shipped])
            pooled[kind] += [errors[i] for i in ids]
            pooled[f"{kind} shipped"] += [shipped[i] for i in ids if i in shipped]
            table.append([f"{source} · {kind}", str(len(ids)), *_cells(held), *_cells(seen)])
    stats = {name: ErrorStats.of(errors) for name, errors in pooled.items()}

    def headline(kind: str) -> str:
        held, seen = stats[kind], stats[f"{kind} shipped"]
        return (
            f"- {kind}: median |error| **{_pct(held.median)}**, MAPE **{_pct(held.mape)}**, "
            f"p90 {_pct(held.p90)} over {held.count} rows, each priced by a fit that never saw "
            f"its source (shipped calibration on the same rows: {_pct(seen.median)}, "
            f"{_pct(seen.mape)}, {_pct(seen.p90)})"
        )

    header = ["source · class", "rows"]
    header += [f"{name} (held out)" for name in ("median", "MAPE", "p90", "signed")]
    header += [f"{name} (shipped)" for name in ("median", "MAPE", "p90", "signed")]
    lines = [
        "# Accuracy on sources the fit never saw",
        "",
        "Generated by `make holdout` (`benchmarks/holdout.py`); do not edit by hand.",
        "",
        (__doc__ or "").split("\n\n")[1].replace("\n", " ").strip(),
        "",
        "## Headline",
        "",
        *(headline(kind) for kind in ("dense", "MoE") if kind in stats),
        "",
        "## By source",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
        *("| " + " | ".join(row) + " |" for row in table),
        "",
        f"{len(folds)} fits on {workers} worker processes, "
        f"{time.perf_counter() - start:.0f} s in all.",
        "",
    ]
    out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {out}")
    return stats


if __name__ == "__main__":
    main()
    sys.exit(0)
