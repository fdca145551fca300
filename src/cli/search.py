"""``ndplan search``: every layout, priced, ranked, explained."""

from __future__ import annotations

import contextlib
import math
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.text import Text

from ndplan.adapters.readers.deepspeed_config import deepspeed_refusal, is_deepspeed
from ndplan.adapters.readers.launch import LaunchLayout, Problem
from ndplan.adapters.readers.megatron_args import (
    arguments_from_mapping,
    looks_like_megatron_args,
    megatron_layout,
    nested_megatron_args,
    parse_arguments,
    tokens_of,
)
from ndplan.adapters.readers.mindformers_config import is_mindformers, mindformers_layout
from ndplan.adapters.readers.torchtitan_config import torchtitan_layout
from ndplan.adapters.sinks.files import csv_text
from ndplan.adapters.yamlfile import parse_yaml, read_text_file
from ndplan.bootstrap import create
from ndplan.core.context import PricingContext
from ndplan.core.errors import (
    BaselineError,
    InfeasibleError,
    InvalidInputError,
    NdplanError,
    PluginError,
    did_you_mean,
    exception_text,
    field_error,
)
from ndplan.core.frameworks import FrameworkTraits
from ndplan.core.layout import DIMENSIONS, SearchSpace, layout_label, parse_layout_label
from ndplan.core.plan import Plan, SearchResult, largest_difference
from ndplan.core.ports import DebugSink
from ndplan.core.search import FIELDS, RECOMPUTES, SCHEDULES, SearchOutcome
from ndplan.planner import REBALANCE_CONFLICT, PricingOptions
from ndplan.plugins.manager import BUILTIN_NAME

from . import interrupts
from .common import (
    A2A_OVERLAP_IDLE,
    SP_AT_TP_1,
    ActivationOffloadOpt,
    AttentionOpt,
    CalibrationOpt,
    CostModelOpt,
    DeferWgradOpt,
    DeviceOpt,
    DevicesOpt,
    DocumentTokensOpt,
    DropoutOpt,
    Fp8ParamsOpt,
    FrameworkOpt,
    GbsOpt,
    GradDtypeOpt,
    JobFileOpt,
    JobInputs,
    MaxMemOpt,
    ModelOpt,
    MoeA2AOverlapOpt,
    MoeDispatcherOpt,
    MoeFusedGroupedMlpOpt,
    PrecisionOpt,
    ReserveOpt,
    RuntimeReserveOpt,
    SeqOpt,
    TpOverlapOpt,
    WgradDeferralLimitOpt,
    build_context,
    check_choice,
    read_yaml,
)
from .executors import PER_CANDIDATE_VERBOSITY, ExecutorOpt, JobsOpt, RayAddressOpt, open_executor
from .export import (
    ExportOpt,
    OutOpt,
    check_out,
    exporter_for,
    layout_pricer,
    stand_in_line,
    write_export,
)
from .options import DeviceFiles, Json, Strict, state
from .output import (
    check_output_file,
    check_writable_folder,
    fitted_table,
    note,
    print_json,
    stdout,
    table,
    write_atomic,
)
from .progress import progress_reporter
from .render import (
    estimate_flags,
    header,
    near_tie_note,
    never_tried_warning,
    plan_report,
    unfilled_pipeline_warning,
)

SPACE_KEYS = {
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "vpp",
    "mbs",
    "zero",
    "sp",
    "recompute",
    "offload_optimizer",
    "schedule",
    "max_tp",
    "allow_tp_beyond_scale_up",
    "balance_layers",
    "max_mem",
    "reserve",
}
INT_DIMS = {"dp", "tp", "pp", "cp", "ep", "etp", "vpp", "mbs", "zero"}
BOOL_DIMS = {"sp", "offload_optimizer"}
DIM_FIELD = {
    "DP": "dp",
    "TP": "tp",
    "PP": "pp",
    "CP": "cp",
    "EP": "ep",
    "VPP": "vpp",
    "MBS": "mbs",
    "ZERO": "zero",
    "SP": "sp",
    "RECOMPUTE": "recompute",
    "OFFLOAD": "offload_optimizer",
}


def parse_vary(values: list[str] | None) -> set[str] | None:
    if not values:
        return None
    dims: set[str] = set()
    for value in values:
        for token in value.replace(",", " ").split():
            name = token.upper()
            if name not in DIMENSIONS:
                raise InvalidInputError(
                    f"-l/--vary: unknown dimension '{token}'{did_you_mean(token, DIMENSIONS)} "
                    f"(use {' '.join(DIMENSIONS)})"
                )
            dims.add(name)
    return dims


def load_space_file(path: Path) -> dict[str, Any]:
    """``--space FILE.yaml``: per dimension a scalar (fixed), a list (candidates) or ``auto``."""
    data = read_yaml(path, "search-space")
    if data is None:
        return {}
    return space_values(data, str(path))


def dimension_name(key: Any) -> str:
    """A dimension as a file or --baseline names it: any case, ``offload`` for short."""
    field = str(key).lower()
    return "offload_optimizer" if field == "offload" else field


def space_values(data: Any, where: str) -> dict[str, Any]:
    """A search-space mapping (scalar = fixed, list = candidates, ``auto``), keys checked."""
    if not isinstance(data, dict):
        raise InvalidInputError(f"{where}: expected a mapping of dimension → value, list or auto")
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = dimension_name(key)
        field = {"max_mem_gib": "max_mem", "reserve_gib": "reserve"}.get(field, field)
        if field not in SPACE_KEYS:
            raise InvalidInputError(
                f"{where}: unknown key '{key}'{did_you_mean(key, SPACE_KEYS)} "
                f"(known: {', '.join(sorted(SPACE_KEYS))})"
            )
        _check_space_value(field, value, f"{where}: {key}")
        out[field] = value
    return out


