"""Keep a skill across training stages by distilling it from earlier checkpoints.

A stage that teaches tiny-bd something new (free text that decodes several tokens a round)
spends its steps there, and a skill it learned slowly before (multiple choice, arithmetic)
drifts by a few points. Learning that skill again from the labels takes tens of thousands of
steps on this model. Matching a teacher's whole distribution on those examples is a much richer
signal than the one right token: every masked position says how sure the teacher was of every
token, so the student recovers the teacher's answers (and its confidence, which decides how many
rounds a block takes) in a few thousand steps.

Only examples of the ``categories`` given are distilled; elsewhere the student learns from the
labels alone, so it keeps what the stage is for. Several teachers are averaged in probability
space (an ensemble), which is usually right more often than any one of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from dwise_predict.errors import TrainingError

from ..config import TinyBDConfig
from ..model import TinyBDModel
from .two_stream import TwoStreamBatch


def _same_vocabulary(a: TinyBDConfig, b: TinyBDConfig) -> bool:
    keys = ("vocab_size", "block_size", "pad_token_id", "mask_token_id", "eos_token_id")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


class Teachers(nn.Module):
    """Frozen checkpoints whose averaged token distribution the student is pulled toward."""

    def __init__(self, models: Sequence[TinyBDModel]) -> None:
        super().__init__()
        if not models:
            raise TrainingError("distillation needs at least one teacher checkpoint")
        first = models[0].config
        for m in models[1:]:
            if not _same_vocabulary(first, m.config):
                raise TrainingError(
                    "teacher checkpoints disagree on the vocabulary or block size; distil only "
                    "from tiny-bd checkpoints of one tokenizer"
                )
        self.models = nn.ModuleList(models)
        self.config = first  # the tokens every teacher shares
        for p in self.parameters():
            p.requires_grad_(False)
        self.eval()

    @classmethod
    def from_checkpoints(cls, paths: Sequence[Path]) -> Teachers:
        from ..io import from_pretrained

        return cls([from_pretrained(p).model for p in paths])

    def check_student(self, config: TinyBDConfig) -> None:
        """Refuse a student that does not share the teachers' tokens (the KL would be nonsense)."""
        teacher = self.config
        if not _same_vocabulary(teacher, config):
            raise TrainingError(
                f"the student (vocab {config.vocab_size}, block {config.block_size}) and the "
                f"teachers (vocab {teacher.vocab_size}, block {teacher.block_size}) do not share "
                "a vocabulary; continue from a tiny-bd checkpoint with --init-from"
            )

    def train(self, mode: bool = True) -> Teachers:
        """Teachers stay in eval mode whatever Lightning asks of the module that holds them."""
        return super().train(False)

    @torch.no_grad()
    def log_probs(self, batch: TwoStreamBatch, rows: torch.Tensor) -> torch.Tensor:
        """[n_rows, T, V] log of the teachers' mean probabilities on the ``rows`` of ``batch``."""
        args = (batch.input_ids[rows], batch.position_ids[rows], batch.attn_mask[rows])
        stacked = torch.stack([m(*args).logits.float().log_softmax(-1) for m in self.models])
        return torch.logsumexp(stacked, dim=0) - math.log(len(self.models))


def distillation_loss(
    student_logits: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    weight: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Weighted mean of KL(teacher || student) over positions ([N, V] logits, [N] weights).

    The ``temperature`` softens the student the same way the teachers' log-probabilities were
    softened by the caller; the T**2 factor keeps the gradient's size independent of T (Hinton
    et al.), so the distillation weight means the same at any temperature.
    """
    if student_logits.shape[0] == 0:
        return student_logits.sum() * 0.0
    log_q = (student_logits.float() / temperature).log_softmax(-1)
    log_p = teacher_log_probs
    if temperature != 1.0:
        log_p = (log_p / temperature).log_softmax(-1)
    kl = F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)
    return (kl * weight).sum() / weight.sum().clamp_min(1e-12) * temperature**2
