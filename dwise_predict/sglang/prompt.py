"""The raw prompt of a request SGLang is serving, as the bundle's features expect it.

SGLang 0.5.23's ``Req`` keeps only the prompt's token ids (after the model's chat template),
not its text. Traces and the bundles trained on them count words and newlines of the raw
prompt, so the plugin decodes the ids with the server's tokenizer and removes the template's
frame (the bundle carries the template) before computing any text feature. The token count
stays SGLang's own: that one is defined after the template.

Decoding is most of what an arrival costs the scheduler thread (tens of microseconds per
request with a Rust tokenizer, growing with the prompt). For byte-level BPE tokenizers (GPT-2
style: Qwen, LLaMA 3, LLaDA, tiny-bd) the decoded text is the UTF-8 reading of the
concatenated byte strings of the tokens, so :class:`PromptDecoder` keeps one byte string per
token id and joins them (a table lookup). It checks itself against the tokenizer's own
``decode`` on the first requests it sees and falls back to ``decode`` for good at the first
difference, so a tokenizer it misreads costs speed, never features.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any

import numpy as np

from ..features import PromptFeaturizer
from . import seam

log = logging.getLogger(__name__)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable character map, character to byte."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class PromptDecoder:
    """Token ids -> text, as ``tokenizer.decode(ids, skip_special_tokens=False)`` gives it."""

    def __init__(self, tokenizer: Any, verify: int = 64) -> None:
        self.tokenizer = tokenizer
        self.verify = int(verify)
        self.table: np.ndarray | None = self._byte_table(tokenizer)

    @property
    def fast(self) -> bool:
        return self.table is not None

    @staticmethod
    def _byte_table(tokenizer: Any) -> np.ndarray | None:
        """One byte string per token id, or None when the tokenizer is not byte-level BPE."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # transformers' fast one
        try:
            import tokenizers

            if not isinstance(backend.decoder, tokenizers.decoders.ByteLevel):
                return None
            added = backend.get_added_tokens_decoder()
            size = backend.get_vocab_size(with_added_tokens=True)
        except Exception:  # not a `tokenizers` tokenizer: decode() it is
            return None
        alphabet = _byte_level_alphabet()
        table = np.empty(size, dtype=object)
        for i in range(size):
            if i in added:
                table[i] = added[i].content.encode("utf-8")
                continue
            token = backend.id_to_token(i)
            if token is None or any(c not in alphabet for c in token):
                return None
            table[i] = bytes(alphabet[c] for c in token)
        return table

    def _slow(self, ids: Any) -> str:
        try:  # the template's markers are often special tokens: keep them to find the frame
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=False) or "")
        except TypeError:  # a tokenizer without the option
            return str(self.tokenizer.decode(list(ids)) or "")

    def __call__(self, ids: Any) -> str:
        table = self.table
        if table is None:
            return self._slow(ids)
        idx = _as_index(ids)
        try:
            text = b"".join(table[idx].tolist()).decode("utf-8", errors="replace")
        except (IndexError, TypeError):  # an id outside the table: the tokenizer decides
            return self._slow(ids)
        if self.verify > 0:
            self.verify -= 1
            slow = self._slow(ids)
            if slow != text:
                log.info(
                    "the tokenizer's decode differs from its byte table on a served prompt: "
                    "the plugin decodes with tokenizer.decode from now on"
                )
                self.table = None
                return slow
        return text


def _as_index(ids: Any) -> np.ndarray:
    if isinstance(ids, array) and ids.typecode == "q":
        return np.frombuffer(ids, dtype=np.int64)  # SGLang's Req keeps an array("q"): no copy
    return np.asarray(ids, dtype=np.int64)


def user_prompt(
    ids: Any, decode: PromptDecoder | None, featurizer: PromptFeaturizer | None = None
) -> str:
    """The user's prompt in the token ids ``ids``: decoded, without the chat template's
    frame; "" when the server has no tokenizer (``--skip-tokenizer-init``; the text features
    are then 0 and the estimate rests on the token count, docs/sglang.md)."""
    if decode is None:
        return ""
    text = decode(ids)
    return featurizer.user_text(text) if featurizer is not None else text


def served_prompt(
    req: Any, decode: PromptDecoder | None, featurizer: PromptFeaturizer | None = None
) -> str:
    """The user's prompt of SGLang's request ``req`` (:func:`user_prompt` of its ids)."""
    return user_prompt(seam.prompt_ids(req), decode, featurizer)


def featurizer_of(tokenizer: Any) -> PromptFeaturizer | None:
    """A featurizer from the server's own tokenizer and its chat template (a ``transformers``
    tokenizer's ``chat_template``), so observe mode counts the raw prompt's words and newlines
    without a bundle; None without a template (the counts are then the served text's)."""
    template = getattr(tokenizer, "chat_template", None)
    if tokenizer is None or not isinstance(template, str) or not template:
        return None
    try:
        return PromptFeaturizer(getattr(tokenizer, "backend_tokenizer", tokenizer), template)
    except Exception as e:  # a template this renderer cannot read: count the served text
        log.warning(
            "cannot read the server tokenizer's chat template (%s): serving traces "
            "count the words of the prompt as served, template included",
            e,
        )
        return None
