"""``ndplan sweep``: many searches in one command, one row per scenario.

Scenarios are every combination of models × device types × device counts × global
batch sizes × sequence lengths, from a YAML file, flags, or both (flags replace the
file's values). Each scenario is one task on the selected executor (serial, pool or
Ray) and becomes one row: its best plan, or why it has none.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from ndplan.core.assumptions import SEPARATOR, AssumptionRecorder, assumed_line
from ndplan.core.errors import ExitCode, InvalidInputError, did_you_mean
from ndplan.core.frameworks import traits_for
from ndplan.core.units import MAX_COUNT, GiB
from ndplan.planner import Planner, check_memory_budget
from ndplan.sweep import ROW_FIELDS, Scenario, SweepRecipe, run_sweep

from .common import (
    CalibrationOpt,
    FrameworkOpt,
    JobFileOpt,
    JobInputs,
    MaxMemOpt,
    PrecisionOpt,
    job_settings,
    load_job_file,
    read_yaml,
)
from .executors import ExecutorOpt, JobsOpt, RayAddressOpt, open_executor
from .options import DeviceFiles, Json, Strict, state
from .output import check_output_file, note, print_json, stdout, table, write_atomic
from .progress import progress_reporter
from .search import UNEVEN_NOTE, build_space, load_space_file, pipeline_cell, space_values

GRID_KEYS = ("model", "device", "devices", "gbs", "seq_len")
"""What varies: each a scalar or a list; every combination is one scenario."""
SHARED_KEYS = ("precision", "framework", "max_mem", "space", "job")
"""What applies to every scenario."""
FILE_KEYS = (*GRID_KEYS, *SHARED_KEYS, "scenarios")
FLAGS = {
    "model": "-m/--model",
    "device": "-d/--device",
    "devices": "-n/--devices",
    "gbs": "--gbs",
    "seq_len": "-s/--seq-len",
}


def load_sweep_file(path: Path) -> dict[str, Any]:
    """A sweep YAML: grid keys (scalars or lists), shared settings, optional ``scenarios``."""
    data = read_yaml(path, "sweep")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InvalidInputError(f"{path}: expected a mapping with keys {', '.join(FILE_KEYS)}")
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in FILE_KEYS:
            raise InvalidInputError(
                f"{path}: unknown key '{key}'{did_you_mean(name, FILE_KEYS)} "
                f"(known: {', '.join(FILE_KEYS)})"
            )
        out[name] = value
    scenarios = out.get("scenarios")
    if scenarios is not None:
        if not isinstance(scenarios, list) or not all(isinstance(s, dict) for s in scenarios):
            raise InvalidInputError(f"{path}: 'scenarios' must be a list of mappings")
        for i, entry in enumerate(scenarios):
            for key in entry:
                name = str(key).replace("-", "_")
                if name not in GRID_KEYS:
                    raise InvalidInputError(
                        f"{path}: scenarios[{i}]: unknown key '{key}'"
                        f"{did_you_mean(name, GRID_KEYS)} (known: {', '.join(GRID_KEYS)})"
                    )
    return out


def flag_values(key: str, given: list[str] | None) -> list[Any] | None:
    """A grid flag's values as users type them: repeated (``-n 8 -n 16``) or comma-separated
    (``-n 8,16``, ``-d h100,b200``). A model path that holds a comma is kept whole."""
    if not given:
        return None
    out: list[Any] = []
    for word in given:
        if key == "model" and Path(word).expanduser().exists():
            out.append(word)
            continue
        pieces = [piece.strip() for piece in word.split(",")]
        if any(not piece for piece in pieces):
            example = {"model": "llama-3-8b,llama-3-70b", "device": "h100,b200"}.get(key, "8,16")
            raise InvalidInputError(f"{FLAGS[key]} {word}: an empty value; give e.g. {example}")
        if key in ("model", "device"):
            out.extend(pieces)
            continue
        for piece in pieces:
            try:
                number = int(piece)
            except ValueError:
                flag = FLAGS[key].split("/")[0]
                raise InvalidInputError(
                    f"{FLAGS[key]} {word}: '{piece}' is not a whole number; give "
                    f"{flag} 8 {flag} 16 or {flag} 8,16"
                ) from None
            if number < 1:
                raise InvalidInputError(f"{FLAGS[key]} {word}: {number} must be at least 1")
            if number > MAX_COUNT:  # a typo, refused before any scenario runs
                raise InvalidInputError(
                    f"{FLAGS[key]} {word}: at most {MAX_COUNT:,}, got {number:,}"
                )
            out.append(number)
    return out


def _values(key: str, value: Any, where: str) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if not values:
        raise InvalidInputError(f"{where}{key}: an empty list gives no scenario")
    kind = str if key in ("model", "device") else int
    out = []
    for v in values:
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise InvalidInputError(f"{where}{key}: expected positive integers, got {v!r}")
        if kind is int and v > MAX_COUNT:  # a typo, refused before any scenario runs
            raise InvalidInputError(f"{where}{key}: at most {MAX_COUNT:,}, got {v:,}")
        if kind is str and not isinstance(v, str | int | float):
            raise InvalidInputError(f"{where}{key}: expected names, got {v!r}")
        out.append(kind(v))
    return list(dict.fromkeys(out))  # `-n 8 -n 8` is one scenario, not the same one twice


def expand(
    file_values: dict[str, Any], flags: dict[str, list[Any] | None], source: str | None = None
) -> list[dict]:
    """Every (model, device, devices, gbs, seq_len) combination, in grid order.

    Flags replace the file's top-level values; entries of ``scenarios`` are grids of
    their own, taking missing keys from the top level. A bad value names ``source``,
    the sweep file (the flags' values were checked as they were read)."""
    top = {k: file_values[k] for k in GRID_KEYS if k in file_values}
    top.update({k: v for k, v in flags.items() if v})
    entries = [
        {**top, **{str(k).replace("-", "_"): v for k, v in e.items()}}
        for e in file_values.get("scenarios") or [{}]
    ]
    out: list[dict] = []
    for i, entry in enumerate(entries):
        where = f"{source}: " if source else ""
        where += f"scenarios[{i}]: " if file_values.get("scenarios") else ""
        missing = [k for k in GRID_KEYS if k not in entry]
        if missing:
            raise InvalidInputError(
                f"{where}missing {', '.join(missing)}: give "
                + ", ".join(FLAGS[k] for k in missing)
                + f" or set {'it' if len(missing) == 1 else 'them'} in the sweep file"
            )
        axes = [_values(k, entry[k], where) for k in GRID_KEYS]
        out.extend(dict(zip(GRID_KEYS, combo, strict=True)) for combo in itertools.product(*axes))
    return out


def rows_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(ROW_FIELDS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                k: repr(v) if isinstance(v, float) else ("" if v is None else v)
                for k, v in row.items()
            }
        )
    return buf.getvalue()


