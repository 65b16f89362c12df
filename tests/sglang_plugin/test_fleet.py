"""The fleet in SGLang: the outstanding-work gauges and report, and the ``dwise`` method of SGLang's
real data-parallel controller code, with its fallback to SGLang's method (``fleet_harness``)."""

from __future__ import annotations

import logging
import math
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
from fleet_harness import (
    equip_publisher,
    make_controller,
    publish,
    remove_shm,
    run_fleet,
    tokenized,
)
from harness import CpuServer, TinyBDRunner, environ, eval_requests, plugin_env
from prometheus_client import CollectorRegistry

from dwise_predict.runtime.fleet import WorkHistogram
from dwise_predict.sglang import dispatch, load
from dwise_predict.sglang.config import load_config
from dwise_predict.sglang.plugin import attach

LABELS = {"model_name": "tiny-bd"}


@pytest.fixture(scope="module")
def runner():
    return TinyBDRunner(memo=True)


def _plugin(settings):
    from sglang.srt.plugins import load_plugins

    env = {**plugin_env("tiny-bd", slots=2, k=2, **settings), "SGLANG_PLUGINS": None}
    return env, load_plugins


def test_outstanding_work_is_exported_under_metrics_and_reported(monkeypatch, runner):
    registry = CollectorRegistry()
    made = load.work_gauges_for
    monkeypatch.setattr(load, "work_gauges_for", lambda s: made(s, registry))
    reqs = eval_requests(6, runner, max_new_tokens=64, max_prompt_tokens=200)
    env, load_plugins = _plugin({})
    instance = "gauge-" + uuid.uuid4().hex[:8]
    with environ(env):
        load_plugins()
        config = load_config()
        with CpuServer(
            max_running_requests=4, runner=runner, on_scheduler=lambda s: attach(s, config)
        ) as srv:
            equip_publisher(srv, instance, 1, 0)
            for spec in reqs:
                srv.submit(spec)
            srv.step()  # the plugin prices arrivals when it composes a round
            # SGLang started with --enable-metrics: its reporter's flag and labels, read when
            # the plugin publishes for the first time (the stub reporter has neither otherwise)
            reporter = srv.scheduler.metrics_reporter
            reporter.enable_metrics = True
            reporter.metrics_collector = SimpleNamespace(labels=LABELS)
            publish(srv, 0)
            reporter.enable_metrics = False
            core = srv.scheduler.dwise_serving.core
            start = registry.get_sample_value("dwise_outstanding_work_rounds", LABELS)
            assert start == pytest.approx(core.recount()[0]) and start > 6
            for _ in range(25):
                srv.step()
            load_ = publish(srv, 0)
            rounds = registry.get_sample_value("dwise_outstanding_work_rounds", LABELS)
            seconds = registry.get_sample_value("dwise_outstanding_work_seconds", LABELS)
            assert rounds > 0 and rounds != start  # blocks done, estimates refined
            assert rounds == pytest.approx(core.recount()[0])
            assert seconds == pytest.approx(core.recount()[1]) and seconds > 0  # tiny-bd's profile
            # the same figures beside SGLang's snapshot, with its timestamp, for the controller
            from sglang.srt.managers.load_snapshot import shm_path_for

            report = load.ReportReader(load.report_path(shm_path_for(instance)), 1).read(0)
            assert report is not None
            assert (report.work_rounds, report.timestamp) == (rounds, load_.timestamp)
            assert report.requests == core.table.live_rows > 0
            # and how that work is spread over the requests: what the dwise method ranks by
            assert report.work_hist is not None
            assert report.work_hist.counts.sum() == report.requests
            assert report.work_hist.sums.sum() == pytest.approx(rounds)
            while any(not r.finished() for r in srv.reqs.values()):
                srv.step()
            srv.drain()
            publish(srv, 0)
            assert registry.get_sample_value("dwise_outstanding_work_rounds", LABELS) == 0.0
        remove_shm(instance)


