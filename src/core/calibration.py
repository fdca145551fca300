"""Fitted efficiency, overlap and reserve parameters (data, not code).

Every parameter means something physical: the fraction of peak a large GEMM
reaches, the fraction of a link's bandwidth a collective achieves, the share of a
communication the framework hides under compute, the memory a runtime holds
back. The shipped values are fitted on the even-``row_id`` measured runs; users
fit their own with ``ndplan compare --fit`` and load them with ``--calibration``.
"""

from __future__ import annotations

from pydantic import Field

from .base import Frozen
from .cluster import DeviceSpec


class DeviceEfficiency(Frozen):
    """How close one device type gets to its datasheet rates."""

    gemm: float = Field(default=0.70, gt=0, le=1)
    """Fraction of the dense bf16 peak that large GEMMs reach."""
    gemm_low_precision: float = Field(default=0.55, gt=0, le=1)
    """Fraction of the fp8/fp4 peak that large low-precision GEMMs reach (scaling and casts)."""
    gemm_fp4: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the fp4 peak that large fp4 GEMMs reach; ``gemm_low_precision`` when
    None. FP4 carries more around its GEMMs than FP8 — per-16-element block scales and
    the recipe's Hadamard transforms and stochastic rounding — so it reaches less of a
    peak that is two to three times FP8's."""
    gemm_mxfp8: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the fp8 peak that MXFP8 GEMMs reach; ``gemm_low_precision`` (the
    per-tensor-scaled FP8 recipes) when None. Each 32-element block carries its own
    scale, which the kernel loads and applies, and the scales run along one direction,
    so a tensor is quantised twice (row- and column-wise). The measured pairs show the
    cost: the same layout on the same Blackwell system runs 2-12 % slower in MXFP8 than
    in per-tensor FP8 (e.g. rows 64 and 65, 66 and 67 of the measured runs)."""
    grouped_gemm_bf16: float | None = Field(default=None, gt=0, le=1)
    """Fraction of the bf16 peak the routed experts' grouped GEMMs reach; ``gemm`` when
    None. Blackwell's MoE recipes run low-precision experts through fused grouped-MLP
    kernels, while bf16 experts take the generic grouped-GEMM path, which reaches less
    (gpt-oss on GB300 steps 1.7× slower in bf16 than in MXFP8: rows 138 and 44 of the
    measured runs). Kept apart so that dense bf16 GEMMs (every LM head) keep theirs."""
    grouped_gemm_low_precision_ratio: float = Field(default=1.0, gt=0, le=1)
    """Share of the dense GEMM's fraction (at the same fp8, MXFP8 or fp4 recipe) that the
    routed experts' low-precision grouped GEMMs reach: one kernel over many thin expert
    GEMMs, with per-expert scales, does not run at a single large GEMM's rate. Shared
    by the generations; only MoE rows constrain it."""
    gemm_half_gflop: float = Field(default=1.0, ge=0)
    """GEMM size (GFLOP per call) at which efficiency falls to half: small GEMMs (big TP,
    thin experts, small micro-batches) cannot fill the device."""
    grouped_gemm_half_gflop: float = Field(default=4.0, ge=0)
    """The same knee for the grouped GEMMs of routed experts (one small GEMM per expert,
    plus the routing and permutation around them)."""
    grouped_gemm_saturation_tokens: float = Field(default=65536.0, gt=0)
    """Tokens per expert past which a routed expert's GEMM gains no more rate: its tiles
    already fill the device, so more tokens add tiles at the rate its weight's shape
    (k × n) allows, and the grouped knee sees at most this many tokens. The default is
    past every expert's tokens in the measured runs: no cap."""
    attention: float = Field(default=0.45, gt=0, le=1)
    """Fraction of the bf16 peak the flash-attention kernels reach on long sequences
    (forward and backward); a call over L keys reaches ``L / (L + 460)`` of it
    (``performance.ATTENTION_HALF_KEYS``)."""
    hbm: float = Field(default=0.75, gt=0, le=1)
    """Fraction of HBM bandwidth that memory-bound kernels (norms, activations, optimizer) reach."""
    scale_up_bus: float = Field(default=0.75, gt=0, le=1)
    """Achieved bus-bandwidth fraction of collectives over the scale-up fabric."""
    scale_out_bus: float = Field(default=0.80, gt=0, le=1)
    """Achieved bus-bandwidth fraction of collectives over the scale-out network."""
    host_optimizer_params_per_s: float = Field(default=1.0e9, gt=0)
    """Parameters per second a device's share of the host CPU updates when the optimizer
    is offloaded (a CPU Adam step; an engineering default — no measured rows offload)."""
    moe_layer_overhead_us: float = Field(default=0.0, ge=0)
    """Fixed time each routed-expert layer adds per micro-batch, forward and again
    backward, microseconds: the token counts per expert go to the host before the
    grouped GEMMs can be sized, which stalls the stream, plus the router's and the
    permutation's small kernels."""
    kernel_launch_us: float = Field(default=4.0, ge=0)
    """Fixed cost per kernel launch on the critical path, microseconds."""
    reserve_gib: float | None = Field(default=None, ge=0)
    """Fixed memory reserve; the device data's when None."""

    def gemm_fraction(self, recipe: str, routed: bool = False) -> float:
        """The fraction of its peak a large GEMM of ``recipe`` (a job precision) reaches
        (``routed``: the routed experts' grouped GEMMs)."""
        if recipe in ("bf16", "fp16"):
            if routed and self.grouped_gemm_bf16 is not None:
                return self.grouped_gemm_bf16
            return self.gemm
        if recipe == "fp4" and self.gemm_fp4 is not None:
            dense = self.gemm_fp4
        elif recipe == "mxfp8" and self.gemm_mxfp8 is not None:
            dense = self.gemm_mxfp8
        else:
            dense = self.gemm_low_precision
        return dense * self.grouped_gemm_low_precision_ratio if routed else dense


