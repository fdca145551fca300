"""Fit the shipped calibration on the even-``row_id`` measured runs (``make calibrate``).

Writes ``src/adapters/devices/data/calibration.json``; the odd rows stay untouched
for reporting the error (``make bench`` → docs/accuracy.md).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ndplan.adapters.measured import RunInterpreter, read_rows
from ndplan.core.calibration import Calibration
from ndplan.planner import Planner
from ndplan.validation import fit_calibration

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "tests" / "data" / "shared" / "measured_runs.csv"
OUT = REPO / "src" / "adapters" / "devices" / "data" / "calibration.json"


def main(out: Path = OUT) -> int:
    planner = Planner()
    rows = [r for r in read_rows(RUNS) if int(r["row_id"]) % 2 == 0]
    cases, skips = RunInterpreter(
        planner.components.presets, planner.components.devices
    ).interpret_all(rows)
    start = time.perf_counter()
    calibration, _results = fit_calibration(
        planner,
        cases,
        Calibration(),
        on_sweep=lambda n, value: print(f"sweep {n}: objective {value:.6f}", flush=True),
        source="fitted on the even-row_id rows of measured_runs.csv (benchmarks/calibrate.py)",
    )
    out.write_text(calibration.model_dump_json(indent=2) + "\n", encoding="utf-8")
    fit = calibration.fit
    print(
        f"fitted on {int(fit['rows'])} rows ({len(skips)} skipped) in {time.perf_counter() - start:.0f} s: "
        f"train median |error| {100 * fit['median_abs_error']:.1f}%, MAPE {100 * fit['mape']:.1f}%, "
        f"loss {fit['loss']:.6f} + prior {fit['objective'] - fit['loss']:.6f} → {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
