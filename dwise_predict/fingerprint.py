"""The dLLM fingerprint: which model, tokenizer and decoding setting a trace or bundle belongs to.

A predictor learned on one model's denoising behaviour is meaningless for another model,
another block size or another confidence threshold: it would silently mis-rank every request.
Traces record the fingerprint of the model that produced them; bundles copy it; and
:meth:`ModelFingerprint.mismatches` lets a loader refuse the wrong pairing with a message
that names both sides.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError

#: Block layouts. ``absolute``: output blocks sit at absolute positions (multiples of the
#: block size); the prompt fills floor(L / block) blocks and its tail shares the first output
#: block, which then holds ``block - L mod block`` masks (SGLang's LLaDA2-style dLLM loop).
#: ``response``: the prompt fills ceil(L / block) blocks and every output block starts at a
#: block boundary counted from the prompt's end (a model that encodes its context apart).
ABSOLUTE = "absolute"
RESPONSE = "response"
BLOCK_ALIGNMENTS: tuple[str, ...] = (ABSOLUTE, RESPONSE)
#: what a fingerprint written before ``block_alignment`` was recorded means: every trace and
#: bundle made then was traced with the response-aligned layout
LEGACY_BLOCK_ALIGNMENT = RESPONSE

#: Fields that change what the predictors learn. A difference in any of them makes a
#: bundle invalid for a server. (dtype and revision are recorded but not compared.)
#: ``block_alignment`` is compared only where both sides record it: a fingerprint from before
#: the field (None) is not refused, and :meth:`ModelFingerprint.legacy_alignment_note` says
#: what the pairing means instead.
CRITICAL_FIELDS: tuple[str, ...] = (
    "model_id",
    "block_size",
    "decoding",
    "threshold",
    "max_steps_per_block",
    "mask_token_id",
    "hidden_size",
    "block_alignment",
)


def check_block_alignment(value: str) -> str:
    """``value`` if it names a known block layout; :class:`ConfigError` naming both otherwise."""
    if value not in BLOCK_ALIGNMENTS:
        raise ConfigError(
            f"unknown block alignment {value!r}; choose one of {', '.join(BLOCK_ALIGNMENTS)}"
        )
    return value


@dataclass(frozen=True)
class ModelFingerprint:
    """Identity of a served dLLM and its decoding configuration."""

    model_id: str
    block_size: int
    threshold: float
    decoding: str = "low_confidence"
    mask_token_id: int | None = None
    hidden_size: int | None = None
    #: ``S``, the most denoising steps the decoder may spend on one block: ``block_size`` for
    #: LowConfidence, more for a decoder that edits committed tokens (JointThreshold). None
    #: in fingerprints written before it was recorded (then it was ``block_size``).
    max_steps_per_block: int | None = None
    max_new_tokens: int | None = None
    revision: str | None = None
    dtype: str | None = None
    tokenizer_hash: str | None = None
    chat_template_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: the block layout the traces were made in (or the server runs): ``absolute`` or
    #: ``response`` (see :data:`BLOCK_ALIGNMENTS`). None in fingerprints written before it was
    #: recorded; those were all traced response-aligned (:attr:`alignment`).
    block_alignment: str | None = None

    def __post_init__(self) -> None:
        if self.block_alignment is not None:
            check_block_alignment(self.block_alignment)

    @property
    def alignment(self) -> str:
        """The block layout, with a fingerprint that predates the field read as ``response``."""
        return self.block_alignment or LEGACY_BLOCK_ALIGNMENT

    def legacy_alignment_note(self, other: ModelFingerprint) -> str | None:
        """A sentence when exactly one side predates ``block_alignment`` and the other side
        records a layout other than the legacy one (the pairing is accepted, not refused, so
        bundles made before the field keep working; the caller logs this warning)."""
        mine, theirs = self.block_alignment, other.block_alignment
        if (mine is None) == (theirs is None):
            return None
        known = mine if mine is not None else theirs
        if known == LEGACY_BLOCK_ALIGNMENT:
            return None
        return (
            f"one fingerprint predates block_alignment (read as {LEGACY_BLOCK_ALIGNMENT!r}, the "
            f"layout every trace of that time was made in) and the other records {known!r}: "
            f"estimates made in the {LEGACY_BLOCK_ALIGNMENT} layout drift in the {known} one; "
            f"retrain on traces made with `dwise-predict trace --block-alignment {known}` "
            "or on serving traces"
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelFingerprint:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        kwargs = {k: v for k, v in data.items() if k in known}
        if unknown:  # forward compatible: keep what a newer writer added
            kwargs.setdefault("extra", {})
            kwargs["extra"] = {**kwargs["extra"], **{k: data[k] for k in unknown}}
        return cls(**kwargs)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def short(self) -> str:
        """One human line: ``tiny-bd@abc123 (block 32, low_confidence τ=0.95)``."""
        rev = f"@{self.revision[:12]}" if self.revision else ""
        steps = self.max_steps_per_block
        most = f", up to {steps} steps per block" if steps and steps != self.block_size else ""
        layout = f", {self.block_alignment} blocks" if self.block_alignment else ""
        return (
            f"{self.model_id}{rev} (block {self.block_size}, {self.decoding} "
            f"threshold {self.threshold:g}{most}{layout})"
        )

    def mismatches(
        self, other: ModelFingerprint, fields: tuple[str, ...] = CRITICAL_FIELDS
    ) -> list[str]:
        """Names of the ``fields`` where two fingerprints disagree (None on either side = unknown,
        skipped)."""
        out = []
        for name in fields:
            a, b = getattr(self, name), getattr(other, name)
            if a is None or b is None:
                continue
            if isinstance(a, float) or isinstance(b, float):
                if abs(float(a) - float(b)) > 1e-9:
                    out.append(name)
            elif a != b:
                out.append(name)
        return out


def text_hash(text: str | bytes) -> str:
    """Short stable hash used for tokenizer vocabularies and chat templates."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()[:16]
