"""The library facade: what the CLI and framework integrations call.

``Planner(bootstrap())`` holds the assembled components; its methods take plain
inputs (names, numbers) or domain models and return domain models.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import ValidationError

from ndplan.adapters.devices.calibration import check_calibration_names, load_calibration
from ndplan.adapters.executors.faults import GuardedPricing, guarded_rule
from ndplan.adapters.readers.resolve import load_model
from ndplan.bootstrap import Components, bootstrap, create
from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.balance import balance as run_balance
from ndplan.core.calibration import Calibration
from ndplan.core.cluster import Cluster, DeviceSpec
from ndplan.core.context import PricingContext
from ndplan.core.errors import (
    BaselineError,
    InfeasibleError,
    InvalidInputError,
    NdplanError,
    PluginError,
    exception_text,
    field_error,
)
from ndplan.core.frameworks import FRAMEWORKS
from ndplan.core.job import Job
from ndplan.core.kernels.knapsack import DEFAULT_BUCKET_BYTES
from ndplan.core.layout import (
    Layout,
    SearchSpace,
    check_layout,
    heads_split,
    selective_not_offered,
)
from ndplan.core.model import ModelSpec, MoEFFN
from ndplan.core.plan import BalanceResult, Baseline, Plan, SearchResult
from ndplan.core.ports import (
    CostModel,
    DebugSink,
    Executor,
    Exported,
    Exporter,
    KnapsackSolver,
    MemoryModel,
    PerLayerPricer,
)
from ndplan.core.pricing import Pricer
from ndplan.core.recompute import parse_option
from ndplan.core.search import (
    SearchHooks,
    SearchOutcome,
    SearchPricing,
    SearchSettings,
    place_in_ranking,
)
from ndplan.core.search import search as run_search
from ndplan.core.units import GiB


@dataclass
class PricingOptions:
    """How to price: which port implementations, the memory budget, the calibration."""

    memory_model: str = "ndplan"
    cost_model: str = "ndplan"
    knapsack_solver: str = "dp"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    max_mem_gib: float | None = None
    balance_reserve_gib: float = 0.0
    reserve_gib: float | None = None
    calibration: Path | None = None
    memoize: bool = True
    """Reuse priced parts across candidates (turn off only to measure what reuse buys)."""


CONTEXT_OPTIONS = ("max_mem_gib", "balance_reserve_gib", "reserve_gib", "calibration", "memoize")
"""The options a context is made with (its budget, its fit, its reuse); the others choose
the ports that price, and a call may name its own."""


def check_memory_budget(
    max_mem_gib: float | None, device: DeviceSpec, where: str = "max_mem_gib"
) -> None:
    """The memory budget is the usable part of the device's memory: positive, finite, and
    no more than the device has (a larger device is a device file, not a bigger budget).
    ``where`` names where the budget was given (an option, a flag, a file's ``max_mem``)."""
    if max_mem_gib is None:
        return
    if not math.isfinite(max_mem_gib) or max_mem_gib <= 0:
        raise InvalidInputError(f"{where}: must be a positive number of GiB, got {max_mem_gib}")
    if max_mem_gib > device.memory_gib:
        raise InvalidInputError(
            f"{where}: {max_mem_gib:g} GiB is more than the {device.id}'s "
            f"{device.memory_gib:g} GiB; give at most {device.memory_gib:g}, or describe a "
            "larger device with --device-file"
        )


class Planner:
    """Searches and prices layouts with the components the plugins contributed."""

    def __init__(self, components: Components | None = None) -> None:
        self.components = components if components is not None else bootstrap()

    # ------------------------------------------------------------------ inputs

    def model(self, name_or_path: str, recorder: AssumptionRecorder | None = None) -> ModelSpec:
        return load_model(self.components, name_or_path, recorder or AssumptionRecorder())

    def device(self, name: str) -> DeviceSpec:
        return self.components.devices.get(name)

    def calibration(self, path: Path | None) -> Calibration:
        calibration = load_calibration(path)
        if path is not None:  # the shipped file is checked by its tests
            check_calibration_names(calibration, path, self.components.devices, FRAMEWORKS)
        return calibration

    def context(
        self,
        model: ModelSpec,
        device: DeviceSpec,
        num_devices: int,
        job: Job,
        *,
        options: PricingOptions | None = None,
        recorder: AssumptionRecorder | None = None,
        devices_per_node: int | None = None,
        option_names: Mapping[str, str] | None = None,
    ) -> PricingContext:
        """What every pricing of one problem shares. ``options`` holds for every call on
        the context that names none; a call's own options may choose other ports, not
        another budget, fit or reuse (``CONTEXT_OPTIONS``: those make another context).
        ``option_names``: how the caller's user spells an option (the CLI's flags), for
        the error lines."""
        opts = options or PricingOptions()
        names = {**{name: name for name in CONTEXT_OPTIONS}, **(option_names or {})}
        check_memory_budget(opts.max_mem_gib, device, names["max_mem_gib"])
        for name in ("balance_reserve_gib", "reserve_gib"):
            value = getattr(opts, name)
            if value is not None and not math.isfinite(value):
                raise InvalidInputError(
                    f"{names[name]}: must be a finite number of GiB, got {value}"
                )
            if value is not None and value < 0:
                raise InvalidInputError(f"{names[name]}: must be at least 0 GiB, got {value:g}")
        if opts.bucket_bytes < 1:
            raise InvalidInputError(f"bucket_bytes: must be at least 1, got {opts.bucket_bytes}")
        capacity = int(opts.max_mem_gib * GiB) if opts.max_mem_gib is not None else None
        try:
            cluster = Cluster(
                device=device, num_devices=num_devices, devices_per_node=devices_per_node
            )
        except ValidationError as exc:
            raise InvalidInputError(field_error(exc)) from None
        ctx = PricingContext(
            model=model,
            cluster=cluster,
            job=job,
            recorder=recorder or AssumptionRecorder(),
            calibration=self.calibration(opts.calibration),
            capacity_bytes=capacity,
            balance_reserve_bytes=int(opts.balance_reserve_gib * GiB),
            reserve_bytes=int(opts.reserve_gib * GiB) if opts.reserve_gib is not None else None,
            memoize=opts.memoize,
            options=opts,
        )
        # Reserves that leave nothing to plan in would only show up later as "no layout
        # fits in -420 GiB"; they are invalid input.
        capacity_gib = ctx.device_capacity_bytes / GiB
        if ctx.budget_bytes <= 0:
            raise InvalidInputError(
                f"{names['balance_reserve_gib']}: {opts.balance_reserve_gib:g} GiB leaves "
                f"nothing of the {capacity_gib:.2f} GiB per device; give less than "
                f"{capacity_gib:.2f}"
            )
        # A stated runtime reserve that takes it all is a typo; the device's own reserve
        # under a small budget is a problem with too little memory (exit 1, the closest miss).
        if opts.reserve_gib is not None and ctx.fixed_reserve_bytes >= ctx.budget_bytes:
            raise InvalidInputError(
                f"{names['reserve_gib']}: {ctx.fixed_reserve_bytes / GiB:g} GiB leaves "
                f"nothing of the {ctx.budget_bytes / GiB:.2f} GiB per device to plan in; give "
                f"less than {ctx.budget_bytes / GiB:.2f}"
            )
        return ctx

    def pricer(self, ctx: PricingContext, options: PricingOptions | None = None) -> Pricer:
        """The ports ``options`` (else the context's own) choose, pricing on ``ctx`` or, for
        ports other than those that first priced it, on a twin of it with its own cache
        (priced parts are the ports' and must not leak from one choice to another)."""
        opts = self._options(ctx, options)
        comps = self.components
        ctx = ctx.for_pricing(
            (opts.memory_model, opts.cost_model, opts.knapsack_solver, opts.bucket_bytes), opts
        )
        # Factory signatures are documented on the registration hooks.
        memory = create(comps.memory_models, opts.memory_model, MemoryModel)
        cost = create(comps.cost_models, opts.cost_model, CostModel, ctx.calibration)
        solver = create(
            comps.knapsack_solvers, opts.knapsack_solver, KnapsackSolver, opts.bucket_bytes
        )
        return Pricer(ctx, memory, cost, solver)

    @staticmethod
    def _options(ctx: PricingContext, options: PricingOptions | None) -> PricingOptions:
        """A call's options, checked against the context's: one that asks for another
        budget, fit or reuse would otherwise be silently priced with the context's."""
        made = ctx.options if isinstance(ctx.options, PricingOptions) else None
        if made is None:  # a context made directly: its budget and fit are its own fields
            return options or PricingOptions()
        if options is None:
            return made
        for name in CONTEXT_OPTIONS:
            if getattr(options, name) != getattr(made, name):
                raise InvalidInputError(
                    f"{name}: {getattr(options, name)!r} differs from the context's "
                    f"{getattr(made, name)!r}; it is set when the context is made: pass these "
                    "options to planner.context(..., options=...)"
                )
        return options

    # ------------------------------------------------------------------ one layout

    def layout(
        self,
        ctx: PricingContext,
        *,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        dp: int | None = None,
        vpp: int = 1,
        ep: int = 1,
        etp: int | None = None,
        mbs: int = 1,
        zero: int | None = None,
        sp: bool | None = None,
        recompute: str = "none",
        offload_optimizer: bool = False,
        schedule: str | None = None,
    ) -> Layout:
        """A layout of the context's problem from the degrees given, the rest as
        ``ndplan estimate`` takes them: dp from the device count, the micro-batch count
        from the global batch, the framework's ZeRO stage (recorded as assumed), SP on
        with TP, the interleaved schedule with VPP. (``Layout(...)`` itself states every
        field: dp 1, one micro-batch, ZeRO 0, SP off.)"""
        devices, gbs = ctx.cluster.num_devices, ctx.job.global_batch_size
        degrees = {"tp": tp, "pp": pp, "cp": cp, "vpp": vpp, "ep": ep, "mbs": mbs}
        degrees |= {"dp": dp, "etp": etp}
        for name, value in degrees.items():
            if value is not None and (isinstance(value, bool) or value < 1):
                raise InvalidInputError(f"{name}: must be at least 1, got {value}")
        model_parallel = tp * pp * cp
        if dp is None:
            if devices % model_parallel:
                raise InvalidInputError(
                    f"tp({tp})·pp({pp})·cp({cp}) = {model_parallel} does not divide "
                    f"devices({devices}); change a degree or --devices"
                )
            dp = devices // model_parallel
        if gbs % (dp * mbs):
            raise InvalidInputError(
                f"global batch({gbs}) is not a multiple of dp({dp})·mbs({mbs}) = {dp * mbs}; "
                "change --gbs or --mbs"
            )
        if zero is None:
            fw = ctx.framework
            zero = ctx.recorder.default("layout.zero", fw.default_zero, f"{fw.name} default")
        try:
            return Layout(
                dp=dp,
                tp=tp,
                pp=pp,
                vpp=vpp,
                cp=cp,
                ep=ep,
                etp=etp,
                mbs=mbs,
                num_microbatches=gbs // (dp * mbs),
                zero=zero,
                # SP with TP, where the framework runs it beside this CP (not DeepSpeed's).
                sp=(tp > 1 and (cp == 1 or ctx.framework.sp_with_cp)) if sp is None else sp,
                schedule=schedule or ("interleaved" if vpp > 1 else "1f1b"),
                recompute=recompute,
                offload_optimizer=offload_optimizer,
            )
        except ValidationError as exc:
            raise InvalidInputError(f"layout: {field_error(exc)}") from None

    def estimate(
        self, ctx: PricingContext, layout: Layout, options: PricingOptions | None = None
    ) -> Plan:
        """Price one layout: memory per stage, the recompute choice, the step time."""
        validate_layout(ctx, layout)
        opts = self._options(ctx, options)
        pricer = self.pricer(ctx, opts)
        if opts.memory_model == "megatron":
            memory = pricer.memory.breakdown(pricer.ctx, layout)
            priced = pricer.price(layout)
            plan = pricer.plan(priced)
            return plan.model_copy(update={"memory": memory})
        return pricer.plan(pricer.price(layout))

    def estimate_per_layer(
        self,
        ctx: PricingContext,
        layout: Layout,
        recompute: Sequence[str],
        options: PricingOptions | None = None,
    ) -> Plan:
        """Price one layout with a recompute option named for each decoder layer (``none``,
        ``full``, ``offload`` or switches such as ``norm+mlp``, as a plan's ranges name
        them), in model order: how a config that recomputes other than the plan runs."""
        validate_layout(ctx, layout)
        pricer = self.pricer(ctx, options)
        return pricer.plan(pricer.price_per_layer(layout, [parse_option(o) for o in recompute]))

    def balance(
        self, ctx: PricingContext, layout: Layout, options: PricingOptions | None = None
    ) -> BalanceResult:
        """The pipeline balancer: per-chunk layer counts (and with ``recompute auto`` the
        per-layer recompute) that make ``layout``'s step fastest within memory."""
        validate_layout(ctx, layout)
        pricer = self.pricer(ctx, options)
        found = run_balance(pricer, layout)
        return BalanceResult(
            start=pricer.plan(found.start),
            balanced=pricer.plan(found.best),
            moved=found.moved,
            priced=found.priced,
        )

    def rebalance(
        self, ctx: PricingContext, result: SearchResult, options: PricingOptions | None = None
    ) -> SearchResult:
        """Re-balance a search's top plans with the pipeline balancer and re-rank them
        (spec: the search's last step). Pipelined plans of frameworks that place layers
        unevenly take the balancer's placement where it is faster; the order is then step
        time, peak memory and the search's own rank; a placement two plans reach is
        kept once. Serial and deterministic, whatever executor the search ran on.

        A result that places a baseline is refused: re-ranking only the top K would leave
        the baseline's rank, gap and parts measured against plans no longer listed."""
        if result.baseline is not None:
            raise BaselineError(REBALANCE_CONFLICT.format(rebalancing="rebalancing"))
        pricer = self.pricer(ctx, options)
        uneven = ctx.framework.uneven_pipeline
        moved = 0
        plans: list[tuple[tuple, Plan]] = []
        for plan in result.plans:
            rank = plan.rank  # the search's, also for the placement that replaces it
            if uneven and plan.layout.pp > 1:
                found = run_balance(pricer, plan.layout)
                if found.best.fits and found.best.time.step_s < plan.time.step_s:
                    plan = pricer.plan(found.best)
                    moved += 1
            plans.append(((plan.time.step_s, plan.memory.peak_bytes, rank), plan))
        kept, seen = [], set()
        for _, plan in sorted(plans, key=lambda item: item[0]):
            if plan.layout not in seen:
                seen.add(plan.layout)
                kept.append(plan.model_copy(update={"rank": len(kept) + 1}))
        summary = result.summary.model_copy(update={"rebalanced": moved})
        return result.model_copy(update={"summary": summary, "plans": tuple(kept)})

    # ------------------------------------------------------------------ configs out

    def export(
        self, ctx: PricingContext, plan: Plan, fmt: str, options: PricingOptions | None = None
    ) -> Exported:
        """``plan`` as the config ``fmt`` writes (``megatron``, ``torchtitan``,
        ``mindformers``, ``deepspeed``, ``ndplan`` or a plugin's), as ``--export`` renders
        it: a framework's format takes only plans priced for that framework, a plan that
        does not fit is refused, and a recompute the format cannot state is written as a
        stand-in priced in ``ctx`` (the header's ``# predicted:`` line). The text is the
        caller's to write; ``caveats`` says where the file differs from the plan."""
        exporter = exporter_for(self.components, fmt, ctx.framework.name, where=fmt)
        if plan.time is not None and not plan.memory.fits:
            peak = plan.memory.peak_bytes / GiB
            raise InfeasibleError(
                f"{fmt}: the plan does not fit (peak {peak:.2f} GiB on stage "
                f"{plan.memory.peak_stage}); nothing to export"
            )
        return render_export(
            exporter,
            plan,
            ctx,
            lambda recompute: self.estimate_per_layer(ctx, plan.layout, recompute, options),
        )

    # ------------------------------------------------------------------ search

    def search(
        self,
        ctx: PricingContext,
        space: SearchSpace,
        *,
        top_k: int = 10,
        distinct: bool = False,
        options: PricingOptions | None = None,
        executor: Executor | None = None,
        sinks: Sequence[DebugSink] = (),
        bounding: bool = True,
        collect_parts: bool = False,
        progress: Callable[[str, int, int], None] | None = None,
        baseline: Mapping[str, int | bool | str] | None = None,
    ) -> SearchOutcome:
        """Every layout in ``space``, priced and ranked (the top ``top_k`` as Plans;
        ``distinct``: the fastest layout of each of the ``top_k`` best shapes).

        ``baseline``: degrees of a layout the user runs (e.g. ``{"tp": 4, "pp": 8}``);
        the fastest layout with them, the others searched as in ``space``, is placed in
        the full ranking (``result.baseline``). Every layout that could be faster is then
        priced, so its rank is exact; the top K is the same as without it."""
        opts = self._options(ctx, options)
        if top_k < 1:
            raise InvalidInputError(f"top_k: must be at least 1, got {top_k}")
        check_precision(ctx)
        debug = bool(sinks) or collect_parts
        pricer = self.pricer(ctx, opts)
        ctx = pricer.ctx  # the one whose cache these ports fill
        # Failures name the candidate and whether a plugin raised (exit 4) or ndplan (5).
        pricing = GuardedPricing(SearchPricing(pricer, debug=debug), self.components.plugin_modules)
        plugins = self.components.plugin_modules
        rules = [
            (name, guarded_rule(name, rule, plugins))
            for name, rule in self.components.refusal_rules.rules
        ]
        hooks = SearchHooks(progress=progress)
        if sinks:

            def refusal(candidate, reason):
                for sink in sinks:
                    sink.refusal(candidate, reason)

            def priced(candidate, memory, time_parts):
                for sink in sinks:
                    sink.memory(candidate, memory)
                    sink.time(candidate, time_parts)

            hooks.refusal, hooks.priced = refusal, priced
        recipe = None
        task = None
        if executor is not None and getattr(executor, "name", "") != "serial":
            if self.components.in_process:
                # Workers rebuild the components from module names; an object handed to
                # bootstrap(extra=...) would be missing there, and the ranking silently differ.
                raise InvalidInputError(
                    f"in-process plugins ({', '.join(self.components.in_process)}) do not reach "
                    f"the '{executor.name}' executor's workers; register them from an "
                    "importable module (bootstrap(plugins=['module'])) or search serially"
                )
            from ndplan.adapters.executors.worker import SearchRecipe, SharedAnalyses, run_task

            recipe = SearchRecipe(
                model=ctx.model,
                cluster=ctx.cluster,
                job=ctx.job,
                calibration=ctx.calibration,
                memory_model=opts.memory_model,
                cost_model=opts.cost_model,
                knapsack_solver=opts.knapsack_solver,
                bucket_bytes=opts.bucket_bytes,
                capacity_bytes=ctx.capacity_bytes,
                balance_reserve_bytes=ctx.balance_reserve_bytes,
                reserve_bytes=ctx.reserve_bytes,
                plugins=self.components.plugin_modules,
                disabled=self.components.disabled,
                device_files=self.components.device_files,
                debug=debug,
                strict=ctx.recorder.strict,
                analyses=SharedAnalyses(ctx.cache),
                token=uuid.uuid4().hex,
            )
            task = run_task

        def run(settings: SearchSettings, hooks: SearchHooks | None) -> SearchOutcome:
            return run_search(
                ctx,
                pricing,
                settings,
                rules=rules,
                executor=executor if task else None,
                task=task,
                recipe=recipe,
                hooks=hooks,
            )

        own = own_miss = None
        if baseline:
            if not ctx.model.is_moe and "etp" in baseline and baseline["etp"] == baseline.get("tp"):
                # A dense plan carries its TP as the expert TP; it shards nothing more.
                baseline = {k: v for k, v in baseline.items() if k != "etp"}
            try:
                own_space = SearchSpace(
                    **{**space.model_dump(), **{k: (v,) for k, v in baseline.items()}}
                )
                # Its own search reports nothing: the records and progress are the main one's.
                own = run(SearchSettings(space=own_space, top_k=1, bounding=bounding), None)
            except InfeasibleError as exc:
                own_miss = str(exc)
            except (InvalidInputError, ValueError) as exc:
                raise BaselineError(field_error(exc)) from None
        settings = SearchSettings(
            space=space,
            top_k=top_k,
            bounding=bounding,
            distinct=distinct,
            rank_through_s=own.ranking[0][1].step_s if own is not None else None,
        )
        outcome = run(settings, hooks)
        if not baseline:
            return outcome
        placed = Baseline(stated=dict(baseline), miss=own_miss)
        if own is not None:
            own_cand, own_priced = own.ranking[0]
            rank, grids_ahead = place_in_ranking(outcome.ranking, own_cand, own_priced)
            best = outcome.result.plans[0].time.step_s
            placed = placed.model_copy(
                update={
                    "plan": own.result.plans[0].model_copy(update={"rank": rank}),
                    "rank": rank,
                    "grids_ahead": grids_ahead,
                    "gap": own_priced.step_s / best - 1,
                }
            )
        return replace(outcome, result=outcome.result.model_copy(update={"baseline": placed}))


def exporter_for(components: Components, fmt: str, framework: str, where: str) -> Exporter:
    """The exporter of ``fmt`` for plans priced for ``framework``: a framework's format
    writes only that framework's plans, whose options (ZeRO stages, recompute switches,
    schedules) it is sure to have. ``where`` names the format as the user gave it."""
    registry = components.exporters
    if fmt not in registry:
        known = ", ".join(registry)
        raise InvalidInputError(f"{where}: unknown format; use one of {known}")
    exporter = registry.get(fmt)
    wants = exporter.framework
    if wants is not None and wants != framework:
        raise InvalidInputError(
            f"{where}: the plan is priced for {framework}, whose options {wants} "
            f"may lack; add --framework {wants} (or --export ndplan)"
        )
    return exporter


def render_export(
    exporter: Exporter, plan: Plan, ctx: PricingContext, price: PerLayerPricer
) -> Exported:
    """The exporter's config of ``plan``; a third-party exporter's fault is a plugin error
    naming it (exit 4)."""
    try:
        exported = exporter.render(plan, ctx, price=price)
    except NdplanError:
        raise
    except Exception as exc:
        raise PluginError(
            f"export format '{exporter.name}' failed: {exception_text(exc)}"
        ) from None
    if not isinstance(exported, Exported):
        raise PluginError(
            f"export format '{exporter.name}' returned a {type(exported).__name__}, not Exported"
        )
    return exported


REBALANCE_CONFLICT = (
    "not with {rebalancing} (it re-ranks only the top K, so the baseline's rank and gap "
    "would be against plans no longer listed); balance a layout with `ndplan balance`"
)
"""Why a baseline and rebalancing do not combine; ``{rebalancing}`` names the option."""


def validate_layout(ctx: PricingContext, layout: Layout) -> None:
    model = ctx.model
    heads, kv = model.head_count_for_tp
    experts = None
    for kind in model.kinds:
        if isinstance(kind.ffn, MoEFFN):
            experts = kind.ffn.num_experts
            if kind.ffn.expert_intermediate_size % layout.expert_tp:
                raise InvalidInputError(
                    f"etp({layout.expert_tp}) does not divide the expert FFN width({kind.ffn.expert_intermediate_size})"
                )
    check_layout(
        layout,
        num_devices=ctx.cluster.num_devices,
        global_batch=ctx.job.global_batch_size,
        seq_len=ctx.job.seq_length,
        num_layers=model.num_layers,
        heads=heads,
        kv_heads=kv,
        num_experts=experts,
    )
    fw = ctx.framework
    if layout.zero not in fw.zero_stages:
        raise InvalidInputError(
            f"zero({layout.zero}) is not offered by {fw.name} (offers {', '.join(map(str, fw.zero_stages))})"
        )
    if layout.tp > 1 and layout.sp not in fw.sequence_parallel:
        raise InvalidInputError(fw.sp_not_offered("on" if layout.sp else "off", str(layout.tp)))
    if layout.pp > 1 and layout.zero > fw.max_zero_with_pipeline:
        raise InvalidInputError(
            f"zero({layout.zero}) with pp({layout.pp}): {fw.name} runs pipeline stages with "
            f"ZeRO {fw.max_zero_with_pipeline} at most; lower --zero or use --pp 1"
        )
    if fw.fsdp_with_cp and layout.cp > 1 and layout.zero < 3:
        raise InvalidInputError(
            f"zero({layout.zero}) with cp({layout.cp}): {fw.name} shards the parameters over "
            "the data-parallel and context-parallel ranks (FSDP) whenever cp > 1; use --zero 3 "
            "or --cp 1"
        )
    if layout.sequence_parallel and layout.cp > 1 and not fw.sp_with_cp:
        raise InvalidInputError(
            f"sp with cp({layout.cp}): {fw.name} does not run sequence parallelism beside "
            "context parallelism (Megatron-DeepSpeed's --sequence-parallel and "
            "--ds-sequence-parallel-size cannot be combined); use --no-sp or --cp 1"
        )
    if layout.recompute == "selective" and not fw.selective:
        raise InvalidInputError(selective_not_offered(fw.name))
    if layout.cp > 1 and ctx.settings.cp_kind == "all_to_all":
        ways = layout.tp * layout.cp
        if not heads_split(heads, kv, ways):  # the search refuses these too
            raise InvalidInputError(
                f"all-to-all CP hands each rank whole heads: tp({layout.tp})·cp({layout.cp}) = "
                f"{ways} does not split the {heads} query / {kv} key-value heads; lower cp or "
                "tp, or use cp_kind ring"
            )
    if experts is not None and layout.tp > 1 and not layout.sp and fw.name == "megatron":
        # Megatron-Core's MoE layer asserts sequence parallelism under TP; the search
        # refuses the same layouts (moe_tp_needs_sp).
        raise InvalidInputError(
            f"tp({layout.tp}) with experts needs sequence parallelism in megatron; drop --no-sp"
        )
    if layout.schedule not in fw.schedules:
        raise InvalidInputError(fw.schedule_not_offered(layout.schedule))
    check_precision(ctx)


def check_precision(ctx: PricingContext) -> None:
    """The job's GEMM precision needs the device's tensor cores for it (an A100 has no fp8,
    a Hopper no fp4): a property of the job and the device, whatever the layout."""
    if not ctx.device.supports(ctx.settings.gemm_precision):
        raise InvalidInputError(
            f"precision '{ctx.settings.precision}' needs {ctx.settings.gemm_precision} tensor cores, which "
            f"{ctx.device.id} does not have; use bf16"
        )
    if ctx.settings.precision == "mxfp8" and not ctx.device.supports("fp4"):
        # MX block scaling came with the FP4 tensor cores (Blackwell, CDNA 4); Hopper's
        # fp8 GEMMs take one scale per tensor (fp8) or software block scales (fp8-blockwise).
        raise InvalidInputError(
            f"precision 'mxfp8' needs MX block-scaled tensor cores, which {ctx.device.id} does "
            "not have; use fp8 or fp8-blockwise"
        )
    blackwell = ctx.device.vendor == "nvidia" and ctx.device.supports("fp4")
    if ctx.settings.job.moe_fused_grouped_mlp and not (ctx.settings.is_low_precision and blackwell):
        # Transformer Engine's CuTe DSL grouped MLP is built for NVIDIA Blackwell (sm100,
        # the first with fp4 tensor cores) and runs quantised experts only.
        raise InvalidInputError(
            "moe_fused_grouped_mlp (Transformer Engine's CuTe DSL kernel) needs a Blackwell "
            f"device and an fp8, MXFP8 or fp4 recipe, not {ctx.device.id} in "
            f"{ctx.settings.precision}; drop --moe-fused-grouped-mlp"
        )
