"""Scheduling policies: small classes behind one protocol.

A policy says three things; the :class:`~dwise_predict.runtime.scheduler.Scheduler` does the
rest (admission, KV reservations, batch forming, state updates) the same way for all of them:

* ``key(table, rows, round_index)``: a priority per row, lower runs first (ties: earlier arrival);
* ``preemptive``: True = rank-based residency as DWISE's Algorithm 1 (admit a waiting request
  when it ranks in the top B of waiting ∪ resident, up to k·B residents, KV permitting; run the
  B best residents, pause the rest). False = SGLang-style residency (at most B residents, a
  waiting request is admitted in key order only when a resident leaves; every resident runs);
* ``batch_former``: ``"mixed"`` = every selected request advances its next block, prompt or
  denoising, in the same round (DWISE); ``"prefill-first"`` = whenever a resident still has
  prompt blocks the round carries only prompt blocks, one per such request (SGLang's dLLM path).

``needs`` names the per-request inputs a policy reads, so that every driver (the simulator, the
SGLang plugin, a scheduler of your own) feeds it without knowing its name: ``"estimate"``
(admission estimate of total denoising rounds), ``"refined"`` (the estimate is refined after the
first denoising round), ``"true_rounds"`` (oracle), ``"score"`` (SJF/SRPT by a per-request
score), ``"cost"`` (that score is the DWS surface priced by the cost profile). The names and
where drivers find them: :data:`.registry.NEEDS`.

Each shipped policy registers its name(s) at the bottom of this module
(:func:`.registry.register_policy`); adding one is a class plus a registration.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError
from .registry import register_policy
from .table import RequestTable
from .tails import TailGuard

BATCH_FORMERS = ("mixed", "prefill-first")


@runtime_checkable
class Policy(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def preemptive(self) -> bool: ...
    @property
    def batch_former(self) -> str: ...
    @property
    def needs(self) -> frozenset[str]: ...

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray: ...


def _check_former(batch_former: str) -> None:
    if batch_former not in BATCH_FORMERS:
        raise ConfigError(f"batch_former={batch_former!r} is not one of {BATCH_FORMERS}")


@dataclass(frozen=True)
class FCFS:
    """SGLang's default: arrival order, B residents, prefill priority (``batch_former="mixed"``
    gives FCFS on DWISE's batch former, the paper's Table 4 setting)."""

    batch_former: str = "prefill-first"
    name: str = "fcfs"
    preemptive: ClassVar[bool] = False
    needs: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        _check_former(self.batch_former)

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        return table.seq[rows].astype(np.float64)


#: what ``DWISE.starvation_cap`` measures: rounds since arrival, rounds without running, or
#: rounds since arrival plus the estimated work left (the round it would finish in)
STARVATION_CLOCKS = ("age", "waited", "projected")
#: the key of a starved request: below any remaining work or aged key a run can reach, so the
#: starved outrank everyone else and tie among themselves (broken by arrival order)
STARVED_KEY = -1e18

#: what a DWISE policy ranks by, from the full algorithm down (see ``DWISE.estimates``)
ESTIMATE_LEVELS = ("refined", "admission", "none")
_ESTIMATE = frozenset({"estimate"})
_REFINED = frozenset({"estimate", "refined"})


class _StarvationRule:
    """The cap-and-slack promotion both SRPT policies share (see :class:`DWISE`): a request
    whose clock passes its deadline outranks every request that is not starved, in arrival
    order among the starved. ``remaining`` is the work left the ``"projected"`` clock adds:
    estimated for DWISE, true for the oracle."""

    starvation_cap: int
    starvation_clock: str
    starvation_slack: float

    def _promote_starved(
        self,
        table: RequestTable,
        rows: np.ndarray,
        round_index: int,
        key: np.ndarray,
        remaining: np.ndarray,
    ) -> np.ndarray:
        if not (self.starvation_cap or self.starvation_slack):
            return key
        elapsed = (round_index - table.arrival_round[rows]).astype(np.float64)
        if self.starvation_clock == "projected":
            elapsed += remaining
        starved = np.zeros(rows.size, dtype=bool)
        if self.starvation_cap:
            clock = elapsed - table.attained[rows] if self.starvation_clock == "waited" else elapsed
            starved |= clock > self.starvation_cap
        if self.starvation_slack:
            # NaN (no horizon yet: not planned since it arrived) compares False
            starved |= elapsed > self.starvation_slack * table.fcfs_rounds[rows]
        # one key for all the starved: the tie-break (arrival order) ranks them, FCFS
        return np.where(starved, STARVED_KEY, key) if starved.any() else key


def _check_starvation(cap: object, clock: str, slack: float) -> None:
    if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 0:
        raise ConfigError(
            f"starvation_cap={cap!r} must be a whole number of rounds >= 0 (0 turns it off)"
        )
    if not np.isfinite(slack) or slack < 0:
        raise ConfigError(
            f"starvation_slack={slack} must be a finite number >= 0 "
            "(a multiple of the FCFS horizon; 0 turns it off)"
        )
    if clock not in STARVATION_CLOCKS:
        raise ConfigError(
            f"starvation_clock={clock!r} is not one of {STARVATION_CLOCKS} "
            "(age = rounds since arrival, waited = rounds spent without running, "
            "projected = rounds since arrival plus the estimated work left)"
        )


@dataclass(frozen=True)
class DWISE(_StarvationRule):
    """Remaining-work SRPT, R = P + r̂, preemptive, mixed-phase (paper Algorithm 1).

    Two anti-starvation rules, both off by default (as in the paper), may be combined:

    * ``aging`` subtracts ``aging`` work units per round a request has spent without running
      (waiting or paused): a request passed over for W rounds outranks any fresh request with
      R < its own R − aging·W, so no request starves longer than (R_max / aging) rounds behind
      a stream of short arrivals. It reorders *every* request a little, so it pays in mean
      latency long before it bounds the tail (docs/runtime.md: "Tails under overload").
    * ``starvation_cap`` = C > 0 rounds: a request whose clock passes C is *starved* and runs
      ahead of every request that is not, in arrival order among the starved; below the cap
      the order is plain SRPT. Only the few requests SRPT would starve are touched, so it
      bounds the tail while keeping most of the mean gain. ``starvation_clock`` picks what
      counts: ``"age"`` (rounds since arrival), ``"waited"`` (rounds spent without running,
      the clock ``aging`` reads) or ``"projected"`` (rounds since arrival plus the estimated
      work left, P + r̂: the round it would finish in if it ran every round from now on). With
      ``"age"`` a request is promoted once it is C rounds old and still owes all its work, so
      a long one finishes near C + its own work; ``"projected"`` promotes it *in time* to
      finish near C, the latest start that meets the deadline, so C reads as a completion
      target and the long requests take their rows as late as they can.
    * ``starvation_slack`` = c > 0: the same promotion, with a deadline of its own per request:
      c times the rounds a B-slot FCFS server would take to clear the estimated work live at
      its arrival (its own included; the scheduler records it, ``RequestTable.fcfs_rounds``).
      A request is starved once its clock (``"age"`` or ``"projected"``; ``"waited"`` reads as
      ``"age"`` here) passes that. Unlike a cap in rounds, it scales with the load and the
      workload: c = 1 aims at "no later than FCFS would".
    """

    aging: float = 0.0
    starvation_cap: int = 0
    starvation_clock: str = "age"
    starvation_slack: float = 0.0
    batch_former: str = "mixed"
    name: str = "dwise"
    #: which estimates rank requests: "refined" (admission, then the refined one after the
    #: first denoising round: the paper's DWISE), "admission" (never refined), or "none"
    #: (r̂ = 0: ranked by prompt blocks left alone). The paper's component ladder, as drivers
    #: read it (:func:`~.simulator.policy_inputs`, the SGLang plugin)
    estimates: str = "refined"
    preemptive: ClassVar[bool] = True

    @property
    def needs(self) -> frozenset[str]:
        return _REFINED if self.estimates == "refined" else _ESTIMATE

    def __post_init__(self) -> None:
        _check_former(self.batch_former)
        if self.estimates not in ESTIMATE_LEVELS:
            raise ConfigError(
                f"estimates={self.estimates!r} is not one of {ESTIMATE_LEVELS} "
                "(refined = the paper's DWISE)"
            )
        if not np.isfinite(self.aging) or self.aging < 0:
            raise ConfigError(
                f"aging={self.aging} must be a finite number >= 0 (0 turns aging off)"
            )
        _check_starvation(self.starvation_cap, self.starvation_clock, self.starvation_slack)

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        work = table.prompt_blocks[rows] + table.r_hat[rows]
        k = work
        if self.aging:
            waited = round_index - table.arrival_round[rows] - table.attained[rows]
            k = k - self.aging * waited
        return self._promote_starved(table, rows, round_index, k, work)  # work before aging


@dataclass(frozen=True)
class OracleSRPT(_StarvationRule):
    """SRPT by the TRUE remaining work P + r (the driver passes ``true_rounds`` at arrival).

    ``starvation_cap`` / ``starvation_clock`` / ``starvation_slack`` as for :class:`DWISE`, with
    the true work in the ``"projected"`` clock: what a rule could do with perfect knowledge
    (a bound for the tail trade-off, docs/runtime.md "Tails under overload")."""

    starvation_cap: int = 0
    starvation_clock: str = "age"
    starvation_slack: float = 0.0
    batch_former: str = "mixed"
    name: str = "oracle"
    preemptive: ClassVar[bool] = True
    needs: ClassVar[frozenset[str]] = frozenset({"true_rounds"})

    def __post_init__(self) -> None:
        _check_former(self.batch_former)
        _check_starvation(self.starvation_cap, self.starvation_clock, self.starvation_slack)

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        work = table.prompt_blocks[rows] + table.r_true[rows]
        return self._promote_starved(table, rows, round_index, work, work)


@dataclass(frozen=True)
class MLFQ:
    """FastServe's skip-join MLFQ in rounds: level ℓ holds requests whose attained rounds lie in
    [q·(2^ℓ − 1), q·(2^(ℓ+1) − 1)); a request joins at the level its prompt blocks would reach
    (skip-join: a long prefill does not start in the top queue) and is demoted as it runs. FCFS
    within a level. Preemptive with k·B residents; on the prefill-first batch former by default,
    as the paper ran it."""

    base_quantum: float = 2.0
    levels: int = 16
    batch_former: str = "prefill-first"
    name: str = "mlfq"
    preemptive: ClassVar[bool] = True
    needs: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        _check_former(self.batch_former)
        if not self.base_quantum > 0:
            raise ConfigError(f"MLFQ base_quantum={self.base_quantum} must be > 0 rounds")
        if self.levels < 1:
            raise ConfigError(f"MLFQ levels={self.levels} must be >= 1")

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        served = np.maximum(table.attained[rows], table.prompt_total[rows] - 1)
        level = np.floor(np.log2(served / self.base_quantum + 1.0))
        return np.minimum(level, self.levels - 1)


@dataclass(frozen=True)
class ScoreSJF:
    """Shortest-job-first by an arbitrary per-request score (lower first).

    Output-length rankers (SSJF, S³, LTR) are just scores. Non-preemptive on the prefill-first
    batch former by default (how the paper ran them); ``preemptive=True`` gives SRPT by score, in
    which case the driver may update scores between rounds (``Scheduler.set_scores``), as a
    TRAIL-style re-estimator would.
    """

    preemptive: bool = False
    batch_former: str = "prefill-first"
    name: str = "sjf"
    needs: ClassVar[frozenset[str]] = frozenset({"score"})

    def __post_init__(self) -> None:
        _check_former(self.batch_former)

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        return table.score[rows]


@dataclass(frozen=True)
class DWSSJF(ScoreSJF):
    """DWS-guided SJF: non-preemptive, by the request's predicted cost in ms (its DWS surface
    priced by the deployment's cost profile; the driver computes it, see ``"cost"`` in
    :data:`.registry.NEEDS`)."""

    name: str = "dws-sjf"
    needs: ClassVar[frozenset[str]] = frozenset({"score", "cost"})


@dataclass(frozen=True)
class LengthSRPT:
    """A learned output-length scheduler (SSJF, S³, LTR, TRAIL) on DWISE's batch former:
    preemptive SRPT by ``P + r̂``, where ``r̂`` is the baseline's predicted output tokens
    stated in rounds (÷ the tokens per round of its training traces) and counted down one per
    denoising round, as DWISE counts its own. ``predictor`` names the bundle kind the driver
    reads it from (``"length"`` in :data:`.registry.NEEDS`); ``refines``: re-estimated once
    after the first denoising round (TRAIL). Ranking by ``P + T̂ / τ`` is ranking by remaining
    tokens with a prompt block counted as τ tokens (docs/baselines.md, "The scale")."""

    predictor: str = "ssjf"
    refines: bool = False
    batch_former: str = "mixed"
    name: str = "ssjf"
    preemptive: ClassVar[bool] = True

    @property
    def needs(self) -> frozenset[str]:
        return frozenset({"estimate", "length", *(("refined",) if self.refines else ())})

    def __post_init__(self) -> None:
        _check_former(self.batch_former)

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        return table.prompt_blocks[rows] + table.r_hat[rows]


def SRPT(batch_former: str = "mixed") -> ScoreSJF:  # noqa: N802 - a policy constructor
    """Preemptive SRPT by a driver-maintained score, on the mixed-phase batch former."""
    return ScoreSJF(preemptive=True, batch_former=batch_former, name="srpt")


# -- the registry's shipped names (the CLI lists them in this order) ---------------------------
register_policy("fcfs", FCFS, "SGLang's default: arrival order, prefill-first rounds")
register_policy(
    "fcfs-mixed",
    partial(FCFS, batch_former="mixed", name="fcfs-mixed"),
    "arrival order, prompt and denoising blocks in one round (mixed-phase FCFS)",
)
register_policy("mlfq", MLFQ, "FastServe's skip-join multi-level feedback queue, prefill-first")
register_policy(
    "mlfq-mixed",
    partial(MLFQ, batch_former="mixed", name="mlfq-mixed"),
    "skip-join MLFQ on mixed-phase rounds",
)
register_policy("sjf", ScoreSJF, "shortest job first by a per-request score (output length)")
register_policy("srpt", SRPT, "preemptive SRPT by a driver-maintained score")
register_policy(
    "dwise-r0",
    partial(DWISE, estimates="none", name="dwise-r0"),
    "DWISE ranked by prompt blocks left alone (no estimate)",
)
register_policy(
    "dwise-admission",
    partial(DWISE, estimates="admission", name="dwise-admission"),
    "DWISE with the admission estimate, never refined",
)
register_policy(
    "dwise-uncapped",
    partial(DWISE, name="dwise-uncapped"),
    "the paper's DWISE: P + r-hat, refined once, no tail rule",
)
register_policy("dwise", TailGuard, "the default: DWISE with the tail guard (runtime/tails.py)")
register_policy("oracle", OracleSRPT, "SRPT by true remaining work (replays only)")
register_policy("dws-sjf", DWSSJF, "non-preemptive SJF by the DWS cost estimate (ms)")
# the learned output-length schedulers the paper compares with (docs/baselines.md)
register_policy(
    "ssjf",
    partial(LengthSRPT, predictor="ssjf", name="ssjf"),
    "SRPT by P + SSJF's predicted output length (tokens / tokens per round), mixed-phase",
)
register_policy(
    "s3",
    partial(LengthSRPT, predictor="s3", name="s3"),
    "SRPT by P + S3's expected output-length bucket, mixed-phase",
)
register_policy(
    "ltr",
    partial(LengthSRPT, predictor="ltr", name="ltr"),
    "SRPT by P + LTR's ranked output length, mixed-phase",
)
register_policy(
    "trail",
    partial(LengthSRPT, predictor="trail", refines=True, name="trail"),
    "SRPT by P + TRAIL's output length, re-estimated from the first round's hidden state",
)
