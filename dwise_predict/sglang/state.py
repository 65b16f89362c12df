"""What every plugin state shares: per-request tracks, and what a finished request leaves behind.

Both states, the planning one (:class:`~.serving.DwiseServing`) and observe mode's
(:class:`~.observe.ObserveServing`), follow requests in :class:`RequestTrack` records. Each
pools a request's first-round hidden rows (and refines with them when a bundle can), and
hands each finished request to the quality monitor and the serving traces. This base class
holds that common part, so the two states differ only in how they follow a round.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..predictors import AdmissionModel, RefinementEnsemble
from . import seam
from .background import Background
from .config import PluginConfig
from .monitor import QualityMonitor
from .prompt import PromptDecoder

if TYPE_CHECKING:
    from ..bundle import Bundle

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RequestTrack:
    """What the plugin learns about one request while it is live."""

    prompt_tokens: int
    output_budget: int
    admission: float
    arrival_round: int
    refined: float | None = None
    #: denoising forwards run (SGLang's count: r + 1 per resolved block), set at the end
    forwards: int = 0
    rounds_per_block: list[int] = field(default_factory=list)
    first_round: int | None = None
    finish_round: int | None = None
    hidden: np.ndarray | None = None
    #: the DWS cost estimate the request was ranked by (a policy that needs "cost"), else None
    cost_ms: float | None = None
    #: denoising forwards run when its current block began
    block_start: int = 0
    #: what the client said the request is (observe mode: ``extra_key`` ``category:NAME``)
    category: str = "serving"
    #: hot swap: the admission estimate of the bundle beside the live one, and the lifecycle
    #: epoch it was made in (lifecycle.py)
    shadow: float | None = None
    shadow_epoch: int = -1
    #: arrival sequence number (the state's counter): the monitor's cohort (monitor.py)
    seq: int = 0


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
    #: requests that ended outside the plan (aborted in SGLang's queues, or dropped by it)
    cancelled: int = 0
    #: rounds that found SGLang's queues out of step with the core and reconciled them
    reconciled: int = 0


class PluginState:
    """The parts of a plugin state that do not depend on who composes the rounds."""

    #: unwraps served prompts from the bundle's chat template (set by each state)
    featurizer: Any

    def __init__(self, config: PluginConfig, bundle: Bundle | None, *, block_size: int) -> None:
        self.config = config
        self.bundle = bundle
        self.block_size = int(block_size)
        #: refine each request once from its first-round hidden rows (needs a bundle)
        self.refine = False
        self.tracks: dict[Any, RequestTrack] = {}
        #: finished requests' records, kept only when a caller asks (benchmarks, tests)
        self.keep_finished = False
        self.finished: list[tuple[Any, RequestTrack]] = []
        #: a ServingTraceSink when DWISE_SGLANG_TRACE_DIR is set (TP rank 0 only)
        self.trace_sink: Any = None
        self.monitor = QualityMonitor(
            config.monitor_window,
            config.drift_threshold,
            config.drift_rho_drop,
            hold=config.monitor_hold,
        )
        #: arrivals tracked so far: the next RequestTrack's ``seq``
        self.arrivals = 0
        #: Prometheus gauges of the monitor when SGLang runs with --enable-metrics (metrics.py)
        self.gauges: Any = None
        #: file writes (trace shards, monitor snapshots) happen here, off the scheduler thread
        self.background = Background()
        #: the server's tokenizer, as a fast decoder of prompt ids (None: no tokenizer)
        self.decoder: PromptDecoder | None = None
        self.stats = ServingStats()
        #: hot swap (DWISE_SGLANG_WATCH_SECONDS > 0): a lifecycle.BundleLifecycle, else None
        self.lifecycle: Any = None
        #: whether a bundle swapped in may refine (False: the settings or SGLang's layout say no)
        self.refine_allowed = True
        #: the output-length baseline a "length" policy ranks by (serving.py), else None
        self.length: Any = None

    def set_tokenizer(self, tokenizer: Any) -> None:
        """The server's tokenizer (None with ``--skip-tokenizer-init``)."""
        self.decoder = None if tokenizer is None else PromptDecoder(tokenizer)

    # -- first-round hidden rows ------------------------------------------------------------------
    def _pool_first_rows(
        self, hidden: Any, idx: list[int], todo: list[RequestTrack], batch_size: int
    ) -> None:
        """Keep each listed request's pooled first-round row and, when refining, its refined
        estimate; ``idx`` are their rows in the batch, ``todo`` their tracks."""
        bs = self.block_size
        # the first output block shares its first (prompt_tokens % bs) rows with the prompt
        tails = [t.prompt_tokens % bs for t in todo]
        try:
            H = seam.pool_block_rows(hidden, idx, tails, bs, batch_size)
        except seam.SGLangIncompatibleError as err:
            log.error("%s; first-round hidden states are off from now on", err)
            self._hidden_off()
            return
        refined: list[float | None] = [None] * len(todo)
        if self.refine and self.bundle is not None:
            # an output-length baseline that re-estimates (TRAIL) refines instead
            base = self.length
            predict = self.bundle.predict_refined if base is None else base.refined_rounds
            est = predict(
                H,
                np.array([t.prompt_tokens for t in todo]),
                np.array([t.output_budget for t in todo]),
            )
            refined = [float(e) if math.isfinite(e) and e >= 0 else None for e in est.tolist()]
        for tr, h, r in zip(todo, H, refined):
            tr.hidden = h
            tr.refined = r

    def _hidden_off(self) -> None:
        """The hidden-state layout is not SGLang's as the plugin knows it: stop using it."""
        self.refine = False
        self.refine_allowed = False

    # -- hot swap (lifecycle.py) ------------------------------------------------------------------
    def _shadow(self, tr: RequestTrack, prompt: tuple[str, int]) -> None:
        """A new request, ``prompt`` = (user text, served token count): count it for the live
        bundle, and give it the shadow bundle's estimate when one predicts beside it."""
        lc = self.lifecycle
        if lc is not None:
            tr.shadow = lc.on_arrival(*prompt)
            tr.shadow_epoch = lc.epoch

    def lifecycle_tick(self) -> None:
        """Between rounds: let the lifecycle take a new revision or swap bundles."""
        if self.lifecycle is not None:
            self.lifecycle.tick(self)

    def swap_bundle(self, bundle: Bundle, epoch: int, next_epoch: int) -> int:
        """Serve ``bundle`` from the next round. Tracked requests that may be re-estimated
        (:meth:`_reestimable`) and carry its estimate from ``epoch`` take it, and keep the
        outgoing one as their shadow estimate for ``next_epoch``. Returns how many switched."""
        self.bundle = bundle
        featurizer = getattr(bundle.admission, "featurizer", None)
        if featurizer is not None:
            self.featurizer = featurizer
        self.refine = self.refine_allowed and bundle.refinement is not None
        switched = []
        for rid, tr in self._reestimable():
            if tr.shadow_epoch == epoch and tr.shadow is not None:
                tr.admission, tr.shadow = tr.shadow, tr.admission
                tr.shadow_epoch = next_epoch
                switched.append((rid, tr.admission))
        self._reestimated(switched)
        return len(switched)

    def _reestimable(self) -> list[tuple[Any, RequestTrack]]:
        """The requests a swap re-estimates: every tracked one (nothing is ranked by them);
        a composing state narrows this to the waiting ones."""
        return list(self.tracks.items())

    def _reestimated(self, switched: list[tuple[Any, float]]) -> None:
        """(request id, new estimate) of the re-estimated requests; a composing state tells
        its core scheduler."""

    # -- finished requests ------------------------------------------------------------------------
    def _record(self, req: Any, tr: RequestTrack) -> None:
        """A finished request: to the monitor, the serving traces and (if asked) ``finished``.
        An aborted one is no measurement of its work and is only counted."""
        if seam.end_kind(req) == "abort":
            self.stats.cancelled += 1
            return
        if self.bundle is not None:
            actual = float(sum(tr.rounds_per_block))
            refined_total = None if tr.refined is None else 1.0 + tr.refined
            self.monitor.record(
                actual,
                {AdmissionModel.kind: tr.admission, RefinementEnsemble.kind: refined_total},
                seq=tr.seq,
            )
            if self.lifecycle is not None:
                self.lifecycle.on_finished(actual, tr.admission, tr.shadow, tr.shadow_epoch)
        else:  # observe mode without a bundle: nothing to compare, only the count
            self.monitor.finished += 1
        rid = seam.rid(req)
        if self.trace_sink is not None:
            self.trace_sink.add(rid, req, tr)
        if self.monitor.finished % self.config.monitor_every == 0:
            # the window takes whole arrival cohorts (monitor.py): O(live) once a period
            self.monitor.release_before(min((t.seq for t in self.tracks.values()), default=None))
            self.background.submit(self._publish, self.monitor.snapshot())
        if self.keep_finished:
            self.finished.append((rid, tr))

    def _follow(self, rid: Any, tr: RequestTrack) -> RequestTrack:
        """Follow a new request: it gets the next arrival sequence number."""
        tr.seq = self.arrivals
        self.arrivals += 1
        self.tracks[rid] = tr
        return tr

    def _publish(self, snapshot: dict[str, Any]) -> None:
        """Background thread: log and write the monitor's snapshot, set gauges, cut a shard."""
        self.monitor.publish(self.config.monitor_file, snapshot)
        if self.gauges is not None:
            self.gauges.set(snapshot)
        if self.trace_sink is not None:
            self.trace_sink.flush_now()  # a shard per monitor period: little to lose on a kill

    def drain(self) -> None:
        """Wait until every trace row and monitor snapshot handed off so far is written."""
        self.background.drain()  # a snapshot may cut a shard: it goes first
        if self.trace_sink is not None:
            self.trace_sink.drain()

    @property
    def plugin_us_per_round(self) -> float:
        return 1e6 * self.stats.plan_seconds / max(1, self.stats.rounds)