def _check_space_value(field: str, value: Any, where: str) -> None:
    """Types checked as written: YAML's ``true`` is not TP 1, nor is ``[]`` a dimension."""

    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)

    if field in ("max_mem", "reserve"):
        low = "a positive" if field == "max_mem" else "a non-negative"
        if not number(value) or value < 0 or (field == "max_mem" and value == 0):
            raise InvalidInputError(f"{where}: must be {low} number of GiB, got {value!r}")
        return
    if field in ("allow_tp_beyond_scale_up", "balance_layers"):
        if not isinstance(value, bool):
            raise InvalidInputError(f"{where}: must be true or false, got {value!r}")
        return
    if field == "max_tp":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{where}: must be a whole number ≥ 1, got {value!r}")
        return
    if value == "auto":
        return
    values = value if isinstance(value, list) else [value]
    if not values:
        raise InvalidInputError(f"{where}: an empty list allows nothing; give values or auto")
    for v in values:
        if field in INT_DIMS:
            low = 0 if field == "zero" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise InvalidInputError(
                    f"{where}: {v!r} is not a whole number ≥ {low}; give numbers, a list or auto"
                )
            if field == "zero" and v > 3:
                raise InvalidInputError(f"{where}: ZeRO stage {v} does not exist; use 0–3")
        elif field in BOOL_DIMS and not isinstance(v, bool):
            raise InvalidInputError(f"{where}: {v!r} is not true or false")
        elif field == "recompute":
            check_choice(where, v, RECOMPUTES)
        elif field == "schedule":
            check_choice(where, v, SCHEDULES)


def build_space(
    *,
    vary: set[str] | None,
    fixed: dict[str, Any],
    file_values: dict[str, Any],
    is_moe: bool,
    framework: FrameworkTraits,
    max_tp: int | None,
    balance_layers: bool | None = None,
) -> SearchSpace:
    """Free dimensions → None; fixed → (value,); the rest at their defaults."""
    applicable = set(DIMENSIONS) - ({"EP"} if not is_moe else set())
    varied = applicable if vary is None else vary
    space: dict[str, Any] = {}
    for dim in DIMENSIONS:
        name = DIM_FIELD[dim]
        if name in fixed and fixed[name] is not None:
            if vary is not None and dim in vary:
                raise InvalidInputError(
                    f"{dim} is both fixed (--{name.replace('_', '-')}) and varied (-l {dim})"
                )
            space[name] = (fixed[name],)
        elif name in file_values:
            value = file_values[name]
            space[name] = (
                None if value == "auto" else tuple(value) if isinstance(value, list) else (value,)
            )
        elif dim in varied:
            space[name] = ("auto",) if dim == "RECOMPUTE" else None
        else:
            space[name] = {
                "dp": None,
                "tp": (1,),
                "pp": (1,),
                "cp": (1,),
                "ep": (1,),
                "vpp": (1,),
                "mbs": (1,),
                "zero": (framework.default_zero,),
                "sp": (True,),
                "recompute": ("none",),
                "offload_optimizer": (False,),
            }[name]
    for extra in ("etp", "schedule"):
        if extra in fixed and fixed[extra] is not None:
            space[extra] = (fixed[extra],)
        elif extra in file_values:
            value = file_values[extra]
            space[extra] = (
                None if value == "auto" else tuple(value) if isinstance(value, list) else (value,)
            )
    for name in space.get("schedule") or ():
        if name not in framework.schedules:  # as estimate refuses it, not silently dropped
            raise InvalidInputError(
                f"{framework.schedule_not_offered(name)}; pick one of those or another --framework"
            )
    if "schedule" not in space and space.get("vpp") != (1,):
        space["schedule"] = tuple(s for s in ("1f1b", "interleaved") if s in framework.schedules)
    if max_tp is not None:
        space["max_tp"] = max_tp
    elif "max_tp" in file_values:
        space["max_tp"] = file_values["max_tp"]
    if "allow_tp_beyond_scale_up" in file_values:
        space["allow_tp_beyond_scale_up"] = file_values["allow_tp_beyond_scale_up"]
    if balance_layers is not None:
        space["balance_layers"] = balance_layers
    elif "balance_layers" in file_values:
        space["balance_layers"] = file_values["balance_layers"]
    try:
        return SearchSpace(**space)
    except ValidationError as exc:
        raise InvalidInputError(f"search space: {field_error(exc)}") from None


SHARE_NAMES = (
    ("forward", "fwd"),
    ("backward", "bwd"),
    ("recompute", "rec"),
    ("tp_comm", "tp"),
    ("cp_comm", "cp"),
    ("ep_comm", "ep"),
    ("offload", "actoff"),
    ("pp_comm", "pp"),
    ("bubble", "bub"),
    ("dp_comm", "dp"),
    ("optimizer", "opt"),
    ("overhead", "ovh"),
)


def shares(plan: Plan) -> str:
    t = plan.time
    return " ".join(
        f"{short} {100 * t.parts[name] / t.step_s:.0f}"
        for name, short in SHARE_NAMES
        if t.parts.get(name, 0) / t.step_s >= 0.005
    )


UNEVEN_MARK = "*"
UNEVEN_NOTE = (
    "* decoder layers split unevenly over the pipeline chunks (a remainder, the embedding "
    "and loss counted as layers, or the output layer's work)"
)


def pipeline_cell(pp: int, vpp: int, schedule: str, uneven: bool) -> str:
    """A table's pp column: ``8×5`` for interleaved chunks, ``4v`` for DualPipeV, ``*``
    for an uneven layer split (the search table and the sweep's alike)."""
    return (
        f"{pp}"
        + (f"×{vpp}" if vpp > 1 else "")
        + ("v" if schedule == "dualpipev" else "")
        + (UNEVEN_MARK if uneven else "")
    )


def expert_cell(lay) -> str:
    """EP, with the expert TP when it differs from TP (two plans of one row otherwise
    look alike under --distinct, whose grids include the expert TP)."""
    if lay.expert_tp != lay.tp:
        return f"{lay.ep} etp{lay.expert_tp}"
    return str(lay.ep) if lay.ep > 1 else ""


BASELINE_MARK = "base"


