"""SYNTHETIC trace tables for tests and benchmarks: schema-valid, with a planted signal.

Nothing here comes from a real dLLM. Each request gets two latent difficulties: ``z_blocks``
(how many output blocks it writes) and ``z_steps`` (how many rounds each block needs). Prompt
features carry the category (categories differ in prompt length and base work) and a little
within-category signal; the first-round hidden vector carries both latents (plus noise). So a
correct refinement model must beat the admission model overall and, above all, within category,
which is what the real first round does in the DWISE paper.

Prompts are made of a small vocabulary so that :func:`synthetic_featurizer` (a WordLevel
tokenizer + chat template) reproduces the trace's ``prompt_tokens`` from the raw text.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, models, pre_tokenizers

from dwise_predict.features import LEXICAL_FEATURES, PromptFeaturizer, lexical_features
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.traces import (
    META_FINGERPRINT,
    META_SCHEMA_VERSION,
    TRACE_SCHEMA,
    TRACE_SCHEMA_VERSION,
    prompt_blocks,
)

WORDS = tuple(
    [
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "it",
        "you",
        "that",
        "he",
        "was",
        "for",
        "on",
        "are",
        "with",
        "as",
        "his",
        "they",
        "be",
        "at",
        "one",
        "have",
        "this",
        "from",
        "or",
        "had",
        "by",
        "word",
        "but",
        "what",
        "some",
        "we",
        "can",
        "out",
        "other",
        "were",
        "all",
        "there",
        "when",
        "up",
        "use",
        "your",
        "how",
        "said",
        "an",
        "each",
        "she",
        "which",
        "do",
        "their",
        "time",
        "if",
        "will",
        "way",
        "about",
        "many",
        "then",
        "them",
        "write",
        "would",
        "like",
        "so",
        "these",
        "her",
        "long",
        "make",
        "thing",
        "see",
        "him",
        "two",
        "has",
        "look",
        "code",
        "math",
        "answer",
        "option",
        "list",
        "explain",
    ]
)
CHAT_TEMPLATE = (
    "<|user|> {{ messages[0]['content'] }}{% if add_generation_prompt %} <|assistant|>{% endif %}"
)


@dataclass(frozen=True)
class Category:
    """How one synthetic category's prompts look and how much denoising work they need."""

    name: str
    words: tuple[int, int]  # prompt word-count range
    newline_rate: float  # newlines per word
    log_blocks: float  # mean log output blocks
    log_steps: float  # mean log rounds per block


CATEGORIES: tuple[Category, ...] = (
    Category("chat", (8, 60), 0.02, 1.3, 2.3),
    Category("code", (20, 160), 0.15, 1.6, 1.2),
    Category("math", (15, 90), 0.05, 1.7, 1.7),
    Category("mcq", (40, 200), 0.10, 0.2, 1.0),
    Category("summarize", (150, 400), 0.04, 1.0, 2.0),
)


