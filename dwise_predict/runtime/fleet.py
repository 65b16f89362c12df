"""Dispatch across data-parallel replicas by predicted work, and a fleet replay to measure it.

Why: a request's work varies more than 100x, so the replica it lands on decides its latency as
much as its place in that replica's queue. The dispatchers servers ship count requests or
tokens; a replica's plugin knows the *work* it still holds (prompt blocks left plus r̂ over its
waiting and resident requests), and a request is priced at arrival in microseconds. Three
pieces, usable from any router:

* :class:`ReplicaLoad`: one replica's load snapshot (what a plugin exports as gauges);
* :class:`WorkHistogram`: how a replica's outstanding work is spread over its requests, in
  fixed log-spaced buckets (a report of a fixed size however long the queue);
* :class:`Dispatcher`: snapshots in, a replica out. It keeps SGLang's ``DPBudget`` shape
  (per-replica counters refreshed from snapshots, bumped locally by each dispatch until the next
  snapshot, so a burst between two reports does not pile onto one replica) and adds the
  ``dwise`` method and ``oracle`` (the same with true work, for replays). A replica whose
  snapshot is missing or stale sends every choice back to round robin (logged once), as
  SGLang's controller does before its first load report;
* :func:`simulate_fleet`: R replicas, each a :class:`~.scheduler.Scheduler` under one policy,
  run in lockstep one round per tick behind a dispatcher, on the same workloads and arrival
  processes as :func:`~.simulator.simulate`; :func:`compare_dispatch` runs it for every policy
  and method (``dwise-predict simulate --replicas R``).

Why ``dwise`` does not send a request to the replica with the least outstanding work: every
replica runs shortest remaining work first, so a request waits only for the work *shorter than
its own* there, and delays each request *longer than its own* there by its own work. Sending it
where ``work_ahead + longer × own`` is least adds the least to the sum of completion times (the
1/B of a replica's B rows is the same on every replica). Least outstanding work counts a long
request's work as if a short arrival waited behind it, which SRPT never makes it do: measured in
SGLang's controller it lost to round robin on the split mix, and so did its oracle
(docs/fleet.md).

Why ``dwise`` takes the near-best replicas in turn rather than the single best: on a fleet of
alike replicas most arrivals add about as much to each, and the exact minimum of those
estimates chases their noise. Measured at the paper's scale (100,000 requests, 32 replicas x
B = 128, 1.1x capacity, the tail guard on every replica), the exact minimum matched round
robin's mean and raised its p99 by 6%; rotating among the replicas within
:data:`DEFAULT_TOLERANCE` of the least added cost kept round robin's evenness where the choice
does not matter and the work rule where it does, with a mean and a p99 below round robin's
(docs/fleet.md).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, SchedulerError
from .arrivals import Arrivals, ArrivalSpec, make_arrivals
from .policies import Policy
from .replay import ARRIVAL_TOLERANCE_S, RequestProgress, queue_request
from .request import RoundResult
from .scheduler import Scheduler
from .simulator import DEFAULT_KV_POOL_TOKENS, policy_inputs, refined_estimates
from .workload import Workload

log = logging.getLogger(__name__)

#: SGLang's own methods, then the work-aware ones
DISPATCH_METHODS = ("round_robin", "total_requests", "total_tokens", "dwise", "oracle")

#: the work histogram's bucket edges, in rounds: 0, then 2^(i/4) from 1 to 2^20 (a bucket
#: spans 19%), then everything above
WORK_EDGES: tuple[float, ...] = (0.0, *(2.0 ** (i / 4) for i in range(81)))
WORK_BUCKETS = len(WORK_EDGES)  # the last one is open: [2^20, inf)

#: ``dwise``/``oracle``: the replicas whose added cost is within this share of the least are
#: taken in round-robin order (0: always the least, ties to fewer requests)
DEFAULT_TOLERANCE = 0.2


@dataclass(frozen=True)
class WorkHistogram:
    """A replica's outstanding work per request, bucketed: ``counts[b]`` requests with work in
    ``[WORK_EDGES[b], WORK_EDGES[b + 1])``, summing to ``sums[b]`` rounds.

    What a dispatcher needs of a replica running shortest remaining work first, for an arrival
    of work ``w`` (:meth:`ahead_longer`): the work of the requests shorter than ``w`` and the
    number longer, each to within the bucket that holds ``w``."""

    counts: np.ndarray
    sums: np.ndarray

    @classmethod
    def empty(cls) -> WorkHistogram:
        return cls(np.zeros(WORK_BUCKETS), np.zeros(WORK_BUCKETS))

    @classmethod
    def of(cls, work: np.ndarray) -> WorkHistogram:
        """The histogram of per-request work ``work`` (rounds; negative counts as 0)."""
        w = np.maximum(np.asarray(work, dtype=np.float64).ravel(), 0.0)
        b = _bucket(w)
        return cls(
            np.bincount(b, minlength=WORK_BUCKETS).astype(np.float64),
            np.bincount(b, weights=w, minlength=WORK_BUCKETS),
        )

    def __post_init__(self) -> None:
        if self.counts.shape != (WORK_BUCKETS,) or self.sums.shape != (WORK_BUCKETS,):
            raise ConfigError(
                f"a work histogram has {WORK_BUCKETS} buckets, got {self.counts.shape} counts "
                f"and {self.sums.shape} sums: the report is from another version"
            )

    def added(self, work: float) -> WorkHistogram:
        """This histogram with one more request of ``work`` rounds."""
        w = max(float(work), 0.0)
        b = int(_bucket(w))
        counts, sums = self.counts.copy(), self.sums.copy()
        counts[b] += 1.0
        sums[b] += w
        return WorkHistogram(counts, sums)

    def ahead_longer(self, work: float) -> tuple[float, float]:
        """(rounds of the requests shorter than ``work``, how many are longer): whole buckets
        below and above ``work``'s, and its own bucket split as if spread evenly over it."""
        w = max(float(work), 0.0)
        b = int(_bucket(w))
        ahead = float(self.sums[:b].sum())
        longer = float(self.counts[b + 1 :].sum())
        c = float(self.counts[b])
        if c > 0:
            lo = _EDGES[b]
            hi = _EDGES[b + 1] if b + 1 < WORK_BUCKETS else max(lo * 2.0, w)
            share = min(max((w - lo) / (hi - lo), 0.0), 1.0) if hi > lo else 1.0
            ahead += self.sums[b] * share
            longer += c * (1.0 - share)
        return ahead, longer


