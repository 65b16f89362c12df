"""What the DWS tests share: a tiny random BERT, category-labelled synthetic traces, and a
cost profile with a planted shape."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from synthetic_traces import make_traces

from dwise_predict.cost import CostProfile


def save_tiny_bert(folder: Path) -> Path:
    """A random 1-layer, 32-wide BERT saved like a Hub folder, with MiniLM's real tokenizer."""
    import torch
    from dwise_predict.trainers.dws import default_encoder_path
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(cfg).save_pretrained(folder)
    shutil.copy(default_encoder_path() / "tokenizer.json", folder / "tokenizer.json")
    return folder


def labelled_traces(n: int, seed: int, *, block_size: int, output_budget: int):
    """Synthetic traces whose prompts open with their category's name: the category sets the
    work, and a 48-token window would otherwise see only interchangeable filler words."""
    import pyarrow as pa

    table = make_traces(n, block_size=block_size, output_budget=output_budget, seed=seed)
    prompts = [
        " ".join([c] * 4) + ": " + p
        for c, p in zip(table.column("category").to_pylist(), table.column("prompt").to_pylist())
    ]
    i = table.schema.get_field_index("prompt")
    return table.set_column(i, table.schema.field(i), pa.array(prompts, pa.string()))


def planted_profile(block_size: int, budget: int, fingerprint: dict[str, Any]) -> CostProfile:
    """K[b, s] = 1 + 0.3 b + 0.05 s ms over budget / block_size blocks and S = block_size."""
    b, s = np.arange(budget // block_size)[:, None], np.arange(block_size)[None, :]
    return CostProfile(
        alpha_ms=2.0,
        beta_ms=1.0,
        K_ms=1.0 + 0.3 * b + 0.05 * s,
        delta_ms=0.01,
        block_size=block_size,
        max_steps=block_size,
        fingerprint=fingerprint,
    )