def ranking_table(
    plans: tuple[Plan, ...], title: str = "best layouts", baseline: Plan | None = None
):
    """The listed plans, and below a rule the baseline's plan when it is not among them
    (its ``#`` cell ``base``: under --distinct the column counts grids, not layouts)."""
    rows = []
    listed = {p.layout for p in plans}
    extra = (baseline,) if baseline is not None and baseline.layout not in listed else ()
    for p in (*plans, *extra):
        lay = p.layout
        pp = pipeline_cell(lay.pp, lay.vpp, lay.schedule, p.uneven_split())
        rows.append(
            (
                BASELINE_MARK if p is baseline else p.rank,
                lay.tp,
                pp,
                lay.cp,
                lay.dp,
                expert_cell(lay),
                f"{lay.mbs}×{lay.num_microbatches}",
                lay.zero,
                "on" if lay.sequence_parallel else "",
                "yes" if lay.offload_optimizer else "",
                p.recompute_summary(),
                f"{p.memory.peak_bytes / 2**30:.1f} (s{p.memory.peak_stage})",
                f"{p.time.step_s:.3f}",
                f"{p.tokens_per_s_per_device:,.0f}",
                f"{100 * p.mfu:.1f}%",
                shares(p),
            )
        )
    columns = [
        ("#", "right"),
        ("tp", "right"),
        ("pp", "right"),
        ("cp", "right"),
        ("dp", "right"),
        ("ep", "right"),
        ("mbs×m", "right"),
        ("zero", "right"),
        "sp",
        "offl",
        "recompute",
        ("peak GiB", "right"),
        ("step s", "right"),
        ("tok/s/dev", "right"),
        ("MFU", "right"),
        "time shares %",
    ]
    # A narrow terminal: leave out the text columns, widest first, rather than cut every
    # number to "5…" (the best plan's report below and --json carry them all).
    out, dropped = fitted_table(title, columns, rows, NARROW_DROPS, stdout.width)
    captions = []
    if dropped:
        captions.append(f"left out at this width: {', '.join(dropped)} (--json has them)")
    if extra:
        out.rows[len(plans) - 1].end_section = True
    if any(p.uneven_split() for p in (*plans, *extra)):
        captions.append(UNEVEN_NOTE + "; --json lists each chunk's layers (memory.stages[].layers)")
    if captions:
        out.caption = "\n".join(captions)
        out.caption_justify = "left"
    return out


NARROW_DROPS = ("time shares %", "recompute", "offl", "sp")
"""The ranking's columns a narrow terminal goes without, in order."""


def summary_line(result: SearchResult) -> str:
    s = result.summary
    refused = sum(s.refused.values())
    reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(s.refused.items(), key=lambda kv: -kv[1]))
    sec = s.seconds
    return (
        f"generated {s.generated:,} · refused {refused:,}"
        + (f" ({reasons})" if reasons else "")
        + f" · over memory {s.over_memory:,} · bounded {s.bounded:,} · priced {s.priced:,}"
        + (f" ({s.priced_for_baseline:,} to place the baseline)" if s.priced_for_baseline else "")
        + " · "
        f"{sec.total:.2f} s (enumerate {sec.enumerate:.2f}, memory {sec.memory:.2f}, bound {sec.bound:.2f}, "
        f"price {sec.price:.2f})"
        + (f" · rebalanced {s.rebalanced:,}" if s.rebalanced is not None else "")
    )


def ranking_csv(outcome: SearchOutcome, exact: int) -> str:
    """The first ``exact`` ranked plans, those whose rank is exact (a bounded search
    priced others only partly in order: a plan past them may have unpriced layouts ahead
    of it), in rank order."""
    rows = []
    for rank, ((candidate, priced), layers) in enumerate(
        zip(outcome.ranking[:exact], outcome.layers_per_chunk[:exact], strict=True), start=1
    ):
        row = {
            "rank": rank,
            **candidate,
            "layers_per_chunk": layers,
            "step_s": repr(priced.step_s),
            "peak_bytes": priced.peak_bytes,
            "peak_stage": priced.peak_stage,
        }
        for name, value in (priced.time_parts or {}).items():
            if name != "step":
                row[f"time.{name}"] = repr(value)
        for name, value in (priced.memory_parts or {}).items():
            if name not in ("stage", "total"):
                row[f"memory.{name}"] = value
        rows.append(row)
    # Only parts can be missing from a row (a stage without the loss's activations, a
    # layout without CP traffic): 0 there, as in the debug sink's files.
    leading = ["rank", *FIELDS, "layers_per_chunk", "step_s", "peak_bytes", "peak_stage"]
    return csv_text(rows, leading, missing=0)


