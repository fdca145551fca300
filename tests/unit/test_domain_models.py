"""The domain models: frozen, strict, hashable, self-documenting; errors that show their arithmetic."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from pydantic._internal._docs_extraction import extract_docstrings_from_cls

import ndplan.core
from ndplan.core.assumptions import Assumption, AssumptionRecorder
from ndplan.core.base import Frozen
from ndplan.core.cluster import DeviceSpec
from ndplan.core.errors import ExitCode, InvalidInputError, field_error
from ndplan.core.job import Job
from ndplan.core.layout import (
    Layout,
    SearchSpace,
    check_layout,
    layout_label,
    parse_layout_label,
)
from ndplan.core.model import DenseFFN, LayerKind, ModelSpec, MoEFFN, StandardAttention


def core_models() -> list[type[BaseModel]]:
    """Every pydantic model defined in ``ndplan.core``."""
    found: dict[str, type[BaseModel]] = {}
    for info in pkgutil.walk_packages(ndplan.core.__path__, "ndplan.core."):
        module = importlib.import_module(info.name)
        for obj in vars(module).values():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseModel)
                and obj.__module__ == module.__name__
            ):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def dense_kind(name: str = "attn+dense", heads: int = 32, kv_heads: int = 8) -> LayerKind:
    return LayerKind(
        name=name,
        attention=StandardAttention(num_heads=heads, num_kv_heads=kv_heads, head_dim=128),
        ffn=DenseFFN(intermediate_size=14336),
    )


def small_model(**overrides: Any) -> ModelSpec:
    data: dict[str, Any] = {
        "name": "tiny",
        "hidden_size": 4096,
        "vocab_size": 32000,
        "kinds": (dense_kind(),),
        "layers": (0,) * 4,
    }
    data.update(overrides)
    return ModelSpec(**data)


CHECK = {
    "num_devices": 8,
    "global_batch": 16,
    "seq_len": 4096,
    "num_layers": 32,
    "heads": 32,
    "kv_heads": 8,
}


def check(layout: Layout, **overrides: Any) -> None:
    check_layout(layout, **{**CHECK, **overrides})


def error_of(layout: Layout, **overrides: Any) -> str:
    with pytest.raises(InvalidInputError) as err:
        check(layout, **overrides)
    assert err.value.exit_code is ExitCode.INVALID_INPUT
    message = str(err.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------- the model conventions


def test_there_are_core_models_to_check() -> None:
    names = {m.__name__ for m in core_models()}
    assert {"Layout", "SearchSpace", "ModelSpec", "DeviceSpec", "Cluster", "Job"} <= names


@pytest.mark.parametrize("model", core_models(), ids=lambda m: m.__name__)
def test_every_core_model_is_frozen_strict_and_self_documenting(model: type[BaseModel]) -> None:
    assert issubclass(model, Frozen), f"{model.__name__} does not derive from core.base.Frozen"
    config = model.model_config
    assert config.get("frozen") is True
    assert config.get("extra") == "forbid"


@pytest.mark.parametrize("model", core_models(), ids=lambda m: m.__name__)
def test_no_core_model_has_a_list_field(model: type[BaseModel]) -> None:
    """Sequences are tuples, so equal models hash equal and can key a cache."""
    lists = [name for name, f in model.model_fields.items() if "list[" in str(f.annotation)]
    assert lists == [], f"{model.__name__}: use tuples for {lists}"


def test_a_model_cannot_be_changed() -> None:
    layout = Layout(tp=2)
    with pytest.raises(ValidationError, match="frozen"):
        layout.tp = 4  # type: ignore[misc]
    assert layout.model_copy(update={"tp": 4}).tp == 4
    assert layout.tp == 2


def test_unknown_keys_are_refused_by_name() -> None:
    with pytest.raises(ValidationError) as err:
        Layout.model_validate({"tp": 2, "tensor_parallel": 2})
    (error,) = err.value.errors()
    assert error["loc"] == ("tensor_parallel",)
    assert error["type"] == "extra_forbidden"


def test_degrees_are_positive() -> None:
    with pytest.raises(ValidationError) as err:
        Layout(tp=0)
    assert err.value.errors()[0]["loc"] == ("tp",)


def test_sequences_become_tuples_and_equal_models_hash_equal() -> None:
    a = Layout.model_validate({"pp": 2, "layers_per_stage": [15, 17]})
    b = Layout.model_validate_json('{"pp": 2, "layers_per_stage": [15, 17]}')
    assert a.layers_per_stage == (15, 17)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Layout(pp=2)}) == 2

    space = SearchSpace.model_validate({"tp": [1, 2, 4], "sp": [True, False]})
    assert space.tp == (1, 2, 4)
    assert hash(space) == hash(SearchSpace(tp=(1, 2, 4), sp=(True, False)))


def test_a_trusted_layout_is_the_validated_one() -> None:
    """The search's unvalidated constructor takes every field (a field added to Layout
    and not to ``trusted`` fails here) and builds what validation builds: equal, equally
    hashed, dumped alike, and as copyable."""
    assert list(inspect.signature(Layout.trusted).parameters) == list(Layout.model_fields)
    values = {
        "dp": 4,
        "tp": 2,
        "pp": 4,
        "vpp": 5,
        "cp": 2,
        "ep": 1,
        "etp": None,
        "mbs": 1,
        "num_microbatches": 8,
        "zero": 1,
        "sp": True,
        "schedule": "interleaved",
        "recompute": "auto",
        "offload_optimizer": False,
        "layers_per_stage": None,
    }
    trusted, validated = Layout.trusted(**values), Layout(**values)
    assert trusted == validated and hash(trusted) == hash(validated)
    assert trusted.model_dump_json() == validated.model_dump_json()
    assert trusted.model_fields_set == validated.model_fields_set
    copied = trusted.model_copy(update={"recompute": "none"})
    assert copied == validated.model_copy(update={"recompute": "none"})
    assert trusted.recompute == "auto"


def test_a_model_spec_and_a_job_can_key_a_cache() -> None:
    cache = {(small_model(), Job(global_batch_size=16, seq_length=4096)): "priced"}
    key = (
        ModelSpec.model_validate_json(small_model().model_dump_json()),
        Job(global_batch_size=16, seq_length=4096),
    )
    assert cache[key] == "priced"


def test_a_model_round_trips_through_json() -> None:
    model = small_model()
    assert ModelSpec.model_validate_json(model.model_dump_json()) == model


def test_field_docstrings_are_schema_descriptions() -> None:
    layout = Layout.model_json_schema()["properties"]
    assert layout["vpp"]["description"] == "Virtual pipeline chunks per stage (interleaved 1F1B)."
    assert layout["mbs"]["description"] == "Micro-batch size (sequences)."
    device = DeviceSpec.model_json_schema()["properties"]
    assert device["memory_gib"]["description"] == "HBM capacity, GiB."
    job = Job.model_json_schema()["properties"]
    assert job["seq_length"]["description"] == "Tokens per sequence."


def _field_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each annotated field in the class body, as pydantic's own
    ``use_attribute_docstrings`` reads them (the models used it until their schema
    learnt to read docstrings only when asked)."""
    return extract_docstrings_from_cls(model, use_inspect=True)


