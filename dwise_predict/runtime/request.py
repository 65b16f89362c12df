"""The records the runtime exchanges: a round's plan, a round's result, a replayable request.

The scheduler is "a plan and an update" (after vLLM v1): ``plan_round()`` returns a
:class:`RoundPlan` saying which requests advance which kind of block, the driver (the simulator
or a serving framework) runs the forward pass, and hands back a :class:`RoundResult`. Both
records carry numpy arrays aligned with ``RoundPlan.rows`` so a round costs no per-request
Python objects; ``RoundPlan.request_ids`` maps rows back to the caller's ids when it needs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import SchedulerError
from ..rounds import RoundsPerBlock

# Residency states of a row of the request table (docs/concepts.md: waiting, running or paused are
# the last two: a resident either runs in a round or is paused with its KV kept).
FREE = 0
WAITING = 1
RESIDENT = 2


@dataclass(frozen=True)
class RoundPlan:
    """What one round runs, in rank order (best first).

    ``rows[j]`` advances a prompt block when ``prompt[j]`` else one denoising round of its
    current output block. ``first_denoise[j]`` marks a request's first denoising round: after
    it the driver may report a refined estimate for that request (once, never again).
    """

    round_index: int
    rows: np.ndarray
    prompt: np.ndarray
    first_denoise: np.ndarray
    admitted: np.ndarray
    preempted: np.ndarray
    resident_rows: np.ndarray
    #: the caller's ids of ``rows`` at planning time (a copy: ``update`` frees rows and the
    #: table reuses them for new requests, so the live id column would go stale)
    ids: np.ndarray = field(repr=False)
    plan_seconds: float = 0.0

    @property
    def request_ids(self) -> list:
        """The caller's ids of ``rows``, in the same order; still true after ``update``."""
        return self.ids.tolist()

    @property
    def paused(self) -> np.ndarray:
        """Residents that hold KV but run no block this round (computed on demand: it is not
        hot)."""
        return np.setdiff1d(self.resident_rows, self.rows, assume_unique=True)

    @property
    def slots_filled(self) -> int:
        return int(self.rows.size)

    @property
    def prefill_only(self) -> bool:
        return bool(self.rows.size) and bool(self.prompt.all())


@dataclass(frozen=True)
class RoundResult:
    """What the driver reports back after running a :class:`RoundPlan`.

    ``rows`` echoes the plan's rows. ``finished[j]`` is True when request ``rows[j]`` committed
    its last output block in this round. ``refined[j]`` is the refined estimate of rounds still
    to go, given only for rows whose first denoising round this was (NaN elsewhere, or NaN when
    no refinement is available: the estimate then just counts down).
    """

    rows: np.ndarray
    finished: np.ndarray
    refined: np.ndarray | None = None


@dataclass(frozen=True)
class SimRequest(RoundsPerBlock):
    """One request as the simulator replays it: its true shape plus optional estimates.

    ``rounds_per_block[b]`` is how many denoising rounds output block ``b`` took (the truth).
    ``admission_estimate`` is the estimated TOTAL denoising rounds (known at arrival);
    ``refined_estimate`` the estimated rounds STILL TO GO after the first denoising round;
    ``cost`` a request-level predicted cost for DWS-SJF; ``score`` any SJF/SRPT score.
    Rounds per block may exceed ``block_size``: LLaDA2.1's token editing can re-mask tokens.
    """

    request_id: str
    prompt_blocks: int
    prompt_tokens: int
    rounds_per_block: tuple[int, ...]
    output_budget: int
    block_size: int
    category: str = ""
    output_tokens: int | None = None
    admission_estimate: float | None = None
    refined_estimate: float | None = None
    cost: float | None = None
    score: float | None = None

    def __post_init__(self) -> None:
        where = f"request {self.request_id!r}"
        if self.block_size < 1:
            raise SchedulerError(f"{where}: block_size={self.block_size} must be >= 1")
        if self.prompt_blocks < 0:
            # 0 is legal: SGLang prefills floor(L / block) blocks; a shorter prompt shares the
            # first output block and starts decoding at once.
            raise SchedulerError(f"{where}: prompt_blocks={self.prompt_blocks} must be >= 0")
        if self.prompt_tokens < 1:
            raise SchedulerError(f"{where}: prompt_tokens={self.prompt_tokens} must be >= 1")
        if not self.rounds_per_block:
            raise SchedulerError(
                f"{where}: rounds_per_block is empty; a request denoises at least one output block"
            )
        if min(self.rounds_per_block) < 1:
            raise SchedulerError(
                f"{where}: rounds_per_block={list(self.rounds_per_block)} "
                "has a block with < 1 round; every block takes >= 1 round"
            )
        if self.output_budget < 1:
            raise SchedulerError(f"{where}: output_budget={self.output_budget} must be >= 1")
        for name in ("admission_estimate", "refined_estimate", "cost", "score"):
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise SchedulerError(
                    f"{where}: {name}={v} must be a finite number "
                    ">= 0; drop the request or re-run the predictor"
                )

    @property
    def work(self) -> int:
        """Remaining work at arrival, in slots: ``R = P + r`` with the true rounds."""
        return self.prompt_blocks + self.total_rounds
