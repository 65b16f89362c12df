"""DWISE with a tail guard: SRPT that promotes a request only when it would otherwise finish
later than a mixed-phase FCFS server would finish nearly everyone.

Why: under sustained overload plain SRPT (the paper's DWISE) wins the mean several times over
and loses the tail, because long requests starve behind a stream of short ones. Operators judge
a scheduler against mixed-phase FCFS, so the guard gives each request a deadline taken from the
FCFS server it is compared with, computed online, and otherwise leaves SRPT alone:

* **Deadlines from a virtual FCFS server.** On arrival each request is list-scheduled, in
  arrival order, on B virtual rows by its predicted work P + r̂ on arrival (one block a round,
  as a mixed-phase FCFS server with B residents runs it): its virtual FCFS latency L̂. Its
  deadline is arrival + bias × max(L̂, ``scale`` × Q), Q the ``quantile`` (default 1: the
  largest) of the virtual latencies of the last ``window`` arrivals, re-read every round, and
  bias = the rounds the finished requests took over their estimates on arrival
  (:func:`estimate_bias`, measured). So no request is promised less than its own FCFS latency,
  and while a backlog builds every request may wait as long as FCFS now makes anyone wait.
* **Promoted only when needed.** Each round the live requests are sorted by deadline. A request
  whose own slack (deadline − now − its remaining work P + r̂) is at most ``margin`` rounds is
  *late* and runs first, earliest deadline first. Then the requests of the longest
  deadline-ordered prefix whose remaining work exceeds what the server does before the
  prefix's last deadline at its measured throughput (``RequestTable.throughput``, blocks per
  round), shortest first (inside the prefix any order finishes it as soon). Then everyone else
  by remaining work, as plain DWISE: when nothing is late the policy *is* plain DWISE.

``scale`` = 0.9 was measured, not derived: in SGLang's loop (``benchmarks/sglang_tails.py``,
tiny-bd v0.9.0) it held the p99 at or below fcfs-mixed's in every regime of both mixes, where
1.0 passed it by 6% on the split mix. It stands in for what a deadline at the FCFS tail cannot
see: the rule ranks by estimates, and requests promoted at the last round that meets their
deadline crowd the rows. It is no guarantee elsewhere: on tiny-bd v1.1.0 the split mix's
overload p99 is 1.05x (docs/runtime.md, "Tails under overload").

Everything it reads a live server has: arrival rounds, estimates, B, the blocks it ran per round
and the rounds its finished requests took. State (the virtual rows and recent latencies) lives in
each scheduler's request table (``RequestTable.policy_state``), so one policy object may serve
several schedulers and nothing outlives a scheduler.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from .table import RequestTable

#: a late request's key: this plus its deadline (a round), below every other key; not the
#: policies' STARVED_KEY (-1e18), whose float spacing (128) would erase the deadline order
URGENT_BASE = -1e12
#: a request of a tight prefix: this plus its remaining work, below any remaining work alone
PREFIX_BASE = -1e9

_NEEDS = frozenset({"estimate", "refined"})


#: estimated rounds of finished requests before their measured bias replaces 1
BIAS_MIN_ROUNDS = 256.0


def estimate_bias(table: RequestTable) -> float:
    """Rounds the finished requests took over what they were estimated to take on arrival:
    the factor that turns the virtual server's rounds into real ones (1 until
    :data:`BIAS_MIN_ROUNDS` estimated rounds have finished)."""
    if table.finished_estimate < BIAS_MIN_ROUNDS:
        return 1.0
    return table.finished_work / table.finished_estimate


class _VirtualFCFS:
    """The virtual mixed-phase FCFS server of one request table (see the module docstring)."""

    def __init__(self, slots: int, window: int) -> None:
        self.rows = [0.0] * max(int(slots), 1)  # each row's free round, a min-heap
        self.next_seq = 0  # arrivals below this sequence number are placed
        self.latency = np.zeros(16)  # virtual FCFS latency, by table row
        self.recent = np.zeros(window)  # the last ``window`` virtual latencies (a ring)
        self.placed = 0
        self.quantile_cache: tuple[int, float] = (-1, 0.0)
        self.urgent: tuple[int, np.ndarray] | None = None  # (round, key per row) for a round

    def place(self, table: RequestTable, live: np.ndarray) -> None:
        """Place the arrivals not placed yet, in arrival order (a request keyed for the first
        time; a cancelled one that never was leaves a gap, skipped)."""
        seq = table.seq[live]
        fresh = live[seq >= self.next_seq]
        if not fresh.size:
            return
        fresh = fresh[np.argsort(table.seq[fresh], kind="stable")]
        if self.latency.size < table.capacity:
            grown = np.zeros(table.capacity)
            grown[: self.latency.size] = self.latency
            self.latency = grown
        arrival = table.arrival_round[fresh].astype(np.float64)
        work = np.maximum(table.prompt_total[fresh] + table.r_hat[fresh], 1.0)
        for row, a, w in zip(fresh.tolist(), arrival.tolist(), work.tolist()):
            finish = max(a, self.rows[0]) + w
            heapq.heapreplace(self.rows, finish)
            self.latency[row] = finish - a
            self.recent[self.placed % self.recent.size] = finish - a
            self.placed += 1
        self.next_seq = int(table.seq[fresh[-1]]) + 1

    def tail(self, q: float) -> float:
        """The ``q`` quantile of the recent virtual latencies (cached between arrivals)."""
        if self.quantile_cache[0] != self.placed:
            seen = self.recent[: min(self.placed, self.recent.size)]
            if not seen.size:
                value = 0.0
            else:  # the default q = 1 is the largest: the same value, without a sort
                value = float(seen.max() if q >= 1.0 else np.quantile(seen, q))
            self.quantile_cache = (self.placed, value)
        return self.quantile_cache[1]


@dataclass(frozen=True)
class TailGuard:
    """Plain DWISE (R = P + r̂, refined once) whose requests are promoted when they would
    otherwise miss a deadline from a virtual mixed-phase FCFS server (module docstring).

    ``quantile`` and ``window``: the deadline floor is ``scale`` × the ``quantile`` of the
    virtual FCFS latencies of the last ``window`` arrivals (1.0: the largest). ``margin``:
    rounds of slack at which a request counts as late (0 = at the last round that still meets
    its deadline). The per-round promotion is computed once per round index and table.
    """

    quantile: float = 1.0
    scale: float = 0.9
    window: int = 1024
    margin: float = 0.0
    #: rank by this output-length baseline's estimates instead of DWISE's own (``ssjf``,
    #: ``s3``, ``ltr``, ``trail``; docs/baselines.md): a baseline held to the same tail rule,
    #: for comparing schedulers at equal tails. ``refines``: its re-estimate after the first
    #: denoising round (TRAIL's)
    predictor: str | None = None
    refines: bool = False
    batch_former: str = "mixed"
    name: str = "dwise"
    preemptive: ClassVar[bool] = True

    @property
    def needs(self) -> frozenset[str]:
        if self.predictor is None:
            return _NEEDS
        return frozenset({"estimate", "length", *(("refined",) if self.refines else ())})

    def __post_init__(self) -> None:
        if self.batch_former != "mixed":
            raise ConfigError(
                f"batch_former={self.batch_former!r}: the tail guard's virtual server is "
                "mixed-phase FCFS, and so must its own rounds be ('mixed')"
            )
        if not (0.0 < self.quantile <= 1.0):
            raise ConfigError(
                f"quantile={self.quantile} must lie in (0, 1] (0.99: deadlines at the p99 of "
                "the latencies a mixed-phase FCFS server would give)"
            )
        if not np.isfinite(self.scale) or self.scale <= 0:
            raise ConfigError(
                f"scale={self.scale} must be a finite number > 0 (1 = the FCFS latency itself)"
            )
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ConfigError(
                f"window={self.window!r} must be a whole number of arrivals >= 1 "
                "(the recent arrivals whose virtual FCFS latencies set the deadline floor)"
            )
        if not np.isfinite(self.margin) or self.margin < 0:
            raise ConfigError(f"margin={self.margin} must be a finite number of rounds >= 0")
        from .lengths import LENGTH_KINDS

        if self.predictor is not None and self.predictor not in LENGTH_KINDS:
            raise ConfigError(
                f"predictor={self.predictor!r} is not an output-length baseline; use one of "
                f"{LENGTH_KINDS}, or None for DWISE's own estimates"
            )
        if self.refines and self.predictor is None:
            raise ConfigError(
                "refines=True re-estimates an output-length baseline (predictor='trail'); "
                "DWISE's own estimates are refined whenever the bundle can"
            )

    # -- per-table state ------------------------------------------------------------------
    def _state(self, table: RequestTable) -> _VirtualFCFS:
        st = table.policy_state.get(self)
        if st is None:
            st = table.policy_state[self] = _VirtualFCFS(table.slots or 1, self.window)
        return st  # type: ignore[no-any-return]

    def deadlines(self, table: RequestTable, rows: np.ndarray) -> np.ndarray:
        """Each row's deadline (a round): arrival + bias × max(L̂, scale × the recent FCFS
        tail), bias = :func:`estimate_bias` (the virtual server runs on the estimates)."""
        st = self._state(table)
        st.place(table, rows)
        floor = self.scale * st.tail(self.quantile)
        latency = estimate_bias(table) * np.maximum(st.latency[rows], floor)
        return table.arrival_round[rows] + latency

    def urgent(self, table: RequestTable, round_index: int) -> np.ndarray:
        """A key per table row for this round: URGENT_BASE + deadline where the request must
        run first, NaN elsewhere (computed once a round over every live request)."""
        st = self._state(table)
        if st.urgent is not None and st.urgent[0] == round_index:
            return st.urgent[1]
        live = np.concatenate((table.resident, table.waiting))
        out = np.full(table.capacity, np.nan)
        if live.size:
            d = self.deadlines(table, live)
            rem = table.prompt_blocks[live] + table.r_hat[live]
            order = np.argsort(d, kind="stable")
            work = np.cumsum(rem[order])
            rate = max(table.throughput, 1.0)
            tight = np.flatnonzero(work > rate * (d[order] - round_index - self.margin))
            if tight.size:  # the prefix's work fills the rows to its last deadline: it runs
                # first, shortest first (any order inside it finishes it as soon)
                prefix = order[: tight[-1] + 1]
                out[live[prefix]] = PREFIX_BASE + rem[prefix]
            late = d - round_index - rem <= self.margin  # its own work fills its time: now
            out[live[late]] = URGENT_BASE + d[late]
        st.urgent = (round_index, out)
        return out

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        work = table.prompt_blocks[rows] + table.r_hat[rows]
        promoted = self.urgent(table, round_index)[rows]
        return np.where(np.isnan(promoted), work, promoted)
