"""Adapter for the project's reference model ``tiny-bd`` (prefix caching of finished blocks).

tiny-bd attends block-causally, so every clean block (prompt chunk or finished output block)
can be kept as keys/values and never recomputed: the adapter stores them in one preallocated
tensor per layer with a seat (*slot*) per running request, right-padded to the longest cache
in the round, and masks the padding out. That is what makes batching requests with different
cache lengths exact: a row never attends another row's or a padding key.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dwise_predict.errors import ModelError
from dwise_predict.features import PromptFeaturizer
from dwise_predict.fingerprint import text_hash

from .base import AdapterInfo, BaseAdapter, BlockBatch, BlockOutput


class TinyBDAdapter(BaseAdapter):
    """Runs a :class:`~dwise_predict.zoo.tiny_bd.model.TinyBDModel` block by block with a KV
    cache."""

    def __init__(self, loaded: object, *, model_id: str = "tiny-bd") -> None:
        from dwise_predict.zoo.tiny_bd.io import TinyBD

        if not isinstance(loaded, TinyBD):
            raise ModelError(
                f"TinyBDAdapter needs a loaded TinyBD checkpoint, got {type(loaded).__name__}"
            )
        self.model = loaded.model.eval()
        cfg = self.model.config
        self.config = cfg
        self.featurizer = PromptFeaturizer(loaded.tokenizer, loaded.chat_template)
        dtype = next(self.model.parameters()).dtype
        self.device = next(self.model.parameters()).device
        self.info = AdapterInfo(
            model_id=model_id,
            revision=loaded.revision,
            dtype=str(dtype).removeprefix("torch."),
            hidden_size=cfg.d_model,
            vocab_size=cfg.vocab_size,
            mask_token_id=cfg.mask_token_id,
            eos_token_ids=(cfg.eos_token_id,),
            max_context=cfg.max_position,
            native_block_size=cfg.block_size,
            tokenizer_hash=text_hash(loaded.tokenizer.to_str()),
            chat_template_hash=text_hash(loaded.chat_template),
        )
        self._k: list[torch.Tensor] = []
        self._v: list[torch.Tensor] = []
        self._lengths: list[int] = []
        self._capacity = 0

    # -- cache -------------------------------------------------------------------------------
    def open_slots(self, n_slots: int, capacity: int) -> None:
        cfg = self.config
        dtype = next(self.model.parameters()).dtype
        shape = (n_slots, cfg.n_heads, capacity, cfg.head_dim)
        self._k = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.n_layers)]
        self._v = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(cfg.n_layers)]
        self._lengths = [0] * n_slots
        self._capacity = capacity

    def reset_slot(self, slot: int) -> None:
        self._lengths[slot] = 0  # stale keys beyond the length are masked, never read

    def cache_length(self, slot: int) -> int:
        return self._lengths[slot]

    # -- forward -----------------------------------------------------------------------------
    def forward(self, batch: BlockBatch) -> BlockOutput:
        n, t = batch.input_ids.shape
        lengths = [self._lengths[s] for s in batch.slots]
        p = max(lengths)
        dev = self.device
        if batch.slots == list(range(len(self._lengths))):  # every seat runs: a view, no copy
            past = [(k[:, :, :p], v[:, :, :p]) for k, v in zip(self._k, self._v)]
        else:
            idx = torch.tensor(batch.slots, device=dev)
            past = [
                (k[:, :, :p].index_select(0, idx), v[:, :, :p].index_select(0, idx))
                for k, v in zip(self._k, self._v)
            ]
        mask = block_attention_mask(lengths, batch.n_valid, p, t, dev, batch.segments)
        out = self.model(batch.input_ids.to(dev), batch.position_ids.to(dev), mask, past)
        for row, slot in enumerate(batch.slots):
            m, start = batch.commit[row], self._lengths[slot]
            if m == 0:
                continue
            if start + m > self._capacity:
                raise ModelError(
                    f"KV cache of slot {slot} would exceed its capacity {self._capacity}; "
                    "this is a bug in the engine's capacity planning"
                )
            for layer, (k_new, v_new) in enumerate(out.kv):
                self._k[layer][slot, :, start : start + m] = k_new[row, :, :m]
                self._v[layer][slot, :, start : start + m] = v_new[row, :, :m]
            self._lengths[slot] = start + m
        return BlockOutput(logits=out.logits, hidden=out.hidden)


def block_attention_mask(
    cache_lengths: list[int],
    n_valid: list[int],
    p: int,
    t: int,
    device: torch.device | None = None,
    segments: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[n, 1, t, p + t]`` bool: row i's real tokens see its cache and its real tokens of the same
    or an earlier segment (see :class:`~.base.BlockBatch`).

    Padding keys (cache beyond ``cache_lengths[i]``, tokens beyond ``n_valid[i]``) are hidden. A
    padding *query* sees only itself, so no softmax row is empty (no NaN); its output is never read.
    """
    n = len(cache_lengths)
    key_cache = (
        torch.arange(p, device=device)[None, :]
        < torch.tensor(cache_lengths, device=device)[:, None]
    )  # [n, p]
    valid = (
        torch.arange(t, device=device)[None, :] < torch.tensor(n_valid, device=device)[:, None]
    )  # [n, t]
    new = valid[:, None, :] & valid[:, :, None]  # [n, t(query), t(key)]
    if segments is not None:
        seg = segments.to(device)
        new = new & (seg[:, None, :] <= seg[:, :, None])
    new = new | torch.eye(t, dtype=torch.bool, device=device)[None]
    cache = key_cache[:, None, :] & valid[:, :, None]
    return torch.cat([cache, new], dim=-1).view(n, 1, t, p + t)


def load_tiny_bd(
    name_or_path: str | Path = "tiny-bd", *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> TinyBDAdapter:
    """Load the shipped ``tiny-bd`` or a tiny-bd checkpoint folder as an adapter."""
    from dwise_predict.zoo.tiny_bd.io import from_pretrained

    loaded = from_pretrained(name_or_path, dtype=dtype)
    loaded.model.to(device)
    return TinyBDAdapter(loaded, model_id=tiny_bd_model_id(name_or_path))


def tiny_bd_model_id(name_or_path: str | Path) -> str:
    """The model id traces (and a server) name tiny-bd or a checkpoint folder of it by:
    ``tiny-bd`` for the shipped weights, ``tiny-bd:FOLDER`` for a checkpoint."""
    from dwise_predict.zoo.tiny_bd.io import NAME

    return NAME if str(name_or_path) == NAME else f"tiny-bd:{Path(name_or_path).name}"
