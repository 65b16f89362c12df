"""The raw prompt of a request SGLang is serving, as the bundle's features expect it.

SGLang 0.5.23's ``Req`` keeps only the prompt's token ids (after the model's chat template),
not its text. Traces and the bundles trained on them count words and newlines of the raw
prompt, so the plugin decodes the ids with the server's tokenizer and removes the template's
frame (the bundle carries the template) before computing any text feature. The token count
stays SGLang's own: that one is defined after the template.
"""

from __future__ import annotations

from typing import Any

from ..features import PromptFeaturizer
from . import seam


def served_prompt(
    req: Any, tokenizer: Any = None, featurizer: PromptFeaturizer | None = None
) -> str:
    """The user's prompt of ``req``: its ids decoded with ``tokenizer``, without the chat
    template's frame; "" when the server has no tokenizer (``--skip-tokenizer-init``; the
    text features are then 0 and the estimate rests on the token count, docs/sglang.md)."""
    if tokenizer is None:
        return ""
    ids = list(seam.prompt_ids(req))
    try:  # the template's markers are often special tokens: keep them to find the frame
        text = tokenizer.decode(ids, skip_special_tokens=False)
    except TypeError:  # a tokenizer without the option
        text = tokenizer.decode(ids)
    text = str(text or "")
    return featurizer.user_text(text) if featurizer is not None else text
