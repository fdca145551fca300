"""A DeepSpeed JSON given as ``search --baseline FILE``: it states the ZeRO stage, the
batch arithmetic and optimizer offload, but not TP or PP, which DeepSpeed takes from the
model code. Rather than rank a layout the file does not state, ``--baseline`` refuses it in
one line that names what it does state and the degrees to add."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ndplan.core.errors import InvalidInputError

from .launch import Problem, check_batch, positive

_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization")


def is_deepspeed(data: Any) -> bool:
    return isinstance(data, Mapping) and any(key in data for key in _KEYS)


def deepspeed_refusal(config: Mapping[str, Any], where: str, problem: Problem) -> InvalidInputError:
    """The one-line error for a DeepSpeed config as a baseline: the degrees it states
    (ZeRO stage, micro-batch, data parallel where its batch arithmetic gives it, optimizer
    offload), and the ``--baseline`` that adds the TP and PP the model code sets."""
    zero_section = config.get("zero_optimization") or {}
    if not isinstance(zero_section, Mapping):
        raise InvalidInputError(f"{where}: zero_optimization: expected a mapping")
    stage = zero_section.get("stage", 0)  # DeepSpeed's default: no ZeRO
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise InvalidInputError(
            f"{where}: zero_optimization.stage {stage!r}: expected 0, 1, 2 or 3"
        )
    stated: dict[str, Any] = {"zero": stage}

    def given(key: str) -> Any:  # "auto": the HF Trainer fills it in, so it states nothing
        value = config.get(key)
        return None if value == "auto" else value

    mbs = given("train_micro_batch_size_per_gpu")
    if mbs is not None:
        stated["mbs"] = positive(mbs, "train_micro_batch_size_per_gpu", where)
    batch = given("train_batch_size")
    if batch is not None:
        check_batch(where, "train_batch_size", positive(batch, "train_batch_size", where), problem)
        steps = given("gradient_accumulation_steps")
        if mbs is not None and steps is not None:
            accumulation = positive(steps, "gradient_accumulation_steps", where)
            if problem.global_batch % (stated["mbs"] * accumulation) == 0:
                stated["dp"] = problem.global_batch // (stated["mbs"] * accumulation)
    offload = zero_section.get("offload_optimizer")
    if isinstance(offload, Mapping) and offload.get("device") in ("cpu", "nvme"):
        stated["offload_optimizer"] = "true"
    degrees = ",".join(f"{k}={v}" for k, v in sorted(stated.items()))
    return InvalidInputError(
        f"{where}: a DeepSpeed config states {degrees} but not TP or PP, which DeepSpeed takes "
        f"from the model code; give them too: --baseline tp=TP,pp=PP,{degrees}"
    )
