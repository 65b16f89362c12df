"""Prompt features for the admission predictor.

Two feature sets (docs/predictors.md, "Admission features"):

- ``"counts"``, the paper's: word count, newline count, token count after the chat template;
- ``"counts+lexical"`` (the default): those plus three counts read off the prompt's characters,
  digits and code symbols per mille of the characters and question marks. They tell a sum from a
  chat question of the same length, which the counts cannot, and they stay integers, so the ONNX
  export (float32 trees) compares exactly like LightGBM (float64).

Every feature is a count of the user's prompt, computed in microseconds with no model. The token
count must be the one the *served* model sees, i.e. after its chat template, so the featurizer
carries the model's tokenizer (a Hugging Face ``tokenizers`` file: no torch, no transformers) and
its chat template (Jinja, rendered like ``transformers`` does). A bundle ships both, and records
its feature names, which is how a scheduler process can predict from raw text alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, PredictorInputError
from .fingerprint import text_hash

#: the paper's three counts, in the column order traces record them
COUNT_FEATURES: tuple[str, ...] = ("word_count", "newline_count", "prompt_tokens")
#: the count features' column order (what traces, baselines and feature rows of three use)
FEATURE_NAMES: tuple[str, ...] = COUNT_FEATURES
#: counts read off the prompt's characters (:func:`lexical_features`)
LEXICAL_FEATURES: tuple[str, ...] = ("digit_permille", "symbol_permille", "question_marks")
#: the admission model's feature sets; a bundle records the names it was trained on
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "counts": COUNT_FEATURES,
    "counts+lexical": COUNT_FEATURES + LEXICAL_FEATURES,
}
DEFAULT_FEATURE_SET = "counts+lexical"
#: every feature this release computes, in the order :func:`feature_values` returns them
ALL_FEATURES: tuple[str, ...] = COUNT_FEATURES + LEXICAL_FEATURES
_POSITION: dict[str, int] = {name: i for i, name in enumerate(ALL_FEATURES)}

#: a prompt no user writes, rendered once to find what the chat template wraps around a prompt
_PROMPT_SENTINEL = "\x00dwise-prompt\x00"


def word_count(text: str) -> int:
    return len(text.split())


def newline_count(text: str) -> int:
    return text.count("\n")


_DIGITS = b"0123456789"
#: characters that mark code and formulas: brackets, operators, assignment, statement ends
_SYMBOLS = b"{}()[];=_<>+*/%"


def lexical_features(text: str) -> tuple[int, int, int]:
    """:data:`LEXICAL_FEATURES` of one prompt: ASCII digits and code symbols per mille of its
    characters, and its question marks.

    Counted on the UTF-8 bytes, where an ASCII character is one byte and no byte of another
    character is ASCII: the same counts as on the characters, several times faster (a scheduler
    computes them on every arrival)."""
    if not text:
        return 0, 0, 0
    raw = text.encode("utf-8", "surrogatepass")
    n = len(text)
    digits = len(raw) - len(raw.translate(None, _DIGITS))
    symbols = len(raw) - len(raw.translate(None, _SYMBOLS))
    return round(1000 * digits / n), round(1000 * symbols / n), text.count("?")


def prompt_counts(text: str) -> dict[str, int]:
    """The counts a trace row records of its user prompt, by column name: words, newlines and
    :data:`LEXICAL_FEATURES` (the token count is the tokenizer's, not the text's)."""
    return {
        "word_count": word_count(text),
        "newline_count": newline_count(text),
        **dict(zip(LEXICAL_FEATURES, lexical_features(text))),
    }


def check_feature_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple when every one is a feature this library computes, else an error
    naming the unknown ones (a bundle from a newer release)."""
    unknown = [n for n in names if n not in _POSITION]
    if unknown or not names:
        raise PredictorInputError(
            f"unknown admission features {unknown or list(names)}: this release computes "
            f"{sorted(ALL_FEATURES)}; upgrade dwise-predict to load this bundle"
        )
    return tuple(names)


def feature_positions(names: Sequence[str]) -> tuple[int, ...]:
    """Where each of ``names`` sits in :func:`feature_values`' output (computed once per model,
    so a row is a pick, not a lookup by name, on every arrival)."""
    return tuple(_POSITION[n] for n in check_feature_names(names))


