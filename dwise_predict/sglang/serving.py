"""One SGLang scheduler process's DWISE state: SGLang's queues in, the core's plan out.

SGLang's dLLM path keeps three sets of requests, and the plugin maps them onto the core
:class:`~dwise_predict.runtime.Scheduler` one to one:

* SGLang's waiting queue (not yet admitted) = the core's waiting rows;
* the dLLM resident set (admitted, holding a request slot and KV) = the core's residents;
* the requests SGLang's adder accepted into the round = the plan's rows.

Per round (:meth:`DwiseServing.compose_round`, called in place of SGLang's prefill-first
``_process_dllm_batches``): fold the previous round's outcome into the core (finished
requests, the refined estimate of requests that just ran their first denoising round),
forget requests that ended outside the plan (aborts), register new arrivals with their
admission estimate, ask the core for a plan, move the admitted requests into the resident set,
and hand the planned requests to SGLang's own per-phase batch building, decode and prefill
alike, so one batch carries both. A resident left out keeps its KV, request slot and partial
block: SGLang's FDFO path already pauses that way. Every decision is a function of the arrival
order and the model's outputs only (no clock, no thread timing), so every TP rank's scheduler
composes the same round.

**Every way a request ends** leaves the core and SGLang agreeing:

* it finishes (EOS, length cap, context limit): :meth:`fold_previous` reports it to the core;
* it is aborted (client disconnect, ``abort_all``) while waiting, resident, paused, mid-prompt,
  mid-block, or in the round just run: SGLang pops it from its queues and frees its KV; the
  hook on ``abort_request`` then cancels it in the core (:meth:`abort`);
* it leaves SGLang's queues any other way: the next round sees the queue sizes disagree with
  the core's and reconciles by membership (:meth:`_reconcile`), so no path leaks a reservation
  or plans a request that is gone.

Round accounting: a block that needs r denoising steps costs SGLang r + 1 forwards (the last
one sees no mask and writes the block's final KV); the traces the bundle learned from count r.
The plugin records both: ``rounds_per_block`` in the trace convention (r), ``forwards`` in
SGLang's. Per-request work per round is proportional to the requests that resolved a block,
started denoising, arrived or ended, not to B: the counters that move every round live in the
core's arrays.
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from ..features import FEATURE_NAMES, feature_values
from ..runtime import RoundPlan, RoundResult
from ..runtime.lengths import length_predictor
from ..runtime.load import LoadTrackingScheduler, WorkPrice
from . import seam
from .config import PluginConfig
from .observe import request_category
from .prompt import served_prompt
from .state import PluginState, RequestTrack

if TYPE_CHECKING:
    from ..bundle import Bundle

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Scored:
    """Arrivals' prompts (user text, served token count), admission estimates, DWS scores."""

    prompts: list[tuple[str, int]]
    estimates: list[float]
    scores: list[float | None]

    def subset(self, keep: list[int]) -> _Scored:
        pick = [self.prompts[i] for i in keep], [self.estimates[i] for i in keep]
        return _Scored(*pick, [self.scores[i] for i in keep])


@dataclass(slots=True)
class _Pending:
    plan: RoundPlan
    reqs: list[Any]


