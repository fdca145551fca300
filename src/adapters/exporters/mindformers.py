"""A MindFormers (HyperParallel) YAML for a plan: ``parallel_config``, the per-stage
layer offsets and recompute lists. The rest of the model config stays the user's."""

from __future__ import annotations

import yaml

from ndplan.core.context import PricingContext
from ndplan.core.plan import Plan
from ndplan.core.ports import Exported, PerLayerPricer, StandIn
from ndplan.core.recompute import FULL, NONE, option_name
from ndplan.core.units import GiB

from .common import Chunk, chunks, options_used, per_layer, summary_lines, switches


class _Dumper(yaml.SafeDumper):
    """Mappings in block style, lists of numbers in flow style (``[0, 1, 0]``), as
    MindFormers' own configs write them."""


def _list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flat = not any(isinstance(item, list) for item in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flat)


_Dumper.add_representer(list, _list)


def per_stage(values: list[int], pp: int, vpp: int) -> list[int] | list[list[int]]:
    """Chunk-ordered values as MindFormers lists them: one per stage, or with an
    interleaved pipeline one list per virtual stage (``[vpp][pp]``)."""
    if vpp == 1:
        return values
    return [values[v * pp : (v + 1) * pp] for v in range(vpp)]


class MindFormersExporter:
    """``--export mindformers``: MindFormers' parallel and recompute settings as YAML."""

    name = "mindformers"
    suffix = ".yaml"
    framework = "mindformers"

    def render(
        self, plan: Plan, ctx: PricingContext, price: PerLayerPricer | None = None
    ) -> Exported:
        lay, job = plan.layout, ctx.settings
        caveats: list[str] = []
        parts = chunks(plan, ctx)
        parallel_config: dict[str, object] = {
            "data_parallel": lay.dp,
            "model_parallel": lay.tp,
            "pipeline_stage": lay.pp,
            "context_parallel": lay.cp,
            "use_seq_parallel": lay.sequence_parallel,
            # Micro-batches per step: the pipeline's, or accumulated without one.
            "micro_batch_num": lay.num_microbatches,
        }
        if ctx.model.is_moe:
            parallel_config["expert_parallel"] = lay.ep
            if lay.expert_tp != lay.tp:
                split = (
                    "keeps each expert whole"
                    if lay.expert_tp == 1
                    else f"splits each expert over {lay.expert_tp} ranks"
                )
                caveats.append(
                    f"mindformers: the plan {split} (expert TP {lay.expert_tp}), not over "
                    f"model_parallel's {lay.tp}; no setting is written for it: set your "
                    "release's expert tensor parallelism to match"
                )
        counts = [len(c.options) for c in parts]
        base = len(ctx.model.layers) // len(parts)
        model_config: dict[str, object] = {
            "num_layers": len(ctx.model.layers),
            "seq_length": ctx.job.seq_length,
            "offset": per_stage([n - base for n in counts], lay.pp, lay.vpp),
        }
        if lay.vpp > 1:
            model_config["pp_interleave_num"] = lay.vpp
        runner: dict[str, object] = {"batch_size": lay.mbs}
        if lay.pp == 1:
            runner["gradient_accumulation_steps"] = lay.num_microbatches
        recompute, inexact, written = self.recompute(parts, ctx, lay.pp, lay.vpp, price)
        caveats += inexact
        config: dict[str, object] = {
            "parallel_config": parallel_config,
            "parallel": {
                "enable_parallel_optimizer": lay.zero >= 1,
                "pipeline_config": {
                    "pipeline_interleave": lay.vpp > 1,
                    "pipeline_scheduler": "1f1b",
                },
            },
            "runner_config": runner,
            "model": {"model_config": model_config},
            "recompute_config": recompute,
        }
        if lay.cp > 1:
            kind = "all-to-all (Ulysses)" if job.cp_kind == "all_to_all" else "ring"
            caveats.append(
                f"mindformers: the plan's context parallelism is {kind}; set "
                "context_parallel_algo to the matching algorithm of your release"
            )
        if lay.offload_optimizer:
            caveats.append(
                "mindformers: the plan keeps the optimizer state in host memory; "
                "enable your release's optimizer offload"
            )
        if job.precision not in ("bf16", "fp16"):
            caveats.append(
                f"mindformers: no {job.precision} settings are written; set the numerics yourself"
            )
        head = [f"# {line}" for line in summary_lines(plan, ctx, "MindFormers settings", written)]
        head += [f"# caveat: {c}" for c in caveats]
        body = yaml.dump(config, Dumper=_Dumper, sort_keys=False, width=4096)
        # No stand_in in Exported: the report's stand-in line says "the fastest setting it
        # states that fits", which MindFormers' default selection is not; the header
        # prices it and a caveat says when it does not fit.
        return Exported(text="\n".join(head) + "\n" + body, caveats=tuple(caveats))

    @staticmethod
    def recompute(
        parts: tuple[Chunk, ...],
        ctx: PricingContext,
        pp: int,
        vpp: int,
        price: PerLayerPricer | None = None,
    ) -> tuple[dict[str, object], list[str], StandIn | None]:
        """``recompute`` (whole layers) and ``select_recompute`` (layers recomputing ops)
        as counts per stage: MindFormers recomputes the first layers of each stage, and
        the plan's counts are what its memory and time were priced on. Where the plan's
        ops are not MindFormers' default selection, the file runs that selection on those
        layers: the setting written (``StandIn``), priced when ``price`` is given."""
        full = [c.count(FULL) for c in parts]
        selected = [len(c.options) - c.count(NONE, FULL) for c in parts]
        ops = frozenset().union(*(switches(o) for o in options_used(parts)))
        selective = ctx.framework.selective
        caveats = []
        written = None
        if ops and ops != selective:
            caveats.append(
                f"mindformers: select_recompute counts the layers that recompute "
                f"{'+'.join(sorted(ops))} in the plan; MindFormers recomputes its default "
                f"selection ({'+'.join(sorted(selective))}) there unless you name those ops"
            )
            default = option_name(frozenset(selective))

            def runs(c: Chunk, i: int) -> str:
                whole = c.count(FULL)
                return (
                    FULL if i < whole else default if i < len(c.options) - c.count(NONE) else NONE
                )

            options = per_layer(parts, runs)
            description = f"{'+'.join(sorted(selective))} on the select_recompute layers"
            written = StandIn(description, price(options) if price is not None else None)
            if written.plan is not None and not written.plan.memory.fits:
                peak = written.plan.memory.peak_bytes / GiB
                caveats.append(
                    f"mindformers: as written (its default selection) the plan does not fit: "
                    f"peak {peak:.1f} GiB on stage {written.plan.memory.peak_stage}; name the "
                    f"plan's ops ({'+'.join(sorted(ops))}) in select_recompute"
                )
        return (
            {
                "recompute": per_stage(full, pp, vpp),
                "select_recompute": per_stage(selected, pp, vpp),
            },
            caveats,
            written,
        )
