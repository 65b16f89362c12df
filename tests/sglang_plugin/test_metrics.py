"""The quality monitor as Prometheus gauges (SGLang's ``--enable-metrics``), with the real
``prometheus_client`` and SGLang's real scheduler serving tiny-bd on CPU."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from harness import (
    TinyBDRunner,
    environ,
    eval_requests,
    make_scheduler,
    plugin_env,
    serve,
)
from prometheus_client import CollectorRegistry

from dwise_predict.sglang import plugin
from dwise_predict.sglang.config import load_config
from dwise_predict.sglang.metrics import MonitorGauges, gauges_for
from dwise_predict.sglang.monitor import QualityMonitor

LABELS = {"model_name": "tiny-bd"}


def _value(registry, name, estimate=None):
    labels = {**LABELS, **({"estimate": estimate} if estimate else {})}
    return registry.get_sample_value(name, labels)


def test_gauges_carry_the_snapshot_and_flag_drift():
    monitor = QualityMonitor(window=8, drift_threshold=1.5)
    for actual in range(10, 20):  # admission twice the truth: drifted; refinement spot on
        monitor.record(float(actual), {"admission": 2.0 * actual, "refinement": float(actual)})
    monitor.record(5.0, {"admission": 10.0, "refinement": None})
    registry = CollectorRegistry()
    MonitorGauges(LABELS, registry).set(monitor.snapshot())
    assert _value(registry, "dwise:monitor_finished") == 11
    assert _value(registry, "dwise:estimate_median_ratio", "admission") == 2.0
    assert _value(registry, "dwise:estimate_median_ratio", "refinement") == 1.0
    assert _value(registry, "dwise:estimate_spearman", "refinement") == 1.0
    assert _value(registry, "dwise:estimate_window", "admission") == 8
    assert _value(registry, "dwise:estimate_drifted", "admission") == 1.0
    assert _value(registry, "dwise:estimate_drifted", "refinement") == 0.0

    empty = CollectorRegistry()  # undefined figures are gaps (NaN), not zeros
    MonitorGauges(LABELS, empty).set(QualityMonitor(window=8).snapshot())
    assert math.isnan(_value(empty, "dwise:estimate_median_ratio", "admission"))
    assert math.isnan(_value(empty, "dwise:estimate_spearman", "refinement"))


def test_no_gauges_unless_sglang_exports_metrics():
    s = make_scheduler(max_running_requests=4)
    s.metrics_reporter = SimpleNamespace(enable_metrics=False)
    assert gauges_for(s, CollectorRegistry()) is None
    # a reporter without the flag is an SGLang the plugin does not know: no silent default
    s.metrics_reporter = SimpleNamespace()
    with pytest.raises(AttributeError, match="enable_metrics"):
        gauges_for(s, CollectorRegistry())


def test_served_requests_reach_the_gauges(monkeypatch, tmp_path):
    """The plugin, loaded by SGLang, exports what it writes to the monitor file."""
    from sglang.srt.plugins import load_plugins

    registry = CollectorRegistry()
    monkeypatch.setattr(plugin, "gauges_for", lambda s: gauges_for(s, registry))

    def on_scheduler(s):
        # SGLang's metrics reporter needs a running server; the CPU harness gives the scheduler
        # a stub. At start-up the plugin reads two attributes of it, set here for the attach
        # only: the --enable-metrics flag and the scheduler's metric labels
        reporter = s.metrics_reporter
        reporter.enable_metrics = True
        reporter.metrics_collector = SimpleNamespace(labels=LABELS)
        plugin.attach(s, load_config())
        reporter.enable_metrics = False

    runner = TinyBDRunner()
    reqs = eval_requests(4, runner, max_new_tokens=32, max_prompt_tokens=120)
    monitor_file = tmp_path / "monitor.json"
    env = plugin_env("tiny-bd", slots=2, k=2, monitor_every=2, monitor_file=monitor_file)
    with environ({**env, "SGLANG_PLUGINS": None}):
        load_plugins()
        res, _ = serve(reqs, max_running_requests=4, runner=runner, on_scheduler=on_scheduler)
    assert len(res.completion_round) == 4
    snap = json.loads(monitor_file.read_text())
    assert _value(registry, "dwise:monitor_finished") == snap["finished"] == 4
    for name in ("admission", "refinement"):
        assert _value(registry, "dwise:estimate_window", name) == snap[name]["n"] == 4
        assert _value(registry, "dwise:estimate_median_ratio", name) == pytest.approx(
            snap[name]["median_ratio"]
        )