_EDGES = np.asarray(WORK_EDGES)


def _bucket(work: np.ndarray | float) -> np.ndarray:
    """The bucket of each (non-negative) work value."""
    return np.searchsorted(_EDGES, work, side="right") - 1


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's load, as its plugin reports it at ``timestamp`` (seconds)."""

    replica: int
    #: waiting + resident requests
    requests: int
    #: KV tokens those requests hold or will hold (the core's worst-case reservations)
    tokens: int
    #: predicted outstanding work in rounds: prompt blocks left + r̂, over those requests
    work_rounds: float
    #: true outstanding work in rounds (replays only, for the ``oracle`` method; NaN when
    #: unknown)
    true_work_rounds: float = math.nan
    timestamp: float = 0.0
    #: the predicted work priced by a cost profile, in seconds (NaN without one)
    work_seconds: float = math.nan
    #: how ``work_rounds`` is spread over the requests (None: the replica did not say, and
    #: ``dwise`` ranks it by ``work_rounds`` alone)
    work_hist: WorkHistogram | None = None
    #: the same of the true work (replays only, for ``oracle``)
    true_work_hist: WorkHistogram | None = None


def replica_load(
    sched: Scheduler,
    replica: int,
    timestamp: float = 0.0,
    true_work_rounds: float = math.nan,
    true_work: np.ndarray | None = None,
) -> ReplicaLoad:
    """The load snapshot of a core scheduler: what a plugin reports for its replica
    (``true_work``: each live request's true work left, for replays)."""
    t = sched.table
    live = np.concatenate([t.waiting, t.resident])
    work = t.prompt_blocks[live] + t.r_hat[live]
    return ReplicaLoad(
        replica=replica,
        requests=int(live.size),
        tokens=int(t.kv_tokens[live].sum()),
        work_rounds=float(work.sum()),
        true_work_rounds=float(true_work_rounds),
        timestamp=float(timestamp),
        work_hist=WorkHistogram.of(work),
        true_work_hist=None if true_work is None else WorkHistogram.of(true_work),
    )


