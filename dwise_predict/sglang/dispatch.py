"""The ``dwise`` method of SGLang's data-parallel controller (``--dp-size N``).

SGLang's controller sends each tokenized request to one DP rank by ``--load-balance-method``:
``round_robin``, ``total_requests`` or ``total_tokens``, the last two from per-rank load
snapshots in shared memory (``DPBudget``), bumped by each dispatch until the next snapshot.
With ``DWISE_SGLANG_DISPATCH=dwise`` the plugin, loaded in the controller process too, puts
:class:`WorkDispatch` in place of that method when the controller starts:

* each rank's plugin reports its outstanding predicted work beside SGLang's load snapshot
  (:mod:`.load`); the controller reads those reports whenever it refreshes its own budget
  (``refresh_load_budget``, at most every 20 ms);
* an arrival's own work, prompt blocks plus the bundle's admission estimate, is computed once,
  here, from the request's text and token ids (the same features its scheduler will compute);
* the request goes to the rank where it adds least to the sum of completion times under
  SRPT (the work shorter than its own there, plus its own times the requests longer, from the
  rank's work histogram; the ranks within ``DWISE_SGLANG_DISPATCH_TOLERANCE`` of the least
  in turn), and that rank's histogram takes the request until its next report:
  the decision is :class:`~dwise_predict.runtime.fleet.Dispatcher`'s, the one the fleet
  simulator measures;
* a request that names its rank (``routed_dp_rank``) goes there, as under SGLang's methods;
* until every rank has reported, and whenever a busy rank's report is older than
  ``DWISE_SGLANG_DISPATCH_STALE_S`` or a rank is inactive, requests go by SGLang's own method
  (the one the controller was started with), and the log says which ranks are missing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..runtime.fleet import Dispatcher, ReplicaLoad
from . import seam
from .config import PluginConfig
from .load import ReportReader, report_path

if TYPE_CHECKING:
    from ..bundle import Bundle

log = logging.getLogger(__name__)


class WorkDispatch:
    """The controller's dispatch function under ``dwise`` (see the module docstring).

    ``method="oracle"`` ranks by true work instead (replays only): ``true_work`` maps request
    ids to their work in rounds, and ``loads`` must report each rank's true outstanding work.
    ``loads`` defaults to reading the ranks' reports.
    """

    def __init__(
        self,
        controller: Any,
        config: PluginConfig,
        bundle: Bundle | None = None,
        *,
        method: str = "dwise",
        loads: Callable[[], list[ReplicaLoad]] | None = None,
        true_work: Mapping[Any, float] | None = None,
    ) -> None:
        from ..bundle import load_bundle

        self.controller = controller
        self.ranks = seam.dp_ranks(controller)
        self.sglang_name, self.sglang_dispatch = seam.sglang_method(controller)
        self.dispatcher = Dispatcher(
            self.ranks,
            method,
            stale_after=config.dispatch_stale_s,
            tolerance=config.dispatch_tolerance,
        )
        self.reader = ReportReader(
            report_path(seam.controller_snapshot_file(controller)), self.ranks
        )
        self.loads = loads if loads is not None else self.reader.read_all
        if bundle is None:
            if not config.bundle:
                raise ConfigError("the dwise dispatch method needs DWISE_SGLANG_BUNDLE")
            bundle = load_bundle(config.bundle)
        self.bundle = bundle
        admission = bundle.admission
        self.featurizer = getattr(admission, "featurizer", None)
        self.block_size = int(bundle.fingerprint.block_size)
        self.true_work = true_work
        if method == "oracle" and true_work is None:
            raise ConfigError("the oracle dispatch needs each request's true work")
        #: requests sent by work, and by SGLang's method because a report was missing
        self.dispatched = 0
        self.fallbacks = 0
        self.refreshes = 0
        #: requests whose estimate failed (sent by SGLang's method)
        self.failed = 0
        self._missing: tuple[int, ...] | None = None

    # -- the controller's hooks ---------------------------------------------------------------
    def refresh(self) -> None:
        """Fold in the ranks' latest reports (the controller just refreshed its own budget)."""
        self.dispatcher.update(self.loads())
        self.refreshes += 1

    def own_work(self, tokenized: Any) -> tuple[float, int]:
        """(prompt blocks + admission estimate, prompt tokens) of one arrival."""
        rid, text, ids = seam.tokenized_prompt(tokenized)
        n = len(ids)
        if self.true_work is not None:
            return float(self.true_work[str(rid)]), n
        if self.featurizer is not None and text:
            text = self.featurizer.user_text(text)
        est = self.bundle.predict_admission_prompt(text, n)
        est = float(est) if math.isfinite(est) and est >= 0 else 0.0
        return n // self.block_size + est, n

    def __call__(self, tokenized: Any) -> None:
        """Dispatch one request (what ``DataParallelController.dispatching`` does)."""
        if seam.route_pinned(self.controller, tokenized):
            return
        now = time.time()
        missing = self.dispatcher.stale_replicas(now)
        active = seam.active_ranks(self.controller)
        if len(active) != self.ranks:
            missing = sorted(set(missing) | (set(range(self.ranks)) - set(active)))
        self._say(tuple(missing))
        if missing:
            self.fallbacks += 1
            self.sglang_dispatch(tokenized)
            return
        try:
            work, tokens = self.own_work(tokenized)
        except Exception as e:  # the controller's loop must not die on one request's estimate
            if not self.failed:
                log.error(
                    "dwise dispatch: pricing a request failed (%s); SGLang's %s sends "
                    "such requests",
                    e,
                    self.sglang_name,
                )
            self.failed += 1
            self.sglang_dispatch(tokenized)
            return
        rank = self.dispatcher.choose(work_rounds=work, tokens=tokens, now=now)
        self.dispatched += 1
        seam.send_to_rank(self.controller, rank, tokenized)

    def _say(self, missing: tuple[int, ...]) -> None:
        """Log each change between dispatching by work and falling back (not every request)."""
        if missing == self._missing:
            return
        if missing:
            log.warning(
                "dwise dispatch: no fresh work report from DP rank(s) %s; sending requests by "
                "SGLang's %s until every rank reports",
                list(missing[:16]),
                self.sglang_name,
            )
        elif self._missing is not None:
            log.info("dwise dispatch: every DP rank reports; dispatching by predicted work")
        self._missing = missing


def install(controller: Any, config: PluginConfig) -> WorkDispatch:
    """Make ``controller`` dispatch by predicted work (the hook at the end of its ``__init__``)."""
    wd = WorkDispatch(controller, config)
    seam.install_dispatch(controller, wd)
    log.info(
        "dwise dispatch over %d DP ranks (bundle %s); SGLang's %s until every rank reports",
        wd.ranks,
        wd.bundle.name,
        wd.sglang_name,
    )
    return wd


def after_refresh(controller: Any, before: float) -> None:
    """The controller ran ``refresh_load_budget``: when it read SGLang's snapshots (its 20 ms
    throttle let it), read the plugin's reports too."""
    wd = seam.current_dispatch(controller)
    if isinstance(wd, WorkDispatch) and seam.last_refresh(controller) != before:
        wd.refresh()