@pytest.mark.parametrize("model", core_models(), ids=lambda m: m.__name__)
def test_every_field_docstring_reaches_the_schema(model: type[BaseModel]) -> None:
    """Every documented field, the inherited ones too, and in nested models' definitions;
    a description on a shared Annotated type does not win over the docstring."""
    if model is Layout:
        assert _field_docstrings(model)["vpp"].startswith("Virtual pipeline")  # the probe works
    schema = model.model_json_schema()
    documented = {model.__name__: schema, **schema.get("$defs", {})}
    by_name = {m.__name__: m for m in core_models()}
    checked = 0
    for name, definition in documented.items():
        if name not in by_name or "properties" not in definition:
            continue
        docs = {}
        for klass in reversed(by_name[name].__mro__):
            if issubclass(klass, BaseModel) and klass is not BaseModel:
                docs.update(_field_docstrings(klass))
        for field, doc in docs.items():
            assert definition["properties"][field]["description"] == doc, f"{name}.{field}"
            checked += 1
    assert checked or not _field_docstrings(model)


def test_constrained_types_document_themselves() -> None:
    tp = Layout.model_json_schema()["properties"]["tp"]
    assert tp["minimum"] == 1  # from the shared Degree type
    assert tp["description"] == "Tensor-parallel degree (Megatron style)."  # its own docstring