def search_cmd(
    ctx: typer.Context,
    model: ModelOpt,
    device: DeviceOpt,
    devices: DevicesOpt,
    gbs: GbsOpt,
    seq_len: SeqOpt,
    vary: Annotated[
        list[str] | None,
        typer.Option(
            "--vary",
            "-l",
            metavar="DIMS",
            help="Dimensions to search: DP TP PP CP EP VPP MBS ZERO SP RECOMPUTE "
            "OFFLOAD [default: all that apply].",
            show_default=False,
        ),
    ] = None,
    tp: Annotated[
        int | None, typer.Option("--tp", min=1, help="Fix TP.", show_default=False)
    ] = None,
    pp: Annotated[
        int | None, typer.Option("--pp", min=1, help="Fix PP.", show_default=False)
    ] = None,
    cp: Annotated[
        int | None, typer.Option("--cp", min=1, help="Fix CP.", show_default=False)
    ] = None,
    dp: Annotated[
        int | None, typer.Option("--dp", min=1, help="Fix DP.", show_default=False)
    ] = None,
    ep: Annotated[
        int | None, typer.Option("--ep", min=1, help="Fix EP.", show_default=False)
    ] = None,
    etp: Annotated[
        int | None,
        typer.Option(
            "--etp",
            min=1,
            help="Fix expert TP. Free, it is TP's own, or where EP reaches into the TP "
            "ranks the widest that leaves EP room (1 at full span).",
            show_default=False,
        ),
    ] = None,
    vpp: Annotated[
        int | None, typer.Option("--vpp", min=1, help="Fix VPP.", show_default=False)
    ] = None,
    mbs: Annotated[
        int | None,
        typer.Option("--mbs", min=1, help="Fix the micro-batch size.", show_default=False),
    ] = None,
    zero: Annotated[
        int | None,
        typer.Option("--zero", min=0, max=3, help="Fix the ZeRO stage.", show_default=False),
    ] = None,
    sp: Annotated[
        bool | None,
        typer.Option("--sp/--no-sp", help="Fix sequence parallelism.", show_default=False),
    ] = None,
    recompute: Annotated[
        str | None,
        typer.Option(
            "--recompute",
            help="Fix the recompute policy (none, selective, full, auto; or stated: per "
            "layout, the fastest setting the framework's config states, so the plan runs "
            "as priced).",
            show_default=False,
        ),
    ] = None,
    offload_optimizer: Annotated[
        bool | None,
        typer.Option(
            "--offload-optimizer/--no-offload-optimizer",
            help="Fix optimizer offload.",
            show_default=False,
        ),
    ] = None,
    schedule: Annotated[
        str | None,
        typer.Option("--schedule", help="Fix the pipeline schedule.", show_default=False),
    ] = None,
    space_file: Annotated[
        Path | None,
        typer.Option(
            "--space",
            help="A search-space YAML: per dimension a scalar "
            "(fixed), a list (candidates) or auto.",
            show_default=False,
        ),
    ] = None,
    max_tp: Annotated[
        int | None,
        typer.Option(
            "--max-tp", min=1, help="Largest TP [default: the scale-up domain].", show_default=False
        ),
    ] = None,
    rebalance: Annotated[
        bool,
        typer.Option(
            "--rebalance",
            help="Re-balance the top K pipelined plans with the pipeline balancer (as `ndplan "
            "balance`: layers moved between stages, every placement priced) and re-rank "
            "them; --ranking-csv keeps the search's own ranking.",
        ),
    ] = False,
    balance_layers: Annotated[
        bool | None,
        typer.Option(
            "--balance-layers/--even-layers",
            help="Also try each pipeline with the last stage lighter by the output layer's "
            "work (uneven layer counts: Megatron's pipeline layout, MindFormers offset, "
            "torchtitan's manual split), each layout ranked at its faster split, or keep "
            "layers even [default: balance where the framework allows].",
            show_default=False,
        ),
    ] = None,
    precision: PrecisionOpt = None,
    framework: FrameworkOpt = None,
    attention: AttentionOpt = None,
    dropout: DropoutOpt = None,
    grad_dtype: GradDtypeOpt = None,
    tp_comm_overlap: TpOverlapOpt = None,
    fp8_param_gather: Fp8ParamsOpt = None,
    activation_offload: ActivationOffloadOpt = None,
    defer_embedding_wgrad: DeferWgradOpt = None,
    wgrad_deferral_limit: WgradDeferralLimitOpt = None,
    document_tokens: DocumentTokensOpt = None,
    moe_dispatcher: MoeDispatcherOpt = None,
    moe_a2a_overlap: MoeA2AOverlapOpt = None,
    moe_fused_grouped_mlp: MoeFusedGroupedMlpOpt = None,
    job_file: JobFileOpt = None,
    max_mem: MaxMemOpt = None,
    reserve: ReserveOpt = None,
    runtime_reserve: RuntimeReserveOpt = None,
    top: Annotated[int, typer.Option("--top", "-t", min=1, help="How many plans to list.")] = 10,
    distinct: Annotated[
        bool,
        typer.Option(
            "--distinct",
            help="List one plan per shape (tp·pp·cp·dp·ep·etp): the fastest of each, so "
            "-t 10 shows ten device grids rather than VPP, micro-batch, ZeRO and "
            "recompute variants of a few; --ranking-csv keeps every plan ranked exactly.",
        ),
    ] = False,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            metavar="LAYOUT",
            help="A layout you run today, placed in the ranking: its degrees as "
            "tp=4,pp=8,vpp=5 or as ndplan prints them ('tp4 pp8×5 dp2 mbs1'; pp8 alone is "
            "one chunk per stage, pp8×? leaves VPP open; the others searched), a "
            "YAML/JSON file of them or of one "
            "plan (`estimate --json`, `--export ndplan`), or the launch config you run: "
            "a Megatron-LM script of flags (or JSON of its args), a torchtitan TOML or a "
            "MindFormers YAML (what --export writes). Prints its exact rank, its gap to the best and its "
            "step-time parts beside the best plan's; --json adds `baseline`. Not with --rebalance.",
            show_default=False,
        ),
    ] = None,
    explain: Annotated[
        int,
        typer.Option(
            "--explain",
            min=1,
            help="Break down the plan of this rank instead of the best (at most -t).",
        ),
    ] = 1,
    as_json: Json = False,
    ranking_out: Annotated[
        Path | None,
        typer.Option(
            "--ranking-csv",
            help="Write the ranked plans with their parts and, for an uneven split, their "
            "layers per chunk (as estimate --layers-per-chunk takes them): each plan whose "
            "rank among every layout is exact — the top K and every other plan the search "
            "priced that no layout it bounded out could beat; with --exhaustive, every "
            "plan that fits.",
            show_default=False,
        ),
    ] = None,
    debug_dir: Annotated[
        Path | None,
        typer.Option(
            "--debug-dir",
            help="Record every priced candidate and refusal here.",
            show_default=False,
        ),
    ] = None,
    debug_sink: Annotated[
        list[str] | None,
        typer.Option(
            "--debug-sink",
            help="Debug sinks to use (repeatable) [default: csv].",
            show_default=False,
        ),
    ] = None,
    export: ExportOpt = None,
    out: OutOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite output files that exist.")
    ] = False,
    calibration: CalibrationOpt = None,
    cost_model: CostModelOpt = "ndplan",
    strict: Strict = False,
    exhaustive: Annotated[
        bool, typer.Option("--exhaustive", help="Price every candidate (no bounding).")
    ] = False,
    no_memo: Annotated[
        bool,
        typer.Option(
            "--no-memo", hidden=True, help="Recompute every part per candidate (benchmarks only)."
        ),
    ] = False,
    jobs: JobsOpt = None,
    executor: ExecutorOpt = None,
    ray_address: RayAddressOpt = None,
    device_file: DeviceFiles = None,
) -> None:
    """Search every parallel layout, price it, drop what does not fit, rank the rest.

    Example: ndplan search -m llama-3-70b -d h100 -n 64 --gbs 512 -s 8192
    """
    st = state(ctx)
    # Workers start before the model and configs are parsed, so their imports overlap that work.
    with open_executor(
        st, jobs=jobs, name=executor, ray_address=ray_address, verbosity=st.verbosity
    ) as pool:
        if ranking_out is not None:
            check_output_file(ranking_out, "--ranking-csv", force=force)
        check_out(export, out, force=force)
        if explain > top:  # only the top K are kept
            raise InvalidInputError(
                f"--explain {explain}: only the top {top} plans are kept; "
                f"pass -t {explain} or a rank up to {top}"
            )
        space_values = load_space_file(space_file) if space_file else {}
        # The space file may state the memory budget too; a flag overrides it.
        options = PricingOptions(
            memoize=not no_memo,
            max_mem_gib=max_mem if max_mem is not None else space_values.get("max_mem"),
            balance_reserve_gib=reserve
            if reserve is not None
            else space_values.get("reserve", 0.0),
            reserve_gib=runtime_reserve,
            calibration=calibration,
            cost_model=cost_model,
        )
        job = JobInputs(
            gbs,
            seq_len,
            precision,
            framework,
            attention,
            dropout,
            grad_dtype,
            tp_comm_overlap,
            fp8_param_gather,
            activation_offload,
            defer_embedding_wgrad=defer_embedding_wgrad,
            wgrad_deferral_limit=wgrad_deferral_limit,
            document_tokens=document_tokens,
            moe_dispatcher=moe_dispatcher,
            moe_a2a_overlap=moe_a2a_overlap,
            moe_fused_grouped_mlp=moe_fused_grouped_mlp,
            file=job_file,
        )
        planner, pctx = build_context(
            st,
            model=model,
            device=device,
            devices=devices,
            job=job,
            device_files=device_file,
            strict=strict,
            options=options,
            budget_from="--max-mem" if max_mem is not None else f"{space_file}: max_mem",
        )
        exporter = exporter_for(planner.components, export, pctx.framework.name) if export else None
        if recompute is not None:
            check_choice("--recompute", recompute, RECOMPUTES)
        fixed = {
            "tp": tp,
            "pp": pp,
            "cp": cp,
            "dp": dp,
            "ep": ep,
            "etp": etp,
            "vpp": vpp,
            "mbs": mbs,
            "zero": zero,
            "sp": sp,
            "recompute": recompute,
            "offload_optimizer": offload_optimizer,
            "schedule": schedule,
        }
        space = build_space(
            vary=parse_vary(vary),
            fixed=fixed,
            file_values=space_values,
            is_moe=pctx.model.is_moe,
            framework=pctx.framework,
            max_tp=max_tp,
            balance_layers=balance_layers,
        )
        if sp and space.tp == (1,):  # as Megatron does, with a word
            note(SP_AT_TP_1, warning=True)
        if moe_a2a_overlap and (not pctx.model.is_moe or space.ep == (1,)):
            why = "a dense model" if not pctx.model.is_moe else "ep 1"
            note(A2A_OVERLAP_IDLE.format(f"there is no expert parallelism ({why})"), warning=True)
        if baseline is not None and not baseline.strip():
            raise InvalidInputError(
                "--baseline: empty; give degrees as tp=4,pp=8,vpp=5, a layout as ndplan prints "
                "it or a file, or leave the flag out"
            )
        if baseline and rebalance:  # refused before the search runs
            raise InvalidInputError(
                "--baseline: " + REBALANCE_CONFLICT.format(rebalancing="--rebalance")
            )
        stated, stated_split = baseline_values(baseline, pctx) if baseline else (None, None)
        sinks: list[DebugSink] = []
        owners: list[str] = []
        made_debug_dir = False
        # Fix: a sink named with --debug-sink but no --debug-dir was silently ignored; now
        # it is opened, and a sink that needs a folder says so (exit 3).
        names = list(debug_sink or (["csv"] if debug_dir is not None else []))
        if st.verbosity >= PER_CANDIDATE_VERBOSITY and "stderr" not in names:
            names.append("stderr")  # -vv: a line per priced candidate
        if names:
            registry = planner.components.debug_sinks
            sinks = [create(registry, n, DebugSink) for n in names]
            owners = [registry.entry(n).plugin for n in names]
            if debug_dir is not None:
                _check_debug_dir(debug_dir, sinks, force)
                made_debug_dir = not debug_dir.exists()

        # Fix: a search that failed or was interrupted never closed nor aborted its sinks:
        # a plugin's file stayed half-written. Now they are aborted (_debug_sinks), and
        # kept only once the search, the rebalancing and the checks on them have passed.
        with (
            _dropped_if_empty(debug_dir if made_debug_dir else None),
            _debug_sinks(sinks, names, owners, debug_dir) as keep_records,
        ):
            with progress_reporter() as report:
                try:
                    outcome = planner.search(
                        pctx,
                        space,
                        top_k=top,
                        distinct=distinct,
                        options=options,
                        executor=pool,
                        sinks=sinks,
                        bounding=not exhaustive,
                        collect_parts=ranking_out is not None,
                        progress=report,
                        baseline=stated,
                    )
                except InfeasibleError:
                    # The search ran to its end: the records say why nothing fits (every
                    # candidate over memory, by how much), which is what the folder is for.
                    keep_records()
                    raise
                except BaselineError as exc:  # named as the user gave it
                    raise InvalidInputError(f"--baseline: {exc.detail}") from None
            result = outcome.result
            if rebalance:
                result = planner.rebalance(pctx, result, options)
            if explain > len(result.plans):  # checked before anything is written
                raise InvalidInputError(
                    f"--explain {explain}: only {len(result.plans)} plans fit; "
                    f"pick a rank up to {len(result.plans)}"
                )
            keep_records()  # before anything is written or printed

        price_per_layer = layout_pricer(planner, pctx, options)
        if ranking_out is not None:
            exact = outcome.exactly_ranked
            write_atomic(ranking_out, ranking_csv(outcome, exact), force=True)
            if outcome.result.summary.bounded:  # else every plan's rank is exact
                note(
                    f"note: {ranking_out} ranks the {exact:,} plans whose "
                    f"rank is exact (every plan under {outcome.exact_below:.3f} s; the search "
                    "bounded out the rest); --exhaustive ranks every plan that fits"
                )
        if exporter is not None and out is not None:
            write_export(
                exporter,
                result.plans[explain - 1],
                pctx,
                out,
                rank=explain,
                price=price_per_layer,
            )
        if as_json:
            print_json(result_json(result))
        else:
            stdout.print(Text(header(pctx), style="bold"))
            stdout.print(
                ranking_table(
                    result.plans,
                    "best layouts, one per shape" if distinct else "best layouts",
                    result.baseline.plan if result.baseline is not None else None,
                )
            )
            stdout.print(Text(summary_line(result)))
            median, runs = pctx.calibration.class_median_error(pctx.model.is_moe)
            tie = near_tie_note(result.plans, median, top, runs)
            if tie:
                stdout.print(Text(tie))
            if result.baseline is not None:
                stdout.print(Text(baseline_line(result, space)))
                if result.baseline.plan is not None and result.baseline.rank != 1:
                    stdout.print(baseline_parts_table(result.plans[0], result.baseline.plan))
            chosen = result.plans[explain - 1]
            title = "best plan:" if explain == 1 else f"plan {explain}:"
            stdout.print(Text(title, style="bold"))
            stdout.print(plan_report(pctx, chosen, flags=True), crop=False)
            written = stand_in_line(planner.components, chosen, pctx, price_per_layer)
            if written:
                stdout.print(Text(written))
        for warning in (
            split_warning(baseline, stated_split, result) if baseline else None,
            never_tried_warning(result, pctx.cluster.num_devices, pctx.job.global_batch_size),
            unfilled_pipeline_warning(result.plans),
        ):
            if warning:
                note(warning, warning=True)
        line = pctx.recorder.line()
        if line:
            note(line)


