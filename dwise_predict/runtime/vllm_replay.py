"""The simulator's vLLM round model: a request set replayed through vLLM's iteration loop.

The project's simulator (:mod:`.simulator`) runs rounds of B block slots, SGLang's and DWISE's
shape. vLLM's diffusion scheduler runs another shape, and this module models it, numpy and
the runtime only (no vLLM), so a vLLM serving run can be predicted and checked:

* one iteration = one ``schedule()``: every running request takes one step, in list order,
  while the token budget lasts: a prompt chunk (``min(context left, budget)`` tokens), or a
  canvas step of ``canvas`` tokens (one more after the first commit: vLLM keeps the last
  committed token to recompute). A block takes ``r_b`` denoising steps and then a commit
  step; the request finishes at its last block's commit;
* KV: a request holds ``ceil(tokens computed or scheduled / page)`` pages; a step that does not
  fit preempts the *victim* (the last running request; under ``priority`` the largest
  ``(priority, arrival)``), which frees its pages, loses its block in progress and computes its
  context again; an iteration that preempted admits nobody;
* admission: while fewer than ``max_num_seqs`` run and the budget lasts, the head of the
  waiting queue (FCFS: arrival order, preempted requests back at the front; ``priority``: a
  heap on ``(priority, arrival, id)``; a runtime policy: its key, re-sorted every iteration,
  as ``dwise_predict.vllm`` does, which also sorts the running list);
* an iteration with nothing to run while requests are still to arrive is skipped.

Completion = iterations from arrival to the iteration that finishes the request (counted as
the CPU harness counts them, ``tests/vllm_plugin``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import SchedulerError
from .iterations import IterationRanker
from .policies import Policy

#: the two queue disciplines vLLM has on its own (``--scheduling-policy``)
VLLM_ORDERS = ("fcfs", "priority")


@dataclass(frozen=True)
class ReplayRequest:
    """One request to replay: its prompt, per block its denoising steps, when it arrives."""

    rid: str
    prompt_tokens: int
    rounds_per_block: tuple[int, ...]
    arrival: int = 0
    estimate: float = 0.0
    priority: int = 0

    @property
    def true_rounds(self) -> int:
        """The true work after the prompt, in iterations: denoising steps and commits."""
        return int(sum(self.rounds_per_block)) + len(self.rounds_per_block)


@dataclass
class ReplayResult:
    iterations: int = 0
    completion: dict[str, int] = field(default_factory=dict)
    preemptions: int = 0
    kv_pages_leaked: int = 0


@dataclass
class _Live:
    req: ReplayRequest
    computed: int = 0  # context tokens in the KV cache (prompt + committed canvases)
    committed: int = 0  # blocks committed
    steps: int = 0  # denoising steps of the block in progress
    pages: int = 0

    def blocks(self) -> int:
        return len(self.req.rounds_per_block)


def replay_vllm(
    requests: Sequence[ReplayRequest],
    order: str | Policy,
    *,
    max_num_seqs: int,
    canvas: int = 32,
    max_num_batched_tokens: int = 8192,
    kv_pages: int = 1 << 20,
    page_tokens: int = 16,
    max_iterations: int = 10_000_000,
) -> ReplayResult:
    """Replay ``requests`` through the vLLM iteration model (module docstring) under ``order``:
    ``"fcfs"``, ``"priority"`` (vLLM's own) or a runtime policy (DWISE's order in vLLM)."""
    if isinstance(order, str) and order not in VLLM_ORDERS:
        raise SchedulerError(f"order={order!r} is not one of {VLLM_ORDERS} or a runtime policy")
    ranker = (
        None
        if isinstance(order, str)
        else IterationRanker(order, prompt_chunk=max_num_batched_tokens, slots=max_num_seqs)
    )
    by_arrival = sorted(requests, key=lambda r: (r.arrival, r.rid))
    res = ReplayResult()
    free = kv_pages
    waiting_fifo: deque[_Live] = deque()
    waiting_heap: list[tuple[int, int, str, _Live]] = []
    running: list[_Live] = []
    live_by_id: dict[str, _Live] = {}
    nxt, it = 0, 0

    def context(x: _Live) -> int:
        return x.req.prompt_tokens + canvas * x.committed

    def push_waiting(x: _Live, front: bool) -> None:
        if order == "priority":
            heapq.heappush(waiting_heap, (x.req.priority, x.req.arrival, x.req.rid, x))
        elif front:
            waiting_fifo.appendleft(x)
        else:
            waiting_fifo.append(x)

    def n_waiting() -> int:
        return len(waiting_heap) if order == "priority" else len(waiting_fifo)

    def peek() -> _Live:
        return waiting_heap[0][3] if order == "priority" else waiting_fifo[0]

    def pop() -> _Live:
        return heapq.heappop(waiting_heap)[3] if order == "priority" else waiting_fifo.popleft()

    def need_tokens(x: _Live, budget: int) -> tuple[int, bool]:
        """(tokens this step schedules, whether it is a canvas step)."""
        left = context(x) - x.computed
        if left > 0:
            return min(left, budget), False
        return canvas + (1 if x.committed else 0), True

    while it < max_iterations:
        while nxt < len(by_arrival) and by_arrival[nxt].arrival <= it:
            r = by_arrival[nxt]
            x = _Live(r)
            live_by_id[r.rid] = x
            push_waiting(x, front=False)
            if ranker is not None:
                ranker.add(
                    r.rid,
                    prompt_tokens=r.prompt_tokens,
                    estimate=r.estimate,
                    true_rounds=r.true_rounds,
                )
            nxt += 1
        if not live_by_id:
            if nxt >= len(by_arrival):
                break
            it = max(it + 1, by_arrival[nxt].arrival)
            continue
        if ranker is not None:  # DWISE's order: both lists sorted by the policy's key
            if len(waiting_fifo) > 1:
                items = list(waiting_fifo)
                pos = ranker.order([w.req.rid for w in items])
                waiting_fifo = deque(items[i] for i in pos.tolist())
            if len(running) > 1:
                pos = ranker.order([w.req.rid for w in running])
                running = [running[i] for i in pos.tolist()]
        budget = max_num_batched_tokens
        scheduled: list[tuple[_Live, int, bool]] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            x = running[i]
            n, canvas_step = need_tokens(x, budget)
            want = -(-(x.computed + n) // page_tokens)
            ok = True
            while want - x.pages > free:
                if order == "priority":
                    victim = max(running, key=lambda w: (w.req.priority, w.req.arrival))
                else:
                    victim = running[-1]
                vi = running.index(victim)
                del running[vi]
                if vi < i:
                    i -= 1
                for j, (s, sn, _) in enumerate(scheduled):
                    if s is victim:
                        budget += sn
                        del scheduled[j]
                        break
                free += victim.pages
                victim.pages, victim.computed, victim.steps = 0, 0, 0
                push_waiting(victim, front=True)
                if ranker is not None:
                    ranker.preempted(victim.req.rid, context(victim))
                res.preemptions += 1
                preempted = True
                if victim is x:
                    ok = False
                    break
            if not ok:
                continue  # x left the list; i now points at the next one
            free -= max(0, want - x.pages)
            x.pages = max(x.pages, want)
            scheduled.append((x, n, canvas_step))
            budget -= n
            i += 1
        if not preempted:
            while budget > 0 and n_waiting() and len(running) < max_num_seqs:
                x = peek()
                n, canvas_step = need_tokens(x, budget)
                want = -(-(x.computed + n) // page_tokens)
                if want - x.pages > free:
                    break
                pop()
                free -= max(0, want - x.pages)
                x.pages = max(x.pages, want)
                running.append(x)
                scheduled.append((x, n, canvas_step))
                budget -= n
                if ranker is not None:
                    ranker.set_running(x.req.rid, True)
        if not scheduled:
            raise SchedulerError(
                f"iteration {it}: nothing fits (KV pages {kv_pages}, budget "
                f"{max_num_batched_tokens}); a request needs more than the pool"
            )
        it += 1
        res.iterations += 1
        if ranker is not None:
            ranker.ran([s.req.rid for s, _, _ in scheduled])
            ranker.tick()
        for x, n, canvas_step in scheduled:
            rid = x.req.rid
            if not canvas_step:
                x.computed += n
                x.steps = 0
                if ranker is not None:
                    ranker.set_prompt_left(rid, max(0, x.req.prompt_tokens - x.computed))
                continue
            if x.steps < x.req.rounds_per_block[x.committed]:
                x.steps += 1
                if ranker is not None:
                    ranker.denoised(rid)
                continue
            x.committed += 1  # commit: the canvas joins the context
            x.steps = 0
            x.computed = context(x)  # (vLLM recomputes the last token with the next canvas)
            if ranker is not None:
                ranker.committed(rid)
            if x.committed >= x.blocks():
                res.completion[rid] = it - x.req.arrival
                running.remove(x)
                free += x.pages
                x.pages = 0
                del live_by_id[rid]
                if ranker is not None:
                    ranker.remove(rid, finished=True)
    res.kv_pages_leaked = kv_pages - free
    return res
