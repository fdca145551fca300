"""Commands that describe ndplan itself: plugins, devices, schema."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ndplan.bootstrap import REGISTRIES
from ndplan.core import calibration, cluster, counting, job, layout, model, plan
from ndplan.core.errors import InvalidInputError
from ndplan.plugins.manager import BUILTIN_NAME

from .options import DeviceFiles, Json, state
from .output import note, print_json, stdout, table, write_stdout

SCHEMAS = {
    "ModelSpec": model.ModelSpec,
    "DeviceSpec": cluster.DeviceSpec,
    "Cluster": cluster.Cluster,
    "Job": job.Job,
    "Layout": layout.Layout,
    "SearchSpace": layout.SearchSpace,
    "MemoryBreakdown": plan.MemoryBreakdown,
    "TimeBreakdown": plan.TimeBreakdown,
    "Plan": plan.Plan,
    "SearchResult": plan.SearchResult,
    "BalanceResult": plan.BalanceResult,  # what `balance --json` prints
    "ParameterCount": counting.ParameterCount,
    "Calibration": calibration.Calibration,  # what `compare --fit` writes, --calibration reads
}


def registered(comps) -> dict[str, dict[str, list[str]]]:
    """By plugin: the names it registered in each registry (``{"cost model": ["slow"]}``):
    what a command can be told to use (``--cost-model``, ``--debug-sink``, …)."""
    out: dict[str, dict[str, list[str]]] = {}
    registries = [getattr(comps, attr) for attr in REGISTRIES]
    for reg in registries:
        for e in reg.entries():
            out.setdefault(e.plugin, {}).setdefault(reg.kind, []).append(e.name)
    return out


def _registers_text(kinds: dict[str, list[str]]) -> str:
    """Names where few, a count where many (the built-in devices and presets)."""
    return "; ".join(
        f"{kind} {', '.join(names)}" if len(names) <= 6 else f"{kind} ×{len(names)}"
        for kind, names in kinds.items()
    )


def plugins(ctx: typer.Context, as_json: Json = False) -> None:
    """List the loaded plugins, where each came from, the hooks it implements and what it
    registered (devices, cost models, debug sinks, executors, …).

    Example: ndplan plugins --json
    """
    comps = state(ctx).components()
    by_plugin = registered(comps)
    if as_json:
        print_json(
            [
                {
                    "name": p.name,
                    "source": p.source,
                    "hooks": list(p.hooks),
                    "registers": by_plugin.get(p.name, {}),
                }
                for p in comps.plugins
            ]
        )
        return
    stdout.print(
        table(
            "plugins",
            ["name", "source", "hooks", "registers"],
            [
                (
                    p.name,
                    p.source,
                    ", ".join(h.removeprefix("ndplan_") for h in p.hooks),
                    _registers_text(by_plugin.get(p.name, {})),
                )
                for p in comps.plugins
            ],
        )
    )
    replaced = [
        (reg, e)
        for reg in (
            comps.devices,
            comps.cost_models,
            comps.memory_models,
            comps.knapsack_solvers,
            comps.executors,
            comps.debug_sinks,
            comps.exporters,
            comps.readers,
            comps.presets,
        )
        for e in reg.entries()
        if e.replaced
    ]
    for reg, e in replaced:
        note(f"{reg.kind} '{e.name}': '{e.plugin}' replaces '{e.replaced}'")


def devices(ctx: typer.Context, as_json: Json = False, device_file: DeviceFiles = None) -> None:
    """List the device catalog (built-in data, device plugins, --device-file).

    Example: ndplan devices --json
    """
    reg = state(ctx).components(device_file).devices
    entries = reg.entries()
    if as_json:
        print_json(
            [
                {
                    **e.value.model_dump(mode="json"),
                    "registered_by": e.plugin,
                    "replaced": e.replaced,
                }
                for e in entries
            ]
        )
        return
    rows = []
    for e in entries:
        d = e.value
        rows.append(
            (
                d.id,
                d.name,
                f"{d.memory_gib:g}",
                f"{d.peak_tflops.get('bf16', d.peak_tflops.get('fp16', 0)):g}",
                f"{d.peak_tflops['fp8']:g}" if "fp8" in d.peak_tflops else "-",
                f"{d.hbm_bandwidth_gb_per_s:g}",
                d.devices_per_node,
                f"{d.scale_up.bandwidth_gb_per_s:g}×{d.scale_up.domain_size}",
                f"{d.scale_out.bandwidth_gb_per_s:g}",
                e.plugin if e.plugin != BUILTIN_NAME else "",
            )
        )
    stdout.print(
        table(
            "devices",
            [
                "id",
                "name",
                ("GiB", "right"),
                ("bf16 TF/s", "right"),
                ("fp8 TF/s", "right"),
                ("HBM GB/s", "right"),
                ("/node", "right"),
                ("scale-up GB/s×dom", "right"),
                ("scale-out GB/s", "right"),
                "plugin",
            ],
            rows,
        )
    )
    if not rows:
        note("the device registry is empty")


def schema(
    name: Annotated[
        str | None, typer.Argument(help="A schema name (e.g. Layout, Job, Plan); all when omitted.")
    ] = None,
) -> None:
    """Print the JSON schema of the inputs and results.

    Example: ndplan schema Layout
    """
    if name is None:
        print_json({n: m.model_json_schema() for n, m in SCHEMAS.items()})
        return
    # Any case, as model and device names: `ndplan schema layout` means Layout.
    name = next((known for known in SCHEMAS if known.lower() == name.lower()), name)
    if name not in SCHEMAS:
        raise InvalidInputError(f"unknown schema '{name}' (known: {', '.join(SCHEMAS)})")
    write_stdout(json.dumps(SCHEMAS[name].model_json_schema(), indent=2) + "\n")


def register(app: typer.Typer) -> None:
    app.command()(plugins)
    app.command()(devices)
    app.command()(schema)
