"""One vLLM engine's DWISE state: vLLM's queues in, the policy's order out.

vLLM's diffusion scheduler runs one step per request per iteration: a prompt chunk, a
denoising step (``canvas_length`` speculative tokens, all rejected, nothing emitted) or the
commit step that emits the converged canvas. It cannot see denoising progress (step counts and
convergence live in the model runner), so the state counts what it can see:

* an arrival gets the bundle's admission estimate r̂ of its denoising steps, from its prompt
  token ids (decoded with the bundle's tokenizer, the chat template's frame removed, as the
  traces counted words and newlines) and a row in an :class:`~..runtime.iterations.
  IterationRanker`; ``SamplingParams.extra_args`` (``vllm_xargs``) may name its ``category``;
* an iteration that scheduled canvas tokens for a request and got none back was a denoising
  step: r̂ −= 1 (the steps of the block in progress are given back if vLLM preempts the
  request, which throws that block away); one that got tokens back was a commit;
* before each ``schedule()``, vLLM's waiting queue and running list are sorted by the runtime
  policy's ``key`` (P + r̂ for ``dwise``), ties by arrival. Admission then takes the head of
  the queue while ``max_num_seqs`` and KV allow, and a KV shortage preempts the *last*
  running request (vLLM's FCFS rule), which is now the one with the most work left.

Every way a request ends leaves the two sides agreeing: a finish is seen in
``update_from_output``, an abort in ``finish_requests``; anything else (a request vLLM dropped
by another path) is caught by :meth:`DwiseVllmState.reconcile`, which compares the live sets
whenever their sizes disagree.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..runtime.iterations import IterationRanker
from . import seam
from .config import VllmConfig

if TYPE_CHECKING:
    from ..bundle import Bundle

log = logging.getLogger(__name__)


@dataclass
class VllmStats:
    """Counters tests and benchmarks read (none of them feeds a decision)."""

    iterations: int = 0
    arrivals: int = 0
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    denoise_steps: int = 0
    commits: int = 0
    reconciled: int = 0
    order_seconds: float = 0.0

    @property
    def order_us_per_iteration(self) -> float:
        return 1e6 * self.order_seconds / max(1, self.iterations)


class DwiseVllmState:
    """The DWISE state inside one vLLM scheduler (see the module docstring)."""

    def __init__(
        self,
        config: VllmConfig,
        bundle: Bundle | None,
        *,
        canvas_length: int,
        max_running: int,
        prompt_chunk: int,
    ) -> None:
        self.config = config
        self.bundle = bundle
        self.policy = config.make_policy()
        self.ranker = IterationRanker(
            self.policy, prompt_chunk=prompt_chunk, slots=max_running, capacity=4 * max_running
        )
        self.canvas_length = int(canvas_length)
        #: ranked without estimates (``dwise-r0``, ``fcfs``, ``oracle``): no bundle call
        self.uses_estimates = bool({"estimate", "refined"} & set(self.policy.needs))
        admission = None if bundle is None else bundle.admission
        self.featurizer = getattr(admission, "featurizer", None)
        self.categories: dict[str, str] = {}
        self.estimates: dict[str, float] = {}
        self.stats = VllmStats()

    # -- arrivals -------------------------------------------------------------------------------
    def _prompt(self, req: Any) -> tuple[str, int]:
        """A request's user prompt (its ids decoded, the chat template removed; empty without a
        tokenizer) and its token count."""
        ids = seam.prompt_ids(req)
        text = ""
        feat = self.featurizer
        if feat is not None:
            text = str(feat.tokenizer.decode(list(ids), skip_special_tokens=False) or "")
            text = feat.user_text(text)
        return text, len(ids)

    def features(self, req: Any) -> tuple[float, ...]:
        """The admission model's feature row of a request (needs the bundle)."""
        if self.bundle is None:
            raise ConfigError("the admission features of a request need DWISE_VLLM_BUNDLE")
        return self.bundle.admission_row(*self._prompt(req))

    def arrive(self, req: Any) -> None:
        rid = seam.rid(req)
        if rid in self.ranker:
            return
        extra = seam.extra_args(req)
        est = 0.0
        if self.uses_estimates and self.bundle is not None:  # the config requires a bundle
            est = float(self.bundle.predict_admission_prompt(*self._prompt(req)))
        truth = extra.get(seam.EXTRA_TRUE_ROUNDS)
        if "true_rounds" in self.policy.needs and truth is None:
            raise ConfigError(
                f"request {rid}: DWISE_VLLM_POLICY=oracle ranks by the true work: send "
                f"vllm_xargs {{'{seam.EXTRA_TRUE_ROUNDS}': N}} (denoising steps) with each request"
            )
        self.ranker.add(
            rid,
            prompt_tokens=seam.prompt_left(req),
            estimate=est,
            true_rounds=None if truth is None else float(truth),
            arrival_time=seam.arrival_time(req),
        )
        self.estimates[rid] = est
        self.categories[rid] = str(extra.get(seam.EXTRA_CATEGORY, "serving"))
        self.stats.arrivals += 1

    # -- ordering -------------------------------------------------------------------------------
    def order(self, sched: Any) -> None:
        """Sort vLLM's waiting queue and running list by the policy's key."""
        t0 = time.perf_counter()
        self.reconcile(sched)
        queue = list(seam.waiting(sched))
        if len(queue) > 1:
            for req in queue:
                self.arrive(req)  # a request that reached the queue another way
            pos = self.ranker.order([seam.rid(r) for r in queue])
            seam.reorder_waiting(sched, [queue[i] for i in pos.tolist()])
        run = seam.running(sched)
        if len(run) > 1:
            for req in run:
                self.arrive(req)
            pos = self.ranker.order([seam.rid(r) for r in run])
            seam.set_running(sched, [run[i] for i in pos.tolist()])
        self.stats.order_seconds += time.perf_counter() - t0

    def after_schedule(self, sched: Any, out: Any) -> None:
        """Residency and preemptions after vLLM's ``schedule()`` built an iteration."""
        ranker = self.ranker
        for rid in seam.preempted(out):
            req = seam.live_requests(sched).get(rid)
            if req is not None and rid in ranker:
                ranker.preempted(rid, seam.context_left(req))
                self.stats.preemptions += 1
        ran = list(seam.scheduled(out))
        for rid in ran:
            if rid in ranker:
                ranker.set_running(rid, True)
        ranker.ran(ran)
        ranker.tick()
        self.stats.iterations += 1

    def after_update(self, sched: Any, out: Any, runner_out: Any) -> None:
        """Fold an iteration's outcome: denoising steps, commits, prompt progress, finishes."""
        ranker = self.ranker
        spec = seam.spec_scheduled(out)
        emitted = seam.sampled(runner_out)
        live = seam.live_requests(sched)
        for rid in seam.scheduled(out):
            if rid not in ranker:
                continue
            if rid in spec:
                if emitted.get(rid, 0):
                    ranker.committed(rid)
                    self.stats.commits += 1
                else:
                    ranker.denoised(rid)
                    self.stats.denoise_steps += 1
            req = live.get(rid)
            if req is None or seam.finished(req):
                ranker.remove(rid, finished=True)
                self._ended(rid, aborted=False)
                continue
            ranker.set_prompt_left(rid, seam.prompt_left(req))

    def forget(self, rids: list[str], *, aborted: bool) -> None:
        for rid in rids:
            if self.ranker.remove(rid):
                self._ended(rid, aborted=aborted)

    def _ended(self, rid: str, *, aborted: bool) -> None:
        self.categories.pop(rid, None)
        self.estimates.pop(rid, None)
        if aborted:
            self.stats.aborted += 1
        else:
            self.stats.finished += 1

    def reconcile(self, sched: Any) -> None:
        """Forget requests vLLM no longer holds (ended by a path the hooks did not see)."""
        live = seam.live_requests(sched)
        if len(self.ranker) <= len(live):
            return
        gone = [r for r in self.ranker.ids() if r not in live or seam.finished(live[str(r)])]
        if gone:
            self.stats.reconciled += 1
            self.forget([str(r) for r in gone], aborted=True)
