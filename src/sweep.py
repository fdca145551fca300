"""Sweeps: many searches (models × device types × device counts × batches × sequence
lengths), each scenario one task on an executor, each summarised by its best plan.

A scenario is plain, picklable, validated data — the model spec and the device spec
themselves, not names or paths — so it runs the same in this process, in a spawned
worker or on a Ray node that has none of the user's files. A scenario that has no
feasible plan, or whose batch no layout can split, is a row saying why, not an error;
a plugin or internal error aborts the sweep like a search.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ndplan.adapters.executors.faults import classify
from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.calibration import Calibration
from ndplan.core.cluster import Cluster, DeviceSpec
from ndplan.core.context import PricingContext
from ndplan.core.errors import InfeasibleError, InvalidInputError, NdplanError, field_error
from ndplan.core.job import Job
from ndplan.core.layout import SearchSpace, layers_per_chunk_text
from ndplan.core.model import ModelSpec
from ndplan.core.plan import Plan
from ndplan.core.units import GiB

STATUSES = ("ok", "infeasible", "invalid")
"""ok: a best plan; infeasible: nothing fits (the reason names the closest miss);
invalid: the scenario cannot be planned as stated (e.g. an unreachable batch)."""

ROW_FIELDS = (
    "model",
    "device",
    "devices",
    "gbs",
    "seq_len",
    "status",
    "tp",
    "pp",
    "vpp",
    "cp",
    "dp",
    "ep",
    "etp",
    "mbs",
    "num_microbatches",
    "zero",
    "sp",
    "offload_optimizer",
    "schedule",
    "layers_per_chunk",
    "recompute",
    "step_s",
    "tokens_per_s_per_device",
    "mfu",
    "peak_gib",
    "reason",
    "assumed",
)
"""The columns of a sweep's rows, in order (``--csv`` and ``--json`` alike); ``assumed``:
the defaults the scenario's search read for fields the inputs left unset, as search's
``assumed:`` line gives them (``job.framework=megatron (pricing); …``)."""


@dataclass(frozen=True)
class Scenario:
    """One search of a sweep."""

    model_name: str
    """The model as the user named it (a preset or a path), for the row."""
    model: ModelSpec
    device: DeviceSpec
    num_devices: int
    job: Job
    space: SearchSpace
    capacity_bytes: int | None = None

    @property
    def label(self) -> str:
        return (
            f"{self.model_name} on {self.num_devices} × {self.device.id} · "
            f"gbs {self.job.global_batch_size} · seq {self.job.seq_length}"
        )


@dataclass(frozen=True)
class SweepRecipe:
    """What every worker rebuilds its planner from (once per process)."""

    plugins: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    calibration: Calibration = field(default_factory=Calibration)
    strict: bool = False
    token: str = ""


_PLANNERS: dict[str, Any] = {}
"""Per process: the planner of the current sweep (rebuilt only when the recipe changes)."""


def _planner(recipe: SweepRecipe):
    from ndplan.bootstrap import bootstrap
    from ndplan.planner import Planner

    found = _PLANNERS.get(recipe.token)
    if found is None:
        _PLANNERS.clear()
        found = _PLANNERS[recipe.token] = Planner(
            bootstrap(plugins=recipe.plugins, disabled=recipe.disabled)
        )
    return found


def _row(scenario: Scenario, status: str, plan: Plan | None = None, reason: str = "") -> dict:
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row.update(
        model=scenario.model_name,
        device=scenario.device.id,
        devices=scenario.num_devices,
        gbs=scenario.job.global_batch_size,
        seq_len=scenario.job.seq_length,
        status=status,
        reason=reason or None,
    )
    if plan is not None:
        lay = plan.layout
        row.update(
            tp=lay.tp,
            pp=lay.pp,
            vpp=lay.vpp,
            cp=lay.cp,
            dp=lay.dp,
            ep=lay.ep,
            etp=lay.expert_tp,
            mbs=lay.mbs,
            num_microbatches=lay.num_microbatches,
            zero=lay.zero,
            sp=lay.sequence_parallel,
            offload_optimizer=lay.offload_optimizer,
            schedule=lay.schedule,
            layers_per_chunk=layers_per_chunk_text(
                plan.chunk_layers() if plan.uneven_split() else None
            ),
            recompute=plan.recompute_summary(),
            step_s=plan.time.step_s if plan.time else None,
            tokens_per_s_per_device=plan.tokens_per_s_per_device,
            mfu=plan.mfu,
            peak_gib=plan.memory.peak_bytes / GiB,
        )
    return row


def run_scenario(planner: Any, scenario: Scenario, recipe: SweepRecipe) -> dict:
    """One search, serially in this process; its best plan, or why there is none, and
    what it assumed."""
    recorder = AssumptionRecorder(strict=recipe.strict)
    row = _searched(planner, scenario, recipe, recorder)
    row["assumed"] = recorder.text() or None
    return row


def _searched(
    planner: Any, scenario: Scenario, recipe: SweepRecipe, recorder: AssumptionRecorder
) -> dict:
    try:
        ctx = PricingContext(
            model=scenario.model,
            cluster=Cluster(device=scenario.device, num_devices=scenario.num_devices),
            job=scenario.job,
            recorder=recorder,
            calibration=recipe.calibration,
            capacity_bytes=scenario.capacity_bytes,
        )
        outcome = planner.search(ctx, scenario.space, top_k=1)
    except InfeasibleError as exc:
        return _row(scenario, "infeasible", reason=str(exc))
    except InvalidInputError as exc:
        return _row(scenario, "invalid", reason=str(exc))
    except ValidationError as exc:
        return _row(scenario, "invalid", reason=field_error(exc))
    except NdplanError as exc:
        raise type(exc)(f"scenario {scenario.label}: {exc}") from exc
    except Exception as exc:
        raise classify(
            exc, f"scenario {scenario.label}", planner.components.plugin_modules
        ) from exc
    return _row(scenario, "ok", outcome.result.plans[0])


def run_scenarios(recipe: SweepRecipe, chunk: Sequence[Scenario]) -> list[dict]:
    """The executor task: every scenario of a chunk, in order."""
    planner = _planner(recipe)
    return [run_scenario(planner, s, recipe) for s in chunk]


run_scenarios.describe = lambda s: f"scenario {s.label}"  # type: ignore[attr-defined]


def run_sweep(
    executor: Any,
    recipe: SweepRecipe,
    scenarios: Sequence[Scenario],
    progress: Callable[[str, int, int], None] | None = None,
) -> list[dict]:
    """Every scenario on ``executor`` (each a task); one row per scenario, in order.

    With ``progress`` (told ``("sweep", done, total)``), the scenarios go to the executor
    a slice at a time, so the bar moves while they run: one at a time in one process,
    four per worker in a pool (each slice still shared out as workers come free)."""
    scenarios = list(scenarios)
    workers = max(1, int(getattr(executor, "workers", 1)))
    size = len(scenarios) if progress is None else (1 if workers == 1 else 4 * workers)
    rows: list[dict] = []
    for start in range(0, len(scenarios), max(1, size)):
        for chunk_rows in executor.map(run_scenarios, recipe, scenarios[start : start + size]):
            rows.extend(chunk_rows)
        if progress is not None:
            progress("sweep", len(rows), len(scenarios))
    if len(rows) != len(scenarios):
        raise RuntimeError(f"executor returned {len(rows)} rows for {len(scenarios)} scenarios")
    return rows
