"""``--memory-mode megatron`` reproduces Megatron-LM's theoretical memory estimate (issue 4).

Every row of ``megatron_reference_vectors.csv`` (Megatron-LM at d98e8a6, MiB = 2^20 B):
``weight_and_optimizer_MiB_head`` and the activation column that ``formula_used``
names, to within 0.01 MiB, through the core (:class:`MegatronMemoryModel`) and through
:meth:`Planner.estimate` with ``memory_model="megatron"``. The CLI path is in
``tests/cli/test_estimate_cli.py``.
"""

from __future__ import annotations

import pytest
from megatron_reference import ROWS, row_config

from ndplan.adapters.readers.hf import read_hf_config
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.memory import MegatronMemoryModel
from ndplan.core.model import ModelSpec
from ndplan.planner import Planner, PricingOptions

MIB = 2**20
TOLERANCE_MIB = 0.01


def row_model(r: dict[str, str]) -> ModelSpec:
    return read_hf_config(row_config(r), name=f"reference {r['case']}")


def row_layout(r: dict[str, str]) -> Layout:
    vpp = int(r["vpp"]) if r["vpp"] else 1
    return Layout(
        dp=int(r["dp"]),
        tp=int(r["tp"]),
        pp=int(r["pp"]),
        vpp=vpp,
        ep=int(r["ep"]),
        mbs=int(r["micro_batch"]),
        num_microbatches=int(r["num_microbatches"]),
        zero=1 if r["distributed_optimizer"] == "true" else 0,
        sp=r["sequence_parallel"] == "true",
        schedule="interleaved" if vpp > 1 else "1f1b",
        recompute=r["recompute"],
    )


def expected_activation_mib(r: dict[str, str]) -> float:
    column = {"sp": "activation_MiB_sp_formula", "nosp": "activation_MiB_nosp_formula"}
    return float(r[column[r["formula_used"]]])


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def context(planner: Planner, r: dict[str, str]):
    layout = row_layout(r)
    job = Job(
        global_batch_size=layout.dp * layout.mbs * layout.num_microbatches,
        seq_length=int(r["seq_len"]),
    )
    return planner.context(row_model(r), planner.device("h100-sxm"), layout.devices, job), layout


def test_the_reference_file_has_the_six_cases() -> None:
    assert [r["case"] for r in ROWS] == list("ABCDEF")
    assert {r["formula_used"] for r in ROWS} == {"sp", "nosp"}


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_core_reproduces_weights_and_optimizer(planner: Planner, row: dict[str, str]) -> None:
    ctx, layout = context(planner, row)
    got = MegatronMemoryModel().weights_and_optimizer_bytes(ctx, layout) / MIB
    assert got == pytest.approx(float(row["weight_and_optimizer_MiB_head"]), abs=TOLERANCE_MIB)


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_core_reproduces_the_named_activation_formula(
    planner: Planner, row: dict[str, str]
) -> None:
    ctx, layout = context(planner, row)
    act, formula = MegatronMemoryModel().activation_bytes(ctx, layout)
    assert formula == row["formula_used"]
    assert act / MIB == pytest.approx(expected_activation_mib(row), abs=TOLERANCE_MIB)


def test_row_f_uses_the_no_sp_formula_because_megatron_turns_sp_off_at_tp_1(
    planner: Planner,
) -> None:
    (row,) = [r for r in ROWS if r["case"] == "F"]
    ctx, layout = context(planner, row)
    # Even when asked for SP, TP = 1 has none: the no-SP formula applies.
    asked = layout.model_copy(update={"sp": True})
    assert not asked.sequence_parallel
    act, formula = MegatronMemoryModel().activation_bytes(ctx, asked)
    assert formula == "nosp"
    assert act / MIB == pytest.approx(float(row["activation_MiB_nosp_formula"]), abs=TOLERANCE_MIB)


@pytest.mark.parametrize("row", ROWS, ids=[r["case"] for r in ROWS])
def test_planner_estimate_in_megatron_mode(planner: Planner, row: dict[str, str]) -> None:
    ctx, layout = context(planner, row)
    plan = planner.estimate(ctx, layout, PricingOptions(memory_model="megatron"))
    mem = plan.memory
    assert mem.mode == "megatron"
    assert mem.weights_and_optimizer_bytes / MIB == pytest.approx(
        float(row["weight_and_optimizer_MiB_head"]), abs=TOLERANCE_MIB
    )
    assert mem.activation_bytes / MIB == pytest.approx(
        expected_activation_mib(row), abs=TOLERANCE_MIB
    )
    (stage,) = mem.stages
    assert stage.total_bytes == sum(stage.parts.values())
    assert stage.total_bytes == mem.weights_and_optimizer_bytes + mem.activation_bytes
    assert mem.peak_bytes == stage.total_bytes
    assert mem.fits == (mem.peak_bytes <= mem.budget_bytes)