def test_the_dwise_method_sends_to_least_work_and_falls_back_while_a_report_is_missing(
    caplog, runner
):
    """SGLang's controller (started with total_requests) under the plugin's method: requests
    go by predicted work while every rank reports, by SGLang's method while one does not."""
    reqs = eval_requests(4, runner, max_new_tokens=32, max_prompt_tokens=200)
    env, load_plugins = _plugin({"dispatch": "dwise"})
    instance = "ctl-" + uuid.uuid4().hex[:8]
    with environ(env):
        load_plugins()  # hooks DataParallelController.__init__ and .refresh_load_budget
        from sglang.srt.managers.data_parallel_controller import DataParallelController
        from sglang.srt.managers.io_struct import BatchTokenizedGenerateReqInput
        from sglang.srt.managers.load_snapshot import shm_path_for

        assert hasattr(DataParallelController.refresh_load_budget, "__wrapped__")
        controller = make_controller(3, "total_requests", instance)
        wd = dispatch.install(controller, load_config())  # what the __init__ hook runs
        assert wd.dispatcher.tolerance == load_config().dispatch_tolerance
        writers = [
            load.ReportWriter(load.report_path(shm_path_for(instance)), 3, r) for r in (0, 1)
        ]

        def send(spec, **kw):
            controller._last_refresh_time = 0.0
            tok = tokenized(spec)
            for k, v in kw.items():
                setattr(tok, k, v)
            controller.dispatch_batch_generate(BatchTokenizedGenerateReqInput(batch=[tok]))
            return [r for r, w in enumerate(controller.workers) if w.take()]

        def hist(work):
            return WorkHistogram.of(np.asarray(work, dtype=float))

        now = time.time()
        writers[0].write(now, 400.0, math.nan, 9, hist([400.0 / 9] * 9))
        writers[1].write(now, 10.0, math.nan, 2, hist([5.0, 5.0]))  # rank 2 has not reported
        with caplog.at_level(logging.INFO):
            got = [send(s) for s in reqs[:2]]
        # SGLang's total_requests over its own (empty) budget: rank 0, then rank 1
        assert got == [[0], [1]] and wd.fallbacks == 2 and wd.dispatched == 0
        assert "DP rank(s) [2]" in caplog.text and "total_requests" in caplog.text
        rank2 = load.ReportWriter(load.report_path(shm_path_for(instance)), 3, 2)
        rank2.write(now, 60.0, math.nan, 3, hist([20.0] * 3))
        own, tokens = wd.own_work(tokenized(reqs[2]))
        assert own > tokens // 32 and tokens == len(reqs[2].input_ids)
        # where it adds least under SRPT: behind 10 rounds, against min(60, 3 x own) on rank 2
        # and 9 x own (or 400) on rank 0
        assert own > 10 / 3 and send(reqs[2]) == [1]
        assert wd.dispatched == 1 and wd.refreshes >= 1
        # the request's own estimate now sits on rank 1 until its next report
        assert wd.dispatcher._work[1] == pytest.approx(10.0 + own)
        assert send(reqs[3], routed_dp_rank=0) == [0]  # a pinned request goes where it says
        assert wd.dispatched == 1
        # a busy rank whose report went stale is missing again: SGLang's method
        rank2.write(now - 60.0, 60.0, math.nan, 3)
        assert len(send(reqs[0])) == 1 and wd.fallbacks == 3
        # an idle rank's old report stays valid (an idle scheduler publishes only on change)
        rank2.write(now - 59.0, 0.0, math.nan, 0)
        assert send(reqs[1]) == [2] and wd.dispatched == 2

        # a request the bundle cannot price goes by SGLang's method; the controller keeps going
        def broken(x):
            raise RuntimeError("no estimate")

        wd.bundle = SimpleNamespace(predict_admission_prompt=lambda text, n: broken((n,)))
        with caplog.at_level(logging.ERROR):
            assert len(send(reqs[2])) == 1
        assert wd.failed == 1 and wd.dispatched == 2 and "no estimate" in caplog.text
        for w in (*writers, rank2):
            w.close()
        remove_shm(instance)


def test_a_fleet_behind_the_controller_serves_everything(caplog, runner):
    """Three real schedulers behind SGLang's controller code: by work while all report, by
    SGLang's round robin for every request while rank 2 is silent; nothing leaks."""
    reqs = eval_requests(10, runner, max_new_tokens=48, max_prompt_tokens=200)
    arrive = [i // 3 for i in range(len(reqs))]
    env, load_plugins = _plugin({"dispatch": "dwise"})
    with environ(env):
        load_plugins()
        config = load_config()
        runs = {}
        for silent in ((), (2,)):
            res = run_fleet(
                reqs,
                arrive,
                dp_size=3,
                method="round_robin",
                runner=runner,
                max_running_requests=4,
                on_scheduler=lambda s: attach(s, config),
                make_dispatch=lambda c, _: dispatch.install(c, config),
                silent=silent,
            )
            runs[silent] = res.summary(3)
    for s in runs.values():
        assert s["finished"] == s["requests"] == 10
        assert s["kv_leaked_tokens"] == 0 and s["req_slots_leaked"] == 0
    assert runs[()]["dispatched_by_work"] == 10 and runs[()]["fallbacks"] == 0
    assert runs[(2,)]["fallbacks"] == 10 and runs[(2,)]["dispatched_by_work"] == 0
    assert runs[(2,)]["requests_per_replica"] == [4, 3, 3]  # SGLang's round robin


def test_the_dispatch_setting_is_checked():
    from dwise_predict.errors import ConfigError

    with pytest.raises(ConfigError, match="DWISE_SGLANG_DISPATCH"):
        load_config(plugin_env("tiny-bd", dispatch="least-loaded"))
    with pytest.raises(ConfigError, match="DISPATCH_STALE_S"):
        load_config(plugin_env("tiny-bd", dispatch="dwise", dispatch_stale_s=0))
    with pytest.raises(ConfigError, match="DISPATCH_TOLERANCE"):
        load_config(plugin_env("tiny-bd", dispatch="dwise", dispatch_tolerance=-0.5))
    assert load_config(plugin_env("tiny-bd")).dispatch == "sglang"
    assert load_config(plugin_env("tiny-bd")).dispatch_tolerance == 0.2
    assert load_config(plugin_env("tiny-bd", dispatch_tolerance=0)).dispatch_tolerance == 0.0
