"""The quality monitor's window under a size-based policy: whole arrival cohorts, not finishers.

Requests are served by the simulator (paper-matched synthetic workload, B = 16) and reported
to the monitor in the order they finish, as the plugin reports them.
"""

from __future__ import annotations

import numpy as np
import pytest

from dwise_predict.runtime import make_policy, simulate, synthetic_workload
from dwise_predict.sglang.monitor import QualityMonitor


def _finish_order(policy: str, arrivals: str, n: int = 512) -> tuple[np.ndarray, ...]:
    w = synthetic_workload("paper-llada2.1-mini", n=n, seed=0)
    run = simulate(w, make_policy(policy), arrivals=arrivals, slots=16, k=8)
    order = np.argsort(run.finish_time, kind="stable")
    # arrival sequence = the order requests reached the server (ties: workload order)
    seq = np.empty(w.n, dtype=np.int64)
    seq[np.argsort(run.arrival_time, kind="stable")] = np.arange(w.n)
    return order, seq, w.total_rounds.astype(float), w.admission


def _feed(order, seq, actual, predicted, *, cohorts: bool, hold: int = 0, every: int = 64):
    """Report finishes as the plugin does; the first drift the monitor flags, and its end."""
    m = QualityMonitor(window=256, hold=hold)
    live = set(seq.tolist())
    first = None
    for i, j in enumerate(order):
        m.record(
            actual[j], {"admission": float(predicted[j])}, seq=int(seq[j]) if cohorts else None
        )
        live.discard(int(seq[j]))
        if (i + 1) % every == 0:
            m.release_before(min(live, default=None))
            snap = m.snapshot()
            if snap["drifted"] and first is None:
                first = (i + 1, snap["admission"]["spearman"], snap["reference_rho"]["admission"])
    return first, m.snapshot()


def test_srpt_finish_order_no_longer_raises_a_false_drift():
    order, seq, actual, est = _finish_order("dwise-uncapped", "burst")
    # by finishers, the window is a slice of the estimate range: its rho swings and trips
    # the rule on the bundle's own traffic
    first, _ = _feed(order, seq, actual, est, cohorts=False)
    assert first is not None and first[1] < first[2] - 0.2
    # by whole arrival cohorts the same run is quiet, and the window's figures are the
    # traffic's own: the same as FCFS's finish order gives
    quiet, snap = _feed(order, seq, actual, est, cohorts=True)
    assert quiet is None and snap["drifted"] == [] and snap["pending"] == 0
    f_order, f_seq, _, _ = _finish_order("fcfs-mixed", "burst")
    _, fcfs = _feed(f_order, f_seq, actual, est, cohorts=True)
    assert snap["admission"] == fcfs["admission"]
    assert snap["admission"]["spearman"] > 0.7  # the estimates' real rank quality


@pytest.mark.parametrize("drift", ["scale", "order"])
@pytest.mark.parametrize(
    ("arrivals", "hold", "by"), [("poisson:5", 0, 640), ("poisson:10", 256, 896)]
)
def test_cohorts_still_flag_real_drift_under_the_default_policy(drift, arrivals, hold, by):
    # the traffic changes after the first 512 of 1,024 arrivals: the estimates of the later
    # ones lose their scale (x 2.5) or their order (shuffled among themselves). At 5
    # requests/s the server keeps up; at 10 it is overloaded, where a straggler would hold the
    # cohort back: a hold of one window lets the earliest pending requests in after it
    order, seq, actual, est = _finish_order("dwise", arrivals, n=1024)
    late = seq >= 512
    predicted = est.copy()
    if drift == "scale":
        predicted[late] *= 2.5
    else:
        predicted[late] = np.random.default_rng(0).permutation(est[late])
    quiet, _ = _feed(order, seq, actual, est, cohorts=True, hold=hold)
    assert quiet is None  # the same run without the change
    first, snap = _feed(order, seq, actual, predicted, cohorts=True, hold=hold)
    assert first is not None and first[0] <= by and snap["drifted"] == ["admission"]
    if drift == "scale":
        assert snap["admission"]["median_ratio"] > 1.5
    else:
        assert snap["admission"]["spearman"] < snap["reference_rho"]["admission"] - 0.2


def test_a_straggler_holds_the_window_back_only_so_long():
    m = QualityMonitor(window=8, hold=16)
    # request 0 never finishes; 1..40 finish in order, each predicted exactly
    for s in range(1, 41):
        m.record(float(s), {"admission": float(s)}, seq=s)
        m.release_before(0)
    snap = m.snapshot()
    assert snap["pending"] == 16  # the rest went in, earliest first
    assert snap["admission"]["n"] == 8 and snap["admission"]["median_ratio"] == 1.0
    m.release_before(None)  # nothing live: every pending request enters, in arrival order
    assert m.snapshot()["pending"] == 0
    assert [a for _, a in m._windows["admission"]] == [float(s) for s in range(33, 41)]
