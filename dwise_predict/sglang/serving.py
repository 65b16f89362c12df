"""One SGLang scheduler process's DWISE state: SGLang's queues in, the core's plan out.

SGLang's dLLM path keeps three sets of requests, and the plugin maps them onto the core
:class:`~dwise_predict.runtime.Scheduler` one to one:

* ``scheduler.waiting_queue`` (not yet admitted) = the core's waiting rows;
* ``dllm_manager.waiting_queue`` (admitted, holding a request slot and KV) = the residents;
* the round's ``PrefillAdder.can_run_list`` = the plan's rows.

Per round (:meth:`DwiseServing.compose_round`, called in place of SGLang's prefill-first
``_process_dllm_batches``): fold the previous round's outcome into the core (finished
requests, the refined estimate of requests that just ran their first denoising round),
register new arrivals with their admission estimate, ask the core for a plan, move the
admitted requests into the resident set, and hand the planned requests to SGLang's own
``_process_batch_by_phase``, decode and prefill alike, so one ``DLLM_EXTEND`` batch carries
both. A resident left out keeps its KV, request slot and partial block: SGLang's FDFO path
already pauses that way. Every decision is a function of the arrival order and the model's
outputs only (no clock, no randomness), so every TP rank's scheduler composes the same round.

Round accounting: a block that needs r denoising steps costs SGLang r + 1 forwards (the last
one sees no mask and writes the block's final KV); the traces the bundle learned from count r.
The plugin records both: ``rounds_per_block`` in the trace convention (r), ``forwards`` in
SGLang's.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..features import newline_count, word_count
from ..runtime import DWISE, DWSSJF, RoundPlan, RoundResult, Scheduler
from .config import PLANNED, PluginConfig
from .monitor import QualityMonitor
from .prompt import served_prompt

log = logging.getLogger(__name__)


@dataclass
class RequestTrack:
    """What the plugin learns about one request while it is live."""

    prompt_tokens: int
    output_budget: int
    admission: float
    arrival_round: int
    refined: float | None = None
    forwards: int = 0
    block_forwards: int = 0
    rounds_per_block: list[int] = field(default_factory=list)
    first_round: int | None = None
    finish_round: int | None = None
    hidden: np.ndarray | None = None
    #: the DWS cost estimate the request was ranked by (policy dws-sjf), else None
    cost_ms: float | None = None


@dataclass
class ServingStats:
    """Counters the benchmark and the tests read (none of them feeds a decision)."""

    rounds: int = 0
    plan_seconds: float = 0.0
    refinements: int = 0
    max_residents: int = 0
    refused_by_adder: int = 0
    phase_mismatches: int = 0
    kv_clamped: int = 0


@dataclass
class _Pending:
    plan: RoundPlan
    reqs: list[Any]


class DwiseServing:
    """The plugin's state inside one SGLang scheduler process (see the module docstring)."""

    def __init__(
        self,
        config: PluginConfig,
        bundle: Any,
        *,
        block_size: int,
        kv_pool_tokens: int,
        req_slots: int,
        refine: bool,
    ) -> None:
        if config.policy in PLANNED and req_slots < config.max_residents:
            raise ConfigError(
                f"SGLang has {req_slots} request slots but the plugin keeps up to k*B = "
                f"{config.k}*{config.slots} = {config.max_residents} residents: launch with "
                f"--max-running-requests {config.max_residents} (or lower DWISE_SGLANG_K)"
            )
        self.config = config
        self.bundle = bundle
        admission = getattr(bundle, "admission", None)
        #: unwraps served prompts from the chat template the bundle was traced with
        self.featurizer = getattr(admission, "featurizer", None)
        self.block_size = int(block_size)
        self.refine = refine
        # a frozen dataclass satisfies Policy at runtime
        policy: Any = DWSSJF() if config.policy == "dws-sjf" else DWISE(aging=config.aging)
        self.core = Scheduler(
            policy,
            slots=config.slots,
            k=config.k,
            kv_pool_tokens=int(kv_pool_tokens),
            kv_limit_frac=config.kv_limit_frac,
            slack_blocks=config.slack_blocks,
            capacity=max(1024, 2 * config.max_residents),
        )
        self.reqs: dict[Any, Any] = {}  # rid -> Req, for every request the core knows
        self.tracks: dict[Any, RequestTrack] = {}
        #: finished requests' records, kept only when a caller asks (benchmarks, tests)
        self.keep_finished = False
        self.finished: list[tuple[Any, RequestTrack]] = []
        #: a ServingTraceSink when DWISE_SGLANG_TRACE_DIR is set (TP rank 0 only)
        self.trace_sink: Any = None
        self.monitor = QualityMonitor(config.monitor_window, config.drift_threshold)
        #: Prometheus gauges of the monitor when SGLang runs with --enable-metrics (metrics.py)
        self.gauges: Any = None
        self.stats = ServingStats()
        self._pending: _Pending | None = None
        self._resolved: dict[Any, bool] = {}
        self._first_rids: set[Any] = set()
        #: (length, last request) of SGLang's waiting list when the plugin last looked
        self._seen: tuple[int, Any] = (0, None)

    # -- arrivals -----------------------------------------------------------------------------
    def _new_in(self, waiting: list[Any]) -> list[Any]:
        """The requests in ``waiting`` the plugin has not seen, without a scan of the queue.

        SGLang appends arrivals to its waiting list, and only the plugin takes requests out
        (admission) in this mode, so what is new is what follows the last request seen. When
        the queue changed otherwise (an abort, a retraction), the whole queue is scanned.
        """
        n, tail = self._seen
        if 0 < n <= len(waiting) and waiting[n - 1] is tail:
            new = [r for r in waiting[n:] if r.rid not in self.reqs]
        else:
            new = [r for r in waiting if r.rid not in self.reqs]
        self._remember(waiting)
        return new

    def _remember(self, waiting: list[Any]) -> None:
        self._seen = (len(waiting), waiting[-1] if waiting else None)

    def register_arrivals(self, waiting: list[Any], tokenizer: Any = None) -> int:
        """Give every request new to ``waiting`` its admission estimate and a core row."""
        new = self._new_in(waiting)
        if not new:
            return 0
        X = np.empty((len(new), 3), dtype=np.float64)
        texts = []
        for i, req in enumerate(new):
            texts.append(served_prompt(req, tokenizer, self.featurizer))
            # the token count is SGLang's own, i.e. after the chat template was applied
            X[i] = (word_count(texts[-1]), newline_count(texts[-1]), len(req.origin_input_ids))
        est = np.asarray(self.bundle.predict_admission_features(X), dtype=np.float64)
        scores: list[float | None] = [None] * len(new)
        if self.config.policy == "dws-sjf":  # the DWS surface priced by the cost profile, in ms
            cost = self.bundle.predict_cost(texts, prompt_tokens=X[:, 2].astype(np.int64))
            scores = [float(c) if math.isfinite(c) and c >= 0 else 0.0 for c in cost.tolist()]
        bs, kv = self.block_size, self.core.kv
        for req, e, score in zip(new, est.tolist(), scores):
            n_prompt = len(req.origin_input_ids)
            budget = int(req.sampling_params.max_new_tokens)
            worst = kv.worst_case(n_prompt, budget, bs)
            if worst > kv.limit_tokens:  # cannot ever fit the rule: run it alone rather than never
                self.stats.kv_clamped += 1
                log.warning(
                    "request %s needs %d KV tokens worst case, over the plugin's limit %d; "
                    "it will run only when nothing else holds a reservation",
                    req.rid,
                    worst,
                    kv.limit_tokens,
                )
                worst = kv.limit_tokens
            e = float(e) if math.isfinite(e) and e >= 0 else 0.0
            self.core.add_request(
                req.rid,
                n_prompt // bs,
                e,
                prompt_tokens=n_prompt,
                output_budget=budget,
                block_size=bs,
                kv_tokens_worst_case=worst,
                score=score,
            )
            self.reqs[req.rid] = req
            self.tracks[req.rid] = RequestTrack(
                n_prompt, budget, e, self.core.round_index, cost_ms=score
            )
        return len(new)

    # -- one round ------------------------------------------------------------------------------
    def fold_previous(self) -> None:
        """Report the last planned round to the core, from the requests' own state.

        Runs right after SGLang folded the round's result; ``compose_round`` runs it too, for a
        round whose planned requests the adder refused entirely (no batch, so no result).
        """
        p, self._pending = self._pending, None
        if p is None:
            return
        t0 = time.perf_counter()
        plan, reqs = p.plan, p.reqs
        finished = np.fromiter((r.finished() for r in reqs), dtype=bool, count=len(reqs))
        refined = np.full(len(reqs), np.nan)
        ri = plan.round_index
        for j, req in enumerate(reqs):
            tr = self.tracks[req.rid]
            if plan.prompt[j]:
                # SGLang reports a prompt block accepted too; it is no output block's end
                self._resolved.pop(req.rid, None)
                continue
            tr.forwards += 1
            tr.block_forwards += 1
            if tr.first_round is None:
                tr.first_round = ri
            if self._resolved.pop(req.rid, False) or finished[j]:
                # the resolving forward saw no mask: the block took (forwards - 1) steps
                tr.rounds_per_block.append(max(tr.block_forwards - 1, 1))
                tr.block_forwards = 0
            if plan.first_denoise[j] and tr.refined is not None:
                refined[j] = tr.refined
        aborted = finished & plan.prompt  # a request aborted mid-prefill: not a finish to the core
        if aborted.any():
            finished = finished & ~plan.prompt
        self.core.update(RoundResult(plan.rows, finished, refined))
        self.stats.refinements = self.core.refinements
        for j in np.flatnonzero(finished).tolist():
            self._finish(reqs[j], ri)
        for j in np.flatnonzero(aborted).tolist():
            self._drop(reqs[j].rid)
        self.stats.plan_seconds += time.perf_counter() - t0

    def _finish(self, req: Any, round_index: int) -> None:
        rid = req.rid
        tr = self.tracks.pop(rid)
        self.reqs.pop(rid, None)
        tr.finish_round = round_index
        actual = float(sum(tr.rounds_per_block))
        refined_total = None if tr.refined is None else 1.0 + tr.refined
        self.monitor.record(actual, tr.admission, refined_total)
        if self.trace_sink is not None:
            self.trace_sink.add(rid, req, tr)
        if self.monitor.finished % self.config.monitor_every == 0:
            snapshot = self.monitor.publish(self.config.monitor_file)
            if self.gauges is not None:
                self.gauges.set(snapshot)
            if self.trace_sink is not None:
                self.trace_sink.flush()  # a shard per monitor period: little to lose on a kill
        if self.keep_finished:
            self.finished.append((rid, tr))

    def _drop(self, rid: Any) -> None:
        log.warning(
            "request %s finished during a prompt block (aborted); the plugin forgets it", rid
        )
        self.tracks.pop(rid, None)
        self.reqs.pop(rid, None)

    def compose_round(self, sched: Any, adder: Any, running_batch: Any) -> Any:
        """SGLang's ``_process_dllm_batches`` under DWISE: fill ``adder`` with the plan's rows."""
        from sglang.srt.dllm.mixin.req import DllmReqPhase
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        self.fold_previous()
        t0 = time.perf_counter()
        self.register_arrivals(sched.waiting_queue, getattr(sched, "tokenizer", None))
        plan = self.core.plan_round()
        if plan.admitted.size:
            # plan.admitted holds table rows (all live now); plan.ids holds the ids of plan.rows
            admitted = [self.reqs[rid] for rid in self.core.table.ids[plan.admitted].tolist()]
            queue = sched.waiting_queue
            if 8 * len(admitted) < len(queue):  # a few: list.remove scans at C speed
                for r in admitted:
                    queue.remove(r)
            else:
                taken = {id(r) for r in admitted}
                queue = sched.waiting_queue = [r for r in queue if id(r) not in taken]
            self._remember(queue)
            sched.dllm_manager.add_waiting_reqs(admitted)
        run = [self.reqs[rid] for rid in plan.request_ids]
        self.stats.max_residents = max(self.stats.max_residents, self.core.n_resident)
        # the round's budget is B blocks, not SGLang's max_running_requests blocks
        adder.rem_dllm_tokens = len(run) * self.block_size
        in_prefill = np.fromiter((r.is_dllm_prefill() for r in run), bool, len(run))
        flags = in_prefill.tolist()  # one is_dllm_prefill() call per request, not three
        decode = [r for r, p in zip(run, flags) if not p]
        prefill = [r for r, p in zip(run, flags) if p]
        self.stats.phase_mismatches += int(np.count_nonzero(plan.prompt != in_prefill))
        self._first_rids = {r.rid for r, f in zip(run, plan.first_denoise.tolist()) if f}
        t1 = time.perf_counter()
        if decode:
            sched._process_batch_by_phase(
                adder,
                decode,
                DllmReqPhase.STAGING_DECODE,
                DllmReqPhase.INCOMING_DECODE,
                running_batch=running_batch,
            )
        if prefill:
            sched._process_batch_by_phase(
                adder,
                prefill,
                DllmReqPhase.STAGING_PREFILL,
                DllmReqPhase.INCOMING_PREFILL,
                running_batch=running_batch,
            )
        t2 = time.perf_counter()
        if len(adder.can_run_list) != len(run):
            self.stats.refused_by_adder += len(run) - len(adder.can_run_list)
        self._pending = _Pending(plan, run)
        self.stats.rounds += 1
        self.stats.plan_seconds += (t1 - t0) + (time.perf_counter() - t2)
        return ForwardMode.DLLM_EXTEND

    # -- results ----------------------------------------------------------------------------------
    def observe_result(self, batch: Any, result: Any) -> None:
        """Before SGLang folds a forward's result: note resolved blocks, pool first-round rows."""
        acc = getattr(result, "accept_length_per_req_cpu", None)
        reqs = batch.reqs
        if acc is not None:
            for idx, req in enumerate(reqs):
                if acc[idx]:
                    self._resolved[req.rid] = True
        if not (self.refine and self._first_rids):
            return
        hidden = getattr(getattr(result, "logits_output", None), "hidden_states", None)
        if hidden is None:
            return
        bs = self.block_size
        rows, todo = [], []
        for idx, req in enumerate(reqs):
            if req.rid not in self._first_rids:
                continue
            tr = self.tracks[req.rid]
            # the first output block shares its first (prompt_tokens % bs) rows with the prompt
            tail = tr.prompt_tokens % bs
            block = hidden[idx * bs + tail : (idx + 1) * bs]
            rows.append(block.float().mean(dim=0).cpu().numpy())
            todo.append(tr)
        if not todo:
            return
        H = np.stack(rows).astype(np.float32)
        est = self.bundle.predict_refined(
            H, np.array([t.prompt_tokens for t in todo]), np.array([t.output_budget for t in todo])
        )
        for tr, h, e in zip(todo, H, np.asarray(est, dtype=np.float64).tolist()):
            tr.hidden = h
            tr.refined = float(e) if math.isfinite(e) and e >= 0 else None
        self._first_rids = set()

    @property
    def plugin_us_per_round(self) -> float:
        return 1e6 * self.stats.plan_seconds / max(1, self.stats.rounds)
