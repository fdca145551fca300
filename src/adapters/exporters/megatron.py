"""Megatron-LM arguments for a plan."""

from __future__ import annotations

from ndplan.core.context import layer_counts
from ndplan.core.layout import Layout
from ndplan.core.model import ModelSpec


def pipeline_layout(model: ModelSpec, layout: Layout) -> str:
    """``--pipeline-model-parallel-layout``: the chunks in order (virtual stage by
    virtual stage, each over the pipeline ranks), split by ``|``; ``E`` the embedding,
    ``t`` a decoder layer, ``m`` an MTP layer, ``L`` the loss. Megatron-Core reads it
    for any per-chunk counts, empty chunks included (e.g. ``Et*3|(tt|)*29,m|L``)."""
    parts = ["t" * n for n in layer_counts(model, layout)]
    parts[0] = "E" + parts[0]
    parts[-1] += "m" * model.num_mtp_layers + "L"
    return "|".join(parts)
