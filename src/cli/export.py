"""``--export FORMAT --out FILE``: the chosen plan as the config its framework runs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer

from ndplan.bootstrap import Components
from ndplan.core.context import PricingContext
from ndplan.core.errors import InvalidInputError
from ndplan.core.layout import Layout
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported, Exporter
from ndplan.planner import Planner, PricingOptions, render_export
from ndplan.planner import exporter_for as planner_exporter_for

from .output import check_output_file, note, write_atomic

ExportOpt = Annotated[
    str | None,
    typer.Option(
        "--export",
        metavar="FORMAT",
        help="Write the chosen plan as a config: megatron (Megatron-LM arguments), "
        "torchtitan (TOML), mindformers (YAML), deepspeed (JSON) — each for a plan of "
        "that --framework — or ndplan (JSON, any framework; --baseline reads it). "
        "Needs --out. Where the framework cannot state the plan exactly, the file says "
        "so and a warning names what it does instead.",
        show_default=False,
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="The file --export writes (written whole or not at all; an existing file "
        "only with --force).",
        show_default=False,
    ),
]


def check_out(export: str | None, out: Path | None, *, force: bool) -> None:
    """Before any work: --export and --out come together, and --out can be written."""
    if export is None and out is None:
        return
    if export is None:
        raise InvalidInputError(
            f"--out {out}: names the file --export writes; add --export megatron, torchtitan, "
            "mindformers, deepspeed or ndplan"
        )
    if out is None:
        raise InvalidInputError(f"--export {export}: give the file to write with --out FILE")
    check_output_file(out, "--out", force=force)


def exporter_for(components: Components, export: str, framework: str) -> Exporter:
    """The exporter of ``--export FORMAT`` for plans priced for ``framework``."""
    return planner_exporter_for(components, export, framework, where=f"--export {export}")


LayoutPricer = Callable[[Layout, Sequence[str]], Plan]
"""Prices a layout with a recompute option per decoder layer (``Planner.estimate_per_layer``)."""


def layout_pricer(planner: Planner, ctx: PricingContext, options: PricingOptions) -> LayoutPricer:
    """``Planner.estimate_per_layer`` in ``ctx``, each pricing kept: the export and the
    report's line price the same stand-ins of the same plan."""

    @functools.cache
    def priced(layout: Layout, recompute: tuple[str, ...]) -> Plan:
        return planner.estimate_per_layer(ctx, layout, recompute, options)

    return lambda layout, recompute: priced(layout, tuple(recompute))


def render(exporter: Exporter, plan: Plan, ctx: PricingContext, price: LayoutPricer) -> Exported:
    """The exporter's config of ``plan``, its stand-ins priced with ``price``."""
    return render_export(exporter, plan, ctx, lambda options: price(plan.layout, options))


def write_export(
    exporter: Exporter,
    plan: Plan,
    ctx: PricingContext,
    out: Path,
    rank: int | None,
    price: LayoutPricer,
) -> None:
    """Render and write atomically (``out`` was checked up front), then say on stderr what
    was written and every caveat. The exporter may price the plan's layout with another
    recompute per layer, to write the fastest setting its framework states."""
    exported = render(exporter, plan, ctx, price)
    write_atomic(out, exported.text, force=True)
    for caveat in exported.caveats:
        note(f"warning: {caveat}", warning=True)
    which = f"plan {rank}" if rank is not None else "the plan"
    note(f"wrote {which} as {exporter.name} to {out}")


def stand_in_line(
    components: Components, plan: Plan, ctx: PricingContext, price: LayoutPricer
) -> str | None:
    """Under a plan's report: where its framework's config cannot state the plan's
    per-layer recompute, what the fastest setting it states costs (the exporter of the
    framework decides, as ``--export`` would write it); None where it states it exactly."""
    framework = ctx.framework.name
    exporter = next(
        (
            e
            for e in map(components.exporters.get, components.exporters)
            if e.framework == framework
        ),
        None,
    )
    if exporter is None or plan.time is None:
        return None
    written = render(exporter, plan, ctx, price).stand_in
    if written is None or written.plan is None or written.plan.time is None:
        return None
    step, planned = written.plan.time.step_s, plan.time.step_s
    fits = written.plan.memory.fits
    return (
        f"{framework}'s config cannot state this plan's per-layer recompute: "
        + (
            f"the fastest setting it states that fits, {written.description}, runs "
            if fits
            else f"no setting it states fits; {written.description} runs "
        )
        + f"{step:.3f} s per step ({100 * (step / planned - 1):+.1f} %) — --export "
        f"{exporter.name} writes it; --recompute stated ranks only plans {framework} runs "
        "as priced"
    )
