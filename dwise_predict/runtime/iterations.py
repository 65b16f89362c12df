"""Ranking requests by a runtime policy's key in an engine that runs one step per iteration.

vLLM's v1 scheduler (and so its diffusion scheduler) has no rounds of B block slots: every
iteration each running request advances one step (a prompt chunk, a denoising step or the
commit of its canvas), admission stops at ``max_num_seqs``, and preemption happens only when
KV allocation fails. The core :class:`~.scheduler.Scheduler` decides admission and batches by
its own rules, so it cannot drive such an engine; what carries over is the *order*. This
module keeps the same :class:`~.table.RequestTable` a policy's ``key(table, rows,
round_index)`` reads and updates it with the engine's per-iteration events, so the engine's
waiting queue and running list are ranked by exactly the policy's key (DWISE's P + r̂ and
whatever tail rule the policy adds, the oracle's P + r, FCFS's arrival order):

* ``prompt_blocks`` = P: the prompt work left in the engine's unit, iterations:
  ``ceil(prompt tokens not yet computed / prompt_chunk)``, with ``prompt_chunk`` the prompt
  tokens one iteration computes (vLLM: ``max_num_batched_tokens``; a prompt is one chunked
  prefill, not one step per block as in DWISE's rounds);
* ``r_hat`` = the admission estimate of denoising steps, counted down by the denoising steps
  run: steps of committed blocks for good, steps of the block in progress until it commits
  (a preemption throws that block away, and its steps come back); refined once if a driver
  has a refined estimate (:meth:`IterationRanker.refine`);
* ``r_true`` = the true work left (oracle): the driver's ``true_rounds`` (in vLLM, denoising
  steps plus one commit a block: the iterations the request still needs) counted down by
  both kinds of step;
* ``arrival_round`` / ``attained`` = the iteration of arrival and the iterations the request
  was scheduled in; ``round_index`` = the iteration; where the table keeps the server's
  measured scalars a tail rule reads (``slots``, ``throughput``, ``r_hat_arrival`` and the
  finished sums), they are kept too: ``slots`` = the running limit, one "block" = one request's
  step, so ``throughput`` = requests stepped per iteration; ``fcfs_rounds`` = the FCFS horizon
  (set at the first ranking after arrival when the policy reads it, with ``slots`` = the
  engine's running limit).

numpy only: the vLLM scheduler subclass (``dwise_predict.vllm``) and the vLLM replay model
(:mod:`.vllm_replay`) both rank through this class.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

import numpy as np

from ..errors import SchedulerError
from .policies import Policy
from .request import RESIDENT, WAITING
from .table import RequestTable


class IterationRanker:
    """A policy's key over the live requests of a per-iteration engine (module docstring)."""

    def __init__(self, policy: Policy, *, prompt_chunk: int, slots: int, capacity: int = 256):
        if int(prompt_chunk) < 1 or int(slots) < 1:
            raise SchedulerError(f"prompt_chunk={prompt_chunk} and slots={slots} must be >= 1")
        self.policy = policy
        self.prompt_chunk = int(prompt_chunk)
        self.slots = int(slots)
        self.table = RequestTable(capacity, slots=self.slots)
        self.iteration = 0
        self._row_of: dict[Hashable, int] = {}
        self._seq = 0
        #: per row: the estimate r̂ counts down from, the truth r counts down from, denoising
        #: steps in committed blocks, and steps of the block in progress
        self._est = np.zeros(self.table.capacity)
        self._truth = np.zeros(self.table.capacity)
        self._committed = np.zeros(self.table.capacity, dtype=np.int64)
        self._block = np.zeros(self.table.capacity, dtype=np.int64)
        self._commits = np.zeros(self.table.capacity, dtype=np.int64)
        self._horizon = bool(getattr(policy, "starvation_slack", 0.0))
        self._new: list[int] = []  # rows still without an FCFS horizon
        self.refinements = 0
        self.preemptions = 0

    # -- membership ---------------------------------------------------------------------------
    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._row_of

    def __len__(self) -> int:
        return len(self._row_of)

    def ids(self) -> list[Hashable]:
        return list(self._row_of)

    def row(self, rid: Hashable) -> int:
        return self._row_of[rid]

    def _fit(self) -> None:
        cap = self.table.capacity
        if self._est.size < cap:
            grow = cap - self._est.size
            self._est = np.concatenate((self._est, np.zeros(grow)))
            self._truth = np.concatenate((self._truth, np.zeros(grow)))
            self._committed = np.concatenate((self._committed, np.zeros(grow, dtype=np.int64)))
            self._block = np.concatenate((self._block, np.zeros(grow, dtype=np.int64)))
            self._commits = np.concatenate((self._commits, np.zeros(grow, dtype=np.int64)))

    def add(
        self,
        rid: Hashable,
        *,
        prompt_tokens: int,
        estimate: float = 0.0,
        true_rounds: float | None = None,
        arrival_time: float = 0.0,
    ) -> int:
        """Register an arrival (waiting); ``estimate`` = the admission estimate of its total
        denoising steps, ``true_rounds`` = the truth (a policy that reads ``r_true``)."""
        if rid in self._row_of:
            raise SchedulerError(f"request {rid!r} is already ranked; ids must be unique")
        est = float(estimate)
        if not math.isfinite(est) or est < 0:
            raise SchedulerError(
                f"request {rid!r}: estimate={estimate} must be a finite number >= 0 "
                "(NaN means the predictor failed)"
            )
        if "true_rounds" in self.policy.needs and true_rounds is None:
            raise SchedulerError(
                f"request {rid!r}: policy {self.policy.name} ranks by the true work; "
                "pass true_rounds"
            )
        t = self.table
        row = t.allocate()
        self._fit()
        blocks = -(-max(0, int(prompt_tokens)) // self.prompt_chunk)
        t.state[row] = WAITING
        t.ids[row] = rid
        t.prompt_blocks[row] = blocks
        t.prompt_total[row] = blocks
        t.seq[row] = self._seq
        t.kv_tokens[row] = 0
        t.done_rounds[row] = 0
        t.attained[row] = 0
        t.refined_n[row] = 0
        t.arrival_round[row] = self.iteration
        t.arrival_time[row] = float(arrival_time)
        t.score[row] = est
        t.last_ran[row] = False
        t.fcfs_rounds[row] = math.nan
        t.r_hat_arrival[row] = est
        self._est[row] = est
        self._truth[row] = math.nan if true_rounds is None else float(true_rounds)
        self._committed[row] = 0
        self._block[row] = 0
        self._commits[row] = 0
        self._recount(row)
        t.mark_dirty()
        self._seq += 1
        self._row_of[rid] = row
        if self._horizon:
            self._new.append(row)
        return row

    def _set_horizons(self) -> None:
        """The FCFS horizon of the requests that arrived since the last ranking: the iterations
        a ``slots``-wide FCFS server needs to clear the estimated work live now, theirs
        included, and at least their own (the core scheduler's rule, at the same moment: all
        of a burst's arrivals see the whole burst)."""
        if not self._new:
            return
        t = self.table
        live = np.fromiter(self._row_of.values(), dtype=np.int64)
        new = np.asarray([r for r in self._new if t.ids[r] is not None], dtype=np.int64)
        self._new = []
        if new.size:
            t.set_fcfs_horizons(new, self.slots, live)

    def remove(self, rid: Hashable, *, finished: bool = False) -> bool:
        """Forget a request (``finished``, or aborted, dropped); False if it was not ranked.
        A finished request's work and estimate join the table's finished sums, where it
        keeps them."""
        row = self._row_of.pop(rid, None)
        if row is None:
            return False
        rows = np.asarray([row], dtype=np.int64)
        if finished:
            self.table.record_finished(rows)
        self.table.release(rows)
        return True

    # -- events -------------------------------------------------------------------------------
    def _recount(self, row: int) -> None:
        t = self.table
        done = self._committed[row] + self._block[row]
        t.done_rounds[row] = done
        t.r_hat[row] = max(self._est[row] - done, 0.0)
        t.r_true[row] = max(self._truth[row] - done - self._commits[row], 0.0)

    def set_prompt_left(self, rid: Hashable, tokens_left: int) -> None:
        row = self._row_of[rid]
        self.table.prompt_blocks[row] = -(-max(0, int(tokens_left)) // self.prompt_chunk)

    def set_running(self, rid: Hashable, running: bool) -> None:
        row = self._row_of[rid]
        state = RESIDENT if running else WAITING
        if self.table.state[row] != state:
            self.table.state[row] = state
            self.table.mark_dirty()

    def ran(self, rids: Iterable[Hashable]) -> None:
        """The iteration scheduled ``rids`` (each took one step of some kind)."""
        rows = [self._row_of[r] for r in rids if r in self._row_of]
        if rows:
            self.table.attained[np.asarray(rows, dtype=np.int64)] += 1
        self.table.record_round(len(rows))

    def denoised(self, rid: Hashable) -> None:
        """One denoising step of the block in progress ran."""
        row = self._row_of[rid]
        self._block[row] += 1
        self._recount(row)

    def committed(self, rid: Hashable) -> None:
        """The block in progress committed: its steps are spent for good."""
        row = self._row_of[rid]
        self._committed[row] += self._block[row]
        self._block[row] = 0
        self._commits[row] += 1
        self._recount(row)

    def preempted(self, rid: Hashable, prompt_tokens_left: int) -> None:
        """The engine preempted the request: the block in progress (and its steps) is lost and
        its context is computed again."""
        row = self._row_of[rid]
        self._block[row] = 0
        self.preemptions += 1
        self._recount(row)
        self.set_prompt_left(rid, prompt_tokens_left)
        self.set_running(rid, False)

    def refine(self, rid: Hashable, remaining: float) -> bool:
        """Replace r̂ by a refined estimate of the denoising steps left (once a request)."""
        row = self._row_of[rid]
        if self.table.refined_n[row]:
            return False
        done = self._committed[row] + self._block[row]
        self._est[row] = max(float(remaining), 0.0) + done
        self.table.refined_n[row] = 1
        self.refinements += 1
        self._recount(row)
        return True

    def tick(self) -> None:
        """One engine iteration went by."""
        self.iteration += 1

    # -- ranking ------------------------------------------------------------------------------
    def keys(self, rids: list[Hashable]) -> np.ndarray:
        self._set_horizons()
        rows = np.asarray([self._row_of[r] for r in rids], dtype=np.int64)
        return np.asarray(self.policy.key(self.table, rows, self.iteration), dtype=np.float64)

    def order(self, rids: list[Hashable]) -> np.ndarray:
        """Positions of ``rids`` sorted by the policy's key, ties by arrival (earlier first)."""
        if not rids:
            return np.zeros(0, dtype=np.int64)
        self._set_horizons()
        rows = np.asarray([self._row_of[r] for r in rids], dtype=np.int64)
        keys = np.asarray(self.policy.key(self.table, rows, self.iteration), dtype=np.float64)
        return np.lexsort((self.table.seq[rows], keys))
