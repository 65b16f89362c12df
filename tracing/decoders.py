"""The per-block decoding rules the engine can run: LowConfidence and JointThreshold.

A decoder looks at one block's logits after one forward and decides which positions change.
Both follow the rules of SGLang 0.5.23's ``sglang.srt.dllm.algorithm`` classes of the same
name, so a trace made offline and a trace logged from an SGLang server describe the same
decoder and the same number of steps per block:

* **LowConfidence** (SGLang's default, threshold 0.95) unmasks every masked position whose
  top-1 probability clears the threshold, and at least the most confident one. A committed
  token is never changed, so a block takes 1 to ``block_size`` steps.
* **JointThreshold** (LLaDA2.1's recommended decoder; SGLang defaults: M2T ``threshold`` 0.5,
  T2T ``edit_threshold`` 0.0, ``max_post_edit_steps`` 16) does two things per step:
  *mask-to-token* (M2T) unmasks masked positions above ``threshold`` (at least one), and
  *token-to-token* (T2T) re-writes an already decoded position whenever the model's argmax
  differs from it with probability above ``edit_threshold``. Once no mask is left, each
  further step is a *post-edit* step; the block is finished on the first step that changes
  nothing, or when the post-edit budget is exceeded. The finishing step is a forward too and
  counts as a step (its input is the final block, so its keys/values are the block's own).
  So a block takes 2 to ``block_size + max_post_edit_steps + 1`` steps: the decoder's ``S``.

Where this differs from SGLang: the mask token is never a prediction (a model that predicts
its own mask token would re-mask a position and could loop forever), ties break at the first
index, and LowConfidence unmasks at ``>= τ`` where SGLang's uses ``> τ`` (kept, so traces
made before stay reproducible). None of these changes a step unless the model predicts its
mask token or a probability equals the threshold exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dwise_predict.errors import ConfigError

#: decoding algorithm names recorded in traces and fingerprints
LOW_CONFIDENCE = "low_confidence"
JOINT_THRESHOLD = "joint_threshold"
DECODERS: tuple[str, ...] = (LOW_CONFIDENCE, JOINT_THRESHOLD)

#: SGLang 0.5.23's defaults for each decoder's threshold (LowConfidence τ; JointThreshold M2T)
DEFAULT_THRESHOLDS: dict[str, float] = {LOW_CONFIDENCE: 0.95, JOINT_THRESHOLD: 0.5}
#: SGLang 0.5.23's JointThreshold defaults for the edit threshold and the post-edit budget
DEFAULT_EDIT_THRESHOLD = 0.0
DEFAULT_MAX_POST_EDIT_STEPS = 16


@dataclass(frozen=True)
class Decoder:
    """Which rule decides a block's positions, with its parameters."""

    name: str = LOW_CONFIDENCE
    threshold: float = DEFAULT_THRESHOLDS[LOW_CONFIDENCE]
    edit_threshold: float = DEFAULT_EDIT_THRESHOLD
    max_post_edit_steps: int = DEFAULT_MAX_POST_EDIT_STEPS

    def __post_init__(self) -> None:
        if self.name not in DECODERS:
            raise ConfigError(
                f"unknown decoding {self.name!r}; choose one of {', '.join(DECODERS)}"
            )
        for label, value in (
            ("threshold", self.threshold),
            ("edit_threshold", self.edit_threshold),
        ):
            if not math.isfinite(value):
                raise ConfigError(f"{label} must be a finite number, got {value}")
        if self.max_post_edit_steps < 0:
            raise ConfigError(f"max_post_edit_steps must be >= 0, got {self.max_post_edit_steps}")

    def max_steps(self, block_size: int) -> int:
        """``S``: the most steps one block of ``block_size`` tokens can take under this rule."""
        if self.name == JOINT_THRESHOLD:
            return block_size + self.max_post_edit_steps + 1
        return block_size

    def params(self) -> dict[str, float | int]:
        """Parameters beyond the threshold, recorded in the fingerprint (LowConfidence: none)."""
        if self.name == JOINT_THRESHOLD:
            return {
                "edit_threshold": float(self.edit_threshold),
                "max_post_edit_steps": int(self.max_post_edit_steps),
            }
        return {}

    def step(
        self, logits: torch.Tensor, block: torch.Tensor, post_edit_steps: int, mask_id: int
    ) -> tuple[torch.Tensor, int, bool]:
        """One step on one block: ``(new block, post-edit steps so far, block finished)``."""
        if self.name == JOINT_THRESHOLD:
            return joint_threshold_step(
                logits,
                block,
                post_edit_steps,
                mask_id=mask_id,
                threshold=self.threshold,
                edit_threshold=self.edit_threshold,
                max_post_edit_steps=self.max_post_edit_steps,
            )
        new = unmask_step(logits, block, self.threshold, mask_id)
        return new, post_edit_steps, not bool((new == mask_id).any())


def _confidence(logits: torch.Tensor, mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 probability and token per position, the mask token excluded."""
    logits = logits.float().clone()
    logits[:, mask_id] = float("-inf")
    conf, pred = torch.softmax(logits, dim=-1).max(dim=-1)
    return conf, pred


def unmask_step(
    logits: torch.Tensor, block: torch.Tensor, threshold: float, mask_id: int
) -> torch.Tensor:
    """One LowConfidence round on one block: unmask positions with top-1 prob >= τ, at least one.

    ``logits`` ``[L, V]``, ``block`` ``[L]`` (``mask_id`` where undecided). Returns the new block.
    """
    conf, pred = _confidence(logits, mask_id)
    masked = block.to(logits.device) == mask_id
    select = masked & (conf >= threshold)
    if not bool(select.any()):
        best = torch.where(masked, conf, torch.full_like(conf, -1.0)).argmax()
        select[best] = True
    new = block.clone()
    new[select.cpu()] = pred[select].cpu()
    return new


def joint_threshold_step(
    logits: torch.Tensor,
    block: torch.Tensor,
    post_edit_steps: int,
    *,
    mask_id: int,
    threshold: float,
    edit_threshold: float,
    max_post_edit_steps: int,
) -> tuple[torch.Tensor, int, bool]:
    """One JointThreshold step on one block (M2T unmasking plus T2T edits).

    Returns the new block, the post-edit steps taken so far (steps that began with no mask
    left) and whether the block is finished: nothing changed, or the post-edit budget ran out.
    """
    conf, pred = _confidence(logits, mask_id)
    block_d = block.to(logits.device)
    masked = block_d == mask_id
    m2t = torch.zeros_like(masked)
    if bool(masked.any()):
        m2t = masked & (conf > threshold)
        if not bool(m2t.any()):
            m2t[torch.where(masked, conf, torch.full_like(conf, -1.0)).argmax()] = True
    else:
        post_edit_steps += 1
        if post_edit_steps > max_post_edit_steps:
            return block, post_edit_steps, True
    t2t = ~masked & (conf > edit_threshold) & (block_d != pred)
    transfer = m2t | t2t
    if not bool(transfer.any()):
        return block, post_edit_steps, True
    new = block.clone()
    new[transfer.cpu()] = pred[transfer].cpu()
    return new, post_edit_steps, False