def feature_set(name: str) -> tuple[str, ...]:
    """The feature names of a named set (:data:`FEATURE_SETS`)."""
    try:
        return FEATURE_SETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown admission feature set {name!r}; choose one of {sorted(FEATURE_SETS)}"
        ) from None


def needs_text(names: Sequence[str]) -> bool:
    """Whether features ``names`` read the prompt's characters (not just its three counts)."""
    return any(n in LEXICAL_FEATURES for n in names)


def feature_values(text: str, prompt_tokens: int, lexical: bool) -> tuple[float, ...]:
    """:data:`ALL_FEATURES` of one request from its user prompt and served token count (the
    three counts only, without ``lexical``): the per-arrival path of a scheduler."""
    counts = (float(word_count(text)), float(newline_count(text)), float(prompt_tokens))
    if not lexical:
        return counts
    return counts + tuple(float(v) for v in lexical_features(text))


def feature_row(names: Sequence[str], text: str, prompt_tokens: int) -> tuple[float, ...]:
    """One request's features ``names`` (any order) from its user prompt and served token
    count."""
    values = feature_values(text, prompt_tokens, needs_text(names))
    return tuple(values[i] for i in feature_positions(names))


def lexical_matrix(prompts: Sequence[str | None]) -> np.ndarray | None:
    """``(n, 3)`` :data:`LEXICAL_FEATURES` of ``prompts``; None when a prompt is missing (traces
    written with prompts redacted)."""
    if any(p is None for p in prompts):
        return None
    out = np.zeros((len(prompts), len(LEXICAL_FEATURES)), dtype=np.float64)
    for i, p in enumerate(prompts):
        out[i] = lexical_features(str(p))
    return out


def select_features(
    names: Sequence[str], counts: np.ndarray, lexical: np.ndarray | None
) -> np.ndarray:
    """Features ``names`` as ``(n, len(names))`` from the count columns ``counts``
    (:data:`COUNT_FEATURES` order) and the lexical ones (None: the prompts were redacted)."""
    counts = np.asarray(counts, dtype=np.float64).reshape(-1, len(COUNT_FEATURES))
    if needs_text(names) and lexical is None:
        raise PredictorInputError(
            f"the admission features {list(names)} read each prompt's lexical counts, and these "
            "traces were written with prompts redacted before trace schema v3, which records "
            "them: re-trace, or use a bundle trained with `--admission-features counts`"
        )
    columns: dict[str, np.ndarray] = dict(zip(COUNT_FEATURES, counts.T))
    if lexical is not None:
        columns.update(zip(LEXICAL_FEATURES, np.asarray(lexical, dtype=np.float64).T))
    return (
        np.column_stack([columns[n] for n in names]) if len(counts) else np.empty((0, len(names)))
    )


@dataclass
class ChatTemplate:
    """A Jinja chat template rendered the way ``transformers.apply_chat_template`` does."""

    source: str

    def __post_init__(self) -> None:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined
        )

        def raise_exception(message: str) -> None:
            raise ConfigError(f"chat template error: {message}")

        env.globals["raise_exception"] = raise_exception
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as e:
            raise ConfigError(f"invalid chat template: {e}") from e

    def render(self, prompt: str, add_generation_prompt: bool = True, **kwargs: Any) -> str:
        return self._template.render(
            messages=[{"role": "user", "content": prompt}],
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )

    @property
    def hash(self) -> str:
        return text_hash(self.source)