@contextlib.contextmanager
def _dropped_if_empty(directory: Path | None) -> Iterator[None]:
    """On failure, remove ``directory`` (one this run made) if nothing was written into it:
    a search that stopped early leaves no empty folder behind."""
    try:
        yield
    except BaseException:
        if directory is not None:
            with contextlib.suppress(OSError):  # not empty (records kept), or already gone
                directory.rmdir()
        raise


@contextlib.contextmanager
def _debug_sinks(
    sinks: list[DebugSink], names: list[str], owners: list[str], directory: Path | None
) -> Iterator[Callable[[], None]]:
    """Open the sinks for the block, which calls the ``keep`` this yields once its run
    has succeeded: that closes them, and they keep their records. A failure or an
    interrupt before (or while) the sinks are kept aborts every sink still open
    (``_abort``): a run that stops early leaves no records. Plugins' sinks are closed
    before the built-in ones, so a plugin sink that fails to close leaves no built-in
    file either; a built-in sink whose files were written before another one failed
    removes them (its ``abort``)."""
    still_open: dict[int, DebugSink] = {}
    written: list[DebugSink] = []  # built-in sinks closed by a keep that has not ended

    def keep() -> None:
        interrupts.check()  # an interrupted search keeps none, even if Python dropped it
        for i in sorted(still_open, key=lambda i: owners[i] == BUILTIN_NAME):
            sink = still_open.pop(i)
            sink.close()  # a sink whose close raised is not called again
            if owners[i] == BUILTIN_NAME:
                written.append(sink)
        written.clear()

    try:
        for i, sink in enumerate(sinks):
            _open_sink(sink, names[i], owners[i], directory)
            still_open[i] = sink
        yield keep
    except BaseException:
        _abort([*still_open.values(), *written])
        raise


