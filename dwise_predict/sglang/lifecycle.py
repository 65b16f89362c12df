"""Hot swap in a live server: a new bundle revision shadows, is promoted, or is rolled back.

With ``DWISE_SGLANG_WATCH_SECONDS`` > 0 the plugin watches ``DWISE_SGLANG_BUNDLE`` for a new
revision (:mod:`.watcher`, a thread: download, verify, load). On the scheduler thread, between
rounds only (:meth:`BundleLifecycle.tick`, at the start of a round's composition), a ready
revision goes through three steps, one revision at a time (a newer one waits its turn):

1. **shadow**: it predicts the admission estimate of every arrival beside the live bundle,
   and ranks nothing; after ``DWISE_SGLANG_SHADOW_REQUESTS`` finished requests carry both
   estimates, :func:`~dwise_predict.bundle.promotion.judge` decides;
2. **promote** (or reject: the revision is dropped, having served no request): the revision
   becomes the live bundle. Requests still *waiting* take the estimate it gave them in shadow,
   so the queue is ranked on one scale; residents keep theirs (they were admitted by it, and
   their refined estimate and progress have replaced most of it). The live monitor's
   admission window restarts from the revision's shadow pairs;
3. **probation**: for as many requests again the previous bundle shadows the promoted one; if
   the live figures fall past ``DWISE_SGLANG_ROLLBACK_DROP`` from the shadow ones and the
   previous bundle does better on the same requests
   (:class:`~dwise_predict.bundle.promotion.Probation`), the previous bundle comes back the same
   way (waiting requests take its estimates).

A revision that fails verification (integrity, the served model's fingerprint, a predictor the
policy needs) is refused with a log line and a gauge; serving goes on with the live bundle.
Every step is logged and counted (:attr:`BundleLifecycle.events`, :attr:`served`, and the
``dwise:bundle_*`` / ``dwise:shadow_*`` gauges of :mod:`.metrics`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..bundle.promotion import Figures, Probation, PromotionRule, ShadowTrial
from ..errors import BundleError, ConfigError
from ..predictors import AdmissionModel
from .config import PluginConfig
from .watcher import Arrival, BundleWatcher, Revision, current_revision

if TYPE_CHECKING:
    from ..bundle import Bundle
    from ..fingerprint import ModelFingerprint

log = logging.getLogger(__name__)

#: the event kinds, in the order a revision meets them (the gauge's ``event`` label)
EVENTS = ("loaded", "refused", "promoted", "rejected", "kept", "rolled_back")
#: the shadow figures go to the gauges every this many paired requests (and at every event)
PUBLISH_EVERY = 16


def check_servable(bundle: Bundle, config: PluginConfig, fingerprint: ModelFingerprint) -> None:
    """Raise unless ``bundle`` can serve ``config`` on the model ``fingerprint`` describes.

    A new revision must match the served model exactly (``allow_mismatch`` applies to the
    bundle given at start-up only: a swap never widens what was accepted then)."""
    bundle.check(fingerprint)
    if bundle.admission is None:
        raise BundleError(f"bundle '{bundle.name}' has no admission predictor to rank arrivals by")
    if config.planned and "cost" in config.make_policy().needs:
        from .plugin import _check_priced

        _check_priced(bundle, config.policy)
    try:
        bundle.check_admission_source(config.admission)
    except BundleError as e:
        raise ConfigError(f"DWISE_SGLANG_ADMISSION={config.admission}: {e}") from None


def label_of(bundle: Bundle, revision: Revision | None) -> str:
    """``name@rN:sha`` (the manifest's revision number and hash), for logs and counts."""
    number = bundle.manifest.get("revision", 0)
    return f"{bundle.name}@r{number}" + ("" if revision is None else f":{revision.short}")


@dataclass(frozen=True)
class LifecycleEvent:
    """One step of a revision's way (``kind`` one of :data:`EVENTS`)."""

    kind: str
    revision: str
    reason: str
    round: int
    finished: int
    time: float


@dataclass
class _Side:
    """A bundle beside the live one: the candidate in shadow, or the previous on probation."""

    bundle: Bundle
    revision: Revision | None
    label: str
    trial: ShadowTrial


class BundleLifecycle:
    """The scheduler thread's half of hot swap (see the module doc)."""

    def __init__(
        self,
        rule: PromotionRule,
        live: Bundle,
        revision: Revision | None,
        watcher: BundleWatcher | None = None,
        *,
        gauges: Any = None,
        background: Any = None,
    ) -> None:
        self.rule = rule
        self.watcher = watcher
        self.gauges = gauges
        self.background = background
        self.revision = revision
        self.label = label_of(live, revision)
        #: the revision beside the live one, and (on probation) the one that was live before
        self.shadow: _Side | None = None
        self.probation: Probation | None = None
        #: label -> requests whose ranking estimate came from that revision
        self.served: dict[str, int] = {self.label: 0}
        self.events: list[LifecycleEvent] = []
        self.counts = dict.fromkeys(EVENTS, 0)
        #: rounds in which the scheduler thread took a revision or swapped the live bundle
        self.swap_rounds: list[int] = []
        #: waiting requests each swap re-estimated with the incoming bundle, in swap order
        self.reestimated: list[int] = []
        #: bumped whenever the shadow or the live bundle changes: a request's shadow estimate
        #: counts only in the epoch it was made in
        self.epoch = 0

    # -- per request (scheduler thread) -----------------------------------------------------------
    def on_arrival(self, text: str, prompt_tokens: int) -> float | None:
        """A new request ranked by the live bundle; returns the shadow's admission estimate
        of its prompt (None when nothing shadows). The shadow builds its own feature row: a
        revision may be trained on other features than the live bundle."""
        self.served[self.label] += 1
        side = self.shadow
        if side is None:
            return None
        e = float(side.bundle.predict_admission_prompt(text, prompt_tokens))
        return e if math.isfinite(e) and e >= 0 else None

    def on_finished(
        self, actual: float, live: float | None, shadow: float | None, epoch: int
    ) -> None:
        """A finished request's actual rounds and both admission estimates, made in ``epoch``
        (a request estimated beside another shadow, or before a swap, is not counted)."""
        side = self.shadow
        if side is None or epoch != self.epoch:
            return
        n = side.trial.n
        side.trial.add(actual, live, shadow)
        if self.probation is not None:
            self.probation.add(actual, live, shadow)
        if side.trial.n != n and side.trial.n % PUBLISH_EVERY == 0:
            self.publish()  # the shadow figures so far, to the gauges

    # -- between rounds (scheduler thread) --------------------------------------------------------
    def tick(self, state: Any) -> None:
        """Take a ready revision, or decide a finished trial; swap when one says so."""
        side = self.shadow
        if side is None:
            arrival = None if self.watcher is None else self.watcher.take()
            if arrival is not None:
                self.offer(arrival, state)
            return
        if self.probation is not None:
            if self.probation.done:
                self._end_probation(state, side, self.probation)
        elif side.trial.done:
            self._end_trial(state, side)

    def offer(self, arrival: Arrival, state: Any) -> None:
        """A revision the watcher loaded (or refused): start its shadow trial, or count it."""
        label = (
            f"revision {arrival.revision.short}"
            if arrival.bundle is None
            else label_of(arrival.bundle, arrival.revision)
        )
        if arrival.bundle is None:
            log.error(
                "dwise hot swap: refused %s at %s: %s (serving goes on with %s)",
                label,
                arrival.revision.path,
                arrival.error,
                self.label,
            )
            self._event(state, "refused", label, arrival.error or "")
            return
        self.served.setdefault(label, 0)
        self.epoch += 1
        self.shadow = _Side(arrival.bundle, arrival.revision, label, ShadowTrial(self.rule))
        self.swap_rounds.append(state.stats.rounds)
        reason = f"loaded in {arrival.load_seconds * 1e3:.0f} ms on {arrival.thread}; shadowing"
        log.info("dwise hot swap: %s %s", label, reason)
        self._event(state, "loaded", label, reason)

    def _end_trial(self, state: Any, side: _Side) -> None:
        ok, reason, live_f, cand_f = side.trial.verdict()
        if not ok:
            log.warning("dwise hot swap: %s %s; %s stays live", side.label, reason, self.label)
            self.shadow = None
            self.epoch += 1
            self._event(state, "rejected", side.label, reason)
            return
        log.info("dwise hot swap: %s %s", side.label, reason)
        previous = _Side(state.bundle, self.revision, self.label, ShadowTrial(self.rule))
        self._swap(state, side, side.trial.candidate_pairs())
        self.shadow = previous  # on probation, the previous bundle shadows the promoted one
        self.probation = Probation(self.rule, cand_f)
        self._event(state, "promoted", side.label, reason)

    def _end_probation(self, state: Any, previous: _Side, probation: Probation) -> None:
        back, reason, _ = probation.verdict()
        self.probation = None
        self.shadow = None
        if not back:
            self.epoch += 1
            log.info("dwise hot swap: %s %s after probation", self.label, reason)
            self._event(state, "kept", self.label, reason)
            return
        log.warning("dwise hot swap: %s %s; %s is live again", self.label, reason, previous.label)
        # the rolled-back revision stays seen: it is judged again only when published again
        self._event(state, "rolled_back", self.label, reason)
        self._swap(state, previous, previous.trial.candidate_pairs())

    def _swap(self, state: Any, incoming: _Side, pairs: list[tuple[float, float]]) -> None:
        # waiting requests estimated by ``incoming`` in this epoch take that estimate, and keep
        # the outgoing one as their shadow estimate in the next
        old, self.epoch = self.epoch, self.epoch + 1
        switched = state.swap_bundle(incoming.bundle, old, self.epoch)
        self.revision, self.label = incoming.revision, incoming.label
        self.served[self.label] = self.served.get(self.label, 0) + switched
        self.reestimated.append(switched)
        state.monitor.restart({AdmissionModel.kind: pairs})
        self.swap_rounds.append(state.stats.rounds)

    def _event(self, state: Any, kind: str, label: str, reason: str) -> None:
        self.counts[kind] += 1
        self.events.append(
            LifecycleEvent(
                kind, label, reason, state.stats.rounds, state.monitor.finished, time.time()
            )
        )
        self.publish()

    # -- figures ----------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Live and shadow figures and event counts (what the gauges export)."""
        side = self.shadow
        live_f = shadow_f = Figures(0, None, None)
        if side is not None:
            live_f, shadow_f = side.trial.figures()
        return {
            "live": self.label,
            "live_revision": _revision_number(self.label),
            "shadow": None if side is None else side.label,
            "shadow_role": None
            if side is None
            else ("previous" if self.probation is not None else "candidate"),
            "shadow_revision": None if side is None else _revision_number(side.label),
            "paired": live_f.n,
            "live_figures": live_f.to_dict(),
            "shadow_figures": shadow_f.to_dict(),
            "events": dict(self.counts),
        }

    def publish(self) -> None:
        """Hand the snapshot to the gauges on the background thread (no-op without them)."""
        if self.gauges is None:
            return
        snap = self.snapshot()
        if self.background is not None:
            self.background.submit(self.gauges.set, snap)
        else:
            self.gauges.set(snap)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()


def _revision_number(label: str) -> int | None:
    try:
        return int(label.split("@r", 1)[1].split(":", 1)[0])
    except (IndexError, ValueError):
        return None


def start_lifecycle(scheduler: Any, state: Any, config: PluginConfig) -> BundleLifecycle:
    """Watch ``config.bundle`` for new revisions (``DWISE_SGLANG_WATCH_SECONDS`` > 0)."""
    from .metrics import lifecycle_gauges_for
    from .seam import server_fingerprint

    if config.bundle is None or state.bundle is None:
        raise ConfigError("DWISE_SGLANG_WATCH_SECONDS needs DWISE_SGLANG_BUNDLE to watch")
    if getattr(state, "length", None) is not None:
        raise ConfigError(
            f"DWISE_SGLANG_POLICY={config.policy} ranks by an output-length baseline, which a "
            "new revision's shadow does not judge: set DWISE_SGLANG_WATCH_SECONDS=0 (hot swap "
            "serves the policies that rank by the admission estimate)"
        )
    fingerprint = server_fingerprint(scheduler)
    revision = current_revision(config.bundle)
    watcher = BundleWatcher(
        config.bundle,
        config.watch_seconds,
        lambda b: check_servable(b, config, fingerprint),
        seen=revision,
    )
    lifecycle = BundleLifecycle(
        config.promotion_rule(),
        state.bundle,
        revision,
        watcher,
        gauges=lifecycle_gauges_for(scheduler),
        background=state.background,
    )
    log.info(
        "dwise hot swap: watching %s every %gs (live %s; shadow %d requests, margin %g, "
        "rollback past %g)",
        config.bundle,
        config.watch_seconds,
        lifecycle.label,
        config.shadow_requests,
        config.promote_margin,
        config.rollback_drop,
    )
    lifecycle.publish()
    return lifecycle