def test_model_validators_name_the_offending_fields() -> None:
    with pytest.raises(
        ValidationError, match=r"num_attention_heads\(32\) .* num_key_value_heads\(5\)"
    ):
        StandardAttention(num_heads=32, num_kv_heads=5, head_dim=128)
    with pytest.raises(ValidationError, match=r"num_experts_per_tok\(9\) exceeds num_experts\(8\)"):
        MoEFFN(num_experts=8, top_k=9, expert_intermediate_size=1024)
    with pytest.raises(ValidationError, match=r"layer kinds never used: \[1\]"):
        small_model(kinds=(dense_kind(), dense_kind("other")))
    with pytest.raises(ValidationError, match=r"vpp\(2\) > 1 needs schedule 'interleaved'"):
        Layout(pp=2, vpp=2)
    # VPP without PP: the interleaved schedule was not asked for, so the error names VPP.
    with pytest.raises(ValidationError, match=r"vpp\(3\) > 1 needs pp > 1 .* or vpp 1"):
        Layout(pp=1, vpp=3, schedule="interleaved")
    with pytest.raises(ValidationError, match=r"schedule 'interleaved' needs vpp > 1"):
        Layout(pp=2, vpp=1, schedule="interleaved")


# --------------------------------------------------------------- cross-field checks


def test_a_consistent_layout_passes() -> None:
    check(Layout(tp=2, pp=2, dp=2, mbs=2, num_microbatches=4))


def test_degrees_that_do_not_multiply_out_print_the_arithmetic() -> None:
    message = error_of(
        Layout(tp=8, pp=4, cp=2, dp=5), num_devices=256, global_batch=5, seq_len=8192
    )
    assert message.startswith("tp(8)·pp(4)·cp(2)·dp(5) = 320 ≠ devices(256)")
    assert "--devices" in message  # names the fix


def test_a_global_batch_mismatch_prints_the_arithmetic() -> None:
    message = error_of(Layout(tp=2, pp=2, dp=2, mbs=2, num_microbatches=3))
    assert message.startswith("dp(2)·mbs(2)·microbatches(3) = 12 ≠ global batch(16)")
    assert "--gbs" in message


def test_tp_must_divide_the_heads() -> None:
    message = error_of(Layout(tp=8, dp=1, num_microbatches=16), heads=36)
    assert message == (
        "tp(8) does not divide the attention heads(36); choose one that does: "
        "1, 2, 3, 4, 6, 9, 12, 18, 36"
    )


def test_tp_and_the_kv_heads_must_divide_one_another() -> None:
    message = error_of(Layout(tp=8, dp=1, num_microbatches=16), heads=48, kv_heads=12)
    assert message == (
        "tp(8) and the key/value heads(12) do not divide one another; choose one of "
        "1, 2, 3, 4, 6, 12, 24, 48"
    )
    # Either direction is fine: tp 8 over 4 kv heads replicates them.
    check(Layout(tp=8, dp=1, num_microbatches=16), kv_heads=4)


def test_cp_must_divide_the_sequence() -> None:
    message = error_of(Layout(cp=8, dp=1, num_microbatches=16), seq_len=4100)
    assert message == (
        "cp(8) needs the sequence length(4100) divisible by 2·cp = 16; choose another cp or "
        "--seq-len"
    )
    # Megatron's load-balanced ring cuts it in 2·cp chunks: dividing by cp is not enough
    message = error_of(Layout(cp=8, dp=1, num_microbatches=16), seq_len=4104)
    assert "divisible by 2·cp = 16" in message


def test_ep_must_divide_the_experts() -> None:
    message = error_of(Layout(dp=8, ep=3, num_microbatches=2), num_experts=64)
    assert message == (
        "ep(3) does not divide the routed experts(64); choose one that does: 1, 2, 4, 8, 16, 32, 64"
    )


