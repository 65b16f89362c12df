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
from typing import TYPE_CHECKING, Any

from ..features import PromptFeaturizer
from . import seam
from .config import PluginConfig
from .prompt import served_prompt
from .state import PluginState, RequestTrack

if TYPE_CHECKING:
    from ..bundle import Bundle

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


class ObserveServing(PluginState):
    """The plugin's state in observe mode (see the module docstring)."""

    def __init__(
        self,
        config: PluginConfig,
        bundle: Bundle | None,
        *,
        block_size: int,
        featurizer: PromptFeaturizer | None,
        pool_hidden: bool,
    ) -> None:
        super().__init__(config, bundle, block_size=block_size)
        self.featurizer = featurizer
        self.pool_hidden = pool_hidden
        self.refine = bundle is not None and bundle.refinement is not None
        self._round = 0

    # -- a round's result -------------------------------------------------------------------------
    def _track(self, req: Any) -> RequestTrack:
        estimate = 0.0
        prompt = None
        if self.bundle is not None:
            text = served_prompt(req, self.decoder, self.featurizer)
            prompt = text, len(seam.prompt_ids(req))
            e = float(self.bundle.predict_admission_prompt(*prompt))
            if self.config.admission != "lightgbm":  # the monitor judges what dwise ranks by
                e = float(self.bundle.admission_from_source([e], [text], self.config.admission)[0])
            estimate = e if math.isfinite(e) and e >= 0 else 0.0
        tr = RequestTrack(
            len(seam.prompt_ids(req)), seam.max_new_tokens(req), estimate, self._round
        )
        tr.category = request_category(seam.label(req))
        self._follow(seam.rid(req), tr)
        if prompt is not None:
            self._shadow(tr, prompt)
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
        if hidden is not None:
            todo = [self.tracks[seam.rid(reqs[i])] for i in idx]
            self._pool_first_rows(hidden, idx, todo, len(reqs))

    def _hidden_off(self) -> None:
        super()._hidden_off()
        self.pool_hidden = False  # the serving traces carry no hidden state from now on

    def after_result(self, batch: Any) -> None:
        """After SGLang folded the result: record the requests that finished in it."""
        t0 = time.perf_counter()
        for req in seam.batch_requests(batch):
            if seam.finished(req):
                tr = self.tracks.pop(seam.rid(req), None)
                if tr is not None:
                    self._finish(req, tr)
        self.lifecycle_tick()  # hot swap: between rounds only
        self.stats.plan_seconds += time.perf_counter() - t0

    def _finish(self, req: Any, tr: RequestTrack) -> None:
        tr.finish_round = self._round
        self._record(req, tr)

    def abort(self, abort_all: bool, prefix: str) -> None:
        """SGLang just ran ``abort_request``: stop following the requests it ended."""
        for rid in [r for r in self.tracks if abort_all or str(r).startswith(prefix)]:
            del self.tracks[rid]
            self.stats.cancelled += 1
