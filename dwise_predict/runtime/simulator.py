"""Trace-driven simulator: replays a workload round by round through a :class:`Scheduler`.

The simulator is the second driver of the scheduler (the serving framework is the first): each
round it adds the requests that have arrived, asks for a plan, advances the true state of every
planned request by one block (a prompt block, or one denoising round of the current output
block, committing the block when its traced rounds are used up), charges the round's time from
the :class:`~.roundtime.RoundTimeModel`, and reports finishes and refined estimates back.

Everything is arrays indexed by request, so a 60,000-round FCFS replay of 4,096 requests takes a
few seconds. Under burst arrivals the schedule does not depend on the round-time model at all
(only when time is charged), which is what makes the model's fit a plain least-squares problem.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, SchedulerError
from .arrivals import Arrivals, ArrivalSpec, make_arrivals
from .costtime import ProfileRoundTime
from .lengths import length_inputs
from .policies import Policy
from .replay import ArrivalFeed, RequestProgress, RoundLog
from .request import RESIDENT, RoundPlan, RoundResult
from .roundtime import RoundTimeModel
from .scheduler import Scheduler
from .workload import Workload

#: default KV pool: 2^21 tokens, enough for k·B = 1,024 typical residents of the paper's
#: workload with their worst-case reservation (prompt + 256-token budget + 2 blocks of slack)
DEFAULT_KV_POOL_TOKENS = 1 << 21


@dataclass
class SimulationRun:
    """Raw outcome of replaying one workload under one policy (see :mod:`.metrics` for
    summaries)."""

    policy: str
    arrival: str
    slots: int
    k: int
    arrival_time: np.ndarray
    finish_time: np.ndarray
    first_block_time: np.ndarray
    completion_order: np.ndarray
    round_ms: np.ndarray
    round_filled: np.ndarray
    round_prompt: np.ndarray
    round_context: np.ndarray
    round_sched_s: np.ndarray
    preemptions: int
    refinements: int
    wall_s: float
    categories: np.ndarray = field(repr=False, default_factory=lambda: np.zeros(0, dtype=object))


def _check_plan(plan: RoundPlan, sched: Scheduler) -> None:
    """Per-round contract (property tests): <= B blocks, one per request, only residents run."""
    rows = plan.rows
    if rows.size > sched.slots:
        raise SchedulerError(
            f"round {plan.round_index} carries {rows.size} blocks > B = {sched.slots}"
        )
    if np.unique(rows).size != rows.size:
        raise SchedulerError(f"round {plan.round_index} carries two blocks of one request")
    if rows.size and np.any(sched.table.state[rows] != RESIDENT):
        raise SchedulerError(f"round {plan.round_index} runs a request that is not resident")
    if np.any(plan.prompt != (sched.table.prompt_blocks[rows] > 0)):
        raise SchedulerError(
            f"round {plan.round_index} runs a denoising block before the prompt is done"
        )


def policy_inputs(workload: Workload, policy: Policy) -> dict[str, np.ndarray | None]:
    """The per-request arrays ``policy`` reads, checked: estimates, truth or a score."""
    out: dict[str, np.ndarray | None] = {
        "admission": None,
        "refined": None,
        "true_rounds": None,
        "score": None,
    }
    needs = policy.needs
    if "estimate" in needs:
        if workload.admission is None and "length" not in needs:
            raise ConfigError(
                f"policy {policy.name!r} needs admission estimates; give a bundle (--bundle) "
                "or use the synthetic workload, which carries noisy estimates"
            )
        out["admission"] = workload.admission
        if "refined" in needs:
            out["refined"] = workload.refined
        if getattr(policy, "estimates", None) == "none":  # ranked by prompt blocks alone
            out["admission"] = np.zeros_like(np.asarray(workload.admission, dtype=np.float64))
        if "length" in needs:  # an output-length baseline's estimates instead (lengths.py)
            out["admission"], out["refined"] = length_inputs(workload, policy)
    if "true_rounds" in needs:
        out["true_rounds"] = workload.total_rounds.astype(np.float64)
    if "cost" in needs:
        if workload.cost is None:
            raise ConfigError(
                f"policy {policy.name!r} ranks by a predicted cost per request "
                "(Workload.cost: a bundle with a DWS predictor and a cost profile)"
            )
        out["score"] = workload.cost
    elif "score" in needs:
        if workload.score is not None:
            out["score"] = workload.score
        elif np.all(workload.output_tokens >= 0):  # an oracle output-length ranker
            out["score"] = workload.output_tokens.astype(np.float64)
        else:
            raise ConfigError(
                f"policy {policy.name!r} needs a score per "
                "request (Workload.score) or output token counts"
            )
    return out


def simulate(
    workload: Workload,
    policy: Policy,
    *,
    arrivals: Arrivals | ArrivalSpec | str = "burst",
    slots: int = 128,
    k: int = 8,
    kv_pool_tokens: int = DEFAULT_KV_POOL_TOKENS,
    round_time: RoundTimeModel | ProfileRoundTime | None = None,
    seed: int = 0,
    max_rounds: int | None = None,
    check_invariants: bool = False,
    priced_late_when_full: bool = False,
) -> SimulationRun:
    """Replay ``workload`` under ``policy``; returns per-request and per-round records.

    Each round: admit the arrivals (:class:`~.replay.ArrivalFeed`), plan, advance the planned
    requests' true state (:class:`~.replay.RequestProgress`), charge the round's time
    (:class:`~.replay.RoundLog`), and report finishes and refined estimates to the scheduler.
    ``priced_late_when_full`` replays the SGLang plugin's encoder-priced arrivals (a policy
    that needs ``"cost"``, the ``lightgbm+dws`` admission source): with B residents, arrivals
    join a round later.
    """
    n = workload.n
    arr = arrivals if isinstance(arrivals, Arrivals) else make_arrivals(arrivals, n, seed)
    if arr.order.size != n:
        raise ConfigError(f"arrivals cover {arr.order.size} requests but the workload has {n}")
    inputs = policy_inputs(workload, policy)
    sched = Scheduler(
        policy, slots=slots, k=k, kv_pool_tokens=kv_pool_tokens, capacity=min(n, 4096)
    )
    t_wall = time.perf_counter()
    feed = ArrivalFeed(workload, arr, inputs, priced_late_when_full)
    progress = RequestProgress(workload)
    cap = int(workload.work.sum()) + n + 1 if max_rounds is None else int(max_rounds)
    log = RoundLog(round_time or RoundTimeModel(), cap)
    while not progress.all_finished:
        _jump_when_idle(log, feed, sched)
        feed.admit_until(sched, log.now)
        log.check_room(n - progress.finished)
        plan = sched.plan_round()
        _check_nonempty(plan, sched, n - progress.finished)
        if check_invariants:
            _check_plan(plan, sched)
        req = feed.request_of_row[plan.rows]
        composition = progress.round_slots(req, plan.prompt)
        context = float(composition.context.sum())
        dt_ms = log.charge(composition)
        finished = progress.advance(req, plan.prompt, log.now)
        refined = refined_estimates(plan, req, inputs["refined"])
        upd_s = sched.update(RoundResult(plan.rows, finished, refined))
        if check_invariants:
            sched.check_invariants()
        log.record(
            dt_ms, plan.rows.size, int(plan.prompt.sum()), context, plan.plan_seconds + upd_s
        )
    return SimulationRun(
        policy=policy.name,
        arrival=str(arrivals) if not isinstance(arrivals, Arrivals) else "custom",
        slots=slots,
        k=k,
        arrival_time=feed.arrival_times(),
        finish_time=progress.finish_time,
        first_block_time=progress.first_block_time,
        completion_order=progress.completion_order(),
        round_ms=log.ms[: log.rounds],
        round_filled=log.filled[: log.rounds],
        round_prompt=log.prompt[: log.rounds],
        round_context=log.context[: log.rounds],
        round_sched_s=log.sched_s[: log.rounds],
        preemptions=sched.preemptions,
        refinements=sched.refinements,
        wall_s=time.perf_counter() - t_wall,
        categories=workload.category,
    )


def _jump_when_idle(log: RoundLog, feed: ArrivalFeed, sched: Scheduler) -> None:
    """An empty server waits: move the clock to the next arrival instead of running idle rounds."""
    t = feed.next_arrival()
    if t is not None and sched.idle and not feed.pricing and t > log.now:
        log.wait_until(t)


def _check_nonempty(plan: RoundPlan, sched: Scheduler, unfinished: int) -> None:
    """An empty round cannot happen with live requests (a lone request always fits the pool)."""
    if plan.rows.size == 0:
        raise SchedulerError(
            f"the scheduler planned an empty round with {unfinished} requests "
            f"unfinished ({sched.n_waiting} waiting, {sched.n_resident} "
            "resident); check the KV pool size"
        )


def refined_estimates(
    plan: RoundPlan, req: np.ndarray, refined: np.ndarray | None
) -> np.ndarray | None:
    """The refined estimate of each slot that ran its first denoising round (NaN elsewhere)."""
    if refined is None or bool(plan.prompt.all()) or not plan.first_denoise.any():
        return None
    out = np.full(plan.rows.size, np.nan)
    out[plan.first_denoise] = refined[req[plan.first_denoise]]
    return out
