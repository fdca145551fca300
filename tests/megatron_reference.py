"""Megatron-LM's reference vectors (the shared data's megatron_reference_vectors.csv) and
the HuggingFace config with each row's shapes, for the unit and CLI tests that check
``--memory-mode megatron`` against them."""

from __future__ import annotations

import csv
from pathlib import Path

# = tests/conftest.py::SHARED_DATA
SHARED_DATA = Path(__file__).resolve().parent / "data" / "shared"


def reference_rows() -> list[dict[str, str]]:
    with (SHARED_DATA / "megatron_reference_vectors.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


ROWS = reference_rows()


def row_config(r: dict[str, str]) -> dict:
    """An HF config.json with the row's shapes (Llama, or Mixtral for the MoE row)."""
    cfg: dict = {
        "model_type": "llama",
        "hidden_size": int(r["hidden"]),
        "num_hidden_layers": int(r["layers"]),
        "num_attention_heads": int(r["heads"]),
        "num_key_value_heads": int(r["kv_groups"]),
        "head_dim": int(r["kv_channels"]),
        "intermediate_size": int(r["ffn_hidden"]),
        "vocab_size": int(r["vocab_padded"]),
        "tie_word_embeddings": r["untied"] != "true",
        "hidden_act": "silu",
        "max_position_embeddings": int(r["seq_len"]),
        "rms_norm_eps": 1e-5,
    }
    if r["num_experts"]:
        cfg.update(
            model_type="mixtral",
            num_local_experts=int(r["num_experts"]),
            num_experts_per_tok=int(r["topk"]),
            intermediate_size=int(r["moe_ffn_hidden"]),
            moe_intermediate_size=int(r["moe_ffn_hidden"]),
        )
    return cfg
