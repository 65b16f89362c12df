"""Hot swap's SGLang-free parts: the monitor's ρ drift rule and its restart at a swap, the core
scheduler re-estimating its waiting queue, the settings. The swap itself, in SGLang's loop, is
tests/sglang_plugin/test_lifecycle.py."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

from dwise_predict.errors import ConfigError, SchedulerError
from dwise_predict.runtime import Scheduler
from dwise_predict.runtime.registry import make_policy
from dwise_predict.sglang.config import load_config
from dwise_predict.sglang.monitor import QualityMonitor
from dwise_predict.sglang.watcher import LOAD_SWITCH_INTERVAL, throttled


def _work(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(5, 200, size=n).astype(float)


def test_a_falling_rho_flags_drift_while_the_median_ratio_stays_near_one():
    m = QualityMonitor(window=64, drift_threshold=1.5, rho_drop=0.2)
    for a in _work(64, 0):  # the bundle's own traffic: good order, right scale
        m.record(a, {"admission": a * 1.05, "refinement": None})
    first = m.snapshot()
    assert first["drifted"] == [] and first["reference_rho"]["admission"] == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    actual = _work(64, 2)
    for a, p in zip(actual, rng.permutation(actual)):  # same scale, order lost
        m.record(a, {"admission": p, "refinement": None})
    snap = m.snapshot()
    assert 0.67 < snap["admission"]["median_ratio"] < 1.5
    assert snap["admission"]["spearman"] < 0.8 and snap["drifted"] == ["admission"]
    off = QualityMonitor(window=64, rho_drop=2.0)  # the ρ rule off
    for a in _work(64, 0):
        off.record(a, {"admission": a})
    off.snapshot()
    for a, p in zip(actual, rng.permutation(actual)):
        off.record(a, {"admission": p})
    assert off.snapshot()["drifted"] == []


def test_restart_keeps_only_the_new_bundles_pairs_and_a_new_reference():
    m = QualityMonitor(window=8)
    for a in range(10, 18):
        m.record(float(a), {"admission": 3.0 * a, "refinement": float(a)})
    m.snapshot()
    m.warned = True
    m.restart({"admission": [(float(a), float(a)) for a in range(1, 12)]})
    snap = m.snapshot()
    assert snap["admission"]["n"] == 8 and snap["admission"]["median_ratio"] == 1.0
    assert snap["refinement"]["n"] == 0 and not m.warned
    assert snap["reference_rho"]["admission"] == 1.0  # the new bundle's first full window


def test_the_core_re_estimates_waiting_requests_only():
    core = Scheduler(make_policy("dwise-uncapped"), slots=1, k=1, kv_pool_tokens=1 << 16)
    for i in range(3):
        core.add_request(f"r{i}", 1, 10.0, prompt_tokens=40, output_budget=64, block_size=32)
    plan = core.plan_round()  # admits one: it is resident now
    resident = int(plan.admitted[0])
    rows = np.array([core.row_of(f"r{i}") for i in range(3)])
    changed = core.set_estimates(rows, np.array([50.0, 60.0, 70.0]))
    assert changed == 2
    t = core.table
    waiting = [r for r in rows.tolist() if r != resident]
    assert t.r_hat_arrival[resident] == 10.0
    assert sorted(t.r_hat_arrival[waiting].tolist()) == sorted(
        v for r, v in zip(rows.tolist(), (50.0, 60.0, 70.0)) if r != resident
    )
    with pytest.raises(SchedulerError, match="finite"):
        core.set_estimates(rows[:1], np.array([np.nan]))


def test_hot_swap_settings_parse_and_refuse():
    env = {
        "DWISE_SGLANG_BUNDLE": "tiny-bd",
        "DWISE_SGLANG_WATCH_SECONDS": "30",
        "DWISE_SGLANG_SHADOW_REQUESTS": "64",
        "DWISE_SGLANG_PROMOTE_MARGIN": "0.05",
        "DWISE_SGLANG_ROLLBACK_DROP": "0.2",
        "DWISE_SGLANG_DRIFT_RHO_DROP": "0.3",
    }
    cfg = load_config(env)
    assert cfg is not None and cfg.watch_seconds == 30.0 and cfg.drift_rho_drop == 0.3
    rule = cfg.promotion_rule()
    assert (rule.shadow_requests, rule.margin, rule.rollback_drop) == (64, 0.05, 0.2)
    assert load_config({"DWISE_SGLANG_BUNDLE": "tiny-bd"}).watch_seconds == 0.0  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="SHADOW_REQUESTS"):
        load_config({**env, "DWISE_SGLANG_SHADOW_REQUESTS": "3"})
    with pytest.raises(ConfigError, match="DRIFT_RHO_DROP"):
        load_config({**env, "DWISE_SGLANG_DRIFT_RHO_DROP": "-1"})
    with pytest.raises(ConfigError, match="ADMISSION=lightgbm"):
        load_config({**env, "DWISE_SGLANG_ADMISSION": "lightgbm+dws"})


def _spin(seconds: float) -> int:
    """Pure-Python work (function calls, so the profile hook sees it) for ``seconds`` of wall
    time; returns the iterations done."""

    def step(i: int) -> int:
        return i + 1

    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        n = step(n)
    return n


def test_a_throttled_load_leaves_the_interpreter_to_other_threads_and_restores_it():
    """The watcher loads a revision under ``throttled``: its thread runs at most busy/(busy +
    pause) of the time (here a quarter; pure-Python work alone on a thread runs all of it),
    sleeping with the GIL released the rest; on exit the trace function is the one before and
    the switch interval is the interpreter's again."""
    interval = sys.getswitchinterval()
    seen: dict[str, float] = {}

    def load() -> None:
        before = sys.gettrace()  # None, or a coverage tool's tracer
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        with throttled(busy=0.001, pause=0.003):
            seen["inside"] = sys.getswitchinterval()
            _spin(0.3)
        seen["cpu_share"] = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
        seen["hook_after"] = float(sys.gettrace() is not before)

    loader = threading.Thread(target=load)
    loader.start()
    loader.join()
    assert seen["cpu_share"] < 0.5
    assert seen["inside"] == pytest.approx(min(interval, LOAD_SWITCH_INTERVAL))
    assert sys.getswitchinterval() == interval and seen["hook_after"] == 0.0


def test_a_throttled_body_that_raises_restores_the_interpreter():
    interval, before = sys.getswitchinterval(), sys.gettrace()
    with pytest.raises(ValueError, match="bad revision"), throttled():
        raise ValueError("bad revision")
    assert sys.getswitchinterval() == interval and sys.gettrace() is before
