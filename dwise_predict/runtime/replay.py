"""The three pieces of state a trace replay keeps besides the scheduler's own.

:func:`~.simulator.simulate` is a loop of "admit arrivals, plan, advance, charge time, report";
each piece of state that loop touches has a home here, so the loop reads as those steps:

* :class:`ArrivalFeed`: which requests have arrived by now, handed to the scheduler once;
* :class:`RequestProgress`: what each request has *really* done (prompt blocks processed,
  the output block it is on, rounds left in that block), which the scheduler only estimates,
  and when it produced its first block and finished;
* :class:`RoundLog`: the clock and the per-round records the metrics are computed from
  (time, filled slots, prompt slots, context attended, scheduler seconds).

All arrays are indexed by the request's position in the workload (``i``), not by the
scheduler's table row; the simulator maps rows to requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import SchedulerError
from .arrivals import Arrivals
from .costtime import ProfileRoundTime, RoundSlots
from .roundtime import RoundTimeModel
from .scheduler import Scheduler
from .workload import Workload

#: an arrival this close after the clock has arrived: what is left of floating-point error
#: once the clock is summed with compensation (rounds last microseconds at least)
ARRIVAL_TOLERANCE_S = 1e-9


@dataclass
class ArrivalFeed:
    """Hands requests to the scheduler in arrival order as the clock passes their times.

    ``priced_late_when_full`` models how the SGLang plugin takes arrivals it prices with a text
    encoder (a policy ranked by DWS cost, the ``lightgbm+dws`` admission source): while fewer
    than B requests are resident they are priced at once; once B are, a round's arrivals are
    priced on a worker thread during the round's forward and join the queue at the next round.
    """

    workload: Workload
    arrivals: Arrivals
    inputs: dict[str, np.ndarray | None]
    priced_late_when_full: bool = False
    #: workload index of the request in each scheduler row (rows are reused, so it is rewritten)
    request_of_row: np.ndarray = field(init=False)
    next: int = 0
    n: int = field(init=False)
    #: arrivals being priced (positions in the arrival order): they join at the next round
    pricing: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.n = self.workload.n
        self.request_of_row = np.zeros(self.n + 1, dtype=np.int64)

    def arrival_times(self) -> np.ndarray:
        """Arrival time of every request, by workload index."""
        out = np.zeros(self.n)
        out[self.arrivals.order] = self.arrivals.times
        return out

    def next_arrival(self) -> float | None:
        """When the next request arrives (None once all have)."""
        if self.next >= self.n:
            return None
        return float(self.arrivals.times[self.next])

    def admit_until(self, sched: Scheduler, now: float) -> None:
        """Add every request that has arrived by ``now`` to the scheduler's waiting queue (or,
        under ``priced_late_when_full`` with B residents, start pricing it for the next round)."""
        for j in self.pricing:
            self._add(sched, j)
        self.pricing = []
        times = self.arrivals.times
        now += ARRIVAL_TOLERANCE_S
        if self.next >= self.n or times[self.next] > now:
            return
        late = self.priced_late_when_full and sched.n_resident >= sched.slots
        while self.next < self.n and times[self.next] <= now:
            if late:
                self.pricing.append(self.next)
            else:
                self._add(sched, self.next)
            self.next += 1

    def _add(self, sched: Scheduler, j: int) -> None:
        """Queue the ``j``-th arrival, with the arrival time it really had."""
        i = int(self.arrivals.order[j])
        row = queue_request(sched, self.workload, self.inputs, i, float(self.arrivals.times[j]))
        self.request_of_row[row] = i


def queue_request(
    sched: Scheduler,
    workload: Workload,
    inputs: dict[str, np.ndarray | None],
    i: int,
    arrival_time: float = 0.0,
) -> int:
    """Add workload request ``i`` to ``sched``'s waiting queue with the inputs its policy reads
    (:func:`~.simulator.policy_inputs`); returns its row."""
    w = workload
    adm, truth, score = inputs["admission"], inputs["true_rounds"], inputs["score"]
    return sched.add_request(
        w.request_ids[i],
        int(w.prompt_blocks[i]),
        None if adm is None else float(adm[i]),
        prompt_tokens=int(w.prompt_tokens[i]),
        output_budget=int(w.output_budget[i]),
        block_size=int(w.block_size[i]),
        arrival_time=arrival_time,
        score=None if score is None else float(score[i]),
        true_rounds=None if truth is None else float(truth[i]),
    )


@dataclass
class RequestProgress:
    """The true progress of every request, advanced one block per planned slot per round."""

    workload: Workload
    prompt_done: np.ndarray = field(init=False)
    block: np.ndarray = field(init=False)
    #: denoising rounds left in the current output block (from the trace)
    left: np.ndarray = field(init=False)
    first_block_time: np.ndarray = field(init=False)
    finish_time: np.ndarray = field(init=False)
    finished: int = 0
    n: int = field(init=False)
    _order: list[np.ndarray] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        w = self.workload
        self.n = w.n
        self.prompt_done = np.zeros(w.n, dtype=np.int64)
        self.block = np.zeros(w.n, dtype=np.int64)
        self.left = w.rounds_flat[w.block_offsets[:-1]].copy()
        self.first_block_time = np.full(w.n, np.nan)
        self.finish_time = np.full(w.n, np.nan)

    @property
    def all_finished(self) -> bool:
        return self.finished >= self.n

    def completion_order(self) -> np.ndarray:
        return np.concatenate(self._order) if self._order else np.zeros(0, dtype=np.int64)

    def context_tokens(self, req: np.ndarray, is_prompt: np.ndarray) -> np.ndarray:
        """Tokens each slot's block attends: the prompt so far, or the prompt and the outputs."""
        w = self.workload
        bs, ptok = w.block_size[req], w.prompt_tokens[req]
        return np.where(
            is_prompt,
            np.minimum((self.prompt_done[req] + 1) * bs, ptok),
            ptok + (self.block[req] + 1) * bs,
        )

    def round_slots(self, req: np.ndarray, is_prompt: np.ndarray) -> RoundSlots:
        """What each slot of this round does: the composition a round-time model prices."""
        w = self.workload
        block = self.block[req]
        this_block = w.block_offsets[req] + np.minimum(block, w.output_blocks[req] - 1)
        return RoundSlots(
            prompt=is_prompt,
            context=self.context_tokens(req, is_prompt),
            prompt_blocks=w.prompt_blocks[req],
            prompt_index=self.prompt_done[req],
            block=block,
            step=w.rounds_flat[this_block] - self.left[req],
            commits=~is_prompt & (self.left[req] == 1),
        )

    def advance(self, req: np.ndarray, is_prompt: np.ndarray, now: float) -> np.ndarray:
        """Run one block of each slot; returns, aligned with the slots, which requests finished.

        A prompt slot processes one prompt block. A denoising slot spends one round of its
        current output block; a block whose traced rounds are used up is committed, the first
        commit stamps the request's first-block time, the last one its finish time.
        """
        finished = np.zeros(req.size, dtype=bool)
        self.prompt_done[req[is_prompt]] += 1
        denoise = ~is_prompt
        dq = req[denoise]
        if dq.size == 0:
            return finished
        self.left[dq] -= 1
        committed = self.left[dq] == 0
        if not committed.any():
            return finished
        w = self.workload
        commit = dq[committed]
        self.block[commit] += 1
        first = commit[np.isnan(self.first_block_time[commit])]
        self.first_block_time[first] = now
        last = self.block[commit] == w.output_blocks[commit]
        done = commit[last]
        if done.size:
            self.finish_time[done] = now
            finished[np.flatnonzero(denoise)[committed][last]] = True
            self._order.append(done)
            self.finished += int(done.size)
        more = commit[~last]
        if more.size:
            self.left[more] = w.rounds_flat[w.block_offsets[more] + self.block[more]]
        return finished