def _open_sink(sink: DebugSink, name: str, owner: str, directory: Path | None) -> None:
    """``sink.open(directory)``: a built-in sink's OSError is the folder's (invalid input,
    exit 3); anything a plugin's sink raises is the plugin's (exit 4), named."""
    try:
        sink.open(directory)
    except NdplanError:
        raise
    except Exception as exc:
        if owner != BUILTIN_NAME:
            raise PluginError(
                f"debug sink '{name}' (from '{owner}') could not open: {exception_text(exc)}"
            ) from None
        if isinstance(exc, OSError):
            raise InvalidInputError(
                f"--debug-dir {directory}: cannot write there ({exc.strerror or exc})"
            ) from None
        raise


def _abort(sinks: list[DebugSink]) -> None:
    """Tell each sink its run failed: its ``abort()`` where it has one (drop the records,
    leave no files), else its ``close()``. What they raise is dropped: the run's own
    error is the one reported, and every sink gets its turn."""
    for sink in sinks:
        end = getattr(sink, "abort", None)
        with contextlib.suppress(Exception):
            (end if callable(end) else sink.close)()


def _check_debug_dir(directory: Path, sinks: list, force: bool) -> None:
    """Before the search: the folder is a folder, and the files the sinks name (a sink's
    ``files``, if it says) are not an earlier run's, unless --force."""
    if directory.exists() and not directory.is_dir():
        raise InvalidInputError(
            f"--debug-dir {directory}: is a file; give a folder (it is created if missing)"
        )
    check_writable_folder(directory, "--debug-dir", directory)
    if force:
        return
    for sink in sinks:
        for name in getattr(sink, "files", ()):
            if (directory / name).exists():
                raise InvalidInputError(
                    f"--debug-dir {directory}: holds {name} from an earlier run; pass --force "
                    "to overwrite it, or give another folder"
                )


def result_json(result: SearchResult) -> dict:
    data = result.model_dump(mode="json")
    for key in ("distinct", "rebalanced", "priced_for_baseline"):
        if data["summary"][key] is None:  # not asked for: the summary as ever
            del data["summary"][key]
    out = {"summary": data["summary"], "assumptions": data["assumptions"], "plans": data["plans"]}
    if data["baseline"] is not None:
        out["baseline"] = data["baseline"]
    return out


BASELINE_KEYS = INT_DIMS | BOOL_DIMS | {"recompute", "schedule"}


