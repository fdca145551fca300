"""``ndplan estimate``: price one given layout."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any, get_args

import typer
from rich.text import Text

from ndplan.core.context import PricingContext
from ndplan.core.errors import InfeasibleError, InvalidInputError
from ndplan.core.layout import Layout
from ndplan.core.plan import BalanceResult, MemoryMode, Plan
from ndplan.core.ports import Exporter
from ndplan.core.search import RECOMPUTES, SCHEDULES
from ndplan.planner import PricingOptions

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
    a2a_overlap_inapplicable,
    build_context,
    check_choice,
)
from .export import (
    ExportOpt,
    LayoutPricer,
    OutOpt,
    check_out,
    exporter_for,
    layout_pricer,
    write_export,
)
from .options import DeviceFiles, Json, Strict, state
from .output import note, print_json, stdout
from .render import plan_report, unfilled_pipeline_warning

Degree = Annotated[int, typer.Option(min=1)]


def parse_layers_per_chunk(text: str, layout: Layout, pctx: PricingContext) -> tuple[int, ...]:
    """``--layers-per-chunk 2,2,3,1`` checked against the layout and the framework."""
    flag = "--layers-per-chunk"
    try:
        counts = tuple(int(v) for v in text.replace(" ", "").split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 0:
        raise InvalidInputError(
            f"{flag}: {text!r} is not a comma-separated list of whole numbers ≥ 0, e.g. 20,20,21,19"
        )
    if not pctx.framework.uneven_pipeline:
        raise InvalidInputError(
            f"{flag}: {pctx.framework.name} splits layers evenly; drop the flag or use another "
            "--framework"
        )
    layers = pctx.model.num_layers
    shape = "2·pp (DualPipeV)" if layout.schedule == "dualpipev" else "pp·vpp"
    if len(counts) != layout.chunks:
        raise InvalidInputError(
            f"{flag}: {len(counts)} numbers for {shape} = {layout.chunks} chunks; give one per chunk"
        )
    if sum(counts) != layers:
        raise InvalidInputError(
            f"{flag}: the counts sum to {sum(counts)}, the model has {layers} layers; make them add up"
        )
    return counts


def _layout_command(
    balancing: bool,
    ctx: typer.Context,
    model: ModelOpt,
    device: DeviceOpt,
    devices: DevicesOpt,
    gbs: GbsOpt,
    seq_len: SeqOpt,
    tp: Annotated[int, typer.Option("--tp", min=1, help="Tensor parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", min=1, help="Pipeline stages.")] = 1,
    vpp: Annotated[
        int, typer.Option("--vpp", min=1, help="Virtual pipeline chunks per stage.")
    ] = 1,
    cp: Annotated[int, typer.Option("--cp", min=1, help="Context parallel degree.")] = 1,
    dp: Annotated[
        int | None,
        typer.Option(
            "--dp",
            min=1,
            help="Data parallel degree [default: devices/(tp·pp·cp)].",
            show_default=False,
        ),
    ] = None,
    ep: Annotated[int, typer.Option("--ep", min=1, help="Expert parallel degree.")] = 1,
    etp: Annotated[
        int | None,
        typer.Option(
            "--etp", min=1, help="Expert tensor parallel degree [default: tp].", show_default=False
        ),
    ] = None,
    mbs: Annotated[int, typer.Option("--mbs", min=1, help="Micro-batch size.")] = 1,
    zero: Annotated[
        int | None,
        typer.Option(
            "--zero",
            min=0,
            max=3,
            help="ZeRO stage (1 = distributed optimizer, 3 = FSDP) [default: the framework's].",
            show_default=False,
        ),
    ] = None,
    sp: Annotated[
        bool | None,
        typer.Option(
            "--sp/--no-sp",
            help="Sequence parallelism [default: on when tp > 1].",
            show_default=False,
        ),
    ] = None,
    recompute: Annotated[
        str,
        typer.Option(
            "--recompute",
            help="none, selective (Megatron: core attention; torchtitan: its per-op "
            "policy), full, auto (per-layer knapsack), or stated (the fastest setting "
            "that fits among those the framework's config states: Megatron's modules on "
            "every layer or the first N of each chunk whole, torchtitan's per-op policy or "
            "one layer in every N).",
        ),
    ] = "none",
    offload_optimizer: Annotated[
        bool, typer.Option("--offload-optimizer", help="Keep optimizer state in host memory.")
    ] = False,
    schedule: Annotated[
        str | None,
        typer.Option(
            "--schedule",
            help="1f1b, interleaved, gpipe or dualpipev [default: interleaved when vpp > 1].",
            show_default=False,
        ),
    ] = None,
    layers_per_chunk: Annotated[
        str | None,
        typer.Option(
            "--layers-per-chunk",
            help="Decoder layers per pipeline chunk in chunk order, comma-separated (pp·vpp "
            "numbers, as a search's layout.layers_per_stage) [default: even].",
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
    memory_mode: Annotated[
        str,
        typer.Option(
            "--memory-mode", help="ndplan (complete) or megatron (Megatron-LM's estimate)."
        ),
    ] = "ndplan",
    max_mem: MaxMemOpt = None,
    reserve: ReserveOpt = None,
    runtime_reserve: RuntimeReserveOpt = None,
    calibration: CalibrationOpt = None,
    cost_model: CostModelOpt = "ndplan",
    strict: Strict = False,
    device_file: DeviceFiles = None,
    as_json: Json = False,
    export: ExportOpt = None,
    out: OutOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the --out file if it exists.")
    ] = False,
) -> None:
    """``estimate`` and ``balance``: one layout from the flags, priced or balanced."""
    check_out(export, out, force=force)
    check_choice("--recompute", recompute, RECOMPUTES)
    check_choice("--memory-mode", memory_mode, get_args(MemoryMode))
    if schedule is not None:
        check_choice("--schedule", schedule, SCHEDULES)
    options = PricingOptions(
        memory_model=memory_mode,
        cost_model=cost_model,
        max_mem_gib=max_mem,
        balance_reserve_gib=reserve or 0.0,
        reserve_gib=runtime_reserve,
        calibration=calibration,
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
        state(ctx),
        model=model,
        device=device,
        devices=devices,
        job=job,
        device_files=device_file,
        strict=strict,
        options=options,
    )
    exporter = exporter_for(planner.components, export, pctx.framework.name) if export else None
    layout = planner.layout(
        pctx,
        tp=tp,
        pp=pp,
        cp=cp,
        dp=dp,
        vpp=vpp,
        ep=ep,
        etp=etp,
        mbs=mbs,
        zero=zero,
        sp=sp,
        recompute=recompute,
        offload_optimizer=offload_optimizer,
        schedule=schedule,
    )
    if layers_per_chunk is not None:
        counts = parse_layers_per_chunk(layers_per_chunk, layout, pctx)
        layout = layout.model_copy(update={"layers_per_stage": counts})
    if sp and layout.tp == 1:  # as Megatron does, with a word
        note(SP_AT_TP_1, warning=True)
        layout = layout.model_copy(update={"sp": False})  # the layout as priced
    if layout.tp > (domain := pctx.cluster.scale_up_domain):
        # Priced as asked (its all-reduces over the network), but search would not offer it.
        note(
            f"warning: tp {layout.tp} spans more than the {pctx.device.id}'s scale-up domain "
            f"({domain} devices): its collectives cross the network; search refuses such TP "
            f"unless given --max-tp {layout.tp}",
            warning=True,
        )
    if moe_a2a_overlap and (why := a2a_overlap_inapplicable(layout)):
        note(A2A_OVERLAP_IDLE.format(why), warning=True)
    if balancing:
        if memory_mode != "ndplan":
            raise InvalidInputError(
                "--memory-mode megatron has no per-stage placement to balance; drop it"
            )
        result = planner.balance(pctx, layout, options)
        plan = result.balanced
        _export(exporter, plan, pctx, out, layout_pricer(planner, pctx, options))
        if as_json:
            print_json(result)
        else:
            stdout.print(plan_report(pctx, plan, layout_flag=True, flags=True), crop=False)
            stdout.print(Text(balance_line(result, given=layers_per_chunk is not None)))
    else:
        plan = planner.estimate(pctx, layout, options)
        _export(exporter, plan, pctx, out, layout_pricer(planner, pctx, options))
        if as_json:
            print_json(plan)
        else:
            stdout.print(plan_report(pctx, plan), crop=False)
    warning = unfilled_pipeline_warning([plan])
    if warning:
        note(warning, warning=True)
    line = pctx.recorder.line()
    if line:
        note(line)


def _export(
    exporter: Exporter | None,
    plan: Plan,
    pctx: PricingContext,
    out: Path | None,
    price: LayoutPricer,
) -> None:
    """Before anything is printed: a plan that does not fit is not written (exit 1)."""
    if exporter is None or out is None:
        return
    if not plan.memory.fits:
        raise InfeasibleError(f"--export: the plan is {over_memory(plan)}; no file written")
    write_export(
        exporter,
        plan,
        pctx,
        out,
        rank=None,
        price=price,
    )


def over_memory(plan: Plan) -> str:
    m = plan.memory
    return (
        f"over memory by {(m.peak_bytes - m.budget_bytes) / 2**30:.2f} GiB on stage {m.peak_stage}"
    )


def balance_line(result: BalanceResult, *, given: bool) -> str:
    """How the balanced placement compares with the split it started from."""
    start, best = result.start, result.balanced
    split = "the given split" if given else "the default split"
    moved = f"{result.moved} layer{'s' if result.moved != 1 else ''} moved"
    priced = f"{result.priced} placements priced"
    if start.layout.layers_per_stage == best.layout.layers_per_stage or result.moved == 0:
        return f"balanced: no move makes {split} faster within memory ({priced})"
    gib = 2**30
    if not best.memory.fits:
        return (
            f"balanced: no placement fits; the closest is {over_memory(best)} ({split}: "
            f"{over_memory(start)}); {moved}; {priced}"
        )
    if start.memory.fits:
        change = best.time.step_s / start.time.step_s - 1
        against = f"{start.time.step_s:.3f} s with {split} ({100 * change:+.1f} %)"
    else:
        against = f"{split}, which is {over_memory(start)}"
    return (
        f"balanced: {best.time.step_s:.3f} s per step against {against}; peak "
        f"{best.memory.peak_bytes / gib:.1f} GiB on stage {best.memory.peak_stage} against "
        f"{start.memory.peak_bytes / gib:.1f} GiB; {moved}; {priced}"
    )


def estimate(**flags: Any) -> None:
    """Price one layout: memory per stage with its parts, whether it fits, the step time.

    Example: ndplan estimate -m llama-3-70b -d h100 -n 64 --gbs 128 -s 8192 --tp 4 --pp 4 --vpp 5 --cp 2
    """
    _layout_command(False, **flags)


def balance(**flags: Any) -> None:
    """The pipeline balancer on one layout: per-chunk layer counts (and with --recompute
    auto the per-layer recompute) that make the step fastest within memory, against the
    layout's own split. Starts from --layers-per-chunk when given.

    Example: ndplan balance -m llama-3-8b -d h100 -n 16 --gbs 64 -s 8192 --pp 16 --recompute auto
    """
    _layout_command(True, **flags)


# Both commands take exactly the layout flags; typer reads them from this signature.
_FLAGS = inspect.signature(_layout_command, eval_str=True)
for _command in (estimate, balance):
    _command.__signature__ = _FLAGS.replace(parameters=list(_FLAGS.parameters.values())[1:])


def register(app: typer.Typer) -> None:
    app.command()(estimate)
    app.command()(balance)
