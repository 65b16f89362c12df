"""The quality monitor's figures as Prometheus gauges, beside SGLang's own scheduler metrics.

SGLang serves ``/metrics`` when started with ``--enable-metrics``: each scheduler process sets
``prometheus_client`` gauges (in multiprocess mode, one file per process under
``PROMETHEUS_MULTIPROC_DIR``) and the HTTP server collects them. The plugin adds its gauges the
same way, with SGLang's labels (``model_name`` and the rest), so a dashboard that already
scrapes SGLang sees the monitor next to the queue lengths:

================================  ==========================================================
``dwise:monitor_finished``        finished requests the monitor has seen
``dwise:estimate_median_ratio``   median predicted/actual over the window, per ``estimate``
``dwise:estimate_spearman``       Spearman ρ of predicted vs actual rounds, per ``estimate``
``dwise:estimate_window``         requests in the window, per ``estimate``
``dwise:estimate_drifted``        1 when the monitor's drift rule fired (retrain), else 0
================================  ==========================================================

With hot swap on (``DWISE_SGLANG_WATCH_SECONDS``, docs/refresh.md), :class:`LifecycleGauges`:

================================  ==========================================================
``dwise:bundle_revision``         manifest revision of the ``live`` / ``shadow`` bundle
``dwise:bundle_events``           revisions per ``event``: loaded, refused, promoted, ...
``dwise:shadow_requests``         finished requests both bundles estimated (this trial)
``dwise:shadow_median_ratio``     their median predicted/actual, per ``bundle`` live/shadow
``dwise:shadow_spearman``         their Spearman ρ, per ``bundle`` live/shadow
================================  ==========================================================

``estimate`` is a kind's ``monitor_label`` in the kind registry (``admission`` or
``refinement`` for the shipped kinds). A figure that is undefined (an empty window,
a ρ over tied values) is exported as NaN, which Prometheus shows as a gap, not as a zero.
Without ``--enable-metrics`` (or without ``prometheus_client``) the plugin only logs and
writes the monitor's JSON file, as before.
"""

from __future__ import annotations

import logging
from typing import Any

from ..bundle.modules import monitored
from . import seam

log = logging.getLogger(__name__)


class MonitorGauges:
    """Gauges for :meth:`QualityMonitor.snapshot`, created once per scheduler process.

    ``registry`` defaults to ``prometheus_client``'s global one, which SGLang's ``/metrics``
    endpoint collects; tests pass their own.
    """

    def __init__(self, labels: dict[str, str], registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Gauge

        self.labels = {str(k): str(v) for k, v in labels.items()}
        names = list(self.labels)
        kw: dict[str, Any] = {
            "registry": REGISTRY if registry is None else registry,
            "multiprocess_mode": "mostrecent",  # SGLang's choice for its scheduler gauges
        }
        self.finished = Gauge(
            "dwise:monitor_finished", "finished requests seen by the dwise monitor", names, **kw
        )
        per = [*names, "estimate"]
        self.median_ratio = Gauge(
            "dwise:estimate_median_ratio", "median predicted/actual rounds (window)", per, **kw
        )
        self.spearman = Gauge(
            "dwise:estimate_spearman", "Spearman rho, predicted vs actual (window)", per, **kw
        )
        self.window = Gauge("dwise:estimate_window", "requests in the monitor window", per, **kw)
        self.drifted = Gauge(
            "dwise:estimate_drifted", "1 when the median ratio drifted: retrain", per, **kw
        )

    def set(self, snapshot: dict[str, Any]) -> None:
        """Export one snapshot (the dict :meth:`QualityMonitor.snapshot` returns)."""
        self.finished.labels(**self.labels).set(snapshot["finished"])
        for name in monitored():
            fig = snapshot.get(name)
            if fig is None:  # a snapshot of a monitor that does not track this label
                continue
            lab = {**self.labels, "estimate": name}
            self.median_ratio.labels(**lab).set(_value(fig["median_ratio"]))
            self.spearman.labels(**lab).set(_value(fig["spearman"]))
            self.window.labels(**lab).set(fig["n"])
            self.drifted.labels(**lab).set(1.0 if name in snapshot["drifted"] else 0.0)


def _value(x: float | None) -> float:
    return float("nan") if x is None else float(x)


def exported_labels(scheduler: Any, *, missing: str | None = None) -> dict[str, str] | None:
    """SGLang's metric labels when this scheduler exports metrics (``--enable-metrics``) and
    prometheus_client (SGLang's own metrics dependency) imports, else None; ``missing`` is
    logged as a warning when metrics are on but prometheus_client is not there."""
    labels = seam.metrics_labels(scheduler)
    if labels is None:
        return None
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        if missing is not None:
            log.warning("--enable-metrics is on but prometheus_client is missing: %s", missing)
        return None
    return labels


def gauges_for(scheduler: Any, registry: Any = None) -> MonitorGauges | None:
    """Gauges when this SGLang scheduler exports metrics (``--enable-metrics``), else None."""
    labels = exported_labels(
        scheduler, missing="the dwise monitor writes only its log lines and JSON file"
    )
    return None if labels is None else MonitorGauges(labels, registry)


class LifecycleGauges:
    """Gauges for :meth:`~.lifecycle.BundleLifecycle.snapshot` (hot swap's figures)."""

    def __init__(self, labels: dict[str, str], registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Gauge

        self.labels = {str(k): str(v) for k, v in labels.items()}
        names = list(self.labels)
        kw: dict[str, Any] = {
            "registry": REGISTRY if registry is None else registry,
            "multiprocess_mode": "mostrecent",
        }
        self.revision = Gauge(
            "dwise:bundle_revision", "manifest revision, live or shadow", [*names, "role"], **kw
        )
        self.events = Gauge(
            "dwise:bundle_events", "bundle revisions per lifecycle event", [*names, "event"], **kw
        )
        self.paired = Gauge(
            "dwise:shadow_requests", "finished requests both bundles estimated", names, **kw
        )
        per = [*names, "bundle"]
        self.median_ratio = Gauge(
            "dwise:shadow_median_ratio", "median predicted/actual in the shadow trial", per, **kw
        )
        self.spearman = Gauge(
            "dwise:shadow_spearman", "Spearman rho in the shadow trial", per, **kw
        )

    def set(self, snapshot: dict[str, Any]) -> None:
        """Export one :meth:`BundleLifecycle.snapshot`."""
        lab = self.labels
        self.revision.labels(**lab, role="live").set(_value(snapshot["live_revision"]))
        self.revision.labels(**lab, role="shadow").set(_value(snapshot["shadow_revision"]))
        for event, count in snapshot["events"].items():
            self.events.labels(**lab, event=event).set(count)
        self.paired.labels(**lab).set(snapshot["paired"])
        for side in ("live", "shadow"):
            fig = snapshot[f"{side}_figures"]
            self.median_ratio.labels(**lab, bundle=side).set(_value(fig["median_ratio"]))
            self.spearman.labels(**lab, bundle=side).set(_value(fig["spearman"]))


def lifecycle_gauges_for(scheduler: Any, registry: Any = None) -> LifecycleGauges | None:
    """Hot swap's gauges when this scheduler exports metrics, else None."""
    labels = exported_labels(scheduler)
    return None if labels is None else LifecycleGauges(labels, registry)
