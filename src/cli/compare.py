"""``ndplan compare``: predicted against measured step time, and calibration fits."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from ndplan.adapters.measured import RunCase, RunInterpreter, Skip, read_rows
from ndplan.core.errors import InvalidInputError
from ndplan.core.fitting import ErrorStats
from ndplan.planner import Planner
from ndplan.validation import RowResult, compare, fit_calibration, group_stats, ranking_groups

from .common import CalibrationOpt, check_choice
from .options import DeviceFiles, Json, state
from .output import check_output_file, note, print_json, stdout, table, write_atomic
from .progress import progress_reporter


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _stats_row(name: str, s: ErrorStats) -> list[str]:
    return [
        name,
        str(s.count),
        f"{100 * s.mape:.1f}%",
        f"{100 * s.median:.1f}%",
        f"{100 * s.p90:.1f}%",
        _pct(s.bias),
    ]


STATS_COLUMNS = [
    "group",
    ("rows", "right"),
    ("MAPE", "right"),
    ("median |err|", "right"),
    ("p90 |err|", "right"),
    ("median err", "right"),
]


def summary_sections(results: list[RowResult]) -> dict[str, list[tuple[str, ErrorStats]]]:
    """The statistics compare prints: by split and model type, source, hardware, family,
    family and precision, and by the layout's shape (TP degree, pipeline schedule, and
    for MoE rows the predicted EP share of the step)."""
    clean = [r for r in results if not r.check]
    sections: dict[str, list[tuple[str, ErrorStats]]] = {}
    overall = []
    for split in ("fit", "test"):
        for label, moe in (("dense", False), ("MoE", True)):
            errs = [r.error for r in clean if r.split == split and r.moe == moe]
            if errs:
                overall.append(
                    (
                        f"{split} rows ({'even' if split == 'fit' else 'odd'} row_id) · {label}",
                        ErrorStats.of(errs),
                    )
                )
    checks = [r.error for r in results if r.check]
    if checks:
        overall.append(("CHECK rows (source contradicts itself)", ErrorStats.of(checks)))
    sections["overall"] = overall
    moe_rows = [r for r in clean if r.moe]
    for name, key, order, rows in (
        ("source", lambda r: r.source, None, clean),
        ("hardware", lambda r: r.hardware, None, clean),
        ("family", lambda r: f"{r.family} ({_kind(r)})", None, clean),
        # One family's bias can differ by precision (the kernels differ): a bias the family
        # figure averages away shows here.
        ("family and precision", lambda r: f"{r.family} · {r.precision} ({_kind(r)})", None, clean),
        # The layout's shape: the search ranks shapes against one another, so a bias that
        # grows with TP, with pipelining or with EP traffic moves its ranking even where the
        # per-row error is small; the signed median shows which way.
        (
            "tensor-parallel degree",
            lambda r: f"tp {r.tp} ({_kind(r)})",
            lambda r: (r.moe, r.tp),
            clean,
        ),
        (
            "pipeline schedule",
            lambda r: f"{PIPELINE_LABELS[r.pipeline]} ({_kind(r)})",
            lambda r: (r.moe, list(PIPELINE_LABELS).index(r.pipeline)),
            clean,
        ),
        (
            "predicted EP share of the step (MoE)",
            lambda r: EP_SHARE_BUCKETS[_ep_bucket(r)],
            _ep_bucket,
            moe_rows,
        ),
    ):
        sections[name] = [(g.key, g.stats) for g in group_stats(rows, key, name, order)]
    return sections


PIPELINE_LABELS = {
    "none": "no pipeline",
    "1f1b": "1F1B",
    "gpipe": "GPipe",
    "interleaved": "interleaved 1F1B",
    "dualpipev": "DualPipeV",
}

EP_SHARE_BUCKETS = ("no EP traffic", "EP under 5 % of the step", "EP 5-10 %", "EP 10 % or more")
"""Bands of the predicted step's exposed EP traffic share (MoE rows)."""


def _kind(r: RowResult) -> str:
    return "MoE" if r.moe else "dense"


def _ep_bucket(r: RowResult) -> int:
    share = r.parts.get("ep_comm", 0.0) / r.predicted_s
    if share <= 0.0:
        return 0
    return 1 if share < 0.05 else 2 if share < 0.10 else 3


