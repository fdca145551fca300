"""Devices and clusters: the hardware side of a plan (spec/performance.md, 'Device catalog').

Figures are stored as the data files state them (units in the names: GiB,
TFLOP/s, GB/s per direction); properties convert to bytes and bytes/s.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import Frozen, PositiveInt
from .units import GB, MAX_COUNT, TFLOP, US, GiB

PrecisionName = Literal["fp32", "tf32", "bf16", "fp16", "fp8", "fp4"]


class Link(Frozen):
    """One fabric a device reaches its peers (or its host) over."""

    technology: str = ""
    bandwidth_gb_per_s: float = Field(gt=0)
    """Per direction, per device, GB/s (1e9 B/s)."""
    latency_us: float = Field(default=0.0, ge=0)
    """Per-step collective latency (alpha), microseconds."""

    @property
    def bytes_per_s(self) -> float:
        return self.bandwidth_gb_per_s * GB

    @property
    def latency_s(self) -> float:
        return self.latency_us * US


class ScaleUpLink(Link):
    domain_size: PositiveInt = 8
    """Devices reachable over the scale-up fabric (8 in an HGX node, 72 in an NVL72 rack)."""
    topology: Literal["switch", "mesh"] = "switch"
    """switch: every device reaches any peer at full bandwidth (NVSwitch); mesh: one
    direct link per peer (Infinity Fabric, HCCS), ``bandwidth_gb_per_s`` is the total
    over all links, so a group of n uses (n − 1)/(domain − 1) of it."""

    def group_bytes_per_s(self, group: int) -> float:
        """Per-direction bandwidth a ring over ``group`` devices of the domain can use."""
        if self.topology == "mesh" and self.domain_size > 1:
            return self.bytes_per_s * min(1.0, (group - 1) / (self.domain_size - 1))
        return self.bytes_per_s


class DeviceSpec(Frozen):
    """One accelerator type, as its datasheet describes it."""

    id: str = Field(min_length=1, pattern=r"\S")
    name: str = ""
    vendor: str = ""
    aliases: tuple[str, ...] = ()
    memory_gib: float = Field(gt=0)
    """HBM capacity, GiB."""
    memory_reserve_gib: float = Field(default=4.0, ge=0)
    """Fixed reserve: runtime context, collective buffers, allocator fragmentation."""
    peak_tflops: dict[PrecisionName, float]
    """Dense peak per precision, TFLOP/s."""
    hbm_bandwidth_gb_per_s: float = Field(gt=0)
    devices_per_node: PositiveInt = 8
    scale_up: ScaleUpLink
    scale_out: Link
    host_link: Link
    fp8_any_layout: bool = False
    """Its tensor cores take fp8 operands in any layout (Blackwell). Hopper's fp8 GEMMs
    are TN only, so a per-tensor-scaled fp8 tensor is also kept transposed there; block
    scales run along one direction, so block-scaled recipes keep both copies anyway."""
    calibration_family: str = ""
    """The fitted generation that prices it (``hopper``, ``blackwell``, ``ampere``, …)
    where the calibration's own ``families`` table does not name it: a device plugin's
    new part of a fitted generation. Empty: the calibration's default fit."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Public source of each figure."""
    notes: str = ""

    @model_validator(mode="after")
    def _has_a_training_rate(self) -> DeviceSpec:
        if not any(p in self.peak_tflops for p in ("bf16", "fp16")):
            raise ValueError("peak_tflops needs a bf16 or fp16 rate")
        if any(v <= 0 for v in self.peak_tflops.values()):
            raise ValueError("peak_tflops values must be positive")
        if self.memory_reserve_gib >= self.memory_gib:
            raise ValueError(
                f"memory_reserve_gib ({self.memory_reserve_gib:g}) leaves nothing of "
                f"memory_gib ({self.memory_gib:g}); give a smaller reserve"
            )
        return self

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GiB)

    @property
    def reserve_bytes(self) -> int:
        return int(self.memory_reserve_gib * GiB)

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_gb_per_s * GB

    def peak_flops(self, precision: PrecisionName) -> float:
        """Dense FLOP/s at ``precision``; fp16 and bf16 stand in for each other."""
        if precision in self.peak_tflops:
            return self.peak_tflops[precision] * TFLOP
        if precision in ("bf16", "fp16"):
            other = "fp16" if precision == "bf16" else "bf16"
            return self.peak_tflops[other] * TFLOP
        raise KeyError(precision)

    def supports(self, precision: PrecisionName) -> bool:
        return precision in self.peak_tflops or precision in ("bf16", "fp16")


class Cluster(Frozen):
    """The devices a job runs on."""

    device: DeviceSpec
    num_devices: int = Field(ge=1, le=MAX_COUNT)
    """Devices in all, `N`."""
    devices_per_node: PositiveInt | None = None
    """Devices per node; the device type's figure when unset."""

    @property
    def per_node(self) -> int:
        return self.devices_per_node or self.device.devices_per_node

    @property
    def scale_up_domain(self) -> int:
        """Devices that share the scale-up fabric (a node, or an NVL72 rack)."""
        return max(self.device.scale_up.domain_size, self.per_node)