def test_ep_times_etp_must_divide_the_data_parallel_devices() -> None:
    message = error_of(Layout(tp=2, dp=4, ep=8, num_microbatches=4), num_experts=64)
    assert message.startswith("ep(8)·etp(2) = 16 does not divide dp·cp·tp = 8")
    # The expert TP followed TP unasked: the fix names the widest that fits.
    assert message.endswith("; give --etp 1 (expert TP follows tp=2 unless stated)")
    message = error_of(Layout(tp=4, dp=4, ep=8, num_microbatches=4), num_experts=64, num_devices=16)
    assert message.endswith("; give --etp 2 (expert TP follows tp=4 unless stated)")
    # A stated expert TP is the user's own choice: no fix is guessed for it.
    message = error_of(Layout(tp=2, etp=2, dp=4, ep=8, num_microbatches=4), num_experts=64)
    assert message.endswith("experts are carved out of the data-parallel devices")


def test_ep_needs_experts() -> None:
    message = error_of(Layout(dp=8, ep=2, num_microbatches=2))
    assert message == "ep(2) > 1 but the model has no experts; use --ep 1"


def test_uneven_placement_must_cover_the_layers() -> None:
    base = {"pp": 2, "dp": 4, "num_microbatches": 4}
    assert error_of(Layout(**base, layers_per_stage=(10, 10, 12))).startswith(
        "layers_per_stage lists 3 entries; the layout has 2 chunks"
    )
    assert error_of(Layout(**base, layers_per_stage=(15, 16))) == (
        "layers_per_stage sums to 31 ≠ layers(32)"
    )
    check(Layout(**base, layers_per_stage=(15, 17)))


def test_more_chunks_than_layers_plus_embedding_and_loss_is_refused() -> None:
    message = error_of(Layout(pp=8, dp=1, num_microbatches=16), num_layers=4)
    assert message == (
        "pp·vpp = 8 chunks exceed the 4 layers plus the embedding and the loss; lower pp or vpp"
    )
    # Two chunks more than layers: the first holds only the embedding, the last only the loss.
    check(Layout(pp=2, vpp=3, dp=4, num_microbatches=4, schedule="interleaved"), num_layers=4)
    assert error_of(
        Layout(pp=2, vpp=4, dp=4, num_microbatches=4, schedule="interleaved"), num_layers=4
    ).startswith("pp·vpp = 8 chunks exceed")


# --------------------------------------------------------------- assumptions


def test_an_assumption_is_recorded_once_with_its_first_reader() -> None:
    rec = AssumptionRecorder()
    assert rec.default("precision", "bf16", "cost model") == "bf16"
    assert rec.default("precision", "bf16", "memory model") == "bf16"

    assert rec.items == (Assumption("precision", "bf16", "cost model"),)


def test_assumptions_are_sorted_by_field_whatever_the_read_order() -> None:
    rec = AssumptionRecorder()
    rec.default("optimizer", "adam", "memory model")
    rec.default("dropout", 0.0, "job")
    rec.default("attention_kernel", "flash", "memory model")

    assert [a.field for a in rec.items] == ["attention_kernel", "dropout", "optimizer"]
    assert rec.line() == (
        "assumed: attention_kernel=flash (memory model); dropout=0.0 (job); "
        "optimizer=adam (memory model)"
    )


def test_no_assumption_no_line() -> None:
    assert AssumptionRecorder().line() == ""
    assert AssumptionRecorder().items == ()


def test_assumptions_from_elsewhere_merge_without_overriding() -> None:
    rec = AssumptionRecorder()
    rec.default("precision", "bf16", "main")
    worker = AssumptionRecorder()
    worker.default("precision", "fp16", "worker")
    worker.default("cp_kind", "ring", "worker")

    rec.merge(worker.items)

    assert rec.items == (
        Assumption("cp_kind", "ring", "worker"),
        Assumption("precision", "bf16", "main"),
    )