def synthetic_tokenizer() -> Tokenizer:
    vocab = {w: i for i, w in enumerate(["[UNK]", "<|", "|>", "user", "assistant", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def synthetic_featurizer() -> PromptFeaturizer:
    return PromptFeaturizer(synthetic_tokenizer(), CHAT_TEMPLATE)


def synthetic_fingerprint(
    hidden_size: int,
    block_size: int = 32,
    output_budget: int = 256,
    featurizer: PromptFeaturizer | None = None,
) -> ModelFingerprint:
    f = featurizer or synthetic_featurizer()
    return ModelFingerprint(
        model_id="synthetic/planted-bd",
        revision="synthetic",
        block_size=block_size,
        threshold=0.9,
        mask_token_id=0,
        hidden_size=hidden_size,
        max_new_tokens=output_budget,
        dtype="float32",
        tokenizer_hash=f.tokenizer_hash,
        chat_template_hash=f.chat_template_hash,
        extra={"synthetic": True},
    )


def make_traces(
    n: int,
    hidden_size: int = 64,
    *,
    seed: int = 0,
    categories: tuple[Category, ...] = CATEGORIES,
    block_size: int = 32,
    output_budget: int = 256,
    hidden_noise: float = 2.0,
    id_prefix: str = "req",
) -> pa.Table:
    """A SYNTHETIC trace table of ``n`` requests (round-robin over ``categories``)."""
    rng = np.random.default_rng(seed)
    dirs = (
        np.random.default_rng(12345)
        .normal(size=(2 + len(CATEGORIES), hidden_size))
        .astype(np.float32)
    )
    featurizer = synthetic_featurizer()
    budget_blocks = output_budget // block_size
    cols: dict[str, list] = {f.name: [] for f in TRACE_SCHEMA}
    prompts = []
    cat_of = [categories[i % len(categories)] for i in range(n)]
    for c in cat_of:
        n_words = int(rng.integers(c.words[0], c.words[1] + 1))
        words = rng.choice(WORDS, size=n_words).tolist()
        for j in range(1, n_words):
            if rng.random() < c.newline_rate:
                words[j] = "\n" + words[j]
        prompts.append(" ".join(words))
    feats = featurizer(prompts)
    z_blocks = rng.normal(size=n)
    z_steps = rng.normal(size=n)
    for i, c in enumerate(cat_of):
        words = feats[i, 0]
        mid = np.exp(np.mean(np.log(c.words)))
        raw_blocks = np.exp(c.log_blocks + 0.25 * np.log(words / mid) + 0.6 * z_blocks[i])
        hit = raw_blocks >= budget_blocks + 0.5
        n_blocks = int(np.clip(np.rint(raw_blocks), 1, budget_blocks))
        steps = np.exp(c.log_steps + 0.45 * z_steps[i] + 0.2 * rng.normal(size=n_blocks))
        rpb = np.clip(np.rint(steps), 1, block_size).astype(int).tolist()
        ci = [k.name for k in CATEGORIES].index(c.name) if c in CATEGORIES else 0
        hidden = (
            dirs[2 + ci]
            + z_blocks[i] * dirs[0]
            + z_steps[i] * dirs[1]
            + hidden_noise * rng.normal(size=hidden_size)
        ).astype(np.float32)
        out_tokens = (
            output_budget
            if hit
            else (n_blocks - 1) * block_size + int(rng.integers(1, block_size + 1))
        )
        p = prompts[i]
        tokens = int(feats[i, 2])
        row = {
            "schema_version": TRACE_SCHEMA_VERSION,
            "request_id": f"{id_prefix}-{seed}-{i:06d}",
            "category": c.name,
            "source": f"synthetic/{c.name}",
            "prompt": p,
            "prompt_sha256": hashlib.sha256(p.encode()).hexdigest(),
            "prompt_tokens": tokens,
            "word_count": int(feats[i, 0]),
            "newline_count": int(feats[i, 1]),
            **dict(zip(LEXICAL_FEATURES, lexical_features(p))),
            "prompt_blocks": prompt_blocks(tokens, block_size),
            "output_budget": output_budget,
            "block_size": block_size,
            "decoding": "low_confidence",
            "threshold": 0.9,
            "max_steps_per_block": block_size,
            "seed": seed,
            "output_tokens": out_tokens,
            "output_text": None,
            "output_blocks": n_blocks,
            "rounds_per_block": rpb,
            "total_rounds": int(sum(rpb)),
            "finished_eos": not hit,
            "hit_budget": bool(hit),
            "first_round_hidden": hidden,
            "round_wall_ms": None,
            "model_id": "synthetic/planted-bd",
            "model_revision": "synthetic",
            "model_dtype": "float32",
            "mask_token_id": 0,
            "hidden_size": hidden_size,
        }
        for k, v in row.items():
            cols[k].append(v)
    fp = synthetic_fingerprint(hidden_size, block_size, output_budget, featurizer)
    schema = TRACE_SCHEMA.with_metadata(
        {
            META_SCHEMA_VERSION: str(TRACE_SCHEMA_VERSION).encode(),
            META_FINGERPRINT: fp.to_json().encode(),
        }
    )
    return pa.Table.from_pydict(cols, schema=schema)


def write_traces(path: str | Path, table: pa.Table) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path
