"""tiny-bd's byte-level tokenizer: one token per UTF-8 byte, plus a few special tokens.

Built with Hugging Face ``tokenizers`` (a byte-level BPE with no merges), so it saves as a
standard ``tokenizer.json`` that the light core's :class:`~dwise_predict.features.PromptFeaturizer`
and any HF tooling can load without torch. Nothing is downloaded: the vocabulary is the 256
byte values.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from dwise_predict.errors import ModelError

#: special tokens, in id order (ids 0..7); bytes follow at ids 8..263
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|pad|>",
    "<|mask|>",
    "<|eos|>",
    "<|bos|>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<|sep|>",
)
PAD, MASK, EOS = 0, 1, 2

#: The chat template (Jinja, rendered like transformers' apply_chat_template).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def build_tokenizer() -> Tokenizer:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel.alphabet() is a set: order bytes canonically by their byte value
    byte_chars = _bytes_to_unicode()
    if set(byte_chars.values()) != set(alphabet):
        raise ModelError(
            "this tokenizers release changed the byte-level alphabet; tiny-bd's "
            "vocabulary cannot be rebuilt: install the pinned tokenizers version"
        )
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for b in range(256):
        vocab[byte_chars[b]] = len(SPECIAL_TOKENS) + b
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode map (the one ByteLevel uses)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))
