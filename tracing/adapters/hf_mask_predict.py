"""Generic adapter for Hugging Face mask-predict dLLMs (LLaDA / LLaDA2 / SDAR style).

Such models are loaded with ``trust_remote_code=True`` and differ in their cache classes, so
this adapter uses the one interface they share: a plain forward over ``input_ids`` with an
attention mask, returning ``logits`` and ``hidden_states`` (``output_hidden_states=True``;
the last entry is the final-layer hidden state the LM head reads). It keeps each request's
committed tokens (prompt chunks and finished blocks) per slot and re-runs the committed
prefix with the current block every round, under an explicit 4-D block-causal mask:

* ``attention="block_causal"`` (default; LLaDA2, SDAR): a token sees every token of its own
  chunk and of earlier chunks. Chunks are the engine's prompt chunks and output blocks, so
  this is exactly the attention a prefix-cached server computes — without the cache.
* ``attention="full"`` (LLaDA 1.x-style fully bidirectional models): every real token sees
  every real token of the visible sequence (committed prefix + current block).

Recomputing the prefix costs O(length²) per round: fine for tracing a few thousand requests
on a GPU, and it is correct for any model that accepts a 4-D boolean mask. A model-specific
adapter with its own KV cache is a drop-in replacement behind the same protocol.
See docs/tracing.md for running LLaDA2/SDAR on a GPU machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from dwise_predict.errors import ConfigError, MissingDependencyError, ModelError
from dwise_predict.features import PromptFeaturizer
from dwise_predict.fingerprint import text_hash

from .base import AdapterInfo, BaseAdapter, BlockBatch, BlockOutput

ATTENTION_MODES = ("block_causal", "full")
#: mask ids of known families whose tokenizers do not declare a mask token
KNOWN_MASK_IDS = {"llada": 126336}


@dataclass
class _SlotPrefix:
    tokens: list[int] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)  # chunk index of every committed token
    n_chunks: int = 0


def prefix_attention_mask(
    chunk_ids: list[list[int]], n_real: list[int], width: int, mode: str
) -> torch.Tensor:
    """``[n, 1, width, width]`` bool mask over right-padded rows of (prefix + current block) tokens.

    ``chunk_ids[i]`` gives each real token of row ``i`` its chunk; a token sees real tokens of
    chunks <= its own (``block_causal``) or all real tokens (``full``). Padding queries see only
    themselves so no softmax row is empty.
    """
    n = len(chunk_ids)
    mask = torch.zeros((n, width, width), dtype=torch.bool)
    for i, (ch, m) in enumerate(zip(chunk_ids, n_real)):
        c = torch.tensor(ch, dtype=torch.long)
        if mode == "block_causal":
            mask[i, :m, :m] = c[None, :] <= c[:, None]
        else:
            mask[i, :m, :m] = True
    mask |= torch.eye(width, dtype=torch.bool)[None]
    return mask[:, None]


class HFMaskPredictAdapter(BaseAdapter):
    """Drives any HF mask-predict LM block by block for the engine (no KV cache: prefix
    recompute)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        mask_token_id: int,
        block_size: int | None,
        attention: str = "block_causal",
        revision: str | None = None,
        chat_template: str | None = None,
        max_context: int | None = None,
    ) -> None:
        if attention not in ATTENTION_MODES:
            raise ConfigError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        self.model = model.eval()
        self.attention = attention
        self.device = next(model.parameters()).device
        cfg = model.config
        hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None)
        if hidden is None:
            raise ModelError(
                f"{model_id}: config has no hidden_size/d_model; cannot record the hidden size"
            )
        template = (
            chat_template
            if chat_template is not None
            else getattr(tokenizer, "chat_template", None)
        )
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self.featurizer = PromptFeaturizer(
            tokenizer.backend_tokenizer, template, template_kwargs=special
        )
        eos = (
            tokenizer.eos_token_id
            if tokenizer.eos_token_id is not None
            else getattr(cfg, "eos_token_id", None)
        )
        if eos is None:
            raise ModelError(
                f"{model_id}: neither tokenizer nor config declares an end-of-sequence token"
            )
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        ctx = (
            max_context
            or getattr(cfg, "max_position_embeddings", None)
            or getattr(cfg, "max_sequence_length", None)
        )
        self.info = AdapterInfo(
            model_id=model_id,
            revision=revision,
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            hidden_size=int(hidden),
            vocab_size=int(cfg.vocab_size),
            mask_token_id=int(mask_token_id),
            eos_token_ids=eos_ids,
            max_context=int(ctx or 4096),
            native_block_size=block_size,
            tokenizer_hash=text_hash(tokenizer.backend_tokenizer.to_str()),
            chat_template_hash=text_hash(template) if template else None,
            extra={"attention": attention, "kv_cache": "none (prefix recompute)"},
        )
        self._slots: list[_SlotPrefix] = []

    def open_slots(self, n_slots: int, capacity: int) -> None:
        self._slots = [_SlotPrefix() for _ in range(n_slots)]

    def reset_slot(self, slot: int) -> None:
        self._slots[slot] = _SlotPrefix()

    def forward(self, batch: BlockBatch) -> BlockOutput:
        n, t = batch.input_ids.shape
        seqs, chunks, starts = [], [], []
        for row, slot in enumerate(batch.slots):
            pre = self._slots[slot]
            m = batch.n_valid[row]
            seg = batch.segments[row, :m].tolist() if batch.segments is not None else [0] * m
            seqs.append(pre.tokens + batch.input_ids[row, :m].tolist())
            chunks.append(pre.chunks + [pre.n_chunks + g for g in seg])
            starts.append(len(pre.tokens))
        width = max(len(s) for s in seqs)
        ids = torch.zeros((n, width), dtype=torch.long)
        pos = torch.zeros((n, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            pos[i, : len(s)] = torch.arange(len(s))
        mask = prefix_attention_mask(chunks, [len(s) for s in seqs], width, self.attention)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            output_hidden_states=True,
        )
        logits_all, hidden_all = out.logits, out.hidden_states[-1]
        logits = logits_all.new_zeros((n, t, logits_all.shape[-1]))
        hidden = hidden_all.new_zeros((n, t, hidden_all.shape[-1]))
        for row, slot in enumerate(batch.slots):
            m, start = batch.n_valid[row], starts[row]
            logits[row, :m] = logits_all[row, start : start + m]
            hidden[row, :m] = hidden_all[row, start : start + m]
            c = batch.commit[row]
            if c:
                pre = self._slots[slot]
                seg = batch.segments[row, :c].tolist() if batch.segments is not None else [0] * c
                pre.tokens.extend(batch.input_ids[row, :c].tolist())
                pre.chunks.extend([pre.n_chunks + g for g in seg])
                pre.n_chunks += seg[-1] + 1
        return BlockOutput(logits=logits, hidden=hidden)


def resolve_mask_token_id(tokenizer: Any, config: Any, mask_token_id: int | None) -> int:
    """The mask id: explicit > tokenizer's mask token > config.mask_token_id > known family
    default."""
    if mask_token_id is not None:
        return int(mask_token_id)
    for cand in (getattr(tokenizer, "mask_token_id", None), getattr(config, "mask_token_id", None)):
        if isinstance(cand, int):
            return cand
    mt = str(getattr(config, "model_type", "")).lower()
    for family, mid in KNOWN_MASK_IDS.items():
        if mt.startswith(family) and not mt.startswith(family + "2"):
            return mid
    raise ConfigError(
        f"cannot tell the mask token id of this {mt or 'model'}: pass --mask-token-id N "
        "(LLaDA: 126336; LLaDA2/SDAR: see the tokenizer's mask token)"
    )


def resolve_block_size(config: Any, block_size: int | None) -> int | None:
    if block_size is not None:
        return int(block_size)
    for key in ("block_size", "block_length", "bd_size"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def load_hf_mask_predict(
    name_or_path: str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str = "cpu",
    mask_token_id: int | None = None,
    block_size: int | None = None,
    attention: str = "block_causal",
    revision: str | None = None,
    **_: Any,
) -> HFMaskPredictAdapter:
    """Load a mask-predict dLLM from a folder or hub id with ``trust_remote_code``."""
    try:
        import transformers
        from transformers import AutoConfig, AutoTokenizer
    except ImportError as e:  # pragma: no cover
        raise MissingDependencyError(
            "hf-mask-predict needs transformers: pip install 'dwise-predict[train]'"
        ) from e
    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=True, revision=revision)
        tokenizer = AutoTokenizer.from_pretrained(
            name_or_path, trust_remote_code=True, revision=revision
        )
    except (OSError, ValueError) as e:
        raise ModelError(
            f"cannot load {name_or_path!r}: {e}; pass a local model folder or a hub id "
            "(downloads need network and HF_HUB_OFFLINE unset)"
        ) from e
    model = None
    errors = []
    for cls_name in ("AutoModelForMaskedLM", "AutoModelForCausalLM", "AutoModel"):
        cls = getattr(transformers, cls_name)
        try:
            model = cls.from_pretrained(
                name_or_path, config=config, trust_remote_code=True, dtype=dtype, revision=revision
            )
            break
        except (ValueError, KeyError) as e:  # this auto class does not map the config
            errors.append(f"{cls_name}: {e}")
    if model is None:
        raise ModelError(f"cannot load {name_or_path!r} as a language model: {'; '.join(errors)}")
    model = model.to(device)
    commit = getattr(config, "_commit_hash", None)
    return HFMaskPredictAdapter(
        model,
        tokenizer,
        model_id=f"hf-mask-predict:{name_or_path}",
        revision=revision or commit,
        mask_token_id=resolve_mask_token_id(tokenizer, config, mask_token_id),
        block_size=resolve_block_size(config, block_size),
        attention=attention,
    )