def rows_table(rows: list[dict]):
    out = []
    for i, r in enumerate(rows, start=1):
        head = (i, r["model"], r["device"], r["devices"], r["gbs"], r["seq_len"])
        if r["status"] != "ok":
            out.append((*head, *[""] * 12, f"{r['status']}: {r['reason']}"))
            continue
        pp = pipeline_cell(r["pp"], r["vpp"], r["schedule"], bool(r["layers_per_chunk"]))
        out.append(
            (
                *head,
                r["tp"],
                pp,
                r["cp"],
                r["dp"],
                r["ep"] if r["ep"] > 1 else "",
                f"{r['mbs']}×{r['num_microbatches']}",
                r["zero"],
                r["recompute"],
                f"{r['step_s']:.3f}",
                f"{r['tokens_per_s_per_device']:,.0f}",
                f"{100 * r['mfu']:.1f}%",
                f"{r['peak_gib']:.1f}",
                "ok",
            )
        )
    out_table = table(
        "sweep: best plan per scenario",
        [
            ("#", "right"),
            "model",
            "device",
            ("n", "right"),
            ("gbs", "right"),
            ("seq", "right"),
            ("tp", "right"),
            ("pp", "right"),
            ("cp", "right"),
            ("dp", "right"),
            ("ep", "right"),
            ("mbs×m", "right"),
            ("zero", "right"),
            "recompute",
            ("step s", "right"),
            ("tok/s/dev", "right"),
            ("MFU", "right"),
            ("peak GiB", "right"),
            "status",
        ],
        out,
    )
    if any(r["layers_per_chunk"] for r in rows):
        out_table.caption = UNEVEN_NOTE + "; layers_per_chunk in --csv and --json gives the counts"
        out_table.caption_justify = "left"
    return out_table


