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
from .policies import Policy
from .request import RESIDENT, RoundResult
from .costtime import ProfileRoundTime, RoundSlots
from .roundtime import RoundTimeModel
from .scheduler import Scheduler
from .workload import Workload

#: default KV pool: 2^21 tokens, enough for k·B = 1,024 typical residents of the paper's
#: workload with their worst-case reservation (prompt + 256-token budget + 2 blocks of slack)
DEFAULT_KV_POOL_TOKENS = 1 << 21


@dataclass
class SimulationRun:
    """Raw outcome of replaying one workload under one policy (see :mod:`.metrics` for summaries)."""

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


def _check_plan(plan, sched: Scheduler) -> None:
    """Per-round contract (property tests): <= B blocks, one per request, only residents run."""
    rows = plan.rows
    if rows.size > sched.slots:
        raise SchedulerError(f"round {plan.round_index} carries {rows.size} blocks > B = {sched.slots}")
    if np.unique(rows).size != rows.size:
        raise SchedulerError(f"round {plan.round_index} carries two blocks of one request")
    if rows.size and np.any(sched.table.state[rows] != RESIDENT):
        raise SchedulerError(f"round {plan.round_index} runs a request that is not resident")
    if np.any(plan.prompt != (sched.table.prompt_blocks[rows] > 0)):
        raise SchedulerError(f"round {plan.round_index} runs a denoising block before the prompt is done")


def policy_inputs(workload: Workload, policy: Policy) -> dict[str, np.ndarray | None]:
    """The per-request arrays ``policy`` reads, checked: estimates, truth or a score."""
    out: dict[str, np.ndarray | None] = {"admission": None, "refined": None, "true_rounds": None, "score": None}
    if "estimate" in policy.needs:
        if workload.admission is None:
            raise ConfigError(f"policy {policy.name!r} needs admission estimates; give a bundle (--bundle) "
                              "or use the synthetic workload, which carries noisy estimates")
        out["admission"], out["refined"] = workload.admission, workload.refined
    if "true_rounds" in policy.needs:
        out["true_rounds"] = workload.total_rounds.astype(np.float64)
    if "score" in policy.needs:
        if policy.name == "dws-sjf":
            if workload.cost is None:
                raise ConfigError("policy 'dws-sjf' needs a predicted cost per request (Workload.cost, from a DWS predictor)")
            out["score"] = workload.cost
        elif workload.score is not None:
            out["score"] = workload.score
        elif np.all(workload.output_tokens >= 0):
            out["score"] = workload.output_tokens.astype(np.float64)  # an oracle output-length ranker
        else:
            raise ConfigError(f"policy {policy.name!r} needs a score per request (Workload.score) or output token counts")
    return out