class DwiseServing(PluginState):
    """The plugin's state inside one SGLang scheduler process (see the module docstring)."""

    #: a composing plugin always ranks by a bundle's estimates (``PluginConfig`` requires one)
    bundle: Bundle

    def __init__(
        self,
        config: PluginConfig,
        bundle: Bundle,
        *,
        block_size: int,
        kv_pool_tokens: int,
        req_slots: int,
        refine: bool,
    ) -> None:
        if req_slots < config.max_residents:
            raise ConfigError(
                f"SGLang has {req_slots} request slots but the plugin keeps up to k*B = "
                f"{config.k}*{config.slots} = {config.max_residents} residents: launch with "
                f"--max-running-requests {config.max_residents} (or lower DWISE_SGLANG_K)"
            )
        super().__init__(config, bundle, block_size=block_size)
        admission = bundle.admission
        #: unwraps served prompts from the chat template the bundle was traced with
        self.featurizer = getattr(admission, "featurizer", None)
        # the same policy the simulator runs under this name
        policy = config.make_policy()
        #: what the core ranks by: estimates (the DWISE family), truth (oracle), or neither
        self.estimates = getattr(policy, "estimates", None)
        self.refine = refine and "refined" in policy.needs
        #: the policy ranks by the DWS cost of each prompt (an encoder pass per arrival)
        self.priced = "cost" in policy.needs
        #: an output-length baseline's policy (needs "length"): its predictor ranks instead
        self.length = length_predictor(bundle, policy)
        #: policy "oracle": each request's true denoising forwards, by request id
        self.oracle: dict[str, float] = {}
        self.oracle_missing = 0
        #: keeps the outstanding predicted work per event: the replica's load signal (load.py)
        self.core = LoadTrackingScheduler(
            policy,
            price=None if bundle.cost_profile is None else WorkPrice(bundle.cost_profile),
            slots=config.slots,
            k=config.k,
            kv_pool_tokens=int(kv_pool_tokens),
            kv_limit_frac=config.kv_limit_frac,
            slack_blocks=config.slack_blocks,
            capacity=max(1024, 2 * config.max_residents),
        )
        self.reqs: dict[Any, Any] = {}  # rid -> Req, for every request the core knows
        #: the Req of each core table row (rows are reused; a live row's entry is current)
        self._req_at = np.empty(self.core.table.capacity, dtype=object)
        #: scratch: a planned row's position in its plan, -1 elsewhere
        self._pos_at = np.full(self.core.table.capacity, -1, dtype=np.int64)
        self._pending: _Pending | None = None
        self._resolved: list[Any] = []  # Reqs whose block resolved in the round just run
        self._aborted = False  # an abort arrived while a round was out: reconcile next round
        #: (length, last request) of SGLang's waiting list when the plugin last looked
        self._seen: tuple[int, Any] = (0, None)
        #: priced arrivals under load: priced while the round runs, registered at the next
        self._worker: ThreadPoolExecutor | None = None
        self._scoring: tuple[list[tuple[int, Any]], int, Future[_Scored], int] | None = None
        #: counts changes to SGLang's queues the plugin did not make (aborts)
        self._queue_epoch = 0
        #: where each waiting request stood in SGLang's queue when seen, and how many requests
        #: the plugin had taken out of the queue by then (see _take_admitted)
        self._qpos = np.zeros(self.core.table.capacity, dtype=np.int64)
        self._qrem = np.zeros(self.core.table.capacity, dtype=np.int64)
        self._removed = 0
        self._qpos_ok = True

    # -- arrivals -----------------------------------------------------------------------------
    def _new_in(self, waiting: list[Any]) -> list[tuple[int, Any]]:
        """(position, request) of each request in ``waiting`` the plugin has not seen, without
        a scan of the queue.

        SGLang appends arrivals to its waiting list, and only the plugin takes requests out
        (admission) in this mode, so what is new is what follows the last request seen. When
        the queue changed otherwise (an abort), the whole queue is scanned.
        """
        n, tail = self._seen
        known = self.reqs
        if 0 < n <= len(waiting) and waiting[n - 1] is tail:
            new = [(n + i, r) for i, r in enumerate(waiting[n:]) if seam.rid(r) not in known]
        else:
            new = [(i, r) for i, r in enumerate(waiting) if seam.rid(r) not in known]
        self._remember(waiting)
        return new

    def _remember(self, waiting: list[Any]) -> None:
        self._seen = (len(waiting), waiting[-1] if waiting else None)

    def _take_admitted(self, queue: list[Any], rows: list[int], admitted: list[Any]) -> list[Any]:
        """Remove the admitted requests from SGLang's waiting queue; returns the queue.

        A request's position only falls after it is seen (SGLang appends behind it, the plugin
        removes), and by at most the removals since, so each is found in a short window of
        the queue rather than by a scan of thousands."""
        if 8 * len(admitted) >= len(queue):  # many: one pass
            taken = {id(r) for r in admitted}
            self._qpos_ok = False
            return [r for r in queue if id(r) not in taken]
        if not self._qpos_ok:
            self._index_positions(queue)
        removed = self._removed
        for r, row in zip(admitted, rows):
            hi = int(self._qpos[row])
            lo = max(0, hi - (removed - int(self._qrem[row])))
            try:
                i = queue.index(r, lo, hi + 1)
            except ValueError:  # only if the bounds were broken: a full scan, still correct
                i = queue.index(r)
            del queue[i]
            removed += 1
        self._removed = removed
        return queue

    def _index_positions(self, queue: list[Any]) -> None:
        row_of = self.core._row_of
        for i, r in enumerate(queue):
            row = row_of.get(seam.rid(r))
            if row is not None:
                self._qpos[row], self._qrem[row] = i, self._removed
        self._qpos_ok = True

    @property
    def _encodes(self) -> bool:
        """Whether pricing an arrival runs the DWS text encoder (milliseconds, not µs)."""
        return self.priced or self._blends

    @property
    def _blends(self) -> bool:
        """Whether the admission estimate averages in DWS's expected rounds (a rung that ranks
        without estimates, ``dwise-r0``, has nothing to average)."""
        return self.config.admission == "lightgbm+dws" and self.estimates != "none"

    def _score(self, new: list[Any]) -> _Scored:
        """Prompts, admission estimates and (a priced policy) DWS cost scores of ``new``."""
        texts = [served_prompt(req, self.decoder, self.featurizer) for req in new]
        prompts = [(t, len(seam.prompt_ids(r))) for t, r in zip(texts, new)]
        if self.length is not None:  # an output-length baseline's estimate, in rounds
            counts = [feature_values(t, n, lexical=False) for t, n in prompts]
            X = np.array(counts, dtype=np.float64).reshape(len(counts), len(FEATURE_NAMES))
            est = self.length.arrival_rounds(X).tolist()
        else:
            rows = [self.bundle.admission_row(t, n) for t, n in prompts]
            if len(rows) <= 8:  # the usual few arrivals a round: no batch-call overhead
                one = self.bundle.predict_admission_one
                est = [one(x) for x in rows]
            else:
                X = np.array(rows, dtype=np.float64)
                est = np.asarray(self.bundle.predict_admission_features(X), np.float64).tolist()
        if self._blends and self.length is None:  # an encoder pass per prompt
            est = self.bundle.admission_from_source(est, texts, self.config.admission).tolist()
        scores: list[float | None] = [None] * len(new)
        if self.priced:  # the DWS surface priced by the cost profile, in ms
            tokens = np.array([n for _, n in prompts], dtype=np.int64)
            cost = self.bundle.predict_cost(texts, prompt_tokens=tokens)
            scores = [float(c) if math.isfinite(c) and c >= 0 else 0.0 for c in cost.tolist()]
        return _Scored(prompts, est, scores)

    def register_arrivals(self, waiting: list[Any], tokenizer: Any = None) -> int:
        """Give every request new to ``waiting`` its admission estimate and a core row, now."""
        known = self.decoder is not None and self.decoder.tokenizer is tokenizer
        if tokenizer is not None and not known:
            self.set_tokenizer(tokenizer)
        new = self._new_in(waiting)
        if not new:
            return 0
        self._register(new, self._removed, self._score([r for _, r in new]))
        return len(new)

    def _register(self, new: list[tuple[int, Any]], removed: int, scored: _Scored) -> None:
        """Core rows for ``new`` ((queue position, request) as seen when ``removed`` requests
        had been taken out of the queue), with their prompts, estimates and scores."""
        bs, kv = self.block_size, self.core.kv
        limit = kv.limit_tokens
        for (pos, req), x, e, score in zip(new, scored.prompts, scored.estimates, scored.scores):
            rid = seam.rid(req)
            if rid in self.reqs:
                continue  # registered already (a priced arrival scored twice)
            n_prompt = x[1]
            budget = seam.max_new_tokens(req)
            worst = kv.worst_case(n_prompt, budget, bs)
            if worst > limit:  # cannot ever fit the rule: run it alone rather than never
                self.stats.kv_clamped += 1
                log.warning(
                    "request %s needs %d KV tokens worst case, over the plugin's limit %d; "
                    "it will run only when nothing else holds a reservation",
                    rid,
                    worst,
                    limit,
                )
                worst = limit
            e = float(e) if math.isfinite(e) and e >= 0 else 0.0
            row = self.core.add_request(
                rid,
                n_prompt // bs,
                0.0 if self.estimates == "none" else e,
                prompt_tokens=n_prompt,
                output_budget=budget,
                block_size=bs,
                kv_tokens_worst_case=worst,
                score=score,
                true_rounds=self._true_rounds(rid, e) if self.oracle_used else None,
            )
            if row >= self._req_at.size:
                self._grow()
            self._req_at[row] = req
            self._qpos[row], self._qrem[row] = pos, removed
            self.reqs[rid] = req
            tr = self._follow(
                rid, RequestTrack(n_prompt, budget, e, self.core.round_index, cost_ms=score)
            )
            if self.trace_sink is not None:  # the client's category, for the serving traces
                tr.category = request_category(seam.label(req))
            self._shadow(tr, x)

    @property
    def oracle_used(self) -> bool:
        return "true_rounds" in self.core.policy.needs

    def _true_rounds(self, rid: Any, estimate: float) -> float:
        """The oracle's work for ``rid``; a request it does not know is ranked by its admission
        estimate instead (counted in ``oracle_missing``, warned about once)."""
        true = self.oracle.get(str(rid))
        if true is not None:
            return max(float(true), 1.0)
        if not self.oracle_missing:
            log.warning(
                "the oracle does not know request %s: ranking it (and any other unknown "
                "request) by its admission estimate",
                rid,
            )
        self.oracle_missing += 1
        return max(estimate, 1.0)

    def _grow(self) -> None:
        cap = self.core.table.capacity
        req_at = np.empty(cap, dtype=object)
        req_at[: self._req_at.size] = self._req_at
        self._req_at = req_at
        for name in ("_qpos", "_qrem"):
            old = getattr(self, name)
            grown = np.zeros(cap, dtype=np.int64)
            grown[: old.size] = old
            setattr(self, name, grown)

    def _arrivals(self, sched: Any) -> None:
        """Register this round's arrivals with their estimates.

        Under a policy ranked by DWS cost, or with the ``lightgbm+dws`` admission source, pricing
        a prompt runs a text encoder (milliseconds), so once the round is full (B residents) new
        arrivals are priced on a worker thread while the round's forward runs, and join the plan
        at the next round: the same round on every TP rank, whatever the threads' timing. While
        the round has room they are priced at once.
        """
        waiting = seam.waiting(sched)
        if self._scoring is not None:
            new, removed, fut, epoch = self._scoring
            self._scoring = None
            scored = fut.result()
            if self._queue_epoch != epoch:  # some may have been aborted while they were scored
                live = {id(r) for r in waiting}
                keep = [i for i, (_, r) in enumerate(new) if id(r) in live]
                new, scored = [new[i] for i in keep], scored.subset(keep)
            if new:
                self._register(new, removed, scored)
        new = self._new_in(waiting)
        if not new:
            return
        if not self._encodes or self.core.n_resident < self.config.slots:
            self._register(new, self._removed, self._score([r for _, r in new]))
            return
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="dwise-dws-encoder")
        job = self._worker.submit(self._score, [r for _, r in new])
        self._scoring = (new, self._removed, job, self._queue_epoch)

    # -- hot swap ---------------------------------------------------------------------------------
    def _reestimable(self) -> list[tuple[Any, RequestTrack]]:
        """Only requests still waiting: a resident keeps the estimate it was admitted by."""
        t, tracks = self.core.table, self.tracks
        return [(rid, tracks[rid]) for rid in t.ids[t.waiting].tolist() if rid in tracks]

    def _reestimated(self, switched: list[tuple[Any, float]]) -> None:
        if switched and self.estimates != "none":
            rows = np.array([self.core.row_of(rid) for rid, _ in switched], dtype=np.int64)
            self.core.set_estimates(rows, np.array([e for _, e in switched], dtype=np.float64))

    # -- requests that end outside the plan ------------------------------------------------------
    def abort(self, abort_all: bool, prefix: str) -> None:
        """SGLang just ran ``abort_request``: forget every request it ended.

        SGLang popped the matching requests from its queues and freed their KV; the core
        still holds them. A round in flight (never the case in SGLang's loop, where aborts
        are read between rounds) defers the clean-up to the next round's reconcile.
        """
        self._queue_epoch += 1  # arrivals being priced may be among the ended
        self._qpos_ok = False
        if self._pending is not None:
            self._aborted = True
            return
        ended = [r for r in self.reqs if abort_all or str(r).startswith(prefix)]
        for rid in ended:
            self._forget(rid, "aborted")
        if ended:
            self._seen = (0, None)  # SGLang's waiting queue changed under the plugin

    def _forget(self, rid: Any, why: str) -> None:
        self.core.cancel(rid)
        self.tracks.pop(rid, None)
        self.reqs.pop(rid, None)
        self.stats.cancelled += 1
        log.debug("request %s %s: the plugin forgets it", rid, why)

    def _reconcile(self, sched: Any) -> None:
        """Forget every request the core holds that is in none of SGLang's queues."""
        self.stats.reconciled += 1
        self._queue_epoch += 1
        live = {id(r) for r in seam.waiting(sched)}
        live.update(id(r) for r in seam.residents(sched))
        for rid, req in list(self.reqs.items()):
            if id(req) not in live:
                self._forget(rid, "left SGLang's queues")
        self._seen = (0, None)
        self._qpos_ok = False
        self._aborted = False

    def _in_step(self, sched: Any) -> bool:
        """Whether SGLang's queues hold as many requests as the core (O(1), run after
        ``_arrivals``): every request the core knows is in SGLang's waiting queue or its
        resident set, and the queue's other entries are arrivals still being priced."""
        pending = len(self._scoring[0]) if self._scoring is not None else 0
        sglang_side = len(seam.waiting(sched)) - pending + len(seam.residents(sched))
        return sglang_side == len(self.reqs)

    # -- one round ------------------------------------------------------------------------------
    def fold_previous(self) -> None:
        """Report the last planned round to the core, from what SGLang did with it.

        Runs right after SGLang folded the round's result; ``compose_round`` runs it too, for a
        round whose planned requests the adder refused entirely (no batch, so no result).
        """
        p, self._pending = self._pending, None
        if p is None:
            return
        t0 = time.perf_counter()
        plan, reqs = p.plan, p.reqs
        t = self.core.table
        n = len(reqs)
        finished = np.zeros(n, dtype=bool)
        refined: np.ndarray | None = None
        ri = plan.round_index
        ended: list[tuple[int, Any, int]] = []
        if self._resolved:
            # position of each planned row in the plan (rows are unique among live requests)
            many = len(self._resolved) > 8
            pos = self._pos_at
            if many:
                if pos.size < t.capacity:
                    pos = self._pos_at = np.full(t.capacity, -1, dtype=np.int64)
                pos[plan.rows] = np.arange(n)
            rows = plan.rows
            row_of = self.core._row_of
            for req in self._resolved:
                rid = seam.rid(req)
                row = row_of.get(rid)
                if row is None:
                    continue
                if many:
                    j = int(pos[row])
                else:
                    hit = np.flatnonzero(rows == row)
                    j = int(hit[0]) if hit.size else -1
                if j < 0 or plan.prompt[j] or reqs[j] is not req:
                    continue  # SGLang reports a prompt block accepted too: no output block's end
                tr = self.tracks[rid]
                done = int(t.done_rounds[row]) + 1  # this round's forward included
                # the resolving forward saw no mask: the block took (forwards - 1) steps
                tr.rounds_per_block.append(max(done - tr.block_start - 1, 1))
                tr.block_start = done
                if seam.finished(req):
                    finished[j] = True
                    ended.append((j, req, done))
            self._resolved = []
            if many:
                pos[plan.rows] = -1
        if plan.first_denoise.any():
            for j in np.flatnonzero(plan.first_denoise).tolist():
                tr = self.tracks[seam.rid(reqs[j])]
                tr.first_round = ri
                if tr.refined is not None:
                    if refined is None:
                        refined = np.full(n, np.nan)
                    refined[j] = tr.refined
        self.core.update(RoundResult(plan.rows, finished, refined))
        self.stats.refinements = self.core.refinements
        for _, req, forwards in ended:
            self._finish(req, ri, forwards)
        self.stats.plan_seconds += time.perf_counter() - t0

    def _finish(self, req: Any, round_index: int, forwards: int) -> None:
        rid = seam.rid(req)
        tr = self.tracks.pop(rid)
        self.reqs.pop(rid, None)
        tr.finish_round = round_index
        tr.forwards = forwards
        self._record(req, tr)

    def compose_round(self, sched: Any, adder: Any, running_batch: Any) -> Any:
        """SGLang's ``_process_dllm_batches`` under DWISE: fill ``adder`` with the plan's rows."""
        self.fold_previous()
        t0 = time.perf_counter()
        self.lifecycle_tick()  # hot swap: between rounds only
        if self._aborted:
            self._reconcile(sched)
        self._arrivals(sched)
        if not self._in_step(sched):
            self._reconcile(sched)
        plan = self.core.plan_round()
        if plan.admitted.size:
            admitted = self._req_at[plan.admitted].tolist()
            queue = seam.waiting(sched)
            taken = self._take_admitted(queue, plan.admitted.tolist(), admitted)
            if taken is not queue:
                seam.set_waiting(sched, taken)
            self._remember(taken)
            seam.admit(sched, admitted)
        run_at = self._req_at[plan.rows]
        run = run_at.tolist()
        self.stats.max_residents = max(self.stats.max_residents, int(plan.resident_rows.size))
        # the round's budget is B blocks, not SGLang's max_running_requests blocks
        seam.set_round_budget(adder, len(run) * self.block_size)
        prompt = plan.prompt
        if prompt.any():
            decode, prefill = run_at[~prompt].tolist(), run_at[prompt].tolist()
        else:
            decode, prefill = run, []
        t1 = time.perf_counter()
        if decode:
            seam.run_phase(sched, adder, decode, prefill=False, running_batch=running_batch)
        if prefill:
            seam.run_phase(sched, adder, prefill, prefill=True, running_batch=running_batch)
        t2 = time.perf_counter()
        accepted = len(seam.planned(adder))
        if accepted != len(run):
            # the core's prompt-block count and SGLang's phase disagree, or the adder ran out
            # of KV: count which (slow, but only on a round that went wrong)
            flags = np.fromiter((seam.in_prefill(r) for r in run), bool, len(run))
            self.stats.phase_mismatches += int(np.count_nonzero(prompt != flags))
            self.stats.refused_by_adder += len(run) - accepted
        self._pending = _Pending(plan, run)
        self.stats.rounds += 1
        self.stats.plan_seconds += (t1 - t0) + (time.perf_counter() - t2)
        return seam.mixed_forward_mode()

    # -- results ----------------------------------------------------------------------------------
    def observe_result(self, batch: Any, result: Any) -> None:
        """Before SGLang folds a forward's result: note resolved blocks, pool first-round rows."""
        t0 = time.perf_counter()
        reqs = seam.batch_requests(batch)
        acc = seam.accept_lengths(result)
        self._resolved = [r for r, a in zip(reqs, acc) if a]
        p = self._pending
        if self.refine and p is not None and p.plan.first_denoise.any():
            self._refine(p, reqs, result)
        self.stats.plan_seconds += time.perf_counter() - t0

    def _refine(self, p: _Pending, reqs: list[Any], result: Any) -> None:
        """Refined estimates for the requests that ran their first denoising round."""
        hidden = seam.round_hidden(result)
        if hidden is None:
            return
        first = {seam.rid(p.reqs[j]) for j in np.flatnonzero(p.plan.first_denoise).tolist()}
        idx = [i for i, r in enumerate(reqs) if seam.rid(r) in first]
        if idx:
            todo = [self.tracks[seam.rid(reqs[i])] for i in idx]
            self._pool_first_rows(hidden, idx, todo, len(reqs))

    def after_result(self, batch: Any) -> None:
        """After SGLang folded the round's result: report it to the core now, so the last
        round of a burst is folded too."""
        self.fold_previous()