def test_strict_refuses_to_assume_naming_the_field() -> None:
    rec = AssumptionRecorder(strict=True)

    with pytest.raises(InvalidInputError) as err:
        rec.default("seq_length", 4096, "job")

    message = str(err.value)
    assert message.startswith("seq_length: not stated")
    assert "4096" in message and "--strict" in message and "(read by job)" in message
    assert err.value.exit_code is ExitCode.INVALID_INPUT
    assert rec.items == ()


def test_layout_label_names_the_degrees_it_needs() -> None:
    plain = Layout(
        dp=8, tp=4, pp=8, vpp=4, mbs=1, num_microbatches=48, zero=1, schedule="interleaved"
    )
    assert plain.label == "tp4 pp8×4 cp1 dp8 mbs1 z1"
    moe = Layout(dp=4, tp=2, ep=8, mbs=2, num_microbatches=8, zero=3, offload_optimizer=True)
    assert moe.label == "tp2 pp1 cp1 ep8 dp4 mbs2 z3 off"
    # DualPipeV's two chunks per stage are its schedule, not a VPP: `v`, as the table has it.
    v_shape = Layout(dp=4, pp=4, ep=4, mbs=1, num_microbatches=16, schedule="dualpipev")
    assert v_shape.label == "tp1 pp4v cp1 ep4 dp4 mbs1 z0"


@settings(max_examples=300, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.integers(1, 16),
    vpp=st.integers(1, 8),
    cp=st.sampled_from([1, 2, 4]),
    ep=st.sampled_from([1, 2, 8, 64]),
    dp=st.integers(1, 64),
    mbs=st.integers(1, 16),
    zero=st.integers(0, 3),
    offload=st.booleans(),
    dualpipe=st.booleans(),
)
def test_a_layout_label_reads_back_as_the_degrees_it_shows(
    tp, pp, vpp, cp, ep, dp, mbs, zero, offload, dualpipe
) -> None:
    """parse_layout_label is layout_label's inverse: every degree the label shows comes
    back (VPP 1 where it shows none; DualPipeV as its schedule), nothing else."""
    values = dict(tp=tp, pp=pp, vpp=1 if dualpipe else vpp, cp=cp, ep=ep, dp=dp, mbs=mbs)
    values |= dict(zero=zero, offload_optimizer=offload)
    if dualpipe:
        values["schedule"] = "dualpipev"
    back = parse_layout_label(layout_label(values))
    shown = {k: v for k, v in values.items() if not (k == "ep" and v == 1)}
    if not offload:
        del shown["offload_optimizer"]
    assert back == shown


def test_a_layout_label_may_leave_degrees_open_and_rejects_what_is_not_one() -> None:
    assert parse_layout_label("tp4 pp8x? dp2 mbs?") == {
        "tp": 4,
        "pp": 8,
        "vpp": None,
        "dp": 2,
        "mbs": None,
    }
    assert parse_layout_label("tp2,pp4*2") == {"tp": 2, "pp": 4, "vpp": 2}
    for text in ("", "tp=4", "tp4 tp2", "tp4 pipeline2", "pp4×", "z", "tp4.5"):
        assert parse_layout_label(text) is None, text


def test_a_validation_error_reads_as_one_line_naming_the_field() -> None:
    """The one wording of a pydantic error: field, message, and the value given when it
    is a plain value; a caller may name the field as its user gave it; a whole-model
    check names no field; any other error reads as it is."""
    with pytest.raises(ValidationError) as bad_value:
        Job(global_batch_size=8, seq_length=0)
    assert field_error(bad_value.value) == (
        "seq_length: Input should be greater than or equal to 1 (got 0)"
    )
    assert field_error(bad_value.value, "--seq-len").startswith("--seq-len: Input should")
    with pytest.raises(ValidationError) as missing:
        Job.model_validate({"seq_length": 8})
    assert field_error(missing.value) == "global_batch_size: Field required"
    with pytest.raises(ValidationError) as whole:
        Layout(pp=1, vpp=2)
    text = field_error(whole.value)
    assert not text.startswith((":", "Value error")) and "(got" not in text
    assert field_error(ValueError("plain")) == "plain"