def no_row_priced(runs: Path, rows: str, table_rows: list, skips: list) -> str:
    """Why a measured-runs file gave nothing to compare: no rows (of the chosen parity),
    or every row skipped, with the commonest reasons."""
    which = "" if rows == "all" else f" {rows}-row_id"
    if not table_rows:
        return f"{runs}: no{which} rows to compare; give a CSV of measured runs with data rows"
    counts: dict[str, int] = {}
    for skip in skips:
        counts[skip.reason] = counts.get(skip.reason, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    why = "; ".join(f"{reason} ({n})" for reason, n in ranked[:2])
    more = f"; and {len(ranked) - 2} other reasons" if len(ranked) > 2 else ""
    rows_said = (
        f"its one{which} row cannot" if len(table_rows) == 1
        else f"none of its {len(table_rows)}{which} rows can"
    )  # fmt: skip
    return f"{runs}: {rows_said} be priced ({why}{more}); fix those rows or their columns"


def compare_cmd(
    ctx: typer.Context,
    runs: Annotated[Path, typer.Argument(help="A CSV in the measured_runs.csv format.")],
    calibration: CalibrationOpt = None,
    fit: Annotated[
        Path | None,
        typer.Option(
            "--fit",
            help="Fit efficiency/overlap parameters on the rows and write a calibration file here.",
            show_default=False,
        ),
    ] = None,
    rows: Annotated[
        str, typer.Option("--rows", help="all, even or odd row_id (the fixed fit/test split).")
    ] = "all",
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the --fit file if it exists.")
    ] = False,
    per_row: Annotated[
        bool, typer.Option("--per-row/--summary-only", help="Print every row.")
    ] = True,
    device_file: DeviceFiles = None,
    as_json: Json = False,
) -> None:
    """Price every row of measured runs and compare with the measured step time.

    Rows that lack the architecture, degrees or batch are skipped with their reason.
    Example: ndplan compare runs.csv --rows odd
    """
    check_choice("--rows", rows, ("all", "even", "odd"))
    if fit is not None:
        check_output_file(fit, "--fit", force=force)
    planner = Planner(state(ctx).components(device_file))
    table_rows = read_rows(runs)
    if rows != "all":
        parity = 0 if rows == "even" else 1
        table_rows = [
            r
            for r in table_rows
            if (int(r["row_id"]) % 2 == parity if r["row_id"].isdigit() else False)
        ]
    cases, skips = RunInterpreter(
        planner.components.presets, planner.components.devices
    ).interpret_all(table_rows)
    if not cases:
        raise InvalidInputError(no_row_priced(runs, rows, table_rows, skips))
    cal = planner.calibration(calibration)
    if fit is not None:
        usable = sum(not c.check for c in cases)
        if not usable:  # nothing measured to fit to: say so instead of fitting on nothing
            raise InvalidInputError(
                f"--fit: no row of {runs} can be priced ({len(skips)} skipped, CHECK rows "
                "excluded); run `ndplan compare` without --fit to see why"
            )
        note(f"fitting on {usable} rows (CHECK rows excluded) …")
        cal, _ = fit_calibration(
            planner,
            cases,
            cal,
            source=f"ndplan compare --fit on {runs.name} ({rows} rows)",
            on_sweep=lambda n, value: note(f"sweep {n}: objective {value:.6f}"),
        )
        write_atomic(fit, cal.model_dump_json(indent=2) + "\n", force=force)
        note(f"wrote {fit}: {', '.join(f'{k}={v:.4g}' for k, v in cal.fit.items())}")
    with progress_reporter() as report:
        results = compare(planner, cases, cal, report)
    sections = summary_sections(results)
    memory = [r for r in results if r.measured_peak_gib is not None]
    ranking = ranking_groups([r for r in results if not r.check])
    if as_json:
        print_json(
            {
                "calibration": cal.source,
                "rows": [_row_json(r) for r in results],
                "skipped": [
                    {
                        "row_id": s.row_id,
                        "source": s.source,
                        "model": s.model_label,
                        "reason": s.reason,
                    }
                    for s in skips
                ],
                "summary": {
                    name: [{"group": g, **_stats_json(s)} for g, s in items]
                    for name, items in sections.items()
                },
                "memory": [
                    {
                        "row_id": r.row_id,
                        "measured_gib": r.measured_peak_gib,
                        "predicted_gib": r.predicted_peak_gib,
                        "error": r.memory_error,
                    }
                    for r in memory
                ],
                # NaN is not JSON: a group whose throughputs tie has no correlation.
                "ranking": [
                    {**g, "spearman": None if math.isnan(g["spearman"]) else g["spearman"]}
                    for g in ranking
                ],
            }
        )
        return
    if per_row:
        by_id = {c.row_id: c for c in cases}
        stdout.print(
            table(
                f"predicted vs measured step time ({cal.source})",
                [
                    "row",
                    "split",
                    "source",
                    "model",
                    "hardware",
                    ("N", "right"),
                    "layout",
                    ("measured s", "right"),
                    ("predicted s", "right"),
                    ("error", "right"),
                    "fits",
                ],
                [_row_cells(r, by_id[r.row_id]) for r in results],
            )
        )
    for name, items in sections.items():
        stdout.print(
            table(f"|error| by {name}", STATS_COLUMNS, [_stats_row(g, s) for g, s in items])
        )
    if memory:
        stdout.print(
            table(
                "peak memory: predicted vs measured",
                [
                    "row",
                    "model",
                    ("measured GiB", "right"),
                    ("predicted GiB", "right"),
                    ("error", "right"),
                ],
                [
                    (
                        r.row_id,
                        r.model,
                        f"{r.measured_peak_gib:.1f}",
                        f"{r.predicted_peak_gib:.1f}",
                        _pct(r.memory_error),
                    )
                    for r in memory
                ],
            )
        )
    if ranking:
        stdout.print(
            table(
                "ranking within groups (same model, hardware, devices; several layouts)",
                [
                    "group",
                    ("rows", "right"),
                    ("layouts", "right"),
                    ("releases", "right"),
                    ("Spearman", "right"),
                    "measured best in top 3",
                ],
                [
                    (
                        g["group"],
                        g["rows"],
                        g["layouts"],
                        g["releases"],
                        spearman_text(g["spearman"]),
                        "yes" if g["measured_best_in_top3"] else "no",
                    )
                    for g in ranking
                ],
            )
        )
    _print_skips(skips)


