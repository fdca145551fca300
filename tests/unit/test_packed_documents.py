"""Sequences packed from short documents (SFT data packed to the sequence length).

Attention runs within each document (Megatron's THD format), so its FLOPs follow the
document length and every kernel call sees document-length keys; nothing else changes.
"""

from __future__ import annotations

import pytest

from ndplan.core.calibration import Calibration
from ndplan.core.cluster import Cluster
from ndplan.core.context import PricingContext
from ndplan.core.counting import core_attention_flops, count_flops
from ndplan.core.job import Job
from ndplan.core.layout import Layout
from ndplan.core.model import DenseFFN, LayerKind, ModelSpec, StandardAttention
from ndplan.core.performance import NdplanCostModel, attention_length_efficiency
from ndplan.planner import Planner

ATTENTION = StandardAttention(num_heads=16, num_kv_heads=4, head_dim=128)
KIND = LayerKind(name="dense", attention=ATTENTION, ffn=DenseFFN(intermediate_size=8192))
MODEL = ModelSpec(name="dense", hidden_size=2048, vocab_size=32000, kinds=(KIND,), layers=(0,) * 8)
H100 = Planner().device("h100")
SEQ = 4096


def make_ctx(layout: Layout, **job) -> PricingContext:
    return PricingContext(
        model=MODEL,
        cluster=Cluster(device=H100, num_devices=layout.devices),
        job=Job(global_batch_size=layout.dp * layout.num_microbatches, seq_length=SEQ, **job),
    )


def ops(layout: Layout, **job) -> dict[str, float]:
    ctx = make_ctx(layout, **job)
    cost = NdplanCostModel(Calibration()).layer_cost(ctx, layout, KIND)
    return {op.name: op.forward_s for op in cost.ops}


@pytest.mark.parametrize(("cp", "docs"), [(1, 225), (1, 1024), (2, 225), (4, 2048)])
def test_attention_follows_the_document_and_nothing_else_moves(cp: int, docs: int) -> None:
    """FLOPs scale by the causal keys of a document against the sequence's, and the kernel
    rate by the efficiency at document-length keys (ring CP: at most seq/cp keys)."""
    layout = Layout(cp=cp, dp=2, num_microbatches=4)
    whole, packed = ops(layout), ops(layout, document_tokens=docs)
    flops = core_attention_flops(ATTENTION, docs, "causal") / core_attention_flops(
        ATTENTION, SEQ, "causal"
    )
    block = SEQ / cp
    rate = attention_length_efficiency(min(docs, block)) / attention_length_efficiency(block)
    assert packed["core_attention"] == pytest.approx(whole["core_attention"] * flops / rate)
    assert packed["core_attention"] < whole["core_attention"]
    assert {k: v for k, v in packed.items() if k != "core_attention"} == {
        k: v for k, v in whole.items() if k != "core_attention"
    }


def test_documents_as_long_as_the_sequence_change_nothing() -> None:
    layout = Layout(dp=2, num_microbatches=4)
    assert ops(layout, document_tokens=SEQ) == ops(layout)
    assert ops(layout, document_tokens=4 * SEQ) == ops(layout)


def test_model_flops_count_attention_within_documents() -> None:
    """MFU's model FLOPs are the work the step needs: attention over each document."""
    layout = Layout(dp=2, num_microbatches=4)
    ctx = make_ctx(layout, document_tokens=225)
    cm = NdplanCostModel(Calibration())
    tokens = 2 * 4 * SEQ
    expected = tokens * count_flops(MODEL, 225).training_flops_per_token
    assert cm.model_flops_per_step(ctx) == pytest.approx(expected, rel=1e-12)
    assert cm.model_flops_per_step(ctx) < cm.model_flops_per_step(make_ctx(layout))


def test_a_document_length_below_one_token_is_refused() -> None:
    with pytest.raises(ValueError, match="document_tokens"):
        Job(global_batch_size=8, seq_length=SEQ, document_tokens=0)
