"""Request state as a structure of arrays, one row per live request.

The per-round work of the scheduler must cost tens of microseconds with thousands of requests
(paper: 1.16 ms for ranking + reorder), so request state lives in numpy arrays indexed by a
*row*, never in per-request Python objects. Rows of finished requests go back to a free list
and are reused, so a long-running server keeps arrays as large as its peak concurrency. The
index arrays of waiting and resident rows are cached and rebuilt only when residency changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .request import FREE, RESIDENT, WAITING

_INT_FIELDS = (
    "prompt_blocks",
    "prompt_total",
    "seq",
    "kv_tokens",
    "done_rounds",
    "attained",
    "arrival_round",
    "refined_n",
)
_FLOAT_FIELDS = ("r_hat", "r_true", "score", "arrival_time", "fcfs_rounds", "r_hat_arrival")
#: rounds over which a round's weight in ``RequestTable.throughput`` halves: long enough to
#: smooth the rounds where few requests are resident, short enough to follow a change of load
THROUGHPUT_HALF_LIFE = 32


class RequestTable:
    """Structure-of-arrays request state. Public arrays are indexed by row.

    ``prompt_blocks`` = P (prompt blocks left), ``r_hat`` = estimated denoising rounds left,
    ``r_true`` = true rounds left when a driver knows them (oracle), ``score`` = an SJF score,
    ``seq`` = arrival sequence number (the tie-break everywhere: earlier first),
    ``done_rounds`` = denoising rounds run, ``attained`` = rounds run of either kind (MLFQ),
    ``refined_n`` = how many times a refined estimate was applied (0 or 1),
    ``fcfs_rounds`` = rounds a B-slot FCFS server would take to clear the estimated work live
    at the request's arrival, its own included (NaN until the scheduler sets it; only for
    policies that read it, see ``DWISE.starvation_slack``).

    ``r_hat_arrival`` = the admission estimate the request arrived with (r̂ before any round).

    Measured scalars of the server the scheduler keeps here, so that a policy's ``key`` can
    read them (:class:`~.tails.TailGuard`): ``slots`` = B; ``throughput`` = blocks run per
    round, an exponentially weighted mean over the recent rounds (B until a round has run);
    ``finished_work`` and ``finished_estimate`` = the rounds the finished requests took (prompt
    blocks + denoising rounds) and what they were estimated to take on arrival (prompt blocks +
    ``r_hat_arrival``), summed: their ratio is how far the admission estimates run from the
    truth, measured.
    """

    #: blocks one round carries (B), given by the driver
    slots: int
    #: blocks run per round, exponentially weighted (see :data:`THROUGHPUT_HALF_LIFE`)
    throughput: float
    #: rounds the finished requests took, and their estimate on arrival, summed
    finished_work: float
    finished_estimate: float

    prompt_blocks: np.ndarray
    prompt_total: np.ndarray
    seq: np.ndarray
    kv_tokens: np.ndarray
    done_rounds: np.ndarray
    attained: np.ndarray
    arrival_round: np.ndarray
    refined_n: np.ndarray
    r_hat: np.ndarray
    r_true: np.ndarray
    score: np.ndarray
    arrival_time: np.ndarray
    fcfs_rounds: np.ndarray
    r_hat_arrival: np.ndarray

    def __init__(self, capacity: int = 256, *, slots: int = 0) -> None:
        self.slots = int(slots)
        self.throughput = float(slots)  # until a round has run
        self.finished_work = self.finished_estimate = 0.0
        self.capacity = 0
        self.state = np.zeros(0, dtype=np.int8)
        self.last_ran = np.zeros(0, dtype=bool)
        self.ids = np.empty(0, dtype=object)
        for name in _INT_FIELDS:
            setattr(self, name, np.zeros(0, dtype=np.int64))
        for name in _FLOAT_FIELDS:
            setattr(self, name, np.zeros(0, dtype=np.float64))
        self._free: list[int] = []
        self._next = 0
        #: what a stateful policy keeps about this table's requests, keyed by the policy (the
        #: tail guard's virtual FCFS server): it lives and dies with the scheduler's table
        self.policy_state: dict[object, Any] = {}
        self._grow(max(16, int(capacity)))
        self._waiting = np.zeros(0, dtype=np.int64)
        self._resident = np.zeros(0, dtype=np.int64)
        self._dirty = False

    # -- rows -------------------------------------------------------------------------------
    def _grow(self, new_capacity: int) -> None:
        def grown(a: np.ndarray) -> np.ndarray:
            out = (
                np.zeros(new_capacity, dtype=a.dtype)
                if a.dtype != object
                else np.empty(new_capacity, dtype=object)
            )
            out[: a.size] = a
            return out

        self.state = grown(self.state)
        self.last_ran = grown(self.last_ran)
        self.ids = grown(self.ids)
        for name in (*_INT_FIELDS, *_FLOAT_FIELDS):
            setattr(self, name, grown(getattr(self, name)))
        self.capacity = new_capacity

    def allocate(self) -> int:
        """A free row (reused when one is free, else the next new one)."""
        if self._free:
            return self._free.pop()
        if self._next >= self.capacity:
            self._grow(2 * self.capacity)
        row = self._next
        self._next += 1
        return row

    def release(self, rows: np.ndarray) -> None:
        """Return finished rows to the free list."""
        self.state[rows] = FREE
        self.last_ran[rows] = False
        self.ids[rows] = None
        self._free.extend(int(r) for r in rows)
        self._dirty = True

    def mark_dirty(self) -> None:
        self._dirty = True

    def record_round(self, blocks: int) -> None:
        """Fold one round's blocks into ``throughput`` (exponentially weighted)."""
        w = 0.5 ** (1.0 / THROUGHPUT_HALF_LIFE)
        self.throughput = w * self.throughput + (1.0 - w) * float(blocks)

    def record_finished(self, rows: np.ndarray) -> None:
        """Add finishing ``rows`` (before their release) to the finished sums."""
        self.finished_work += float((self.prompt_total[rows] + self.done_rounds[rows]).sum())
        self.finished_estimate += float((self.prompt_total[rows] + self.r_hat_arrival[rows]).sum())

    def set_fcfs_horizons(self, new: np.ndarray, slots: int, *live: np.ndarray) -> None:
        """``fcfs_rounds`` of the ``new`` rows: the rounds a ``slots``-wide FCFS server needs to
        clear the estimated work (P + r̂) of the ``live`` rows (given in parts, e.g. waiting
        and resident), theirs included, and at least their own work (one block a round). Every
        driver sets it when it next ranks, so all of a burst's arrivals see the whole burst."""
        work = float(sum((self.prompt_blocks[p] + self.r_hat[p]).sum() for p in live))
        own = self.prompt_blocks[new] + self.r_hat[new]
        self.fcfs_rounds[new] = np.maximum(work / slots, own)

    # -- cached views -----------------------------------------------------------------------
    def _refresh(self) -> None:
        live = self.state[: self._next]
        self._waiting = np.flatnonzero(live == WAITING)
        self._resident = np.flatnonzero(live == RESIDENT)
        self._dirty = False

    @property
    def waiting(self) -> np.ndarray:
        if self._dirty:
            self._refresh()
        return self._waiting

    @property
    def resident(self) -> np.ndarray:
        if self._dirty:
            self._refresh()
        return self._resident

    @property
    def live_rows(self) -> int:
        return self._next - len(self._free)
