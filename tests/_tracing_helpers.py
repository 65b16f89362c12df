"""Small real models for the tracing tests (random weights, made deliberately confident).

A freshly initialised tiny-bd is unsure of every position (every block takes ``block_size``
rounds). Scaling the final norm makes its predictions peaked so confidence really varies
between positions, and giving the EOS embedding one strong coordinate makes some requests
stop at EOS, so both stopping rules are exercised by the real model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from dwise_predict.zoo.tiny_bd.config import TinyBDConfig
from dwise_predict.zoo.tiny_bd.io import save_pretrained
from dwise_predict.zoo.tiny_bd.model import TinyBDModel

PROMPTS = [
    "hello",
    "what is 2+2?",
    "a" * 50,
    "line\nline2\n" * 5,
    "x",
    "tell me a story",
    "yo",
    "abc" * 20,
    "zzz",
    "qwerty uiop",
    "Write a haiku about the sea.",
    "1 2 3 4 5 6 7 8 9 10 11 12",
]


def make_tiny_bd(out: Path, *, block_size: int = 8, norm_scale: float = 50.0, eos_weight: float = 0.4,
                 seed: int = 0, max_position: int = 16384) -> Path:
    torch.manual_seed(seed)
    cfg = TinyBDConfig(d_model=64, n_layers=2, n_heads=2, d_ff=128, block_size=block_size, max_position=max_position)
    model = TinyBDModel(cfg)
    with torch.no_grad():
        model.norm.weight.mul_(norm_scale)
        model.embed.weight[cfg.eos_token_id] = 0.0
        model.embed.weight[cfg.eos_token_id, 0] = eos_weight
    return save_pretrained(model, out)


def workload_records(prompts: list[str] = PROMPTS, category: str = "chat") -> list[dict]:
    return [{"id": f"req-{i:03d}", "category": category, "source": "test", "prompt": p,
             "reference": None, "meta": {}} for i, p in enumerate(prompts)]
