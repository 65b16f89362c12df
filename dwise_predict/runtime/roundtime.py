"""Round-time cost model: what one batched forward pass costs, from its composition.

``t_round = overhead + per_slot · filled + per_slot_per_1k · Σ_slots context_tokens / 1000`` (ms)

* ``overhead``: fixed cost of a forward pass (kernel launches, sampling, scheduler sync);
* ``per_slot``: the dense compute of one block of tokens through the MLP/MoE layers;
* ``per_slot_per_1k``: attention of that block over the KV context it attends to (the prompt
  prefix processed so far for a prompt block; the whole prompt plus committed output for a
  denoising block). Long prompts make their own blocks dearer, which is what a model linear in
  filled slots alone misses: it puts SGLang's time into slots instead of into the ~60K nearly
  empty prefill rounds of long-context prompts, and under-states remaining-work ordering's gain.

Defaults (10.0 ms, 0.427 ms, 0.925 ms per 1K tokens) solve the three equations the DWISE
paper's LLaDA2.1-mini figures give on the paper-matched synthetic workload: SGLang's ≈1,050 s
makespan, DWISE's ≈510 s and its ≈95 ms median round (docs/simulator.md gives the arithmetic;
the first guess of 8 / 0.75 / 1.0 gives 1,065 s / 633 s / 137 ms there). :meth:`RoundTimeModel.fit`
re-fits the three numbers by least squares from measured rounds (e.g. the ``round_wall_ms`` column
of traces together with each round's composition).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ConfigError

if TYPE_CHECKING:
    from .costtime import RoundSlots


@dataclass(frozen=True)
class RoundTimeModel:
    overhead_ms: float = 10.0
    per_slot_ms: float = 0.427
    per_slot_per_1k_context_ms: float = 0.925

    def __post_init__(self) -> None:
        for name, v in asdict(self).items():
            if not np.isfinite(v) or v < 0:
                raise ConfigError(f"round-time model {name}={v} must be finite and >= 0")
        if self.overhead_ms == 0 and self.per_slot_ms == 0 and self.per_slot_per_1k_context_ms == 0:
            raise ConfigError(
                "a round-time model with all-zero costs makes "
                "every round free; give at least one positive cost"
            )

    def round_ms(
        self, filled: int | np.ndarray, context_tokens: float | np.ndarray
    ) -> float | np.ndarray:
        """Wall time of a round (ms) with ``filled`` slots attending ``context_tokens`` tokens in
        total."""
        return (
            self.overhead_ms
            + self.per_slot_ms * filled
            + self.per_slot_per_1k_context_ms * (np.asarray(context_tokens) / 1000.0)
        )

    def time_round(self, slots: RoundSlots) -> float:
        """The round's time (ms) from its composition (the simulator's entry point)."""
        return float(self.round_ms(slots.prompt.size, float(slots.context.sum())))

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> RoundTimeModel:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"unknown round-time model fields {sorted(unknown)}; "
                f"expected {sorted(cls.__dataclass_fields__)}"
            )
        return cls(**{k: float(v) for k, v in d.items()})

    @classmethod
    def fit(
        cls, filled: np.ndarray, context_tokens: np.ndarray, wall_ms: np.ndarray
    ) -> RoundTimeModel:
        """Least-squares fit from measured rounds: ``filled[i]`` slots, ``context_tokens[i]`` summed
        context, ``wall_ms[i]`` measured time. Coefficients are solved by non-negative least
        squares on the three columns [1, filled, context/1000] (an active-set solve: a negative
        cost has no physical meaning, and measured noise would otherwise produce one)."""
        f = np.asarray(filled, dtype=np.float64).ravel()
        c = np.asarray(context_tokens, dtype=np.float64).ravel() / 1000.0
        y = np.asarray(wall_ms, dtype=np.float64).ravel()
        if not (f.size == c.size == y.size):
            raise ConfigError(f"fit needs equal-length arrays, got {f.size}, {c.size}, {y.size}")
        if f.size < 3:
            raise ConfigError(f"fit needs at least 3 measured rounds, got {f.size}")
        if not (np.all(np.isfinite(f)) and np.all(np.isfinite(c)) and np.all(np.isfinite(y))):
            raise ConfigError("fit inputs contain NaN/inf; drop unmeasured rounds first")
        X = np.stack([np.ones_like(f), f, c], axis=1)
        coef = _nnls(X, y)
        return cls(*map(float, coef))


def _nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns: try every support set (2^p − 1)."""
    p = X.shape[1]
    best, best_err = np.zeros(p), np.inf
    for mask in range(1, 1 << p):
        cols = [j for j in range(p) if mask >> j & 1]
        sol, *_ = np.linalg.lstsq(X[:, cols], y, rcond=None)
        if np.any(sol < 0):
            continue
        full = np.zeros(p)
        full[cols] = sol
        err = float(np.sum((X @ full - y) ** 2))
        if err < best_err - 1e-12:
            best, best_err = full, err
    return best
