"""Online quality monitor: are the bundle's estimates still calibrated on live traffic?

Over a sliding window of finished requests it tracks, for each kind the kind registry names a
``monitor_label`` (the shipped ones: the admission estimate, total denoising rounds known at
arrival, as ``admission``; the refined one, rounds still to go after the first denoising round
plus that round, as ``refinement``), the median predicted/actual ratio and the Spearman rank
correlation with the actual rounds. A bundle trained on other traffic drifts in scale first
(the ratio leaves 1) and then in order (ρ falls): the first is what ranking tolerates least
across admission and refinement, because the two estimates must share one scale.

**The window holds whole arrival cohorts.** A size-based policy finishes requests in the order
of their estimates, so the last N *finishers* are a slice of the estimate range: their ρ is
range-restricted and swings with the slice (on a 512-request burst of tiny-bd's zoo bundle
under plain DWISE, 0.87 for the first 256 finishers and 0.42 for finishers 129-384, with the same
bundle on the same traffic, while FCFS's finish order keeps it steady). So a request that
reports its arrival sequence (``record(..., seq=...)``, the plugin's arrival counter) waits in
a pending list until every request that arrived before it has ended, and enters the window in
arrival order: the window is the last N requests *by arrival* whose cohort is complete, a
sample the policy did not select. The plugin calls :meth:`release_before` with the oldest live
sequence number before each snapshot. A straggler holds the window back by at most ``hold``
finished requests (default 4 windows); past that the earliest pending ones go in regardless.
A record without ``seq`` enters at once (finish order).

Drift rule (documented in docs/sglang.md): once the window is full, warn when the median
ratio of either estimate leaves ``[1/t, t]`` (``t`` = ``drift_threshold``, default 1.5), or
when its ρ falls more than ``rho_drop`` (default 0.2) below the ρ of the bundle's first full
window (a traffic change can reorder the work, e.g. one category's answers growing, while the
median ratio stays near 1): that is the signal to retrain from the serving traces. The
monitor is pure numpy and keeps no global state; the plugin publishes :meth:`snapshot` as a
JSON file every ``monitor_every`` finished requests.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_json
from ..bundle.modules import monitored
from ..runtime.synthetic import spearman

log = logging.getLogger(__name__)


@dataclass
class QualityMonitor:
    """Sliding-window calibration and rank correlation of each monitored estimate.

    Which estimates: every kind in the kind registry with a ``monitor_label`` (the admission
    estimate and the refined total for the shipped kinds), under that label.
    """

    window: int = 256
    drift_threshold: float = 1.5
    #: flag a ρ this far below the reference ρ (the first full window's); >= 2 turns it off
    rho_drop: float = 0.2
    #: monitor label -> kind (default: every monitored kind in the registry)
    labels: dict[str, str] = field(default_factory=monitored)
    _windows: dict[str, deque] = field(default_factory=dict, repr=False)
    finished: int = 0
    warned: bool = False
    #: label -> the ρ of the live bundle's first full window (None until there is one)
    reference_rho: dict[str, float | None] = field(default_factory=dict)
    #: finished requests a straggler may hold back (pending) before the earliest enter
    #: regardless; 0 = 4 windows
    hold: int = 0
    #: (seq, actual, ((label, predicted), ...)) of finished requests waiting for their
    #: cohort, sorted by seq
    _pending: list[tuple[int, float, tuple[tuple[str, float], ...]]] = field(
        default_factory=list, repr=False
    )

    def __post_init__(self) -> None:
        self._windows = {label: deque() for label in self.labels}
        self.reference_rho = dict.fromkeys(self.labels)
        self._label_of = {kind: label for label, kind in self.labels.items()}

    def record(
        self,
        actual_rounds: float,
        predicted: Mapping[str, float | None],
        seq: int | None = None,
    ) -> None:
        """One finished request: its actual denoising rounds and, per kind, the total rounds
        that kind predicted (None when it made no estimate); unmonitored kinds are ignored.
        ``seq``: its arrival sequence number, to enter the window with its cohort (module
        docstring); None enters it now."""
        self.finished += 1
        if actual_rounds <= 0 or not math.isfinite(actual_rounds):
            return
        pairs = tuple(
            (self._label_of[kind], float(pred))
            for kind, pred in predicted.items()
            if kind in self._label_of and pred is not None and math.isfinite(pred)
        )
        if seq is None:
            self._append(float(actual_rounds), pairs)
            return
        # finishes come nearly in arrival order under FCFS, where the insort is at the end
        bisect.insort(self._pending, (int(seq), float(actual_rounds), pairs))
        excess = len(self._pending) - (self.hold or 4 * self.window)
        if excess > 0:  # a straggler holds the cohort back too long: let the oldest in
            self._release(excess)

    def _append(self, actual: float, pairs: tuple[tuple[str, float], ...]) -> None:
        for label, pred in pairs:
            q = self._windows[label]
            q.append((pred, actual))
            while len(q) > self.window:
                q.popleft()

    def _release(self, count: int) -> None:
        """Move the ``count`` earliest-arrived pending requests into the windows."""
        for _, actual, pairs in self._pending[:count]:
            self._append(actual, pairs)
        del self._pending[:count]

    def release_before(self, oldest_live: int | None) -> None:
        """Every pending request that arrived before ``oldest_live`` (the sequence number of
        the oldest request still live; None: none is) enters the window, in arrival order."""
        if oldest_live is None:
            self._release(len(self._pending))
        else:
            self._release(bisect.bisect_left(self._pending, (int(oldest_live),)))

    def restart(self, pairs: Mapping[str, Sequence[tuple[float, float]]]) -> None:
        """A new bundle went live: every window starts over, the kinds in ``pairs`` from
        those (predicted, actual) pairs (the new bundle's own, scored in shadow), so the
        figures describe the live bundle only; a drift warns again."""
        for q in self._windows.values():
            q.clear()
        self._pending.clear()  # the old bundle's predictions
        for kind, kept in pairs.items():
            label = self._label_of.get(kind)
            if label is not None:
                self._windows[label].extend(list(kept)[-self.window :])
        self.warned = False
        self.reference_rho = dict.fromkeys(self.labels)

    @staticmethod
    def _stats(q: deque) -> dict[str, Any]:
        if not q:
            return {"n": 0, "median_ratio": None, "spearman": None}
        a = np.asarray(q, dtype=np.float64)
        ratio = float(np.median(np.maximum(a[:, 0], 1e-9) / a[:, 1]))
        rho = spearman(a[:, 0], a[:, 1])  # None while undefined (< 3 requests, all tied)
        return {
            "n": len(q),
            "median_ratio": round(ratio, 4),
            "spearman": None if rho is None else round(rho, 4),
        }

    def snapshot(self) -> dict[str, Any]:
        """The monitor's figures now (one entry per label), and which drifted past the
        threshold (``pending``: finished requests waiting for their cohort)."""
        stats = {label: self._stats(q) for label, q in self._windows.items()}
        t = self.drift_threshold
        drifted = []
        for name, s in stats.items():
            if s["n"] < self.window:
                continue
            ref, rho = self.reference_rho.get(name), s["spearman"]
            if ref is None and rho is not None:
                ref = self.reference_rho[name] = rho  # the live bundle's first full window
            fell = ref is not None and rho is not None and rho < ref - self.rho_drop
            ratio = s["median_ratio"]
            if fell or (ratio is not None and not 1.0 / t <= ratio <= t):
                drifted.append(name)
        return {
            "finished": self.finished,
            "window": self.window,
            "drift_threshold": t,
            "reference_rho": dict(self.reference_rho),
            **stats,
            "pending": len(self._pending),
            "drifted": drifted,
        }

    def publish(
        self, path: str | Path | None, snapshot: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Log the figures, warn once on drift, and write them atomically to ``path``.

        ``snapshot`` is one taken earlier (the plugin takes it on the scheduler thread and
        publishes it from a background one); by default, the figures now."""
        snap = self.snapshot() if snapshot is None else snapshot
        log.info(
            "dwise monitor: %s",
            ", ".join(f"{label} {snap[label]}" for label in self.labels if label in snap),
        )
        if snap["drifted"] and not self.warned:
            self.warned = True
            log.warning(
                "dwise monitor: %s estimates drifted (median predicted/actual outside "
                "[%.2f, %.2f], or ρ more than %g below the first window's, over the last %d "
                "requests): retrain the bundle from the serving traces (docs/refresh.md)",
                " and ".join(snap["drifted"]),
                1.0 / self.drift_threshold,
                self.drift_threshold,
                self.rho_drop,
                self.window,
            )
        if path is not None:
            write_json(Path(path), snap)
        return snap
