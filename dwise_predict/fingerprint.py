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

#: Fields that change what the predictors learn. A difference in any of them makes a
#: bundle invalid for a server. (dtype and revision are recorded but not compared.)
CRITICAL_FIELDS: tuple[str, ...] = (
    "model_id",
    "block_size",
    "decoding",
    "threshold",
    "max_steps_per_block",
    "mask_token_id",
    "hidden_size",
)


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
        return (
            f"{self.model_id}{rev} (block {self.block_size}, {self.decoding} "
            f"threshold {self.threshold:g}{most})"
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
