"""The framework-neutral scheduler runtime: ``add_request``, ``plan_round``, ``update``.

One object, two drivers: the trace-driven simulator here and (later) an SGLang plugin call the
same three methods. Per round the work is a handful of numpy operations over the live rows
(see :mod:`.table`), so ranking 4,096 requests costs tens of microseconds.

Round protocol (paper Algorithm 1 for preemptive policies; see :mod:`.policies` for the rest)::

    plan = sched.plan_round()          # admit, rank, pick <= B rows, each one block
    ... run one forward pass over plan.rows (prompt block if plan.prompt[j]) ...
    sched.update(RoundResult(plan.rows, finished, refined))

``update`` applies the DWISE update (docs/concepts.md): prompt block done → P −= 1; first denoising
round done → r̂ := the refined estimate if the driver gave one (once, never again), else r̂ :=
max(r̂ − 1, 0); finished requests free their KV and their row.
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable

import numpy as np

from ..errors import ConfigError, SchedulerError
from .kv import KVPool
from .policies import Policy
from .ranking import smallest
from .request import FREE, RESIDENT, WAITING, RoundPlan, RoundResult
from .table import RequestTable

_EMPTY = np.zeros(0, dtype=np.int64)


def _finite_nonneg(value: float | None, name: str, where: str) -> float:
    if value is None:
        raise SchedulerError(f"{where}: {name} is required by this policy; pass it to add_request")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise SchedulerError(
            f"{where}: {name}={value} must be a finite number "
            ">= 0 (NaN means the predictor failed: re-run it)"
        )
    return v


class Scheduler:
    """Round-by-round scheduler for a block-diffusion LLM server.

    Parameters: ``policy`` (a :class:`~.policies.Policy`), ``slots`` = B block slots per
    round, ``k`` = resident-set multiplier (at most k·B residents for preemptive policies, B for
    the others), ``kv_pool_tokens`` and ``kv_limit_frac``/``slack_blocks`` for the worst-case
    reservation rule.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        slots: int = 128,
        k: int = 8,
        kv_pool_tokens: int = 1 << 21,
        kv_limit_frac: float = 0.9,
        slack_blocks: int = 2,
        capacity: int = 1024,
    ) -> None:
        if not isinstance(policy, Policy):
            raise ConfigError(
                f"policy {policy!r} does not implement the Policy "
                "protocol (name, preemptive, batch_former, needs, key)"
            )
        if not isinstance(slots, (int, np.integer)) or slots < 1:
            raise ConfigError(
                f"slots={slots!r} must be a positive integer "
                "(block slots B per round; the paper uses 128)"
            )
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise ConfigError(
                f"k={k!r} must be a positive integer (resident-set multiplier; the paper uses 8)"
            )
        self.policy = policy
        self.slots = int(slots)
        self.k = int(k)
        self.max_residents = self.slots * self.k if policy.preemptive else self.slots
        self.kv = KVPool(int(kv_pool_tokens), kv_limit_frac, slack_blocks)
        self.table = RequestTable(capacity, slots=self.slots)
        self._row_of: dict[Hashable, int] = {}
        self._seq = 0
        self.round_index = 0
        self._plan: RoundPlan | None = None
        self._mixed = policy.batch_former == "mixed"
        self.preemptions = 0
        self.refinements = 0
        self.finished = 0
        #: requests that ended outside the round protocol (:meth:`cancel`)
        self.cancelled = 0
        self._cancel_at_update: set[int] = set()
        #: the policy reads each request's FCFS horizon (``DWISE.starvation_slack``)
        self._horizon = bool(getattr(policy, "starvation_slack", 0.0))

    # -- arrivals ---------------------------------------------------------------------------
    def add_request(
        self,
        request_id: Hashable,
        prompt_blocks: int,
        admission_estimate: float | None = None,
        *,
        prompt_tokens: int,
        output_budget: int,
        block_size: int,
        arrival_time: float = 0.0,
        score: float | None = None,
        true_rounds: float | None = None,
        kv_tokens_worst_case: int | None = None,
    ) -> int:
        """Queue a request; returns its row (valid until it finishes).

        ``admission_estimate`` = estimated TOTAL denoising rounds (DWISE); ``true_rounds`` = the
        truth (oracle); ``score`` = an SJF/SRPT score. A request that could never fit the KV
        limit is refused now rather than left waiting forever.
        """
        where = f"request {request_id!r}"
        if request_id in self._row_of:
            raise SchedulerError(
                f"{where} is already queued or running; "
                "request ids must be unique among live requests"
            )
        if int(prompt_blocks) < 0:
            # 0 is legal: SGLang runs no prefill round for a prompt shorter than one block
            # (its tail shares the first output block), so such a request starts decoding.
            raise SchedulerError(f"{where}: prompt_blocks={prompt_blocks} must be >= 0")
        if int(block_size) < 1 or int(output_budget) < 1 or int(prompt_tokens) < 1:
            raise SchedulerError(
                f"{where}: prompt_tokens, output_budget and block_size must be >= 1 "
                f"(got {prompt_tokens}, {output_budget}, {block_size})"
            )
        needs = self.policy.needs
        est = (
            _finite_nonneg(admission_estimate, "admission_estimate", where)
            if "estimate" in needs
            else (
                _finite_nonneg(admission_estimate, "admission_estimate", where)
                if admission_estimate is not None
                else 0.0
            )
        )
        truth = (
            _finite_nonneg(true_rounds, "true_rounds", where)
            if "true_rounds" in needs
            else math.nan
        )
        sc = _finite_nonneg(score, "score", where) if "score" in needs else 0.0
        if "true_rounds" in needs and truth < 1:
            raise SchedulerError(
                f"{where}: true_rounds={true_rounds} must be >= 1 (every request denoises a block)"
            )
        if not math.isfinite(float(arrival_time)):
            raise SchedulerError(f"{where}: arrival_time={arrival_time} must be finite")
        kv_tokens = (
            int(kv_tokens_worst_case)
            if kv_tokens_worst_case is not None
            else self.kv.worst_case(prompt_tokens, output_budget, block_size)
        )
        self.kv.check_admissible(kv_tokens, where)
        t = self.table
        row = t.allocate()
        t.state[row] = WAITING
        t.ids[row] = request_id
        t.prompt_blocks[row] = int(prompt_blocks)
        t.prompt_total[row] = int(prompt_blocks)
        t.r_hat[row] = est
        t.r_hat_arrival[row] = est
        t.r_true[row] = truth
        t.score[row] = sc
        t.seq[row] = self._seq
        t.kv_tokens[row] = kv_tokens
        t.done_rounds[row] = 0
        t.attained[row] = 0
        t.refined_n[row] = 0
        t.arrival_round[row] = self.round_index
        t.arrival_time[row] = float(arrival_time)
        t.last_ran[row] = False
        t.fcfs_rounds[row] = math.nan  # set by the next plan_round when the policy reads it
        t.mark_dirty()
        self._seq += 1
        self._row_of[request_id] = row
        return row

    def cancel(self, request_id: Hashable) -> bool:
        """Forget a request that ended outside the round protocol (a client abort, the serving
        framework dropping it): its row, and its KV reservation if it was resident.

        Returns False for an id the scheduler does not hold (it already finished, or was never
        added), so a driver may cancel without first asking. Between ``update`` and the next
        ``plan_round`` the request is gone at once. While a plan is outstanding and names the
        request, it stays until ``update``, which then releases it whatever the result says
        (it is not counted as finished); the driver still reports every planned row.
        """
        row = self._row_of.get(request_id)
        if row is None:
            return False
        plan = self._plan
        if plan is not None and bool(np.any(plan.rows == row)):
            self._cancel_at_update.add(row)
            return True
        self._release_cancelled(np.asarray([row], dtype=np.int64))
        return True

    def _release_cancelled(self, rows: np.ndarray) -> None:
        t = self.table
        resident = rows[t.state[rows] == RESIDENT]
        if resident.size:
            self.kv.release(int(t.kv_tokens[resident].sum()))
        for rid in t.ids[rows].tolist():
            del self._row_of[rid]
        prev = self._prev_rows
        if prev is not None and prev.size:
            # the freed row may be reused by a new request: it did not "run last round"
            self._prev_rows = prev[~np.isin(prev, rows)]
        t.release(rows)
        self.cancelled += int(rows.size)

    def row_of(self, request_id: Hashable) -> int:
        try:
            return self._row_of[request_id]
        except KeyError:
            raise SchedulerError(
                f"unknown request id {request_id!r}; it finished or was never added"
            ) from None

    def set_scores(self, rows: np.ndarray, scores: np.ndarray) -> None:
        """Replace SJF/SRPT scores (a re-estimating driver calls this between rounds)."""
        s = np.asarray(scores, dtype=np.float64)
        if not np.all(np.isfinite(s)) or np.any(s < 0):
            raise SchedulerError("scores must be finite and >= 0; NaN means the score model failed")
        self.table.score[np.asarray(rows, dtype=np.int64)] = s

    def set_estimates(self, rows: np.ndarray, estimates: np.ndarray) -> int:
        """Replace the admission estimate of requests still waiting (a driver that swapped in
        a new bundle between rounds re-estimates the queue); a row that is no longer waiting
        keeps its own. Returns how many rows changed."""
        r = np.asarray(rows, dtype=np.int64)
        e = np.asarray(estimates, dtype=np.float64)
        if r.shape != e.shape:
            raise SchedulerError(f"{r.size} rows but {e.size} estimates; pass one per row")
        if not np.all(np.isfinite(e)) or np.any(e < 0):
            raise SchedulerError("estimates must be finite and >= 0")
        t = self.table
        keep = t.state[r] == WAITING
        r, e = r[keep], e[keep]
        t.r_hat[r] = e
        t.r_hat_arrival[r] = e
        if r.size:
            t.mark_dirty()
        return int(r.size)

    # -- views ------------------------------------------------------------------------------
    @property
    def n_waiting(self) -> int:
        return int(self.table.waiting.size)

    @property
    def n_resident(self) -> int:
        return int(self.table.resident.size)

    @property
    def idle(self) -> bool:
        return self.table.live_rows == 0

    # -- one round --------------------------------------------------------------------------
    def _admit(self, rows: np.ndarray) -> np.ndarray:
        """Make ``rows`` (in rank order) resident while room and KV last; returns those admitted."""
        t, kv = self.table, self.kv
        room = self.max_residents - t.resident.size
        if room <= 0 or rows.size == 0:
            return _EMPTY
        rows = rows[:room]
        need = t.kv_tokens[rows]
        if kv.reserved + int(need.sum()) <= kv.limit_tokens:
            taken = rows
        elif self.policy.preemptive:
            # Algorithm 1 walks the ranked candidates and admits each one whose reservation
            # still fits; a big one that does not fit does not block smaller ones behind it.
            keep = []
            free = kv.limit_tokens - kv.reserved
            for r, n in zip(rows.tolist(), need.tolist()):
                if n <= free:
                    keep.append(r)
                    free -= n
            taken = np.asarray(keep, dtype=np.int64)
        else:
            # strict order (FCFS/SJF): the head waits for memory, nobody overtakes it
            fits = np.cumsum(need) + kv.reserved <= kv.limit_tokens
            taken = rows[: int(np.argmin(fits)) if not fits.all() else rows.size]
        if taken.size:
            kv.reserve(int(t.kv_tokens[taken].sum()))
            t.state[taken] = RESIDENT
            t.mark_dirty()
        return taken

    def plan_round(self) -> RoundPlan:
        """Admit, rank and choose the blocks of the next round (see the module docstring)."""
        if self._plan is not None:
            raise SchedulerError(
                "plan_round() called twice without update(); "
                "report the previous round's result first"
            )
        t0 = time.perf_counter()
        t, pol, B, ri = self.table, self.policy, self.slots, self.round_index
        waiting, resident = t.waiting, t.resident
        if self._horizon and waiting.size:
            self._set_fcfs_horizon(waiting, resident)
        admitted = _EMPTY
        rows: np.ndarray | None = None
        if waiting.size and resident.size < self.max_residents:
            if pol.preemptive:
                # top-B of W ∪ S = top-B of (top-B of S) ∪ (top-B of W): two partitions of the
                # parts instead of one of the whole, and top-B of S is reused for the batch.
                ks = pol.key(t, resident, ri)
                top_s_pos = smallest(ks, t.seq[resident], B)
                top_s = resident[top_s_pos]
                kw = pol.key(t, waiting, ri)
                top_w_pos = smallest(kw, t.seq[waiting], B)
                top_w = waiting[top_w_pos]
                union = np.concatenate((top_s, top_w))
                ukeys = np.concatenate((ks[top_s_pos], kw[top_w_pos]))
                top = union[smallest(ukeys, t.seq[union], B)]
                cand = top[t.state[top] == WAITING]
                admitted = self._admit(cand)
                if self._mixed:
                    pool = np.concatenate((top_s, admitted)) if admitted.size else top_s
                    rows = pool[smallest(pol.key(t, pool, ri), t.seq[pool], B)]
            else:
                cand = waiting[
                    smallest(
                        pol.key(t, waiting, ri), t.seq[waiting], self.max_residents - resident.size
                    )
                ]
                admitted = self._admit(cand)
            if admitted.size:
                resident = t.resident
        # batch forming
        eligible = resident
        if not self._mixed and resident.size:
            in_prefill = resident[t.prompt_blocks[resident] > 0]
            if in_prefill.size:
                eligible = in_prefill
        if rows is not None:
            pass
        elif eligible.size > B or pol.preemptive:
            rows = eligible[smallest(pol.key(t, eligible, ri), t.seq[eligible], B)]
        else:
            rows = eligible
        # preemptions: ran last round, still resident and eligible now, not chosen
        preempted = _EMPTY
        prev = self._prev_rows
        if prev is not None and prev.size and eligible.size > rows.size:
            still = prev[(t.state[prev] == RESIDENT)]
            if still.size:
                ran_now = t.last_ran  # scratch: reuse last_ran as "chosen now" marker
                ran_now[still] = False
                ran_now[rows] = True
                if eligible is resident:
                    cand_pre = still
                else:
                    cand_pre = still[t.prompt_blocks[still] > 0]
                preempted = cand_pre[~ran_now[cand_pre]]
                ran_now[rows] = False
                self.preemptions += int(preempted.size)
        prompt = t.prompt_blocks[rows] > 0
        first = ~prompt & (t.done_rounds[rows] == 0)
        plan = RoundPlan(
            ri,
            rows,
            prompt,
            first,
            admitted,
            preempted,
            resident,
            t.ids[rows],
            time.perf_counter() - t0,
        )
        self._plan = plan
        return plan

    def _set_fcfs_horizon(self, waiting: np.ndarray, resident: np.ndarray) -> None:
        """Give the requests that arrived since the last plan their FCFS horizon: the rounds a
        B-slot FCFS server would need to clear the estimated work live now (P + r̂ summed over
        waiting ∪ resident, theirs included), and at least their own work (one block a round).
        O(live) once per round with arrivals: the ranking itself is O(live) already."""
        t = self.table
        new = waiting[np.isnan(t.fcfs_rounds[waiting])]
        if new.size:
            t.set_fcfs_horizons(new, self.slots, waiting, resident)

    _prev_rows: np.ndarray | None = None

    def update(self, result: RoundResult) -> float:
        """Fold a round's results into the request state; returns seconds spent (for metrics)."""
        t0 = time.perf_counter()
        plan = self._plan
        if plan is None:
            raise SchedulerError("update() called without a plan; call plan_round() first")
        rows = np.asarray(result.rows)
        if rows is not plan.rows and (
            rows.shape != plan.rows.shape or not np.array_equal(rows, plan.rows)
        ):
            raise SchedulerError(
                "RoundResult.rows differ from the planned "
                "rows; report exactly the rows of the last plan"
            )
        finished = np.asarray(result.finished, dtype=bool)
        if finished.shape != rows.shape:
            raise SchedulerError(
                f"RoundResult.finished has shape {finished.shape}, "
                f"expected {rows.shape} (one flag per planned row)"
            )
        t = self.table
        prompt = plan.prompt
        cancelled = _EMPTY
        if self._cancel_at_update:
            cancelled = np.fromiter(sorted(self._cancel_at_update), dtype=np.int64)
            self._cancel_at_update.clear()
            # a cancelled request is released below, not finished, whatever was reported
            finished = finished & ~np.isin(rows, cancelled)
        if prompt.any():
            if finished[prompt].any():
                raise SchedulerError(
                    "a request reported finished in a round that advanced its prompt block; "
                    "a request finishes only when its last output block is committed"
                )
            t.prompt_blocks[rows[prompt]] -= 1
        dec = rows[~prompt]
        if dec.size:
            new = np.maximum(t.r_hat[dec] - 1.0, 0.0)
            if result.refined is not None:
                refined = np.asarray(result.refined, dtype=np.float64)
                if refined.shape != rows.shape:
                    raise SchedulerError(
                        f"RoundResult.refined has shape {refined.shape}, "
                        f"expected {rows.shape} (NaN where none)"
                    )
                given = ~np.isnan(refined)
                if given.any():
                    if np.any(given & ~plan.first_denoise):
                        raise SchedulerError(
                            "a refined estimate was given for a request not in its first denoising "
                            "round; refinement is applied once, after the first denoising round "
                            "(pass NaN elsewhere)"
                        )
                    vals = refined[given]
                    if not np.all(np.isfinite(vals)) or np.any(vals < 0):
                        raise SchedulerError(
                            "refined estimates must be finite and >= 0 (NaN means none)"
                        )
                    ref_rows = rows[given]
                    t.r_hat[ref_rows] = vals
                    t.refined_n[ref_rows] += 1
                    self.refinements += int(ref_rows.size)
                    keep = ~given[~prompt]
                    t.r_hat[dec[keep]] = new[keep]
                else:
                    t.r_hat[dec] = new
            else:
                t.r_hat[dec] = new
            t.done_rounds[dec] += 1
            t.r_true[dec] -= 1.0
        t.attained[rows] += 1
        t.record_round(int(rows.size))
        # last_ran is used only transiently by plan_round; remember this round's rows instead
        self._prev_rows = rows
        if finished.any():
            done = rows[finished]
            t.record_finished(done)
            self.kv.release(int(t.kv_tokens[done].sum()))
            for rid in t.ids[done].tolist():
                del self._row_of[rid]
            t.release(done)
            self.finished += int(done.size)
        if cancelled.size:
            self._release_cancelled(cancelled)
        self.round_index += 1
        self._plan = None
        return time.perf_counter() - t0

    def check_invariants(self) -> None:
        """Consistency checks used by the property tests (cheap enough to call each round there)."""
        t = self.table
        res = t.resident
        if res.size > self.max_residents:
            raise SchedulerError(f"{res.size} residents exceed the cap {self.max_residents}")
        if (
            int(t.kv_tokens[res].sum()) != self.kv.reserved
            or self.kv.reserved > self.kv.limit_tokens
        ):
            raise SchedulerError("KV reservations out of balance or over the limit")
        if np.any(t.refined_n[: t.capacity] > 1):
            raise SchedulerError("a request was refined more than once")
        if np.any(t.state[t.waiting] != WAITING) or np.any(t.state[res] != RESIDENT):
            raise SchedulerError("cached residency views are stale")
        if self._plan is None and self._cancel_at_update:
            raise SchedulerError("a cancellation waits for an update that no plan will bring")
        live = np.flatnonzero(t.state != FREE)
        if live.size != len(self._row_of):
            raise SchedulerError("id map and table disagree")
