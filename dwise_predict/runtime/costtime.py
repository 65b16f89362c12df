"""Time simulated rounds with a deployment's cost profile instead of the round-time defaults.

Why: the default :class:`~.roundtime.RoundTimeModel` prices a round by its filled slots and
summed context, so every denoising step of every block costs the same. A cost profile
(``dwise_predict.cost``) knows that on an MoE dLLM a block's later steps are dearer, that
later blocks and longer prompts attend to more context, and what prefill and KV refresh
cost; timing rounds with it lets scheduling be studied under those heterogeneous costs
(e.g. the shipped ``paper-llada2.0-mini`` example).

A profile prices work served one request at a time, so it gives each slot's own cost:

* a prompt slot (prompt block j of a request): ``alpha + alpha2 * (2j + 1)`` (the increment
  of ``alpha*m + alpha2*m^2``);
* a denoising slot (output block b, step s, prompt blocks m): ``K[b, s] + delta * m``, plus
  ``beta`` when the step finishes its block (the commit/KV refresh).

A batched round is cheaper than those costs run back to back: the round costs its dearest
slot plus ``batch_share`` of every other slot's cost. The default 0.04 is the share the
round-time defaults give one more slot (0.427 ms per slot over a 10.4 ms one-slot round);
1.0 prices a round as serial work (no batching gain).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cost import CostProfile
from ..errors import ConfigError


@dataclass(frozen=True)
class RoundSlots:
    """The composition of one round, one entry per slot."""

    prompt: np.ndarray  # bool: a prompt block (else a denoising step)
    context: np.ndarray  # tokens the slot's block attends to
    prompt_blocks: np.ndarray  # m of the slot's request
    prompt_index: np.ndarray  # the prompt block being prefilled (prompt slots)
    block: np.ndarray  # output block b (denoising slots)
    step: np.ndarray  # step s within the block (denoising slots)
    commits: np.ndarray  # bool: this step finishes its block


@dataclass(frozen=True)
class ProfileRoundTime:
    """Round time from a :class:`~dwise_predict.cost.CostProfile` (see the module docstring)."""

    profile: CostProfile
    batch_share: float = 0.04
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.profile, CostProfile):
            raise ConfigError("ProfileRoundTime needs a CostProfile (dwise_predict.cost)")
        if not (np.isfinite(self.batch_share) and 0.0 <= self.batch_share <= 1.0):
            raise ConfigError(f"batch_share must lie in [0, 1], got {self.batch_share}")

    def slot_ms(self, slots: RoundSlots) -> np.ndarray:
        p = self.profile
        m = slots.prompt_blocks.astype(np.float64)
        b = np.clip(slots.block, 0, p.n_blocks - 1)
        s = np.clip(slots.step, 0, p.max_steps - 1)
        denoise = p.K_ms[b, s] + p.delta_ms * m + p.beta_ms * slots.commits
        prefill = p.alpha_ms + p.alpha2_ms * (2.0 * slots.prompt_index + 1.0)
        out: np.ndarray = np.where(slots.prompt, prefill, denoise)
        return out

    def time_round(self, slots: RoundSlots) -> float:
        c = self.slot_ms(slots)
        if c.size == 0:
            return 0.0
        top = float(c.max())
        return top + self.batch_share * (float(c.sum()) - top)

    def to_dict(self) -> dict[str, Any]:
        p = self.profile
        return {
            "kind": CostProfile.kind,
            "profile": self.name,
            "batch_share": self.batch_share,
            "alpha_ms": p.alpha_ms,
            "alpha2_ms": p.alpha2_ms,
            "beta_ms": p.beta_ms,
            "delta_ms": p.delta_ms,
            "K_ms_min": float(p.K_ms.min()),
            "K_ms_max": float(p.K_ms.max()),
            "hardware": p.hardware,
        }
