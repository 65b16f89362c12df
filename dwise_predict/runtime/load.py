"""A scheduler's outstanding predicted work, kept up to date per event: the fleet's load signal.

Why: a dispatcher in front of several replicas (SGLang's data-parallel controller, an outside
router) sends a request where it will finish soonest, and what a replica still has to do is its
*work*: prompt blocks left plus r̂, summed over its waiting and resident requests, in rounds
(one block of one request for one round). Summing that over thousands of live rows every round
would cost as much as ranking them; :class:`LoadTrackingScheduler` keeps the sum instead:

* an arrival adds its prompt blocks plus its admission estimate;
* a round changes only the rows it ran (a prompt block done, r̂ down by one or replaced by the
  refined estimate, a finished request gone): the sum moves by the difference over those rows,
  O(B) numpy on arrays the round already touches, never O(live);
* a cancelled request (an abort, a request that left the server's queues) takes its remaining
  work with it.

When nothing is live the sums are reset to exactly 0, so rounding cannot drift over a long run.
With a cost profile (:class:`WorkPrice`) the same work is also kept in seconds.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from ..cost import CostProfile
from ..errors import ConfigError
from .policies import Policy
from .request import FREE, WAITING, RoundResult
from .scheduler import Scheduler


class WorkPrice:
    """Seconds of a request's remaining work, priced by a deployment's cost profile.

    A prompt block j of a request with m prompt blocks costs ``alpha + alpha2 * (2j + 1)`` (the
    profile's prefill terms), so the P blocks left cost ``alpha * P + alpha2 * (m^2 - (m-P)^2)``;
    a denoising round costs the profile's mean step cost ``mean(K) + delta * m``. Work served
    one request at a time: a batched round runs many of these at once, so the figure ranks
    replicas and sizes backlogs; it is not a wall-clock forecast.
    """

    def __init__(self, profile: CostProfile) -> None:
        if not isinstance(profile, CostProfile):
            raise ConfigError("WorkPrice needs a CostProfile (dwise_predict.cost)")
        self.alpha_s = profile.alpha_ms / 1000.0
        self.alpha2_s = profile.alpha2_ms / 1000.0
        self.step_s = float(np.mean(profile.K_ms)) / 1000.0
        self.delta_s = profile.delta_ms / 1000.0

    def seconds(
        self, prompt_left: np.ndarray, prompt_total: np.ndarray, r_hat: np.ndarray
    ) -> float:
        """Summed seconds of rows with ``prompt_left`` of ``prompt_total`` blocks and r̂ left."""
        p = prompt_left.astype(np.float64)
        m = prompt_total.astype(np.float64)
        prefill = self.alpha_s * p + self.alpha2_s * (m * m - (m - p) ** 2)
        return float((prefill + r_hat * (self.step_s + self.delta_s * m)).sum())


class LoadTrackingScheduler(Scheduler):
    """A :class:`~.scheduler.Scheduler` that knows its outstanding predicted work in O(1).

    ``outstanding_rounds``: prompt blocks left plus r̂ over waiting and resident requests;
    ``outstanding_seconds``: the same priced by ``price`` (NaN without one). Both equal what
    :meth:`recount` sums over the live rows, round for round (tested).
    """

    def __init__(self, policy: Policy, *, price: WorkPrice | None = None, **kwargs: Any) -> None:
        super().__init__(policy, **kwargs)
        self.price = price
        self.outstanding_rounds = 0.0
        self.outstanding_seconds = 0.0 if price is not None else math.nan

    def _work(self, rows: np.ndarray) -> tuple[float, float]:
        t = self.table
        rounds = float((t.prompt_blocks[rows] + t.r_hat[rows]).sum())
        if self.price is None:
            return rounds, math.nan
        return rounds, self.price.seconds(
            t.prompt_blocks[rows], t.prompt_total[rows], t.r_hat[rows]
        )

    def _move(self, rounds: float, seconds: float) -> None:
        if self.table.live_rows == 0:  # exactly nothing left: no rounding carried over
            self.outstanding_rounds = 0.0
            self.outstanding_seconds = 0.0 if self.price is not None else math.nan
            return
        self.outstanding_rounds = max(self.outstanding_rounds + rounds, 0.0)
        if self.price is not None:
            self.outstanding_seconds = max(self.outstanding_seconds + seconds, 0.0)

    def outstanding_work(self) -> np.ndarray:
        """Each live request's outstanding work in rounds (prompt blocks left + r̂): O(live),
        for the work histogram a replica reports at each load snapshot."""
        t = self.table
        live = np.concatenate([t.waiting, t.resident])
        return np.asarray(t.prompt_blocks[live] + t.r_hat[live], dtype=np.float64)

    def recount(self) -> tuple[float, float]:
        """(rounds, seconds) summed over every live row: O(live), for checks."""
        t = self.table
        return self._work(np.concatenate([t.waiting, t.resident]))

    def add_request(self, request_id: Hashable, *args: Any, **kwargs: Any) -> int:
        row = super().add_request(request_id, *args, **kwargs)
        self._move(*self._work(np.asarray([row])))
        return row

    def update(self, result: RoundResult) -> float:
        plan = self._plan
        if plan is None:
            return super().update(result)  # the base class refuses it, naming the mistake
        rows = plan.rows
        before = self._work(rows)
        seconds = super().update(result)
        live = rows[self.table.state[rows] != FREE]  # finished and cancelled rows are gone
        after = self._work(live)
        self._move(after[0] - before[0], after[1] - before[1])
        return seconds

    def set_estimates(self, rows: np.ndarray, estimates: np.ndarray) -> int:
        r = np.unique(np.asarray(rows, dtype=np.int64))
        r = r[(r >= 0) & (r < self.table.capacity)]
        r = r[self.table.state[r] == WAITING]  # only waiting rows change
        before = self._work(r)
        n = super().set_estimates(rows, estimates)
        after = self._work(r)
        self._move(after[0] - before[0], after[1] - before[1])
        return n

    def cancel(self, request_id: Hashable) -> bool:
        row = self._row_of.get(request_id)
        if row is None:
            return False
        work = self._work(np.asarray([row]))
        super().cancel(request_id)
        if request_id not in self._row_of:  # released now (else at the next update, counted there)
            self._move(-work[0], -work[1])
        return True