@dataclass
class Dispatcher:
    """Chooses a replica per arrival from the replicas' latest :class:`ReplicaLoad`.

    ``method``: ``round_robin``, ``total_requests`` and ``total_tokens`` (SGLang's, same
    tie-breaks), ``dwise`` (the replica where the arrival adds least to the sum of completion
    times under SRPT: ``work_ahead + longer × own`` from the replica's work histogram, taking
    the replicas within ``tolerance`` × the least of it in round-robin order; by least
    outstanding work while a replica reports no histogram) or ``oracle`` (the same with true
    work). A snapshot older than ``stale_after`` seconds,
    or none at all, sends the choice to round robin until every replica reports again; a
    replica whose last snapshot found it idle (no requests) stays fresh however old that
    snapshot is, since an idle server reports only when its state changes (SGLang's does).
    """

    replicas: int
    method: str = "dwise"
    stale_after: float = math.inf
    tolerance: float = DEFAULT_TOLERANCE
    _requests: list[float] = field(init=False)
    _tokens: list[float] = field(init=False)
    _work: list[float] = field(init=False)
    _hist: list[WorkHistogram | None] = field(init=False)
    _seen: list[float] = field(init=False)
    _idle: list[bool] = field(init=False)
    _next_rr: int = field(init=False, default=0)
    _warned: bool = field(init=False, default=False)
    #: choices made by round robin because a report was missing or stale
    fallbacks: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.method not in DISPATCH_METHODS:
            raise ConfigError(f"dispatch method {self.method!r} is not one of {DISPATCH_METHODS}")
        if self.replicas < 1:
            raise ConfigError(f"a fleet needs at least one replica, got {self.replicas}")
        if not self.stale_after > 0:
            raise ConfigError(f"stale_after={self.stale_after} must be > 0 seconds")
        if not (math.isfinite(self.tolerance) and self.tolerance >= 0):
            raise ConfigError(
                f"tolerance={self.tolerance} must be a finite share >= 0 of the least added "
                "cost (0: always the least)"
            )
        n = self.replicas
        self._requests, self._tokens, self._work = [0.0] * n, [0.0] * n, [0.0] * n
        self._hist = [None] * n
        self._seen = [-math.inf] * n
        self._idle = [False] * n

    def update(self, loads: Iterable[ReplicaLoad]) -> None:
        """Fold in the replicas' snapshots (replacing the local bumps since their last one).

        A snapshot already folded in (the same timestamp) is skipped, so the dispatches counted
        since it stay counted until the replica reports again (SGLang's ``DPBudget`` does the
        same): a reader polling faster than replicas report does not erase them."""
        for load in loads:
            r = load.replica
            if not 0 <= r < self.replicas:
                raise ConfigError(f"load report of replica {r}; the fleet has {self.replicas}")
            if load.timestamp == self._seen[r]:
                continue
            self._requests[r], self._tokens[r] = float(load.requests), float(load.tokens)
            oracle = self.method == "oracle"
            self._work[r] = load.true_work_rounds if oracle else load.work_rounds
            self._hist[r] = load.true_work_hist if oracle else load.work_hist
            self._seen[r] = load.timestamp
            self._idle[r] = load.requests == 0

    def choose(self, *, work_rounds: float = 0.0, tokens: int = 0, now: float = 0.0) -> int:
        """The replica for one arrival, whose own work (``work_rounds``: prompt blocks plus its
        admission estimate, or its true work under ``oracle``) and prompt ``tokens`` are then
        counted on that replica until its next snapshot."""
        if self.method == "round_robin" or self._stale(now):
            target = self._next_rr
            self._next_rr = (self._next_rr + 1) % self.replicas
        elif self.method == "total_requests":
            target = min(range(self.replicas), key=lambda i: self._requests[i])
        elif self.method == "total_tokens":
            target = min(range(self.replicas), key=lambda i: (self._tokens[i], self._requests[i]))
        else:  # dwise, oracle
            target = self._least_added(float(work_rounds))
        self._requests[target] += 1
        self._tokens[target] += tokens
        self._work[target] += max(float(work_rounds), 0.0)
        hist = self._hist[target]
        if hist is not None:
            self._hist[target] = hist.added(work_rounds)
        return target

    def _least_added(self, own: float) -> int:
        """The replica where a request of work ``own`` adds least to the sum of completion
        times under SRPT (module docstring), the next in turn among those within
        ``tolerance`` of the least; least outstanding work while any replica has sent no
        histogram. Fewer requests on a tie."""
        hists = self._hist
        if any(h is None for h in hists):
            return min(range(self.replicas), key=lambda i: (self._work[i], self._requests[i]))
        own = max(own, 0.0)
        cost = []
        for h in hists:
            ahead, longer = h.ahead_longer(own)  # type: ignore[union-attr]
            cost.append(ahead + longer * own)
        if self.tolerance == 0:
            return min(range(self.replicas), key=lambda i: (cost[i], self._requests[i]))
        limit = min(cost) * (1.0 + self.tolerance)
        turn = ((self._next_rr + step) % self.replicas for step in range(self.replicas))
        i = next(i for i in turn if cost[i] <= limit)  # the least is within its own limit
        self._next_rr = (i + 1) % self.replicas
        return i

    def stale_replicas(self, now: float) -> list[int]:
        """The replicas with no report yet, or whose last report (of a busy replica) is older
        than ``stale_after`` seconds at ``now``."""
        return [
            r
            for r, t in enumerate(self._seen)
            if t == -math.inf or (now - t > self.stale_after and not self._idle[r])
        ]

    def _stale(self, now: float) -> bool:
        if self.method == "round_robin":
            return False
        stale = self.stale_replicas(now)
        if not stale:
            return False
        self.fallbacks += 1
        if not self._warned:
            log.warning(
                "dispatch %s: no fresh load report from replica(s) %s; round robin until "
                "every replica reports",
                self.method,
                stale[:8],
            )
            self._warned = True
        return True