@dataclass
class RoundLog:
    """The clock and one record per round: what the metrics are computed from.

    The clock is ``origin`` (seconds: 0, or the arrival an idle server last waited for) plus
    the milliseconds charged since, summed with compensation. A plain running sum in seconds
    drifts (a thousand 1 ms rounds do not add up to 1.0 s exactly), and a replay whose
    arrivals fall on round boundaries, as a served run's do, then sees some arrivals a round
    late: a different schedule, not a rounding error.
    """

    round_time: RoundTimeModel | ProfileRoundTime
    capacity: int
    origin: float = 0.0
    rounds: int = 0
    #: milliseconds charged since ``origin`` (a Neumaier sum: ``_ms + _ms_carry``)
    _ms: float = field(init=False, default=0.0)
    _ms_carry: float = field(init=False, default=0.0)
    ms: np.ndarray = field(init=False)
    filled: np.ndarray = field(init=False)
    prompt: np.ndarray = field(init=False)
    context: np.ndarray = field(init=False)
    sched_s: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.ms = np.zeros(self.capacity)
        self.filled = np.zeros(self.capacity, dtype=np.int64)
        self.prompt = np.zeros(self.capacity, dtype=np.int64)
        self.context = np.zeros(self.capacity)
        self.sched_s = np.zeros(self.capacity)

    def check_room(self, unfinished: int) -> None:
        if self.rounds >= self.capacity:
            raise SchedulerError(
                f"simulation exceeded {self.capacity} rounds with {unfinished} "
                "requests unfinished; the policy starves requests or max_rounds "
                "is too small"
            )

    @property
    def now(self) -> float:
        """Seconds since the replay began."""
        return self.origin + (self._ms + self._ms_carry) / 1000.0

    def wait_until(self, t: float) -> None:
        """An idle server waits for the next arrival at ``t`` seconds."""
        self.origin, self._ms, self._ms_carry = float(t), 0.0, 0.0

    def charge(self, slots: RoundSlots) -> float:
        """Advance the clock by the round-time model's time for this round; returns it (ms)."""
        dt_ms = float(self.round_time.time_round(slots))
        total = self._ms + dt_ms
        if abs(self._ms) >= abs(dt_ms):
            self._ms_carry += (self._ms - total) + dt_ms
        else:
            self._ms_carry += (dt_ms - total) + self._ms
        self._ms = total
        return dt_ms

    def record(
        self, dt_ms: float, filled: int, prompt: int, context_tokens: float, sched_s: float
    ) -> None:
        i = self.rounds
        self.ms[i], self.filled[i], self.prompt[i] = dt_ms, filled, prompt
        self.context[i], self.sched_s[i] = context_tokens, sched_s
        self.rounds += 1