def baseline_values(
    text: str, ctx: PricingContext
) -> tuple[dict[str, int | bool | str], tuple[int, ...] | None]:
    """``--baseline``: ``tp=4,pp=8,vpp=5``, the layout as ndplan prints it (``tp4 pp8×5 cp1
    dp2 mbs1 z1``: the baseline line, search-quality.md), a YAML/JSON file of those
    degrees or of one plan (its ``layout``, as ``estimate --json`` prints it), or a
    framework's launch config (``launch_layout``). ``auto``, ``?`` and null leave a degree
    to the search. Then the decoder layers per chunk it states, if any: the search ranks
    its own splits, and ``split_warning`` says when the placed one differs."""
    global_batch = ctx.job.global_batch_size
    split: tuple[int, ...] | None = None
    if "=" in text:
        data: Any = {}
        for item in text.replace(",", " ").split():
            key, sep, value = item.partition("=")
            if not sep or not key or not value:
                raise InvalidInputError(
                    f"--baseline: '{item}' is not name=value; write e.g. tp=4,pp=8,vpp=5"
                )
            if key in data:  # tp=4,tp=2: which one did the user run?
                raise InvalidInputError(f"--baseline: {key} is given twice; give it once")
            try:
                data[key] = yaml.safe_load(value)
            except yaml.YAMLError:
                data[key] = value
        where = "--baseline"
    elif not Path(text).exists() and (label := parse_layout_label(text)) is not None:
        data = label  # as ndplan prints a layout: tp4 pp8×5 cp1 dp2 mbs1 z1
        where = "--baseline"
    else:
        path = Path(text)
        if not path.exists():
            raise InvalidInputError(
                f"--baseline {text}: no such file; give degrees as tp=4,pp=8,vpp=5, as ndplan "
                "prints a layout (tp4 pp8×5 dp2 mbs1 z1) or a YAML/JSON file"
            )
        where = f"--baseline {text}"
        content = read_text_file(path, "baseline")  # read once, parsed once
        suffix, parsed = config_format(path.suffix.lower(), content, str(path))
        script = suffix not in (".toml", *YAML_SUFFIXES) and looks_like_megatron_args(content)
        if parsed is None and not script:
            parsed = (
                toml_of(content, where) if suffix == ".toml" else parse_yaml(content, str(path))
            )
        launch = launch_layout(suffix, content, parsed, where, ctx)
        if launch is not None:
            data, split = launch.degrees, launch.split
        else:
            data = parse_yaml(content, str(path)) if script else parsed
        if isinstance(data, dict) and isinstance(data.get("layout"), dict):
            other = isinstance(data.get("inputs"), dict) and other_problem(
                data["inputs"], where, ctx
            )
            data = data["layout"]  # one plan, as estimate --json prints it
            if other:  # its micro-batch count was its own batch's: dp and mbs say it here
                data = {k: v for k, v in data.items() if k != "num_microbatches"}
        elif isinstance(data, dict) and "plans" in data:
            raise InvalidInputError(
                f"{where}: holds a search's plans; give one plan (its layout) or the degrees"
            )
    if not isinstance(data, dict) or not data:
        raise InvalidInputError(f"{where}: expected degrees, e.g. tp=4,pp=8,vpp=5")
    out: dict[str, int | bool | str] = {}
    microbatches = None
    for key, value in data.items():
        field = dimension_name(key)
        if field == "layers_per_stage":
            if value is not None:
                if not isinstance(value, list) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value
                ):
                    raise InvalidInputError(
                        f"{where}: layers_per_stage: expected decoder layers per chunk, "
                        f"e.g. [20, 20, 21, 19], got {value!r}"
                    )
                split = tuple(value)
            continue
        if field == "num_microbatches":
            microbatches = value
            continue
        if field not in BASELINE_KEYS and isinstance(value, dict):
            inner = ", ".join(f"{key}.{k}" for k in list(value)[:2]) or key
            raise InvalidInputError(
                f"{where}: {key}: a nested section, not a degree (got {inner}, …); ndplan reads "
                "nested Megatron-Bridge and NeMo YAML by model.tensor_model_parallel_size and "
                "the like, else give --baseline tp=…,pp=… or a flat Megatron args file"
            )
        if field not in BASELINE_KEYS:
            raise InvalidInputError(
                f"{where}: unknown degree '{key}'{did_you_mean(str(key), BASELINE_KEYS)} "
                f"(known: {', '.join(sorted(BASELINE_KEYS))})"
            )
        if value is None or (value == "auto" and field != "recompute"):
            continue  # the search's to choose (recompute auto is the per-layer policy)
        if isinstance(value, list):
            raise InvalidInputError(f"{where}: {key}: one value (a baseline is one layout)")
        _check_space_value(field, value, f"{where}: {key}")
        out[field] = value
    if microbatches is not None:
        dp, mbs = out.get("dp"), out.get("mbs")
        if dp is None or mbs is None or dp * mbs * microbatches != global_batch:
            raise InvalidInputError(
                f"{where}: num_microbatches({microbatches}) needs dp and mbs with "
                f"dp·mbs·num_microbatches = global batch({global_batch}); fix it or leave it out"
            )
    if not out:
        raise InvalidInputError(f"{where}: states no degree; give e.g. tp=4,pp=8,vpp=5")
    pp = out.get("pp")
    # The chunks the split places (DualPipeV's 2·pp chunks are not virtual stages).
    if (
        split is not None
        and "vpp" not in out
        and isinstance(pp, int)
        and len(split) % pp == 0
        and out.get("schedule") != "dualpipev"
    ):
        out["vpp"] = len(split) // pp
    return out, split


def split_warning(text: str, split: tuple[int, ...] | None, result: SearchResult) -> str | None:
    """Where a baseline states its layers per chunk and the search placed it with another
    of its own splits (even or balanced): which, and how to price the stated one."""
    placed = result.baseline.plan if result.baseline is not None else None
    if split is None or placed is None or placed.chunk_layers() == split:
        return None
    counts = ",".join(map(str, split))
    flags = estimate_flags(placed, split=False)
    return (
        f"warning: --baseline {text}: its layers per chunk ({counts}) are not a split the "
        f"search tries; ranked with the search's own "
        f"({','.join(map(str, placed.chunk_layers()))}); price yours with estimate {flags} "
        f"--layers-per-chunk {counts}"
    )


YAML_SUFFIXES = (".json", ".yaml", ".yml")
TORCHTITAN_SECTIONS = ("job", "model", "parallelism", "training", "activation_checkpoint")


def config_format(suffix: str, text: str, origin: str) -> tuple[str, Any]:
    """A baseline file's format: its suffix where that names one, else what its content
    is (``plan.out``, ``job.cfg``): a torchtitan TOML, or a YAML/JSON mapping (MindFormers,
    DeepSpeed, Megatron's arguments by name, ndplan's own degrees), read as the same file
    named ``.yaml`` would be — a TOML's or mapping's keys would otherwise pass for
    Megatron's argparse names in a script. With the content parsed where telling its
    format took that (else None), so it is parsed once."""
    if suffix in (".toml", *YAML_SUFFIXES):
        return suffix, None
    with contextlib.suppress(tomllib.TOMLDecodeError):
        config = tomllib.loads(text)
        if any(isinstance(config.get(name), dict) for name in TORCHTITAN_SECTIONS):
            return ".toml", config
    with contextlib.suppress(InvalidInputError):
        data = parse_yaml(text, origin)
        if isinstance(data, dict):
            return ".yaml", data
    return suffix, None