@dataclass
class FleetRun:
    """Outcome of one fleet replay; times in rounds (one tick = one round on every replica)."""

    method: str
    policy: str
    replicas: int
    arrival_round: np.ndarray
    finish_round: np.ndarray
    replica_of: np.ndarray
    fallbacks: int

    @property
    def completion_rounds(self) -> np.ndarray:
        return self.finish_round - self.arrival_round

    def summary(self) -> dict[str, float | int | list[int]]:
        c = self.completion_rounds
        done = np.isfinite(c)
        return {
            "mean_completion_rounds": float(c[done].mean()) if done.any() else math.nan,
            "p99_completion_rounds": float(np.percentile(c[done], 99)) if done.any() else math.nan,
            "finished": int(done.sum()),
            "requests": int(c.size),
            "requests_per_replica": np.bincount(self.replica_of, minlength=self.replicas).tolist(),
            "fallbacks": self.fallbacks,
        }


def simulate_fleet(
    workload: Workload,
    policy: Policy,
    *,
    replicas: int,
    method: str = "dwise",
    arrivals: Arrivals | ArrivalSpec | str = "burst",
    round_ms: float = 1.0,
    slots: int = 16,
    k: int = 8,
    kv_pool_tokens: int = DEFAULT_KV_POOL_TOKENS,
    seed: int = 0,
    snapshot: str = "core",
    tolerance: float = DEFAULT_TOLERANCE,
) -> FleetRun:
    """Replay ``workload`` on ``replicas`` schedulers under ``policy`` behind ``method``.

    ``snapshot``: what each replica reports for SGLang's methods. ``core``: its waiting and
    resident requests and their KV reservations. ``sglang-dllm``: what SGLang 0.5.23's load
    snapshot says of a dLLM server, whose admitted requests sit in no batch it counts: only the
    requests not yet admitted, and their reservations (replays of served SGLang fleets).
    ``tolerance``: the ``dwise``/``oracle`` dispatcher's (:class:`Dispatcher`).

    Every tick, each replica reports its load, the arrivals of the tick are dispatched in
    arrival order, and each replica with live requests runs one round (``round_ms`` of the
    arrival clock). Each request's true work is the workload's, whichever replica runs it.
    """
    n = workload.n
    arr = arrivals if isinstance(arrivals, Arrivals) else make_arrivals(arrivals, n, seed)
    if arr.order.size != n:
        raise ConfigError(f"arrivals cover {arr.order.size} requests but the workload has {n}")
    if not round_ms > 0:
        raise ConfigError(f"round_ms={round_ms} must be > 0")
    inputs = policy_inputs(workload, policy)
    if snapshot not in ("core", "sglang-dllm"):
        raise ConfigError(f"snapshot={snapshot!r} is not one of ('core', 'sglang-dllm')")
    fleet = _Fleet(workload, policy, inputs, replicas, slots, k, kv_pool_tokens)
    fleet.waiting_only = snapshot == "sglang-dllm"
    dispatcher = Dispatcher(replicas, method, tolerance=tolerance)
    dt = round_ms / 1000.0
    arrival_round = np.full(n, np.nan)
    progress = RequestProgress(workload)
    tick, nxt, cap = 0, 0, int(workload.work.sum()) + n + 1
    while not progress.all_finished:
        if fleet.idle and nxt < n:  # an empty fleet waits for the next arrival
            tick = max(tick, int(math.ceil(arr.times[nxt] / dt - 1e-9)))
        now = tick * dt + ARRIVAL_TOLERANCE_S
        dispatcher.update(fleet.loads(tick * dt))
        while nxt < n and arr.times[nxt] <= now:
            i = int(arr.order[nxt])
            fleet.admit(i, dispatcher)
            arrival_round[i] = tick
            nxt += 1
        fleet.run_round(progress, float(tick + 1))
        tick += 1
        if tick > cap:
            raise SchedulerError(f"fleet replay passed {cap} rounds with requests unfinished")
    return FleetRun(
        method,
        policy.name,
        replicas,
        arrival_round,
        progress.finish_time,  # stamped with the round count, see run_round
        fleet.replica_of,
        dispatcher.fallbacks,
    )


