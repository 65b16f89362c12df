"""A small, single-request reference decoder for tiny-bd (smoke tests and the model card).

The project's real decoder is the batched tracing engine (``dwise_predict.tracing``); this one
exists so the model package can check itself without it, with the same semantics:

* the chat-templated prompt is prefilled in chunks of ``block_size`` from position 0;
* each output block (starting at ``len(prompt)``) starts fully masked and, every round,
  unmasks the masked positions whose top-1 probability is >= ``threshold`` -- at least the
  single most confident one -- with greedy (argmax) tokens, never the mask token;
* a finished block is committed to the KV cache by a clean forward (not a round);
* decoding stops at an EOS inside a finished block or at ``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from dwise_predict.errors import PredictorInputError

from .model import KV, TinyBDModel
from .tokenizer import EOS, MASK


@dataclass
class Generation:
    """What one request did: its tokens, rounds per output block, and why it stopped."""

    tokens: list[int]
    rounds_per_block: list[int]
    finished_eos: bool
    tokens_per_round: list[int] = field(default_factory=list)

    @property
    def total_rounds(self) -> int:
        return sum(self.rounds_per_block)

    @property
    def output_tokens(self) -> int:
        """Tokens up to (not including) the first EOS."""
        return self.tokens.index(EOS) if EOS in self.tokens else len(self.tokens)


def _extend(cache: KV | None, kv: KV) -> KV:
    if cache is None:
        return [(k, v) for k, v in kv]
    return [
        (torch.cat([c[0], k], dim=2), torch.cat([c[1], v], dim=2)) for c, (k, v) in zip(cache, kv)
    ]


@torch.inference_mode()
def prefill(model: TinyBDModel, prompt_ids: Sequence[int], block_size: int) -> KV | None:
    """KV cache of the prompt, computed chunk by chunk (chunk c sees chunks <= c)."""
    cache: KV | None = None
    for start in range(0, len(prompt_ids), block_size):
        chunk = torch.as_tensor(list(prompt_ids[start : start + block_size]), dtype=torch.long)[
            None
        ]
        pos = torch.arange(start, start + chunk.shape[1])[None]
        out = model(chunk, pos, None, cache)
        cache = _extend(cache, out.kv)
    return cache


@torch.inference_mode()
def generate(
    model: TinyBDModel,
    prompt_ids: Sequence[int],
    *,
    threshold: float = 0.95,
    max_new_tokens: int = 256,
    block_size: int | None = None,
) -> Generation:
    """Decode one request block by block with confidence-threshold unmasking."""
    if len(prompt_ids) == 0:
        raise PredictorInputError(
            "empty prompt: render the chat template first (it is never empty)"
        )
    bs = block_size or model.config.block_size
    cache = prefill(model, prompt_ids, bs)
    start = len(prompt_ids)
    tokens: list[int] = []
    rounds: list[int] = []
    per_round: list[int] = []
    finished_eos = False
    while len(tokens) < max_new_tokens:
        x = torch.full((1, bs), MASK, dtype=torch.long)
        pos = torch.arange(start, start + bs)[None]
        n_rounds = 0
        while bool((x == MASK).any()):
            logits = model(x, pos, None, cache).logits.float()[0]
            logits[:, MASK] = float(
                "-inf"
            )  # the mask token is never predicted (as in the tracing engine)
            probs = logits.softmax(-1)
            conf, pred = probs.max(-1)
            masked = x[0] == MASK
            conf = torch.where(masked, conf, torch.full_like(conf, -1.0))
            pick = masked & (conf >= threshold)
            if not bool(pick.any()):
                pick = torch.zeros_like(masked)
                pick[int(conf.argmax())] = True
            x[0, pick] = pred[pick]
            n_rounds += 1
            per_round.append(int(pick.sum()))
        rounds.append(n_rounds)
        block = x[0].tolist()
        tokens.extend(block)
        cache = _extend(cache, model(x, pos, None, cache).kv)
        start += bs
        if EOS in block:
            finished_eos = True
            break
    return Generation(
        tokens=tokens,
        rounds_per_block=rounds,
        finished_eos=finished_eos,
        tokens_per_round=per_round,
    )