class Overlap(Frozen):
    """Share of each communication a framework hides under compute (0 = none, 1 = all)."""

    tp: float = Field(default=0.0, ge=0, le=1)
    cp: float = Field(default=1.0, ge=0, le=1)
    """Ring attention hides a K/V block's transfer behind the previous block's attention."""
    ep: float = Field(default=0.0, ge=0, le=1)
    pp: float = Field(default=0.8, ge=0, le=1)
    dp: float = Field(default=0.9, ge=0, le=1)
    """Of the gradient reduction that fits under the last micro-batch's backward."""
    fsdp: float = Field(default=0.8, ge=0, le=1)
    """Of the per-layer parameter gathers that fit under that layer's compute."""


def median_error_key(moe: bool) -> str:
    """The fit figure holding the median error over the fitted runs of one model class."""
    return "median_abs_error_moe" if moe else "median_abs_error_dense"


class Calibration(Frozen):
    """The full set of fitted parameters."""

    source: str = "built-in defaults"
    default: DeviceEfficiency = Field(default_factory=DeviceEfficiency)
    devices: dict[str, DeviceEfficiency] = Field(default_factory=dict)
    """By device id or device family (see ``families``)."""
    families: dict[str, str] = Field(default_factory=dict)
    """Device id → family key, so parts of one generation share a fit."""
    overlap: dict[str, Overlap] = Field(default_factory=dict)
    """By framework name; ``default`` when absent."""
    interference: float = Field(default=0.0, ge=0, le=1)
    """Share of hidden communication time that still slows the compute it overlaps
    (collective kernels take SMs and HBM bandwidth from the GEMMs they hide behind)."""
    tp_interference: float | None = Field(default=None, ge=0, le=1)
    """The same for hidden TP communication, whose overlap runs on copy engines and a
    few SMs (Transformer Engine's userbuffers) rather than NCCL's kernels; unset, it is
    ``interference``."""
    attention_scale: dict[str, float] = Field(default_factory=dict)
    """By framework: how its default attention kernel compares with the device's
    fitted attention efficiency (1 = the same; cuDNN/FA3-class kernels > FA2-class)."""
    step_overhead_s: float = Field(default=0.0, ge=0)
    """Fixed time per step outside the model (data loading, logging, launch gaps)."""
    fit: dict[str, float] = Field(default_factory=dict)
    """Figures from the fit that produced this file (rows used, train error)."""

    def family_of(self, device: DeviceSpec) -> str | None:
        """The device's family: the file's ``families`` entry, else the one the device
        names itself (``DeviceSpec.calibration_family``)."""
        return self.families.get(device.id) or device.calibration_family or None

    def fits_device(self, device: DeviceSpec) -> bool:
        """Whether the file has a fit for this device or its family (else ``default``)."""
        return device.id in self.devices or self.family_of(device) in self.devices

    def for_device(self, device: DeviceSpec) -> DeviceEfficiency:
        if device.id in self.devices:
            return self.devices[device.id]
        family = self.family_of(device)
        if family is not None and family in self.devices:
            return self.devices[family]
        return self.default

    @property
    def median_error(self) -> float | None:
        """The fit's median |predicted / measured step time - 1| over the runs it was
        fitted to; None for a calibration that states none."""
        return self.fit.get("median_abs_error")

    def class_median_error(self, moe: bool) -> tuple[float | None, str]:
        """The fit's median error over its runs of one model class (MoE or dense) and the
        class's name, or over all its runs (name "") where the fit states no class's."""
        found = self.fit.get(median_error_key(moe))
        if found is None:
            return self.median_error, ""
        return found, "MoE" if moe else "dense"

    @property
    def tp_slowdown(self) -> float:
        return self.interference if self.tp_interference is None else self.tp_interference

    def overlap_for(self, framework: str) -> Overlap:
        return self.overlap.get(framework) or self.overlap.get("default") or Overlap()

    def reserve_gib(self, device: DeviceSpec) -> float:
        eff = self.for_device(device)
        return eff.reserve_gib if eff.reserve_gib is not None else device.memory_reserve_gib
