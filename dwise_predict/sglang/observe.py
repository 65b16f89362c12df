"""Observe mode: SGLang schedules as stock; the plugin only watches and writes serving traces.

``DWISE_SGLANG_POLICY=observe`` is the cold start for a model with no bundle yet: SGLang's own
rounds run unchanged (so outputs and timing equal stock's), and every finished request becomes
a trace row in the project's schema, from what the server did: rounds per output block as
served, the pooled final-layer hidden state of its first denoising round, the prompt's
features, the server's fingerprint. Train a bundle on those traces (``dwise-predict train
--traces TRACE_DIR/dp0``) and serve it under ``DWISE_SGLANG_POLICY=dwise``: docs/sglang.md,
"Cold start".

The plugin learns a request at its first forward and follows it through
``process_batch_result_dllm``: a row that carried a prompt block is not counted; a denoising
row is one forward of its current block, and the row whose accept length is non-zero resolved
the block (r + 1 forwards for r denoising steps, recorded as r, the trace convention). With a
bundle (optional here), the monitor also compares the bundle's estimates with what served
requests took, without steering anything.

A client passes a request's category as SGLang's ``extra_key`` in the form ``category:NAME``
(it also partitions SGLang's prefix cache by category); without one the trace's category is
``serving``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from ..features import PromptFeaturizer, newline_count, word_count
from . import seam
from .background import Background
from .config import PluginConfig
from .monitor import QualityMonitor
from .prompt import PromptDecoder, served_prompt
from .serving import RequestTrack, ServingStats

log = logging.getLogger(__name__)

#: the ``extra_key`` prefix that names a request's category
CATEGORY_PREFIX = "category:"


def request_category(label: str | None) -> str:
    """The category a client passed in ``extra_key`` (``category:NAME``), else ``serving``."""
    if label:
        for part in str(label).split("|"):  # SGLang may append "|<namespace>"
            if part.startswith(CATEGORY_PREFIX) and len(part) > len(CATEGORY_PREFIX):
                return part[len(CATEGORY_PREFIX) :]
    return "serving"


class ObserveServing:
    """The plugin's state in observe mode (see the module docstring)."""

    def __init__(
        self,
        config: PluginConfig,
        bundle: Any,
        *,
        block_size: int,
        featurizer: PromptFeaturizer | None,
        pool_hidden: bool,
    ) -> None:
        self.config = config
        self.bundle = bundle
        self.block_size = int(block_size)
        self.featurizer = featurizer
        self.pool_hidden = pool_hidden
        self.refine = bundle is not None and getattr(bundle, "refinement", None) is not None
        self.decoder: PromptDecoder | None = None
        self.tracks: dict[Any, RequestTrack] = {}
        self.trace_sink: Any = None
        self.monitor = QualityMonitor(config.monitor_window, config.drift_threshold)
        self.gauges: Any = None
        self.background = Background()
        self.stats = ServingStats()
        self.keep_finished = False
        self.finished: list[tuple[Any, RequestTrack]] = []
        self._round = 0

    def set_tokenizer(self, tokenizer: Any) -> None:
        self.decoder = None if tokenizer is None else PromptDecoder(tokenizer)

    # -- a round's result -------------------------------------------------------------------------
    def _track(self, req: Any) -> RequestTrack:
        ids = seam.prompt_ids(req)
        estimate = 0.0
        if self.bundle is not None:
            text = served_prompt(req, self.decoder, self.featurizer)
            x = (word_count(text), newline_count(text), len(ids))
            e = float(self.bundle.predict_admission_one(x))
            estimate = e if math.isfinite(e) and e >= 0 else 0.0
        tr = RequestTrack(len(ids), seam.max_new_tokens(req), estimate, self._round)
        tr.category = request_category(seam.label(req))
        self.tracks[seam.rid(req)] = tr
        return tr

    def observe_result(self, batch: Any, result: Any) -> None:
        """Before SGLang folds a forward's result: count denoising forwards, resolved blocks,
        and pool the hidden rows of requests in their first denoising round."""
        t0 = time.perf_counter()
        reqs = seam.batch_requests(batch)
        acc = seam.accept_lengths(result)
        first: list[int] = []
        for i, req in enumerate(reqs):
            tr = self.tracks.get(seam.rid(req))
            if tr is None:
                tr = self._track(req)
            if seam.in_prefill(req):
                continue  # a prompt block: no denoising work
            tr.forwards += 1
            if tr.first_round is None:
                tr.first_round = self._round
                first.append(i)
            if acc[i]:
                # the resolving forward saw no mask: the block took (forwards - 1) steps
                tr.rounds_per_block.append(max(tr.forwards - tr.block_start - 1, 1))
                tr.block_start = tr.forwards
        if first and (self.pool_hidden or self.refine):
            self._pool(reqs, first, result)
        self._round += 1
        self.stats.rounds += 1
        self.stats.plan_seconds += time.perf_counter() - t0

    def _pool(self, reqs: list[Any], idx: list[int], result: Any) -> None:
        hidden = seam.round_hidden(result)
        if hidden is None:
            return
        todo = [self.tracks[seam.rid(reqs[i])] for i in idx]
        tails = [t.prompt_tokens % self.block_size for t in todo]
        try:
            H = seam.pool_block_rows(hidden, idx, tails, self.block_size, len(reqs))
        except seam.SGLangIncompatibleError as err:
            log.error("%s; serving traces carry no hidden state from now on", err)
            self.pool_hidden = self.refine = False
            return
        refined: list[float | None] = [None] * len(todo)
        if self.refine:
            est = self.bundle.predict_refined(
                H,
                np.array([t.prompt_tokens for t in todo]),
                np.array([t.output_budget for t in todo]),
            )
            refined = [float(e) if math.isfinite(e) and e >= 0 else None for e in est.tolist()]
        for tr, h, r in zip(todo, H, refined):
            tr.hidden = h
            tr.refined = r

    def after_result(self, batch: Any) -> None:
        """After SGLang folded the result: record the requests that finished in it."""
        t0 = time.perf_counter()
        for req in seam.batch_requests(batch):
            if seam.finished(req):
                tr = self.tracks.pop(seam.rid(req), None)
                if tr is not None:
                    self._finish(req, tr)
        self.stats.plan_seconds += time.perf_counter() - t0

    def _finish(self, req: Any, tr: RequestTrack) -> None:
        tr.finish_round = self._round
        if seam.end_kind(req) == "abort":
            self.stats.cancelled += 1
            return
        actual = float(sum(tr.rounds_per_block))
        if self.bundle is not None:
            refined_total = None if tr.refined is None else 1.0 + tr.refined
            self.monitor.record(actual, tr.admission, refined_total)
        else:
            self.monitor.finished += 1
        if self.trace_sink is not None:
            self.trace_sink.add(seam.rid(req), req, tr)
        if self.monitor.finished % self.config.monitor_every == 0:
            self.background.submit(self._publish, self.monitor.snapshot())
        if self.keep_finished:
            self.finished.append((seam.rid(req), tr))

    def _publish(self, snapshot: dict[str, Any]) -> None:
        self.monitor.publish(self.config.monitor_file, snapshot)
        if self.gauges is not None:
            self.gauges.set(snapshot)
        if self.trace_sink is not None:
            self.trace_sink.flush_now()

    def abort(self, abort_all: bool, prefix: str) -> None:
        """SGLang just ran ``abort_request``: stop following the requests it ended."""
        for rid in [r for r in self.tracks if abort_all or str(r).startswith(prefix)]:
            del self.tracks[rid]
            self.stats.cancelled += 1

    def drain(self) -> None:
        if self.trace_sink is not None:
            self.trace_sink.drain()
        self.background.drain()
        if self.trace_sink is not None:
            self.trace_sink.drain()

    @property
    def plugin_us_per_round(self) -> float:
        return 1e6 * self.stats.plan_seconds / max(1, self.stats.rounds)
