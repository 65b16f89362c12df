"""What the tiny-bd training tests share: a tiny model shape and small encoded examples that a
real Lightning run learns from in seconds."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from dwise_predict.zoo.tiny_bd.config import TinyBDConfig
from dwise_predict.zoo.tiny_bd.recipe.data import (
    EncodedExample,
    TrainingExample,
    TrainingSet,
    encode_examples,
)
from dwise_predict.zoo.tiny_bd.recipe.train import TrainConfig

BS = 8
CONFIG = TinyBDConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, block_size=BS)


def examples(n: int, seed: int) -> list[EncodedExample]:
    """Alternating one-digit sums (math) and "say hi" echoes (chat), encoded for block ``BS``."""
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        if i % 2:
            recs.append(TrainingExample(f"What is {a} + {b}?", f"{a + b}", "math", "generated"))
        else:
            recs.append(TrainingExample(f"Say hi to {a}{b}", f"hi {a}{b}", "chat", "generated"))
    enc, dropped = encode_examples(recs, block_size=BS)
    assert dropped == 0
    return enc


def training_set(enc: list[EncodedExample]) -> TrainingSet:
    """``enc`` as the prepared training set ``train`` takes instead of building one."""
    counts = dict(Counter(e.category for e in enc))
    return TrainingSet(examples=enc, counts=counts, dropped_too_long=0, eval_prompts_checked=0)


def quick_config(max_steps: int, **extra: Any) -> TrainConfig:
    """A seconds-long run: one thread, a high learning rate, no loss logging to speak of."""
    return TrainConfig(
        max_steps=max_steps,
        minutes=5,
        warmup_steps=5,
        lr=3e-3,
        batch_tokens=16 * 60,
        threads=1,
        seed=0,
        log_every=10**6,
        **extra,
    )
