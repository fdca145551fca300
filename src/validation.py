"""Predicted against measured: pricing published runs, error statistics, calibration fits.

The fixed split of spec/validation.md: parameters are fitted on the rows with an
even ``row_id`` and the error is reported on the odd ones, so nobody chooses the
test rows. Rows whose source contradicts itself (``CHECK:``) stay out of fits
and are reported apart.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ndplan.adapters.measured import RunCase
from ndplan.core.calibration import Calibration, Overlap, median_error_key
from ndplan.core.cluster import Cluster
from ndplan.core.context import PricingContext
from ndplan.core.errors import NdplanError
from ndplan.core.fitting import (
    ErrorStats,
    Parameter,
    Prior,
    coordinate_search,
    prior_penalty,
    spearman,
)
from ndplan.core.layout import Layout
from ndplan.core.pricing import PricedLayout
from ndplan.core.search import divisors
from ndplan.planner import Planner, PricingOptions, validate_layout

FAMILIES = {
    "a100-40gb": "ampere",
    "a100-80gb": "ampere",
    "h100-sxm": "hopper",
    "h100-pcie": "hopper",
    "h100-96gb": "hopper",
    "h200": "hopper",
    "h800": "hopper",
    "b200": "blackwell",
    "gb200": "blackwell",
    "b300": "blackwell-ultra",
    "gb300": "blackwell-ultra",
}
"""Device id → generation: parts of one generation share a fit."""


@dataclass
class RowResult:
    row_id: int
    source: str
    model: str
    family: str
    hardware: str
    num_devices: int
    tokens_per_step: int
    layout: str
    moe: bool
    check: bool
    measured_s: float
    predicted_s: float
    fits: bool
    predicted_peak_gib: float
    measured_peak_gib: float | None
    step_from: str
    assumed: list[str] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    release: str = ""
    precision: str = ""
    tp: int = 1
    pipeline: str = "none"
    """How the row pipelines: ``none`` (pp 1) or its schedule."""

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1

    @property
    def memory_error(self) -> float | None:
        if self.measured_peak_gib is None:
            return None
        return self.predicted_peak_gib / self.measured_peak_gib - 1

    @property
    def split(self) -> str:
        return "fit" if self.row_id % 2 == 0 else "test"


def price_case(planner: Planner, case: RunCase, calibration: Calibration) -> RowResult:
    """Price one measured row as it ran. An unstated micro-batch size is not guessed at 1:
    a published run was tuned, so every size the batch allows is priced and the fastest
    that fits stands for the row, as the search would choose it (the default stands when
    none fits). An unstated interleaving depth stays at its default: the time model
    rewards deep interleaving more than the runs show (see ``unstated_mbs_variants``)."""
    ctx = PricingContext(
        model=case.model,
        cluster=Cluster(device=case.device, num_devices=case.num_devices),
        job=case.job,
        calibration=calibration,
    )
    pricer = planner.pricer(ctx, PricingOptions())

    def price(layout: Layout) -> PricedLayout:
        if case.whole_layer_every is not None:
            return pricer.price_layer_checkpointing(layout, case.whole_layer_every)
        return pricer.price(layout)

    layout, priced = case.layout, price(case.layout)
    assert priced.time is not None
    for other in unstated_mbs_variants(case):
        try:
            validate_layout(ctx, other)
        except NdplanError:
            continue
        candidate = price(other)
        assert candidate.time is not None
        if candidate.fits and (not priced.fits or candidate.time.step_s < priced.time.step_s):
            layout, priced = other, candidate
    how = "the fastest that fits" if priced.fits else "no size fits"
    assumed = [f"mbs={layout.mbs} (unstated: {how})" if a == "mbs=1" else a for a in case.assumed]
    return RowResult(
        row_id=case.row_id,
        source=case.source,
        model=case.model_label,
        family=case.family,
        hardware=case.hardware,
        num_devices=case.num_devices,
        tokens_per_step=case.job.global_batch_size * case.job.seq_length,
        layout=layout.label,
        moe=case.moe,
        check=case.check,
        measured_s=case.measured_step_s,
        predicted_s=priced.time.step_s,
        fits=priced.fits,
        predicted_peak_gib=priced.peak_bytes / 2**30,
        measured_peak_gib=case.measured_peak_gib,
        step_from=case.step_from,
        assumed=assumed,
        parts=dict(priced.time.parts),
        release=case.release,
        precision=case.job.precision,
        tp=layout.tp,
        pipeline="none" if layout.pp == 1 else layout.schedule,
    )


def unstated_mbs_variants(case: RunCase) -> list[Layout]:
    """The row's layout at every other micro-batch size that divides its per-replica batch,
    when the source does not state one (the checks of ``validate_layout`` still apply).

    The interleaving depth is not varied with it. With it free, the time model's fastest
    depth for the Megatron-LM README rows is 1–3 layers per chunk (vpp 15 for GPT-70B at
    pp 2, where the bubble it saves and the fill-and-drain sends it adds balance; one
    layer for GPT-314B and GPT-462B), and those rows price 5–10 % faster than measured:
    the model rewards deep interleaving more than these runs show, so an unstated depth
    stays at 1."""
    lay = case.layout
    if "mbs" not in case.unstated:
        return []
    per_replica = case.job.global_batch_size // lay.dp
    return [
        lay.model_copy(update={"mbs": mbs, "num_microbatches": per_replica // mbs})
        for mbs in divisors(per_replica)
        if mbs != lay.mbs
    ]


def compare(
    planner: Planner,
    cases: Sequence[RunCase],
    calibration: Calibration,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[RowResult]:
    """Every case priced (``progress`` hears ``("compare", done, total)`` after each)."""
    out = []
    for done, case in enumerate(cases, start=1):
        with contextlib.suppress(NdplanError):  # the row's own error; the others go on
            out.append(price_case(planner, case, calibration))
        if progress is not None:
            progress("compare", done, len(cases))
    return out


@dataclass(frozen=True)
class GroupStats:
    group: str
    key: str
    stats: ErrorStats


def group_stats(
    results: Sequence[RowResult],
    key: Callable[[RowResult], str],
    name: str,
    order: Callable[[RowResult], Any] | None = None,
) -> list[GroupStats]:
    """The error statistics of each group of rows, in the order of ``order`` (a row's sort
    key; the groups' names when None)."""
    groups: dict[str, list[float]] = defaultdict(list)
    rank: dict[str, Any] = {}
    for r in results:
        group = key(r)
        groups[group].append(r.error)
        if order is not None:
            rank.setdefault(group, order(r))
    names = sorted(groups, key=rank.__getitem__) if order is not None else sorted(groups)
    return [GroupStats(name, g, ErrorStats.of(groups[g])) for g in names]


def ranking_groups(results: Sequence[RowResult]) -> list[dict]:
    """Groups of rows with the same model, hardware and device count that measured at
    least two different layouts: the Spearman correlation of predicted and measured
    throughput (tokens/s, so rows with other batches compare fairly; NaN when one side
    ties throughout), whether the measured best is in the predicted top 3, and how many
    software releases the rows span (the same layout's throughput moves between releases,
    which no layout model predicts)."""
    groups: dict[tuple, list[RowResult]] = defaultdict(list)
    for r in results:
        groups[(r.model, r.hardware, r.num_devices)].append(r)
    out = []
    for key, rows in sorted(groups.items()):
        layouts = {r.layout for r in rows}
        if len(rows) < 3 or len(layouts) < 2:
            continue
        measured = [r.tokens_per_step / r.measured_s for r in rows]
        predicted = [r.tokens_per_step / r.predicted_s for r in rows]
        best = max(range(len(rows)), key=lambda i: measured[i])
        top3 = sorted(range(len(rows)), key=lambda i: -predicted[i])[:3]
        out.append(
            {
                "group": " · ".join(str(k) for k in key),
                "rows": len(rows),
                "layouts": len(layouts),
                "spearman": spearman(predicted, measured),
                "measured_best_in_top3": best in top3,
                "releases": len({r.release for r in rows}),
            }
        )
    return out


# ----------------------------------------------------------------------------- fitting


DEVICE_FIELDS = ("gemm", "gemm_low_precision", "attention")
LOW_PRECISION_RATIO = "low_precision_ratio"
"""Fitted in place of ``gemm_low_precision``: its share of the fp8 peak over bf16's share
of the bf16 peak. An fp8 GEMM runs the same tiles with half the operand bytes plus
scaling and casts, so it reaches no larger a share of its peak than bf16 does (cuBLAS
on H100 and B200 measures 0.9–1.0). Bounding the ratio keeps a generation whose bf16
rows are all MoE from pushing its bf16 GEMMs (the LM head of every fp8 run) below
its fp8 ones."""
FITTED_DEVICE_FIELDS = ("gemm", LOW_PRECISION_RATIO, "attention")
"""The per-generation parameters the fit moves; ``DEVICE_FIELDS`` follow from them."""
FP4_FIELD = "gemm_fp4"
"""Fitted only for the generations that have fp4 rows (elsewhere nothing constrains it)."""
GROUPED_BF16_FIELD = "grouped_gemm_bf16"
"""Fitted only for the generations that have bf16 MoE rows (elsewhere nothing constrains it)."""
MXFP8_FIELD = "gemm_mxfp8"
"""Fitted only for the generations that have MXFP8 rows."""
OPTIONAL_FIELDS = (FP4_FIELD, GROUPED_BF16_FIELD, MXFP8_FIELD)
SHARED_FIELDS = (
    ("hbm", 0.4, 0.95),
    ("scale_up_bus", 0.3, 0.95),
    ("scale_out_bus", 0.3, 0.95),
    ("gemm_half_gflop", 0.0, 40.0),
    ("grouped_gemm_half_gflop", 0.0, 40.0),
    ("grouped_gemm_saturation_tokens", 256.0, 65536.0),
    ("grouped_gemm_low_precision_ratio", 0.3, 1.0),
    ("kernel_launch_us", 0.0, 40.0),
    ("moe_layer_overhead_us", 0.0, 3000.0),
)
OVERLAP_FIELDS = {"megatron": ("tp", "ep", "dp", "cp", "fsdp"), "torchtitan": ("fsdp", "tp", "cp")}
ATTENTION_SCALED = ("megatron",)
"""Frameworks whose attention kernel gets its own factor (the others keep the device's fit)."""
BOUNDS = {
    "gemm": (0.3, 0.95),
    LOW_PRECISION_RATIO: (0.5, 1.0),
    "attention": (0.15, 0.95),
    FP4_FIELD: (0.15, 0.95),
    GROUPED_BF16_FIELD: (0.15, 0.95),
    MXFP8_FIELD: (0.15, 0.95),
}

PRIORS: dict[str, Prior] = {
    # Per generation. Large bf16 GEMMs reach 0.7-0.8 of the dense peak in cuBLAS;
    # training shapes and the epilogues around them a little less.
    "gemm": Prior(0.70, 0.15),
    # fp8 runs the same tiles (cuBLAS 0.9-1.0 of bf16's share); the recipe's casts and
    # scaling take some of it back.
    LOW_PRECISION_RATIO: Prior(0.85, 0.15),
    # Flash-attention forward and backward: FA2-class kernels 0.35-0.7 of the bf16 peak
    # (Hopper low, Ampere high), FA3/cuDNN-class up to 0.75 on Hopper. Broad.
    "attention": Prior(0.45, 0.20),
    FP4_FIELD: Prior(0.40, 0.20),
    GROUPED_BF16_FIELD: Prior(0.50, 0.20),
    MXFP8_FIELD: Prior(0.50, 0.20),
    # Shared. Streaming kernels reach 0.7-0.9 of HBM bandwidth; NCCL's bus bandwidth
    # 0.7-0.9 of the link rate.
    "hbm": Prior(0.75, 0.10),
    "scale_up_bus": Prior(0.75, 0.15),
    "scale_out_bus": Prior(0.80, 0.15),
    # cuBLAS bf16 on H100: a 1024³ GEMM (2 GFLOP) runs at about a third of the large-GEMM
    # rate, a 2048³ one (17 GFLOP) at about three quarters: a knee of 5-7 GFLOP. Grouped
    # expert GEMMs are thinner and carry routing and permutation around them.
    "gemm_half_gflop": Prior(5.0, 4.0),
    "grouped_gemm_half_gflop": Prior(15.0, 15.0),
    # An expert's grouped GEMM fills the device's 132-160 SMs with 128-row tiles once it
    # holds some thousands of tokens (a thin expert has few column tiles, and its group
    # runs several experts at once). Broad: the rows place it.
    "grouped_gemm_saturation_tokens": Prior(8192.0, 32768.0),
    # Grouped expert GEMMs against one large GEMM at the same recipe: grouped-GEMM
    # kernels reach roughly 0.6-0.9 of the dense rate on thin per-expert shapes.
    "grouped_gemm_low_precision_ratio": Prior(0.75, 0.2),
    # A launch costs ~4 µs of CPU, on the critical path only when the GPU starves.
    "kernel_launch_us": Prior(4.0, 4.0),
    # A device-to-host sync of the per-expert token counts plus the router's and the
    # permutation's small kernels: 100-300 µs a layer.
    "moe_layer_overhead_us": Prior(200.0, 200.0),
    # Overlaps: broad where the frameworks' options vary from run to run (EP, torchtitan's
    # async TP); near the design where the mechanism is on in the runs it prices
    # (gradient reduction under backward, ring attention's K/V exchange, FSDP2's
    # prefetched all-gathers, and Megatron's TP overlap, which its performance recipes
    # turn on: Transformer Engine splits each all-gather and reduce-scatter into chunks
    # pipelined with the GEMM).
    "overlap.megatron.tp": Prior(0.7, 0.3),
    "overlap.megatron.ep": Prior(0.5, 0.4),
    "overlap.megatron.dp": Prior(0.9, 0.2),
    "overlap.megatron.cp": Prior(0.9, 0.2),
    "overlap.megatron.fsdp": Prior(0.7, 0.3),
    "overlap.torchtitan.fsdp": Prior(0.8, 0.2),
    "overlap.torchtitan.tp": Prior(0.3, 0.4),
    "overlap.torchtitan.cp": Prior(0.9, 0.2),
    # Megatron runs Transformer Engine's cuDNN attention, the others FA2-class kernels
    # (PyTorch SDPA): the FlashAttention-3 paper measures 1.5-2x between them on H100.
    "attention_scale.megatron": Prior(1.5, 0.4),
    "step_overhead_s": Prior(0.05, 0.10),
    # Collectives take SMs and HBM bandwidth from the GEMMs they hide behind: NCCL's
    # kernels hold 8-32 of ~132 SMs, copy-engine transfers (TE's ring exchange) none.
    # TP's overlap (userbuffers) mixes the two, so it gets its own share, with the same
    # prior: the rows, not the prior, say whether it differs.
    "interference": Prior(0.10, 0.10),
    "tp_interference": Prior(0.10, 0.10),
}
"""What each fitted parameter should be before the measured rows are seen, and how sure
that is (kernel benchmarks and datasheets, not the rows). Keyed by the field name for
per-generation and shared fields, by the parameter's full name otherwise."""

PRIOR_ERROR_SCALE = 0.1
"""The spread of log(predicted/measured) a row carries (run-to-run variation and what
the model leaves out; the fitted train RMS is 0.1-0.12). It sets how far the rows may
pull a parameter from its prior: the fit minimises the weighted mean loss plus
``PRIOR_ERROR_SCALE² / Σ weights × Σ z²``, which is the negative log posterior with
the loss read as a Gaussian log-likelihood of that spread, a source of n rows counting
as √n observations."""


def prior_for(name: str) -> Prior:
    """The prior of a fitted parameter by its name in ``CalibrationSpace.params``."""
    head, _, tail = name.partition(".")
    if head in ("overlap", "attention_scale", "step_overhead_s", "interference", "tp_interference"):
        return PRIORS[name]
    return PRIORS[tail]


class CalibrationSpace:
    """The fitted parameters as a vector, and back: per device generation the GEMM and
    attention efficiencies (and the fp4, MXFP8 and bf16 routed-expert GEMM efficiencies
    where rows constrain them); shared HBM and link efficiencies, the small-GEMM knee and the
    per-kernel gap; per framework the overlap fractions; the per-step overhead.

    ``fp4_families`` / ``grouped_bf16_families`` / ``mxfp8_families``: the generations
    whose fp4 GEMM / bf16 routed-expert GEMM / MXFP8 GEMM efficiency is fitted; by
    default those the base calibration already gives one."""

    def __init__(
        self,
        base: Calibration,
        families: Iterable[str],
        fp4_families: Iterable[str] | None = None,
        grouped_bf16_families: Iterable[str] | None = None,
        mxfp8_families: Iterable[str] | None = None,
    ) -> None:
        self.base = base
        self.families = sorted(set(families))
        given = {
            FP4_FIELD: fp4_families,
            GROUPED_BF16_FIELD: grouped_bf16_families,
            MXFP8_FIELD: mxfp8_families,
        }
        self.optional: dict[str, list[str]] = {}
        for name, fams in given.items():
            if fams is None:
                fams = [f for f, eff in base.devices.items() if getattr(eff, name) is not None]
            self.optional[name] = sorted(set(fams) & set(self.families))
        params: list[Parameter] = []
        for fam in self.families:
            for f in FITTED_DEVICE_FIELDS:
                params.append(Parameter(f"{fam}.{f}", *BOUNDS[f]))
            for name in OPTIONAL_FIELDS:
                if fam in self.optional[name]:
                    params.append(Parameter(f"{fam}.{name}", *BOUNDS[name]))
        for f, lo, hi in SHARED_FIELDS:
            params.append(Parameter(f"shared.{f}", lo, hi))
        for fw, fields in OVERLAP_FIELDS.items():
            for f in fields:
                params.append(Parameter(f"overlap.{fw}.{f}", 0.0, 1.0))
        for fw in ATTENTION_SCALED:
            params.append(Parameter(f"attention_scale.{fw}", 0.5, 2.0))
        params.append(Parameter("step_overhead_s", 0.0, 0.5))
        params.append(Parameter("interference", 0.0, 0.5))
        params.append(Parameter("tp_interference", 0.0, 0.5))
        self.params = [Parameter(p.name, p.low, p.high, prior_for(p.name)) for p in params]

    def start(self) -> np.ndarray:
        values = []
        for p in self.params:
            head, _, tail = p.name.partition(".")
            if head == "shared":
                values.append(getattr(self.base.default, tail))
            elif head == "overlap":
                fw, f = tail.split(".")
                values.append(getattr(self.base.overlap_for(fw), f))
            elif head == "step_overhead_s":
                values.append(self.base.step_overhead_s)
            elif head == "interference":
                values.append(self.base.interference)
            elif head == "tp_interference":
                values.append(self.base.tp_slowdown)
            elif head == "attention_scale":
                values.append(self.base.attention_scale.get(tail, 1.0))
            else:
                eff = self.base.devices.get(head, self.base.default)
                if tail == LOW_PRECISION_RATIO:
                    lo, hi = BOUNDS[LOW_PRECISION_RATIO]
                    values.append(min(hi, max(lo, eff.gemm_low_precision / eff.gemm)))
                    continue
                value = getattr(eff, tail)
                if value is None:  # not fitted yet: start where the figure it replaces is
                    value = eff.gemm if tail == GROUPED_BF16_FIELD else eff.gemm_low_precision
                values.append(value)
        return np.asarray(values, dtype=float)

    def calibration(self, x: np.ndarray, **fit: float) -> Calibration:
        values = dict(zip((p.name for p in self.params), (float(v) for v in x), strict=True))
        for fam in self.families:
            ratio = values[f"{fam}.{LOW_PRECISION_RATIO}"]
            values[f"{fam}.gemm_low_precision"] = ratio * values[f"{fam}.gemm"]
        shared = {f: values[f"shared.{f}"] for f, _, _ in SHARED_FIELDS}
        # A device type no measured row covers (MI300X, Ascend, ...) gets the mean of the
        # fitted generations, not an unfitted guess.
        mean = {
            f: sum(values[f"{fam}.{f}"] for fam in self.families) / len(self.families)
            for f in DEVICE_FIELDS
        }
        for name, fams in self.optional.items():
            if fams:
                mean[name] = sum(values[f"{fam}.{name}"] for fam in fams) / len(fams)
        default = self.base.default.model_copy(update={**shared, **mean})
        devices = dict(self.base.devices)
        for fam in self.families:
            update = {**shared, **{f: values[f"{fam}.{f}"] for f in DEVICE_FIELDS}}
            # A generation without rows for an optional figure keeps none (it falls back
            # to the figure it refines).
            for name, fams in self.optional.items():
                update[name] = values[f"{fam}.{name}"] if fam in fams else None
            devices[fam] = devices.get(fam, default).model_copy(update=update)
        overlap = dict(self.base.overlap)
        for fw, fields in OVERLAP_FIELDS.items():
            current = overlap.get(fw) or self.base.overlap_for(fw)
            overlap[fw] = Overlap(
                **{**current.model_dump(), **{f: values[f"overlap.{fw}.{f}"] for f in fields}}
            )
        families = {
            **self.base.families,
            **{d: f for d, f in FAMILIES.items() if f in self.families},
        }
        return self.base.model_copy(
            update={
                "default": default,
                "devices": devices,
                "overlap": overlap,
                "families": families,
                "step_overhead_s": values["step_overhead_s"],
                "interference": values["interference"],
                "tp_interference": values["tp_interference"],
                "fit": fit,
                "attention_scale": {
                    **self.base.attention_scale,
                    **{fw: values[f"attention_scale.{fw}"] for fw in ATTENTION_SCALED},
                },
            }
        )


MOE_ONLY_PARAMETERS = (
    "shared.grouped_gemm_half_gflop",
    "shared.grouped_gemm_saturation_tokens",
    "shared.grouped_gemm_low_precision_ratio",
    "shared.moe_layer_overhead_us",
    "overlap.megatron.ep",
)
"""Shared parameters only MoE layers read (with each generation's bf16 routed-expert GEMM
efficiency): the second stage of the fit."""


def moe_only(name: str) -> bool:
    return name in MOE_ONLY_PARAMETERS or name.endswith(f".{GROUPED_BF16_FIELD}")


def fit_calibration(
    planner: Planner,
    cases: Sequence[RunCase],
    base: Calibration | None = None,
    *,
    sweeps: int = 16,
    tolerance: float = 0.002,
    source: str = "ndplan compare --fit",
    progress: Callable[[int], None] | None = None,
    on_sweep: Callable[[int, float], None] | None = None,
) -> tuple[Calibration, list[RowResult]]:
    """Fit the calibration on ``cases`` (CHECK rows excluded), minimising a robust
    loss of log(predicted/measured) with each source weighted by 1/√rows, plus the
    parameters' priors (``PRIORS``, ``PRIOR_ERROR_SCALE``). Runs until a sweep lowers
    that by no more than ``tolerance`` of it (at most ``sweeps``): the priors, not an
    early stop, keep the parameters the rows barely constrain physical.

    In two stages when there are dense and MoE rows: the dense rows fit every parameter
    a dense layer reads (GEMM, attention, HBM and link efficiencies, overlaps,
    overheads); the MoE rows then fit only what MoE layers alone read (``moe_only``),
    the first stage's figures held. The same kernels run a MoE layer's attention and
    shared GEMMs, and the MoE rows' residual — expert dispatch paths that vary release to
    release — would otherwise pull those kernels' efficiencies off what the dense rows
    measure (fitting every row at once moved Blackwell's GEMM efficiency from 0.60 to
    0.55 and the scale-up bus from 0.71 to 0.64)."""
    base = base or Calibration()
    usable = [c for c in cases if not c.check]

    def family(c: RunCase) -> str:
        return FAMILIES.get(c.device.id, c.device.id)

    fp4 = {family(c) for c in usable if c.job.precision == "fp4"}
    bf16_moe = {family(c) for c in usable if c.moe and c.job.precision in ("bf16", "fp16")}
    mxfp8 = {family(c) for c in usable if c.job.precision == "mxfp8"}
    space = CalibrationSpace(base, {family(c) for c in usable}, fp4, bf16_moe, mxfp8)
    calls = 0

    def source_weights(rows: Sequence[RunCase]) -> np.ndarray:
        per_source: dict[str, int] = defaultdict(int)
        for c in rows:
            per_source[c.source] += 1
        return np.array([1 / math.sqrt(per_source[c.source]) for c in rows])

    def weighted_loss(results: list[RowResult], weights: np.ndarray) -> float:
        if len(results) != len(weights):
            return math.inf
        errors = np.array([math.log(r.predicted_s / r.measured_s) for r in results])
        delta = 0.25
        loss = np.where(np.abs(errors) <= delta, errors**2, delta * (2 * np.abs(errors) - delta))
        return float((weights * loss).sum() / weights.sum())

    dense = [c for c in usable if not c.moe]
    moe = [c for c in usable if c.moe]
    everything = list(range(len(space.params)))
    if dense and moe:
        stages = [
            (dense, [i for i in everything if not moe_only(space.params[i].name)]),
            (moe, [i for i in everything if moe_only(space.params[i].name)]),
        ]
    else:
        stages = [(usable, everything)]
    x = space.start()
    sweeps_done = 0
    for rows, free in stages:
        weights = source_weights(rows)
        prior_strength = PRIOR_ERROR_SCALE**2 / weights.sum()
        free_params = [space.params[i] for i in free]

        def objective(
            y: np.ndarray, rows=rows, free=free, weights=weights, ps=prior_strength, fp=free_params
        ) -> float:
            nonlocal calls
            calls += 1
            if progress is not None:
                progress(calls)
            trial = x.copy()
            trial[free] = y
            results = compare(planner, rows, space.calibration(trial))
            return weighted_loss(results, weights) + ps * prior_penalty(y, fp)

        def heard(n: int, value: float, offset: int = sweeps_done) -> None:
            nonlocal sweeps_done
            sweeps_done = offset + n  # sweeps number on across the stages
            if on_sweep is not None:
                on_sweep(sweeps_done, value)

        y, _ = coordinate_search(
            objective, x[free], free_params, sweeps=sweeps, tolerance=tolerance, on_sweep=heard
        )
        x[free] = y
    weights = source_weights(usable)
    results = compare(planner, usable, space.calibration(x))
    stats = ErrorStats.of([r.error for r in results])
    # Per model class too: MoE rows err about twice as much as dense ones, and a search's
    # near-tie note quotes the error of the class it plans.
    by_class = {
        g.key: g.stats.median
        for g in group_stats(results, lambda r: median_error_key(r.moe), "model class")
    }
    loss = weighted_loss(results, weights)
    penalty = prior_penalty(x, space.params)
    fitted = space.calibration(
        x,
        rows=float(len(usable)),
        loss=loss,
        prior_penalty=penalty,
        objective=loss + PRIOR_ERROR_SCALE**2 / weights.sum() * penalty,
        median_abs_error=stats.median,
        **by_class,
        mape=stats.mape,
        evaluations=float(calls),
    )
    return fitted.model_copy(update={"source": source}), results