class _Fleet:
    """The replicas' schedulers and which row of which replica holds each request."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        inputs: dict[str, np.ndarray | None],
        replicas: int,
        slots: int,
        k: int,
        kv_pool_tokens: int,
    ) -> None:
        self.w, self.inputs = workload, inputs
        self.scheds = [
            Scheduler(policy, slots=slots, k=k, kv_pool_tokens=kv_pool_tokens, capacity=1024)
            for _ in range(replicas)
        ]
        self.request_of_row: list[dict[int, int]] = [{} for _ in range(replicas)]
        self.replica_of = np.full(workload.n, -1, dtype=np.int64)
        #: true work left on each replica and of each request: every block a replica runs
        #: is one round of it
        self.true_left = np.zeros(replicas)
        self.true_rem = (workload.prompt_blocks + workload.total_rounds).astype(np.float64)

    @property
    def idle(self) -> bool:
        return all(s.idle for s in self.scheds)

    #: report only requests not yet admitted, as SGLang's snapshot of a dLLM server does
    waiting_only = False

    def loads(self, timestamp: float) -> list[ReplicaLoad]:
        out = []
        for r, s in enumerate(self.scheds):
            live = np.fromiter(self.request_of_row[r].values(), np.int64)
            load = replica_load(s, r, timestamp, float(self.true_left[r]), self.true_rem[live])
            if self.waiting_only:
                w = s.table.waiting
                load = dataclasses.replace(
                    load, requests=int(w.size), tokens=int(s.table.kv_tokens[w].sum())
                )
            out.append(load)
        return out

    def admit(self, i: int, dispatcher: Dispatcher) -> None:
        w, adm = self.w, self.inputs["admission"]
        true_work = float(w.prompt_blocks[i] + w.total_rounds[i])
        if dispatcher.method == "oracle":
            own = true_work
        else:
            own = float(w.prompt_blocks[i]) + (0.0 if adm is None else float(adm[i]))
        r = dispatcher.choose(work_rounds=own, tokens=int(w.prompt_tokens[i]))
        self.true_left[r] += true_work
        row = queue_request(self.scheds[r], w, self.inputs, i)
        self.request_of_row[r][row] = i
        self.replica_of[i] = r

    def run_round(self, progress: RequestProgress, finish_stamp: float) -> None:
        refined = self.inputs["refined"]
        for r, sched in enumerate(self.scheds):
            if sched.idle:
                continue
            plan = sched.plan_round()
            self.true_left[r] -= plan.rows.size
            rows_map = self.request_of_row[r]
            req = np.fromiter((rows_map[int(x)] for x in plan.rows), np.int64, plan.rows.size)
            self.true_rem[req] -= 1.0
            finished = progress.advance(req, plan.prompt, finish_stamp)
            ref = refined_estimates(plan, req, refined)
            sched.update(RoundResult(plan.rows, finished, ref))
            for x in plan.rows[finished].tolist():
                rows_map.pop(int(x), None)


def compare_dispatch(
    workload: Workload,
    policies: Sequence[Policy],
    methods: Sequence[str] = DISPATCH_METHODS,
    *,
    replicas: int,
    progress: Callable[[FleetRun], None] | None = None,
    **fleet: Any,
) -> list[FleetRun]:
    """Every policy behind every dispatch method on the same workload and arrivals (one
    :func:`simulate_fleet` each; ``fleet``: its keyword settings). Methods are checked before
    anything runs, so a typo does not surface after minutes of replay."""
    unknown = [m for m in methods if m not in DISPATCH_METHODS]
    if unknown or not methods:
        raise ConfigError(
            f"dispatch methods {unknown or list(methods)}: choose from {DISPATCH_METHODS}"
        )
    runs = []
    for policy in policies:
        for method in methods:
            run = simulate_fleet(workload, policy, replicas=replicas, method=method, **fleet)
            runs.append(run)
            if progress is not None:
                progress(run)
    return runs


def fleet_table(runs: Sequence[FleetRun]) -> str:
    """A plain table of fleet runs: policy, method, mean and p99 completion, finished."""
    from ..tables import format_table

    rows = []
    for run in runs:
        s = run.summary()
        rows.append(
            [
                run.policy,
                run.method,
                f"{s['mean_completion_rounds']:.1f}",
                f"{s['p99_completion_rounds']:.1f}",
                f"{s['finished']}/{s['requests']}",
            ]
        )
    return format_table(["policy", "method", "mean_rounds", "p99_rounds", "finished"], rows)


def method_bars(
    ax: Any,
    groups: Sequence[str],
    methods: Sequence[str],
    cell: Callable[[str, str], dict[str, Any]],
) -> None:
    """Draw, on a matplotlib axis, a bar per method in each group at its mean completion and a
    tick at its p99 (``cell(group, method)``: a run summary; missing keys are left blank)."""
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        xs = np.arange(len(groups)) + (j - (len(methods) - 1) / 2) * width
        cells = [cell(g, m) for g in groups]
        means = [c.get("mean_completion_rounds", math.nan) for c in cells]
        p99s = [c.get("p99_completion_rounds", math.nan) for c in cells]
        bars = ax.bar(xs, means, width, label=m)
        ax.scatter(xs, p99s, marker="_", s=120, color=bars.patches[0].get_facecolor())
    ax.set_xticks(np.arange(len(groups)), groups)
    ax.set_ylabel("completion, rounds (bar: mean, tick: p99)")
    ax.legend(fontsize=8)


def plot_fleet(runs: Sequence[FleetRun], path: str | Path, title: str = "") -> Path:
    """Mean completion (bars) and p99 (ticks) per dispatch method, a group per policy."""
    from .plots import pyplot, save_figure

    if not runs:
        raise ConfigError("no fleet runs to plot: compare_dispatch returned none")
    plt = pyplot()
    policies = list(dict.fromkeys(r.policy for r in runs))
    methods = list(dict.fromkeys(r.method for r in runs))
    by = {(r.policy, r.method): r.summary() for r in runs}
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(policies) * len(methods) / 2), 4.0))
    method_bars(ax, policies, methods, lambda p, m: by.get((p, m), {}))
    ax.set_title(title or f"{runs[0].replicas} replicas: dispatch methods")
    fig.tight_layout()
    out = save_figure(fig, path)
    plt.close(fig)
    return out
