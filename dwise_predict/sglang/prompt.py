"""The raw prompt of a request SGLang is serving, as the bundle's features expect it.

SGLang 0.5.23's ``Req`` keeps the prompt as the server received it, which for chat requests is
the text after the model's chat template, and it sometimes keeps only the ids. Traces and the
bundles trained on them count words and newlines of the raw prompt, so the plugin decodes the
ids when it must and removes the template's frame (the bundle carries the template) before
computing any text feature. The token count stays SGLang's own: that one is defined after the
template.
"""

from __future__ import annotations

from typing import Any

from ..features import PromptFeaturizer


def served_prompt(
    req: Any, tokenizer: Any = None, featurizer: PromptFeaturizer | None = None
) -> str:
    """The user's prompt of ``req``: its text (or its ids decoded with ``tokenizer``) without
    the chat template's frame; "" when SGLang kept no text and there is no tokenizer (a server
    started with ``--skip-tokenizer-init``; the text features are then 0 and the estimate rests
    on the token count, docs/sglang.md)."""
    text = getattr(req, "origin_input_text", None)
    if not text and tokenizer is not None:
        ids = list(req.origin_input_ids)
        try:  # the template's markers are often special tokens: keep them to find the frame
            text = tokenizer.decode(ids, skip_special_tokens=False)
        except TypeError:  # a tokenizer without the option
            text = tokenizer.decode(ids)
    text = str(text or "")
    return featurizer.user_text(text) if featurizer is not None else text