def sweep_cmd(
    ctx: typer.Context,
    file: Annotated[
        Path | None,
        typer.Argument(
            metavar="FILE",
            help="A sweep YAML: model, device, devices, gbs, seq_len (each a value or a "
            "list), precision, framework, max_mem, space, job, scenarios.",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="Model preset or config (repeatable, or comma-separated).",
            show_default=False,
        ),
    ] = None,
    device: Annotated[
        list[str] | None,
        typer.Option(
            "--device",
            "-d",
            help="Device type (repeatable, or comma-separated).",
            show_default=False,
        ),
    ] = None,
    devices: Annotated[
        list[str] | None,
        typer.Option(
            "--devices",
            "-n",
            metavar="N[,N…]",
            help="Device count (repeatable, or comma-separated).",
            show_default=False,
        ),
    ] = None,
    gbs: Annotated[
        list[str] | None,
        typer.Option(
            "--gbs",
            metavar="B[,B…]",
            help="Global batch size (repeatable, or comma-separated).",
            show_default=False,
        ),
    ] = None,
    seq_len: Annotated[
        list[str] | None,
        typer.Option(
            "--seq-len",
            "-s",
            metavar="S[,S…]",
            help="Sequence length (repeatable, or comma-separated).",
            show_default=False,
        ),
    ] = None,
    precision: PrecisionOpt = None,
    framework: FrameworkOpt = None,
    max_mem: MaxMemOpt = None,
    space_file: Annotated[
        Path | None,
        typer.Option(
            "--space",
            help="A search-space YAML applied to every scenario (as in `ndplan search`).",
            show_default=False,
        ),
    ] = None,
    job_file: JobFileOpt = None,
    calibration: CalibrationOpt = None,
    strict: Strict = False,
    as_json: Json = False,
    csv_out: Annotated[
        Path | None,
        typer.Option("--csv", help="Write every scenario's row as CSV.", show_default=False),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite output files that exist.")
    ] = False,
    jobs: JobsOpt = None,
    executor: ExecutorOpt = None,
    ray_address: RayAddressOpt = None,
    device_file: DeviceFiles = None,
) -> None:
    """Run many searches — models × device types × device counts × batch sizes × sequence
    lengths — and print the best plan of each (or why it has none).

    Exit 0 when at least one scenario has a plan, 1 when none has.

    Example: ndplan sweep -m llama-3-8b,llama-3-70b -d h100 -n 64 -n 128 --gbs 512 -s 8192

    Example: ndplan sweep sweep.yaml --executor ray --ray-address ray://head:10001 --csv out.csv
    """
    st = state(ctx)
    # Workers start before anything is parsed, so their imports overlap that work. A
    # sweep prints no per-candidate lines, so -vv need not price serially.
    with open_executor(
        st, jobs=jobs, name=executor, ray_address=ray_address, verbosity=min(st.verbosity, 1)
    ) as pool:
        if csv_out is not None:
            check_output_file(csv_out, "--csv", force=force)
        file_values = load_sweep_file(file) if file is not None else {}
        given = dict(zip(GRID_KEYS, (model, device, devices, gbs, seq_len), strict=True))
        flags = {key: flag_values(key, values) for key, values in given.items()}
        combos = expand(file_values, flags, str(file) if file is not None else None)
        if job_file is not None:
            job_values, job_from = load_job_file(job_file), str(job_file)
        else:
            job_from = f"{file}: job"
            job_values = job_settings(file_values.get("job"), job_from)
        precision = precision if precision is not None else file_values.get("precision")
        framework = framework if framework is not None else file_values.get("framework")
        if space_file is not None:
            space_values = load_space_file(space_file)
        else:
            space_values = _inline_space(file_values.get("space"), file)
        if "reserve" in space_values:
            raise InvalidInputError(
                "space: reserve: a sweep holds nothing back for balancing; drop the key"
            )
        budget_from = "--max-mem"
        for given, where in (
            (max_mem, "--max-mem"),
            (file_values.get("max_mem"), f"{file}: max_mem"),
            (
                space_values.get("max_mem"),
                f"{space_file}: max_mem" if space_file else f"{file}: space: max_mem",
            ),
        ):
            if given is not None:
                max_mem, budget_from = given, where
                break
        if max_mem is not None and (
            not isinstance(max_mem, int | float)
            or isinstance(max_mem, bool)
            or not math.isfinite(max_mem)
            or max_mem <= 0
        ):
            raise InvalidInputError(
                f"{budget_from}: must be a positive number of GiB, got {max_mem!r}"
            )
        planner = Planner(st.components(device_file))
        recorder = AssumptionRecorder(strict=strict)
        specs = {
            name: planner.model(name, recorder)
            for name in dict.fromkeys(c["model"] for c in combos)
        }
        devs = {name: planner.device(name) for name in dict.fromkeys(c["device"] for c in combos)}
        for dev in devs.values():
            check_memory_budget(max_mem, dev, budget_from)
        scenarios = []
        first_of: dict[tuple, str] = {}  # one search per problem, however it is named
        for c in combos:
            spec, dev = specs[c["model"]], devs[c["device"]]
            problem = (spec, dev.id, c["devices"], c["gbs"], c["seq_len"])
            given = f"{c['model']} on {c['devices']} × {c['device']}"
            if problem in first_of:
                note(
                    f"note: '{given}' repeats '{first_of[problem]}' (one model and device by "
                    "other names): searched once"
                )
                continue
            first_of[problem] = given
            job = JobInputs(
                c["gbs"],
                c["seq_len"],
                precision,
                framework,
                None,
                None,
                settings=job_values,
                settings_from=job_from,
            ).job()
            space = build_space(
                vary=None,
                fixed={},
                file_values=space_values,
                is_moe=spec.is_moe,
                framework=traits_for(job.framework or "megatron"),
                max_tp=None,
            )
            scenarios.append(
                Scenario(
                    model_name=c["model"],
                    model=spec,
                    device=dev,
                    num_devices=c["devices"],
                    job=job,
                    space=space,
                    capacity_bytes=int(max_mem * GiB) if max_mem is not None else None,
                )
            )
        recipe = SweepRecipe(
            plugins=planner.components.plugin_modules,
            disabled=planner.components.disabled,
            calibration=planner.calibration(calibration),
            strict=strict,
            token=uuid.uuid4().hex,
        )
        with progress_reporter() as report:
            rows = run_sweep(pool, recipe, scenarios, report)
        # One line, as search gives it: the defaults reading the models or any scenario
        # assumed, each once, in field order.
        assumed = {a.describe() for a in recorder.items}
        for row in rows:
            assumed.update(row["assumed"].split(SEPARATOR) if row["assumed"] else ())
        if csv_out is not None:
            write_atomic(csv_out, rows_csv(rows), force=True)
        if as_json:
            print_json({"scenarios": rows})
        else:
            stdout.print(rows_table(rows))
            found = sum(r["status"] == "ok" for r in rows)
            stdout.print(
                Text(
                    f"{len(rows)} scenario{'s' if len(rows) != 1 else ''} · {found} with a plan · "
                    f"{len(rows) - found} without"
                )
            )
        if assumed:
            note(assumed_line(sorted(assumed)))
    if not any(r["status"] == "ok" for r in rows):
        raise typer.Exit(int(ExitCode.NO_FEASIBLE_PLAN))


def _inline_space(value: Any, file: Path | None) -> dict[str, Any]:
    """The sweep file's ``space:`` mapping, read like a ``--space`` file."""
    if value is None:
        return {}
    return space_values(value, f"{file}: space")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep_cmd)