def toml_of(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInputError(f"{where}: not TOML ({exc})") from None


def launch_layout(
    suffix: str, text: str, parsed: Any, where: str, ctx: PricingContext
) -> LaunchLayout | None:
    """The layout a framework's launch config states — a torchtitan TOML, a MindFormers
    YAML, Megatron-LM arguments (a JSON/YAML of its args, flat or nested as Megatron-Bridge
    and NeMo 1.0 write them, or a script of ``--flags``, ``text``; ``parsed`` is the file's
    TOML or YAML, None for a script) — with a note on
    what the ranking cannot reproduce; None for ndplan's own files. A DeepSpeed JSON,
    which states no TP or PP, is one line naming what it states."""
    problem = Problem(
        num_layers=ctx.model.num_layers,
        is_moe=ctx.model.is_moe,
        global_batch=ctx.job.global_batch_size,
        seq_length=ctx.job.seq_length,
        framework=ctx.framework.name,
        devices=ctx.cluster.num_devices,
    )
    if suffix == ".toml":
        read = torchtitan_layout(parsed, where, problem)
    elif is_mindformers(parsed):
        read = mindformers_layout(parsed, where, problem)
    elif is_deepspeed(parsed):
        raise deepspeed_refusal(parsed, where, problem)
    elif parsed is not None and not (suffix in YAML_SUFFIXES and isinstance(parsed, dict)):
        return None  # ndplan's own degrees, or not a mapping at all
    elif looks_like_megatron_args(text):
        if parsed is not None:
            words = arguments_from_mapping(nested_megatron_args(parsed, where) or parsed)
        else:
            words = tokens_of(text, where)
        found = parse_arguments(words, where)
        if not found:
            return None
        read = megatron_layout(found, where, problem)
    else:
        return None
    for line in read.notes:
        note(f"note: {line}")
    return read


def other_problem(inputs: dict[str, Any], where: str, ctx: PricingContext) -> bool:
    """Whether a plan file (``--export ndplan``) was priced for another model, device,
    device count, batch or sequence than this search's. Its degrees are still placed (a
    layout carried over is a fair question), but the user hears that the file is not this
    problem's."""
    job = inputs.get("job") if isinstance(inputs.get("job"), dict) else {}
    theirs = {
        "model": inputs.get("model"),
        "device": inputs.get("device"),
        "devices": inputs.get("devices"),
        "gbs": job.get("global_batch_size"),
        "seq": job.get("seq_length"),
    }
    ours = {
        "model": ctx.model.name,
        "device": ctx.device.id,
        "devices": ctx.cluster.num_devices,
        "gbs": ctx.job.global_batch_size,
        "seq": ctx.job.seq_length,
    }
    differ = [f"{k} {theirs[k]} (here {ours[k]})" for k in ours if theirs[k] not in (None, ours[k])]
    if differ:
        note(
            f"warning: {where} was priced for another problem: {', '.join(differ)}; "
            "its degrees are placed in this one as given",
            warning=True,
        )
    return bool(differ)


def outside_space(layout: Any, space: SearchSpace | None) -> list[str]:
    """The placed baseline's values that the search space's fixed lists leave out."""
    if space is None:
        return []
    out = []
    for name in ("tp", "pp", "vpp", "cp", "dp", "ep", "mbs", "zero", "schedule"):
        allowed = getattr(space, name)
        value = getattr(layout, name)
        if allowed is not None and value not in allowed:
            out.append(f"{name} {value} where the search took {'|'.join(map(str, allowed))}")
    return out


def baseline_line(result: SearchResult, space: SearchSpace | None = None) -> str:
    """Where the user's layout ranks, one line under the ranking; a layout the space's
    fixed values leave out is said to be, as its rank then counts only what was searched."""
    b = result.baseline
    stated = " ".join(f"{k}={_stated(v)}" for k, v in b.stated.items())
    if b.plan is None:
        return f"baseline ({stated}): no layout with these degrees fits; {b.miss}"
    lay = b.plan.layout
    label = layout_label(lay.model_dump())
    faster_than_all = b.rank == 1 and b.gap is not None and b.gap < 0
    outside = outside_space(lay, space)
    if outside and not faster_than_all:
        label += f" (outside the searched space: {', '.join(outside)})"
    if faster_than_all:
        # Faster than every layout searched: it lies outside the space (a schedule such as
        # DualPipeV is searched only when asked for), so the table's best is not the best.
        return (
            f"baseline ({stated}): {label} is faster than every layout searched "
            f"({b.plan.time.step_s:.3f} s, {100 * b.gap:+.1f} % against the best listed): it lies "
            f"outside the search space; search with its values ({stated}) to rank it among them"
        )
    if b.rank == 1:
        return f"baseline ({stated}): {label} is the best plan, {b.plan.time.step_s:.3f} s"
    best = result.plans[0]
    name, delta = largest_difference(b.plan, best)
    faster = f"{b.rank - 1:,} layout{'s are' if b.rank > 2 else ' is'} faster"
    if b.grids_ahead:
        faster += f"; {b.grids_ahead:,} other grid{'s have' if b.grids_ahead > 1 else ' has'} one"
    return (
        f"baseline ({stated}): {label} ranks {b.rank:,} ({faster}); "
        f"{b.plan.time.step_s:.3f} s, {100 * b.gap:+.1f} % over the best; "
        f"largest difference: {name} {delta:+.2f} s"
    )


def baseline_parts_table(best: Plan, baseline: Plan):
    """The step-time parts of the best plan and the baseline side by side, and what the
    baseline pays more (a single largest difference can hide parts that offset)."""
    rows = []
    for name, _ in SHARE_NAMES:
        mine, theirs = baseline.time.parts.get(name, 0.0), best.time.parts.get(name, 0.0)
        if max(mine, theirs) >= 0.0005:
            rows.append((name, f"{theirs:.3f}", f"{mine:.3f}", f"{mine - theirs:+.3f}"))
    step_b, step_m = best.time.step_s, baseline.time.step_s
    rows.append(("step", f"{step_b:.3f}", f"{step_m:.3f}", f"{step_m - step_b:+.3f}"))
    peak_b, peak_m = best.memory.peak_bytes / 2**30, baseline.memory.peak_bytes / 2**30
    rows.append(("peak memory, GiB", f"{peak_b:.1f}", f"{peak_m:.1f}", f"{peak_m - peak_b:+.1f}"))
    out = table(
        "baseline against the best, seconds per step",
        ["part", ("best", "right"), ("baseline", "right"), ("baseline − best", "right")],
        rows,
    )
    out.rows[-3].end_section = True
    return out


def _stated(value: int | bool | str) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)


DEMO = {"model": "llama-3-70b", "device": "h100-sxm", "devices": 64, "gbs": 512, "seq_len": 8192}


def demo(ctx: typer.Context, as_json: Json = False) -> None:
    """A first run: search every layout of Llama-3-70B on 64 × H100, GBS 512, seq 8192.

    The same as `ndplan search -m llama-3-70b -d h100-sxm -n 64 --gbs 512 -s 8192`.
    """
    if not as_json:
        note("ndplan demo: " + " ".join(f"{k}={v}" for k, v in DEMO.items()))
    search_cmd(ctx, **DEMO, as_json=as_json)


def register(app: typer.Typer) -> None:
    app.command("search")(search_cmd)
    app.command("demo")(demo)