def simulate(workload: Workload, policy: Policy, *, arrivals: Arrivals | ArrivalSpec | str = "burst",
             slots: int = 128, k: int = 8, kv_pool_tokens: int = DEFAULT_KV_POOL_TOKENS,
             round_time: RoundTimeModel | ProfileRoundTime | None = None, seed: int = 0,
             max_rounds: int | None = None,
             check_invariants: bool = False) -> SimulationRun:
    """Replay ``workload`` under ``policy``; returns per-request and per-round records."""
    rt = round_time or RoundTimeModel()
    n = workload.n
    arr = arrivals if isinstance(arrivals, Arrivals) else make_arrivals(arrivals, n, seed)
    if arr.order.size != n:
        raise ConfigError(f"arrivals cover {arr.order.size} requests but the workload has {n}")
    inputs = policy_inputs(workload, policy)
    sched = Scheduler(policy, slots=slots, k=k, kv_pool_tokens=kv_pool_tokens, capacity=min(n, 4096))
    t_wall = time.perf_counter()

    # true per-request state
    bs = workload.block_size
    ptok = workload.prompt_tokens
    offsets = workload.block_offsets
    nblocks = workload.output_blocks
    rflat = workload.rounds_flat
    pdone = np.zeros(n, dtype=np.int64)
    cur_block = np.zeros(n, dtype=np.int64)
    left = rflat[offsets[:-1]].copy()
    arrival_time = np.zeros(n)
    arrival_time[arr.order] = arr.times
    finish = np.full(n, np.nan)
    first_block = np.full(n, np.nan)
    req_of_row = np.zeros(n + 1, dtype=np.int64)
    refined_src = inputs["refined"]
    order_done: list[np.ndarray] = []

    cap = int(workload.work.sum()) + n + 1 if max_rounds is None else int(max_rounds)
    r_ms = np.zeros(cap)
    r_fill = np.zeros(cap, dtype=np.int64)
    r_prompt = np.zeros(cap, dtype=np.int64)
    r_ctx = np.zeros(cap)
    r_sched = np.zeros(cap)
    adm, truth, score = inputs["admission"], inputs["true_rounds"], inputs["score"]
    ids = workload.request_ids

    now = 0.0
    nxt = 0
    order, times = arr.order, arr.times
    n_rounds = 0
    finished_total = 0
    while finished_total < n:
        # arrivals up to now (jump ahead when the server is empty)
        if nxt < n and sched.idle and times[nxt] > now:
            now = float(times[nxt])
        while nxt < n and times[nxt] <= now:
            i = int(order[nxt])
            row = sched.add_request(
                ids[i], int(workload.prompt_blocks[i]), None if adm is None else float(adm[i]),
                prompt_tokens=int(ptok[i]), output_budget=int(workload.output_budget[i]), block_size=int(bs[i]),
                arrival_time=float(times[nxt]), score=None if score is None else float(score[i]),
                true_rounds=None if truth is None else float(truth[i]))
            req_of_row[row] = i
            nxt += 1
        if n_rounds >= cap:
            raise SchedulerError(f"simulation exceeded {cap} rounds with {n - finished_total} requests unfinished; "
                                 "the policy starves requests or max_rounds is too small")
        plan = sched.plan_round()
        rows = plan.rows
        if rows.size == 0:  # cannot happen with live requests: a lone request always fits the pool
            raise SchedulerError(f"the scheduler planned an empty round with {n - finished_total} requests unfinished "
                                 f"({sched.n_waiting} waiting, {sched.n_resident} resident); check the KV pool size")
        if check_invariants:
            _check_plan(plan, sched)
        req = req_of_row[rows]
        is_p = plan.prompt
        # context each slot's block attends to
        bsr = bs[req]
        ctx = np.where(is_p, np.minimum((pdone[req] + 1) * bsr, ptok[req]), ptok[req] + (cur_block[req] + 1) * bsr)
        csum = float(ctx.sum())
        step = rflat[offsets[req] + np.minimum(cur_block[req], nblocks[req] - 1)] - left[req]
        dt_ms = rt.time_round(RoundSlots(
            prompt=is_p, context=ctx, prompt_blocks=workload.prompt_blocks[req],
            prompt_index=pdone[req], block=cur_block[req], step=step,
            commits=~is_p & (left[req] == 1)))
        now += dt_ms / 1000.0
        n_p = int(is_p.sum())
        fin_aligned = np.zeros(rows.size, dtype=bool)
        if n_p:
            pdone[req[is_p]] += 1
        refined_aligned = None
        if n_p < rows.size:
            dmask = ~is_p
            dq = req[dmask]
            left[dq] -= 1
            cm = left[dq] == 0
            if cm.any():
                commit = dq[cm]
                cur_block[commit] += 1
                fb = commit[np.isnan(first_block[commit])]
                first_block[fb] = now
                fm = cur_block[commit] == nblocks[commit]
                fin = commit[fm]
                if fin.size:
                    finish[fin] = now
                    fin_aligned[np.flatnonzero(dmask)[cm][fm]] = True
                    order_done.append(fin)
                    finished_total += int(fin.size)
                cont = commit[~fm]
                if cont.size:
                    left[cont] = rflat[offsets[cont] + cur_block[cont]]
            if refined_src is not None and plan.first_denoise.any():
                refined_aligned = np.full(rows.size, np.nan)
                fd = plan.first_denoise
                refined_aligned[fd] = refined_src[req[fd]]
        upd_s = sched.update(RoundResult(rows, fin_aligned, refined_aligned))
        if check_invariants:
            sched.check_invariants()
        r_ms[n_rounds] = dt_ms
        r_fill[n_rounds] = rows.size
        r_prompt[n_rounds] = n_p
        r_ctx[n_rounds] = csum
        r_sched[n_rounds] = plan.plan_seconds + upd_s
        n_rounds += 1
    wall = time.perf_counter() - t_wall
    return SimulationRun(
        policy=policy.name, arrival=str(arrivals) if not isinstance(arrivals, Arrivals) else "custom",
        slots=slots, k=k, arrival_time=arrival_time, finish_time=finish, first_block_time=first_block,
        completion_order=np.concatenate(order_done) if order_done else np.zeros(0, dtype=np.int64),
        round_ms=r_ms[:n_rounds], round_filled=r_fill[:n_rounds], round_prompt=r_prompt[:n_rounds],
        round_context=r_ctx[:n_rounds], round_sched_s=r_sched[:n_rounds], preemptions=sched.preemptions,
        refinements=sched.refinements, wall_s=wall, categories=workload.category)
