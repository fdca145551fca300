"""Job switches that exist in only some frameworks.

A switch the framework does not have would go unread, and the plan would price
something other than what was asked; so a job that states one is refused, by field.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ndplan.core.assumptions import AssumptionRecorder
from ndplan.core.frameworks import FRAMEWORKS
from ndplan.core.job import Job, JobSettings

SWITCHES = {
    # field: (value asked for, the trait that says whether the framework has it)
    "activation_offload": (True, "activation_offload"),
    "defer_embedding_wgrad": (True, "deferred_embedding_wgrad"),
    "fp8_param_gather": (True, "fp8_primary_weights"),
    "moe_a2a_overlap": (True, "paired_a2a_overlap"),
    "moe_fused_grouped_mlp": (True, "fused_grouped_mlp"),
}


def job(**fields) -> Job:
    return Job(global_batch_size=8, seq_length=1024, **fields)


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
@pytest.mark.parametrize("field", sorted(SWITCHES))
def test_a_switch_is_refused_where_the_framework_lacks_it(framework: str, field: str) -> None:
    value, trait = SWITCHES[field]
    has_it = getattr(FRAMEWORKS[framework], trait)
    if has_it:
        assert getattr(job(framework=framework, **{field: value}), field) is value
        return
    with pytest.raises(ValidationError) as info:
        job(framework=framework, **{field: value})
    (error,) = info.value.errors()
    assert error["loc"] == (field,)
    assert framework in error["msg"] and "--framework megatron" in error["msg"]
    # Saying no is always fine, and so is not saying.
    assert getattr(job(framework=framework, **{field: False}), field) is False
    assert getattr(job(framework=framework), field) is None


def test_only_megatron_has_the_megatron_switches() -> None:
    for field, (value, _) in SWITCHES.items():
        offered = set()
        for framework in FRAMEWORKS:
            try:
                job(framework=framework, **{field: value})
            except ValidationError:
                continue
            offered.add(framework)
        assert offered == {"megatron"}, field


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
@pytest.mark.parametrize("kind", ["ring", "all_to_all"])
def test_a_context_parallel_algorithm_the_framework_lacks_is_refused(
    framework: str, kind: str
) -> None:
    if kind in FRAMEWORKS[framework].cp_kinds:
        assert job(framework=framework, cp_kind=kind).cp_kind == kind
        return
    with pytest.raises(ValidationError, match=f"{framework} has no {kind} context parallelism"):
        job(framework=framework, cp_kind=kind)


@pytest.mark.parametrize(
    ("framework", "kind"),
    [
        ("megatron", "ring"),
        ("torchtitan", "ring"),
        ("mindformers", "ring"),
        ("deepspeed", "all_to_all"),
    ],
)
def test_an_unstated_context_parallel_algorithm_is_the_framework_default(
    framework: str, kind: str
) -> None:
    recorder = AssumptionRecorder()
    settings = JobSettings(job(framework=framework), recorder)
    assert settings.cp_kind == kind
    (assumed,) = [a for a in recorder.items if a.field == "job.cp_kind"]
    assert (assumed.value, assumed.reader) == (kind, f"{framework} default")


def test_an_unstated_framework_is_checked_as_megatron() -> None:
    assert job(defer_embedding_wgrad=True).defer_embedding_wgrad is True
    assert job(cp_kind="all_to_all").cp_kind == "all_to_all"


def test_deduplicated_moe_dispatch_exists_where_deepep_does() -> None:
    """DeepEP/HybridEP dispatch is Megatron's flex dispatcher and torchtitan's deepep
    backend; MindFormers and DeepSpeed have only the all-to-all, which every one has."""
    offered = set()
    for framework in FRAMEWORKS:
        assert job(framework=framework, moe_dispatcher="alltoall").moe_dispatcher == "alltoall"
        try:
            job(framework=framework, moe_dispatcher="deepep")
        except ValidationError as exc:
            (error,) = exc.errors()
            assert error["loc"] == ("moe_dispatcher",)
            assert framework in error["msg"] and "use moe_dispatcher alltoall" in error["msg"]
            continue
        offered.add(framework)
    assert offered == {"megatron", "torchtitan"}


def test_an_unstated_moe_dispatcher_is_the_all_to_all() -> None:
    recorder = AssumptionRecorder()
    assert JobSettings(job(), recorder).moe_dispatcher == "alltoall"
    (assumed,) = [a for a in recorder.items if a.field == "job.moe_dispatcher"]
    assert (assumed.value, assumed.reader) == ("alltoall", "pricing")