def spearman_text(rho: float) -> str:
    return "— (ties)" if math.isnan(rho) else f"{rho:.2f}"


def _print_skips(skips: list[Skip]) -> None:
    if not skips:
        return
    counts = Counter(s.reason for s in skips)
    stdout.print(
        table(
            f"skipped rows ({len(skips)})",
            ["reason", ("rows", "right"), "row ids"],
            [
                (reason, n, ", ".join(str(s.row_id) for s in skips if s.reason == reason)[:60])
                for reason, n in counts.most_common()
            ],
        )
    )


def _row_cells(r: RowResult, case: RunCase) -> list:
    return [
        r.row_id,
        r.split + ("*" if r.check else ""),
        r.source,
        r.model,
        r.hardware,
        r.num_devices,
        f"{r.layout} {case.job.precision}",
        f"{r.measured_s:.3f}",
        f"{r.predicted_s:.3f}",
        _pct(r.error),
        "yes" if r.fits else "NO",
    ]


def _row_json(r: RowResult) -> dict:
    return {
        "row_id": r.row_id,
        "split": r.split,
        "check": r.check,
        "source": r.source,
        "model": r.model,
        "family": r.family,
        "hardware": r.hardware,
        "precision": r.precision,
        "moe": r.moe,
        "layout": r.layout,
        "tp": r.tp,
        "pipeline": r.pipeline,
        "measured_step_s": r.measured_s,
        "predicted_step_s": r.predicted_s,
        "error": r.error,
        "fits": r.fits,
        "step_from": r.step_from,
        "assumed": r.assumed,
        "parts": r.parts,
    }


def _stats_json(s: ErrorStats) -> dict:
    return {
        "rows": s.count,
        "mape": s.mape,
        "median_abs_error": s.median,
        "p90_abs_error": s.p90,
        "median_error": s.bias,
    }


def register(app: typer.Typer) -> None:
    app.command("compare")(compare_cmd)