class PromptFeaturizer:
    """Turns raw prompts into the admission predictor's feature matrix.

    ``tokenizer`` is a :class:`tokenizers.Tokenizer`; ``chat_template`` a Jinja string (or None:
    the raw prompt is tokenized as is). ``add_special_tokens`` follows the served model.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        *,
        add_special_tokens: bool = False,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = ChatTemplate(chat_template) if chat_template else None
        self.add_special_tokens = add_special_tokens
        self.template_kwargs = dict(template_kwargs or {})
        self._frame = self._template_frame()

    def _template_frame(self) -> tuple[str, str] | None:
        """What the chat template puts before and after a user prompt, or None when it does
        not wrap the prompt as one unchanged piece of text."""
        if self.chat_template is None:
            return None
        rendered = self.render(_PROMPT_SENTINEL)
        if rendered.count(_PROMPT_SENTINEL) != 1:
            return None
        prefix, _, suffix = rendered.partition(_PROMPT_SENTINEL)
        return prefix, suffix

    @classmethod
    def from_files(
        cls, tokenizer_file: str | Path, chat_template_file: str | Path | None = None, **kwargs: Any
    ) -> PromptFeaturizer:
        from tokenizers import Tokenizer

        try:
            tok = Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # tokenizers raises a bare Exception on bad files
            raise ConfigError(f"cannot load tokenizer {tokenizer_file}: {e}") from e
        template = None
        if chat_template_file is not None:
            template = _read_template(Path(chat_template_file))
        return cls(tok, template, **kwargs)

    @classmethod
    def from_pretrained(cls, folder: str | Path, **kwargs: Any) -> PromptFeaturizer:
        """The featurizer of a model folder in Hugging Face layout (``tokenizer.json`` and, if
        present, ``tokenizer_config.json`` with its ``chat_template``): the tokens the served model
        sees."""
        folder = Path(folder)
        tok = folder / "tokenizer.json"
        if not tok.is_file():
            raise ConfigError(
                f"{folder} has no tokenizer.json; pass --tokenizer FILE (and --chat-template FILE)"
            )
        cfg = folder / "tokenizer_config.json"
        template = None
        if cfg.is_file():
            data = json.loads(cfg.read_text(encoding="utf-8"))
            template = (
                data.get("chat_template") if isinstance(data.get("chat_template"), str) else None
            )
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(tok)), template, **kwargs)

    def render(self, prompt: str) -> str:
        if self.chat_template is None:
            return prompt
        return self.chat_template.render(prompt, **self.template_kwargs)

    def user_text(self, text: str) -> str:
        """The user's prompt inside ``text`` when ``text`` is one prompt rendered by this chat
        template, else ``text`` unchanged.

        A server's request holds the prompt after the chat template, but traces record word and
        newline counts of the raw prompt, and so do the features a bundle was trained on; the
        template's own words and newlines would shift every served request's features. Only an
        exact frame is removed: text that is not a templated prompt is never cut.
        """
        if self._frame is None:
            return text
        prefix, suffix = self._frame
        if (
            len(text) >= len(prefix) + len(suffix)
            and text.startswith(prefix)
            and text.endswith(suffix)
        ):
            return text[len(prefix) : len(text) - len(suffix)]
        return text

    def token_count(self, prompt: str) -> int:
        return len(
            self.tokenizer.encode(
                self.render(prompt), add_special_tokens=self.add_special_tokens
            ).ids
        )

    def token_counts(self, prompts: Sequence[str]) -> np.ndarray:
        rendered = [self.render(p) for p in prompts]
        encs = (
            self.tokenizer.encode_batch(rendered, add_special_tokens=self.add_special_tokens)
            if len(rendered) > 1
            else [
                self.tokenizer.encode(r, add_special_tokens=self.add_special_tokens)
                for r in rendered
            ]
        )
        return np.fromiter((len(e.ids) for e in encs), dtype=np.float64, count=len(encs))

    def __call__(
        self, prompts: str | Sequence[str], names: Sequence[str] = COUNT_FEATURES
    ) -> np.ndarray:
        """Feature matrix ``(n, len(names))`` float64 in ``names`` order (the three counts by
        default)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise PredictorInputError(f"prompt #{i} is {type(p).__name__}, expected str")
        counts = np.empty((len(prompts), 3), dtype=np.float64)
        if len(prompts) == 0:
            return np.empty((0, len(names)), dtype=np.float64)
        counts[:, 0] = [word_count(p) for p in prompts]
        counts[:, 1] = [newline_count(p) for p in prompts]
        counts[:, 2] = self.token_counts(prompts)
        lexical = lexical_matrix(prompts) if needs_text(names) else None
        return select_features(names, counts, lexical)

    @property
    def tokenizer_hash(self) -> str:
        return text_hash(self.tokenizer.to_str())

    @property
    def chat_template_hash(self) -> str | None:
        return self.chat_template.hash if self.chat_template else None


def _read_template(path: Path) -> str:
    """A chat template from a ``.jinja`` file or a ``tokenizer_config.json``'s ``chat_template``."""
    if not path.exists():
        raise ConfigError(f"chat template file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
        tpl = data.get("chat_template")
        if not isinstance(tpl, str):
            raise ConfigError(f"{path} has no string 'chat_template'; pass a .jinja file instead")
        return tpl
    return text
