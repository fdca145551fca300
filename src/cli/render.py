"""Rendering plans for people: memory per stage, step-time parts, recompute ranges."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby

from rich.console import Group
from rich.text import Text

from ndplan.adapters.exporters.common import chunks
from ndplan.adapters.exporters.megatron import exact_args, pipeline_layout
from ndplan.adapters.exporters.torchtitan import exact_checkpointing
from ndplan.core.context import PricingContext
from ndplan.core.plan import Plan, RecomputeRange, SearchResult

from .output import table

MAX_STAGE_COLUMNS = 8


def layout_line(plan: Plan) -> str:
    lay = plan.layout
    parts = [f"dp {lay.dp}", f"tp {lay.tp}", f"pp {lay.pp}"]
    if lay.vpp > 1:
        parts[-1] += f" (vpp {lay.vpp})"
    parts += [f"cp {lay.cp}"]
    if lay.ep > 1 or lay.etp:
        parts.append(f"ep {lay.ep}" + (f" etp {lay.expert_tp}" if lay.expert_tp != lay.tp else ""))
    parts += [
        f"mbs {lay.mbs} × {lay.num_microbatches}",
        f"zero {lay.zero}",
        f"sp {'on' if lay.sequence_parallel else 'off'}",
        f"{lay.schedule}",
        f"recompute {lay.recompute}",
    ]
    if lay.offload_optimizer:
        parts.append("optimizer offloaded")
    return " · ".join(parts)


def estimate_flags(plan: Plan, split: bool = True) -> str:
    """The plan's layout as ``ndplan estimate`` flags (``--tp 4 --pp 4 --vpp 4 …``): with
    the search's own flags they price this plan again, or balance it (``ndplan balance``).
    An uneven split comes with its ``--layers-per-chunk`` (unless ``split`` is false: the
    caller gives another)."""
    lay = plan.layout
    flags = [f"--tp {lay.tp}", f"--pp {lay.pp}"]
    if lay.vpp > 1:
        flags.append(f"--vpp {lay.vpp}")
    flags += [f"--cp {lay.cp}", f"--dp {lay.dp}"]
    if lay.ep > 1:
        flags.append(f"--ep {lay.ep}")
    if lay.ep > 1 or lay.expert_tp != lay.tp:  # expert TP means nothing without experts
        flags.append(f"--etp {lay.expert_tp}")
    flags += [
        f"--mbs {lay.mbs}",
        f"--zero {lay.zero}",
        "--sp" if lay.sequence_parallel else "--no-sp",
        f"--schedule {lay.schedule}",
        f"--recompute {lay.recompute}",
    ]
    if lay.offload_optimizer:
        flags.append("--offload-optimizer")
    if split and plan.uneven_split():
        flags.append("--layers-per-chunk " + ",".join(str(n) for n in plan.chunk_layers()))
    return " ".join(flags)


def split_line(plan: Plan) -> str | None:
    """``layers per chunk: 4 ×15, 1`` when the decoder layers do not split evenly over the
    pipeline chunks (a remainder, the embedding and loss as layers, an MTP model's last
    chunk); None when every chunk holds the same number."""
    if not plan.uneven_split():
        return None
    counts = plan.chunk_layers()
    runs = [(n, len(list(same))) for n, same in groupby(counts)]
    return "layers per chunk: " + ", ".join(f"{n} ×{k}" if k > 1 else f"{n}" for n, k in runs)


def megatron_layout_line(ctx: PricingContext, plan: Plan) -> str | None:
    """The Megatron flag that places the layers as the plan does (Megatron splits them
    evenly by itself, and refuses counts the pipeline does not divide); None for other
    frameworks and DualPipeV, whose chunks Megatron places itself."""
    if ctx.framework.name != "megatron" or plan.layout.schedule == "dualpipev":
        return None
    return f'megatron: --pipeline-model-parallel-layout "{pipeline_layout(ctx.model, plan.layout)}"'


def _stage_columns(n: int, peak: int) -> list[int]:
    if n <= MAX_STAGE_COLUMNS:
        return list(range(n))
    keep = {0, 1, 2, peak, n - 2, n - 1}
    extra = iter(i for i in range(3, n - 2) if i not in keep)
    while len(keep) < MAX_STAGE_COLUMNS:
        keep.add(next(extra))
    return sorted(keep)


def memory_table(plan: Plan):
    mem = plan.memory
    cols = _stage_columns(len(mem.stages), mem.peak_stage)
    names: list[str] = []
    for stage in mem.stages:
        for name in stage.parts:
            if name not in names:
                names.append(name)
    rows = []
    for name in names:
        rows.append([name] + [f"{mem.stages[i].parts.get(name, 0) / 2**30:.2f}" for i in cols])
    rows.append(["total"] + [f"{mem.stages[i].total_bytes / 2**30:.2f}" for i in cols])
    title = f"memory per device, GiB ({mem.mode} model)"
    if len(cols) < len(mem.stages):
        title += f" — {len(cols)} of {len(mem.stages)} stages shown"
    return table(title, ["part"] + [(f"stage {i}", "right") for i in cols], rows)


def memory_verdict(plan: Plan) -> str:
    mem = plan.memory
    verdict = (
        "fits"
        if mem.fits
        else f"DOES NOT FIT (over by {(mem.peak_bytes - mem.budget_bytes) / 2**30:.2f} GiB)"
    )
    return (
        f"peak {mem.peak_bytes / 2**30:.2f} GiB on stage {mem.peak_stage}; budget "
        f"{mem.budget_bytes / 2**30:.2f} GiB of {mem.capacity_bytes / 2**30:.2f} GiB — {verdict}"
    )


def time_table(plan: Plan):
    t = plan.time
    rows = [
        (name, f"{v:.4f}", f"{100 * v / t.step_s:.1f}%") for name, v in t.parts.items() if v > 0
    ]
    rows.append(("step", f"{t.step_s:.4f}", "100%"))
    return table("step time, s", ["part", ("seconds", "right"), ("share", "right")], rows)


def rates_line(ctx: PricingContext, plan: Plan) -> str:
    """Throughput, and the utilisations with the peak they are of: an fp8 run's is the fp8
    peak, twice the bf16 one, so its MFU reads half what a bf16 basis would give."""
    basis = ctx.settings.gemm_precision
    peak = ctx.device.peak_flops(basis) / 1e12
    return (
        f"{plan.tokens_per_s_per_device:,.0f} tokens/s/device · {plan.model_tflops_per_device:,.0f} model "
        f"TFLOP/s/device · MFU {100 * plan.mfu:.1f}% · HFU {100 * plan.hfu:.1f}% "
        f"(of the {basis} dense peak, {peak:,.0f} TFLOP/s)"
    )


def recompute_lines(ranges: Sequence[RecomputeRange]) -> list[str]:
    """``stage 0: layers 0-5 full, 6-19 none``."""
    by_stage: dict[int, list[str]] = {}
    for r in ranges:
        span = f"{r.start}" if r.stop - r.start == 1 else f"{r.start}-{r.stop - 1}"
        by_stage.setdefault(r.stage, []).append(f"{span} {r.option}")
    return [f"stage {s}: layers " + ", ".join(items) for s, items in sorted(by_stage.items())]


def header(ctx: PricingContext) -> str:
    job = ctx.job
    seq = f"seq {job.seq_length}"
    if ctx.settings.attention_span < job.seq_length:
        seq += f" (packed documents of {job.document_tokens})"
    # A cost model other than ndplan's own priced every figure below: say which.
    cost = getattr(ctx.options, "cost_model", "ndplan")
    priced_by = f" · cost model '{cost}'" if cost != "ndplan" else ""
    return (
        f"{ctx.model.name} on {ctx.cluster.num_devices} × {ctx.device.id} · gbs {job.global_batch_size} · "
        f"{seq} · {ctx.settings.precision} · {ctx.settings.framework}{priced_by}"
    )


def plan_report(
    ctx: PricingContext, plan: Plan, layout_flag: bool = False, flags: bool = False
) -> Group:
    """The plan's layout, memory, time and recompute; with an uneven split (or
    ``layout_flag``: the balancer's placement, even or not) the Megatron flag that places
    the layers so; with ``flags`` (a plan the search chose) its ``ndplan estimate`` flags."""
    items = [Text(header(ctx), style="bold"), Text("layout: " + layout_line(plan))]
    if flags:  # one line whatever the width: it is pasted after the search's own flags
        items.append(
            Text("estimate flags: " + estimate_flags(plan), no_wrap=True, overflow="ignore")
        )
    split = split_line(plan)
    if split is not None:
        items.append(Text(split))
    flag = megatron_layout_line(ctx, plan) if split is not None or layout_flag else None
    # One line whatever the width (printed uncropped): it is pasted into a launch script.
    if flag is not None:
        items.append(Text(flag, no_wrap=True, overflow="ignore"))
    items += [
        memory_table(plan),
        Text(memory_verdict(plan)),
    ]
    if plan.time is not None:
        items += [time_table(plan), Text(rates_line(ctx, plan))]
    if _recompute_ranges_say_more(plan):
        items.append(Text("recompute:"))
        items += [Text("  " + line) for line in recompute_lines(plan.recompute)]
    else:  # the recompute ranges would have shown where the layers are
        items += [Text(line) for line in placement_section(ctx, plan)]
    stated = stated_recompute_line(ctx, plan)
    if stated is not None:  # one line, as pasted into a launch script or config
        items.append(Text(stated, no_wrap=True, overflow="ignore"))
    return Group(*items)


def stated_recompute_line(ctx: PricingContext, plan: Plan) -> str | None:
    """Under ``--recompute stated``, the setting chosen as the framework's config states
    it (Megatron's arguments, torchtitan's ``[activation_checkpoint]``); None otherwise
    and for per-stage counts, which the recompute ranges show as they are written."""
    if plan.layout.recompute != "stated":
        return None
    framework = ctx.framework.name
    if framework == "megatron":
        args = exact_args(chunks(plan, ctx))
        if args is not None:
            return f"megatron: {' '.join(args) if args else 'no recompute arguments'}"
    elif framework == "torchtitan":
        section = exact_checkpointing(chunks(plan, ctx))
        if section is not None:
            pairs = ", ".join(f"{k} = {json.dumps(v)}" for k, v in section.items())
            return f"torchtitan: [activation_checkpoint] {pairs}"
    return None


def _recompute_ranges_say_more(plan: Plan) -> bool:
    """Whether the per-layer recompute ranges tell more than the layout line: the options
    differ between layers (e.g. none with offloaded layers), or the per-layer or stated
    choice picked one that is not none."""
    options = {r.option for r in plan.recompute}
    chosen = plan.layout.recompute in ("auto", "stated")
    return len(options) > 1 or (chosen and bool(options - {"none"}))


def placement_section(ctx: PricingContext, plan: Plan) -> list[str]:
    """Which decoder layers each pipeline stage holds (``stage 0: layers 0-4, 20-24 ·
    embedding``), and where the embedding, the output layer with the loss and an MTP
    module sit; nothing without a pipeline."""
    if plan.layout.pp == 1:
        return []
    lines = ["layers by stage:"]
    for stage in ctx.placement(plan.layout):
        spans = [
            f"{c.start}" if c.stop - c.start == 1 else f"{c.start}-{c.stop - 1}"
            for c in stage.chunks
            if c.stop > c.start
        ]
        line = f"  stage {stage.index}: " + ("layers " + ", ".join(spans) if spans else "no layers")
        extras = (
            (stage.has_embedding, "embedding"),
            (stage.has_head, "output layer and loss"),
            (stage.has_mtp, "MTP"),
        )
        lines.append(line + "".join(f" · {name}" for held, name in extras if held))
    return lines


def unfilled_pipeline_warning(plans: Sequence[Plan]) -> str | None:
    """A warning when a plan runs fewer micro-batches than pipeline stages: the pipeline
    never fills, so every stage idles part of each step (allowed, but rarely meant).
    ``plans`` are ranked (search) or a single estimate."""
    unfilled = [
        (i, p.layout)
        for i, p in enumerate(plans, start=1)
        if p.layout.pp > 1 and p.layout.num_microbatches < p.layout.pp
    ]
    if not unfilled:
        return None
    if len(plans) == 1:
        lay = unfilled[0][1]
        return (
            f"warning: {lay.num_microbatches} micro-batches for {lay.pp} pipeline stages: the "
            "pipeline never fills; raise --gbs, or lower --mbs, --dp or --pp"
        )
    if len(unfilled) == 1:
        return (
            f"warning: rank {unfilled[0][0]} runs fewer micro-batches than pipeline stages: "
            "its pipeline never fills"
        )
    shown = 10  # -t 100000 would list hundreds of ranks on one line
    ranks = ", ".join(str(i) for i, _ in unfilled[:shown])
    if len(unfilled) > shown:
        ranks += f" and {len(unfilled) - shown:,} more"
    return (
        f"warning: ranks {ranks} run fewer micro-batches than pipeline stages: "
        "their pipelines never fill"
    )


def near_tie_note(
    plans: Sequence[Plan], median_error: float | None, top: int, runs: str = ""
) -> str | None:
    """A note when the leading ranks differ by less than the calibration's median error
    on the measured runs it was fitted to (``runs``: of the model's class, "MoE" or
    "dense", where the fit states it): their order is then within what the model
    can tell apart, so a user should weigh memory headroom and simplicity too. None
    when the calibration states no error (e.g. hand-written) or only rank 1 is that
    close. ``plans`` are ranked (step times ascend), at most ``top`` of them; when
    they are variants of fewer shapes, the note points to ``--distinct``, which lists
    the alternatives a user weighs (its own lists never repeat a shape)."""
    if not median_error or median_error <= 0 or len(plans) < 2:
        return None
    best = plans[0].time.step_s
    close = [p for p in plans if p.time.step_s <= best * (1 + median_error)]
    if len(close) < 2:
        return None
    spread = close[-1].time.step_s / best - 1
    beyond = len(close) == len(plans) == top  # the band may go on past the kept plans
    who = f"all {len(close)} listed plans are" if beyond else f"ranks 1-{len(close)} are"
    more = f", and more may lie beyond -t {top}" if beyond else ""
    shapes = len({p.layout.shape for p in close})
    among = "all of one shape" if shapes == 1 else f"{shapes} shapes among them"
    hint = f" ({among}: --distinct lists one plan per shape)" if shapes < len(close) else ""
    return (
        f"{who} within {100 * spread:.1f} % of the best step time, less than the "
        f"calibration's median error on the {runs + ' ' if runs else ''}runs it was fitted to "
        f"({100 * median_error:.1f} %): "
        f"their order is uncertain{more}; weigh memory headroom and simplicity too{hint}"
    )


def never_tried_warning(result: SearchResult, devices: int, gbs: int) -> str | None:
    """A warning naming the listed values no layout could take (``--space tp: [1, 3]`` on
    8 devices): the search ran without them, which the user may not have meant."""
    missing = result.summary.never_tried
    if not missing:
        return None
    listed = "; ".join(f"{name} {', '.join(map(str, values))}" for name, values in missing.items())
    return (
        f"warning: never tried, as no layout of {devices} devices and global batch {gbs} "
        f"can take them: {listed} (tp·pp·cp·dp make the device count, dp·mbs divides the "
        "batch, pp·vpp chunks split the layers)"
    )
