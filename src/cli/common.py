"""Inputs shared by the commands that price layouts (estimate, search, explain)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.errors import InvalidInputError
from ndplan.core.job import Job
from ndplan.planner import Planner, PricingOptions

from .options import State

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Preset name, config.json, or a model directory.")
]
DeviceOpt = Annotated[
    str, typer.Option("--device", "-d", help="Device id or alias (see `ndplan devices`).")
]
DevicesOpt = Annotated[int, typer.Option("--devices", "-n", min=1, help="Number of devices.")]
GbsOpt = Annotated[
    int, typer.Option("--gbs", min=1, help="Global batch size (sequences per step).")
]
SeqOpt = Annotated[int, typer.Option("--seq-len", "-s", min=1, help="Sequence length (tokens).")]
PrecisionOpt = Annotated[
    str | None,
    typer.Option(
        "--precision",
        help="bf16, fp16, fp8, fp8-blockwise, mxfp8 or fp4 [default: bf16].",
        show_default=False,
    ),
]
FrameworkOpt = Annotated[
    str | None,
    typer.Option(
        "--framework",
        help="megatron, torchtitan, mindformers or deepspeed "
        "(fixes which options exist) [default: megatron].",
        show_default=False,
    ),
]
AttentionOpt = Annotated[
    str | None,
    typer.Option(
        "--attention", help="Attention kernel: flash or eager [default: flash].", show_default=False
    ),
]
DropoutOpt = Annotated[
    float | None,
    typer.Option(
        "--dropout", min=0.0, max=0.99, help="Dropout probability [default: 0].", show_default=False
    ),
]
MaxMemOpt = Annotated[
    float | None,
    typer.Option(
        "--max-mem", help="Usable device memory, GiB [default: the device's].", show_default=False
    ),
]
ReserveOpt = Annotated[
    float, typer.Option("--reserve", min=0.0, help="Memory held back for balancing, GiB.")
]
RuntimeReserveOpt = Annotated[
    float | None,
    typer.Option(
        "--runtime-reserve",
        min=0.0,
        help="Fixed runtime reserve (context, NCCL, fragmentation), GiB [default: the device's].",
        show_default=False,
    ),
]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration", help="A calibration file from `ndplan compare --fit`.", show_default=False
    ),
]
GradDtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--grad-dtype",
        help="Gradient buffer / reduction dtype: fp32 or bf16 [default: the framework's].",
        show_default=False,
    ),
]

TpOverlapOpt = Annotated[
    bool | None,
    typer.Option(
        "--tp-comm-overlap/--no-tp-comm-overlap",
        help="Whether TP collectives overlap the GEMMs (Megatron --tp-comm-overlap, "
        "torchtitan async TP) [default: on].",
        show_default=False,
    ),
]


@dataclass
class JobInputs:
    gbs: int
    seq_len: int
    precision: str | None
    framework: str | None
    attention: str | None
    dropout: float | None
    grad_dtype: str | None = None
    tp_comm_overlap: bool | None = None

    def job(self) -> Job:
        try:
            return Job(
                global_batch_size=self.gbs,
                seq_length=self.seq_len,
                precision=self.precision,
                framework=self.framework,
                attention_kernel=self.attention,
                dropout=self.dropout,
                grad_reduce_dtype=self.grad_dtype,
                tp_comm_overlap=self.tp_comm_overlap,
            )
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(p) for p in err.get("loc", ()))
            flag = {
                "precision": "--precision",
                "framework": "--framework",
                "attention_kernel": "--attention",
                "dropout": "--dropout",
                "grad_reduce_dtype": "--grad-dtype",
            }.get(field, field)
            raise InvalidInputError(
                f"{flag}: {err.get('msg')} (got {err.get('input')!r})"
            ) from None


def build_context(
    state: State,
    *,
    model: str,
    device: str,
    devices: int,
    job: JobInputs,
    device_files: list[Path] | None,
    strict: bool,
    options: PricingOptions,
):
    """The planner, the pricing context and the assumptions recorder for one command."""
    planner = Planner(state.components(device_files))
    recorder = AssumptionRecorder(strict=strict)
    spec = planner.model(model, recorder)
    dev = planner.device(device)
    if options.max_mem_gib is not None and options.max_mem_gib <= 0:
        raise InvalidInputError(f"--max-mem: must be positive, got {options.max_mem_gib}")
    ctx = planner.context(spec, dev, devices, job.job(), options=options, recorder=recorder)
    return planner, ctx
