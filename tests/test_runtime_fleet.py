"""The fleet: load snapshots, the dispatcher's methods and fallback, and the lockstep replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dwise_predict.errors import ConfigError
from dwise_predict.runtime import make_policy, simulate, synthetic_workload
from dwise_predict.runtime.fleet import (
    DISPATCH_METHODS,
    WORK_EDGES,
    Dispatcher,
    ReplicaLoad,
    WorkHistogram,
    replica_load,
    simulate_fleet,
)
from dwise_predict.runtime.roundtime import RoundTimeModel
from dwise_predict.runtime.scheduler import Scheduler


def _load(r: int, requests: int, tokens: int, work: float, t: float = 0.0) -> ReplicaLoad:
    return ReplicaLoad(r, requests, tokens, work, true_work_rounds=work, timestamp=t)


def test_each_method_picks_its_least_loaded_replica_and_counts_the_dispatch():
    loads = [_load(0, 1, 900, 500.0), _load(1, 5, 100, 40.0), _load(2, 3, 300, 10.0)]
    picks = {}
    for m in DISPATCH_METHODS:
        d = Dispatcher(3, m)
        d.update(loads)
        picks[m] = d.choose(work_rounds=100.0, tokens=50)
    assert picks == {
        "round_robin": 0,
        "total_requests": 0,
        "total_tokens": 1,
        "dwise": 2,
        "oracle": 2,
    }
    # between snapshots the dispatcher counts its own choices: 100 rounds now sit on replica 2
    d = Dispatcher(3, "dwise")
    d.update(loads)
    assert [d.choose(work_rounds=100.0) for _ in range(3)] == [2, 1, 2]
    d.update(loads)  # the same snapshots read again: the three dispatches stay counted
    assert d.choose(work_rounds=100.0) == 1
    d.update([_load(2, 3, 300, 10.0, t=1.0)])  # replica 2 reports anew: its bumps are replaced
    assert d.choose(work_rounds=100.0) == 2


def _hist_load(r: int, work: list[float], t: float = 0.0) -> ReplicaLoad:
    hist = WorkHistogram.of(np.asarray(work))
    return ReplicaLoad(
        r,
        len(work),
        0,
        float(sum(work)),
        true_work_rounds=float(sum(work)),
        timestamp=t,
        work_hist=hist,
        true_work_hist=hist,
    )


def test_the_histogram_splits_work_at_an_arrival_as_srpt_would():
    h = WorkHistogram.of(np.array([3.0, 3.0, 50.0, 1000.0, 0.0, -2.0]))  # -2 counts as 0
    assert h.counts.sum() == 6 and h.sums.sum() == pytest.approx(1056.0)
    # 20 rounds: shorter 0, 0, 3, 3 (6 rounds ahead), longer 50 and 1000
    assert h.ahead_longer(20.0) == (pytest.approx(6.0), pytest.approx(2.0))
    assert h.ahead_longer(1e6) == (pytest.approx(1056.0), pytest.approx(0.0))
    # nothing is shorter than no work (the two of 0 share its bucket, split at its low edge)
    assert h.ahead_longer(0.0) == (0.0, pytest.approx(6.0))
    # inside a bucket the split is linear: 50 sits in [2^5.5, 2^5.75) = [45.25, 53.82)
    lo, hi = 2.0**5.5, 2.0**5.75
    ahead, longer = h.ahead_longer(50.0)
    share = (50.0 - lo) / (hi - lo)
    assert ahead == pytest.approx(6.0 + 50.0 * share) and longer == pytest.approx(2 - share)
    assert h.added(20.0).ahead_longer(30.0) == (pytest.approx(26.0), pytest.approx(2.0))
    assert len(WORK_EDGES) == h.counts.size
    with pytest.raises(ConfigError, match="buckets"):
        WorkHistogram(np.zeros(3), np.zeros(3))


def test_dwise_sends_a_request_where_srpt_adds_least_to_the_completion_times():
    """Replica 0 holds one long request (1,000 rounds), replica 1 four of 50 (200 in all).
    Least outstanding work sends everything to replica 1; under SRPT a short arrival waits
    for nothing on replica 0 and delays one request there, against four on replica 1; a very
    long one waits behind 1,000 rounds on replica 0 and 200 on replica 1."""
    loads = [_hist_load(0, [1000.0]), _hist_load(1, [50.0] * 4)]
    for method in ("dwise", "oracle"):
        picks = []
        for own in (10.0, 100.0, 2000.0):
            d = Dispatcher(2, method)
            d.update(loads)
            picks.append(d.choose(work_rounds=own))
        assert picks == [0, 0, 1]
    # a report without a histogram (another version's): least outstanding work, as before
    d = Dispatcher(2, "dwise")
    d.update([_load(0, 1, 0, 1000.0), _hist_load(1, [50.0] * 4)])
    assert d.choose(work_rounds=10.0) == 1
    # dispatches between reports land in the histogram: each 10-round request sent to replica
    # 0 adds 10 to what the next one costs there (ahead of it or behind it); replica 1 costs
    # 40 throughout. Always the least (tolerance 0): a tie after four, broken to replica 0
    # (as many requests), then replica 1
    d = Dispatcher(2, "dwise", tolerance=0.0)
    d.update(loads)
    assert [d.choose(work_rounds=10.0) for _ in range(5)] == [0, 0, 0, 0, 1]
    # the default takes turns once replica 1 is within 20% of the least: 40 <= 1.2 x 40
    # at the fourth, when replica 0 costs 40 too
    d = Dispatcher(2, "dwise")
    d.update(loads)
    assert [d.choose(work_rounds=10.0) for _ in range(5)] == [0, 0, 0, 1, 0]


def test_dwise_takes_the_near_best_replicas_in_turn():
    """Replicas 0-2 hold 10 rounds of short work each, replica 3 holds 200: a 100-round
    arrival costs 10 on each of the first three (the work ahead of it) and 200 on the last.
    Each dispatch adds 100 to what the next arrival costs on its replica. The default (20%)
    takes the alike replicas in turn, and the loaded one only once it is within 20% of the
    least (200 against 210 after two rounds of turns)."""
    loads = [_hist_load(i, [5.0, 5.0]) for i in range(3)] + [_hist_load(3, [5.0] * 40)]
    d = Dispatcher(4, "dwise")
    d.update(loads)
    assert [d.choose(work_rounds=100.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 3]
    # a wide tolerance lets the loaded replica in at its first turn: 200 <= 11 x 10
    d = Dispatcher(4, "dwise", tolerance=10.0)
    d.update(loads)
    assert [d.choose(work_rounds=100.0) for _ in range(4)] == [0, 1, 2, 3]
    for bad in (-0.1, math.inf, math.nan):
        with pytest.raises(ConfigError, match="tolerance"):
            Dispatcher(2, "dwise", tolerance=bad)


def test_a_missing_or_stale_report_falls_back_to_round_robin(caplog):
    d = Dispatcher(3, "dwise", stale_after=1.0)
    d.update([_load(0, 2, 0, 900.0, t=10.0), _load(1, 2, 0, 0.0, t=10.0)])  # replica 2 silent
    assert d.stale_replicas(10.5) == [2]
    with caplog.at_level("WARNING"):
        assert [d.choose(now=10.5) for _ in range(4)] == [0, 1, 2, 0]
    assert d.fallbacks == 4 and "replica(s) [2]" in caplog.text
    d.update([_load(2, 2, 0, 50.0, t=10.5)])
    assert d.choose(now=10.6) == 1  # all fresh: least work again
    assert d.stale_replicas(12.0) == [0, 1, 2]
    assert d.choose(now=12.0) == 1 and d.fallbacks == 5  # all went stale: round robin
    # an idle replica reports only when its state changes: an old report of nothing stays fresh
    d.update(
        [_load(0, 0, 0, 0.0, t=10.2), _load(1, 3, 0, 70.0, t=30.0), _load(2, 1, 0, 9.0, t=30.0)]
    )
    assert d.stale_replicas(30.5) == []
    assert d.choose(work_rounds=20.0, now=30.5) == 0 and d.fallbacks == 5
    with pytest.raises(ConfigError, match="not one of"):
        Dispatcher(2, "least-loaded")
    with pytest.raises(ConfigError, match="replica 5"):
        Dispatcher(2).update([_load(5, 0, 0, 0.0)])


def test_replica_load_sums_prompt_blocks_and_estimates_of_live_requests():
    s = Scheduler(make_policy("dwise-uncapped"), slots=2, k=2)
    s.add_request("a", 3, 40.0, prompt_tokens=100, output_budget=64, block_size=32)
    s.add_request("b", 1, 7.5, prompt_tokens=40, output_budget=64, block_size=32)
    load = replica_load(s, 4, timestamp=2.0)
    assert (load.replica, load.requests, load.work_rounds, load.timestamp) == (4, 2, 51.5, 2.0)
    assert load.tokens == int(s.table.kv_tokens[:2].sum()) > 140
    assert math.isnan(load.true_work_rounds)


def test_fleet_replay_finishes_everything_and_one_replica_is_the_single_server():
    w = synthetic_workload("paper-llada2.1-mini", n=240, seed=2)
    pol = make_policy("dwise-uncapped")
    runs = {
        m: simulate_fleet(w, pol, replicas=4, method=m, arrivals="poisson:600", slots=8, k=4)
        for m in DISPATCH_METHODS
    }
    for m, run in runs.items():
        s = run.summary()
        assert s["finished"] == s["requests"] == 240, m
        assert sum(s["requests_per_replica"]) == 240 and s["fallbacks"] == 0
        assert np.all(run.completion_rounds >= 1)
    assert runs["round_robin"].summary()["requests_per_replica"] == [60, 60, 60, 60]
    # one replica behind any method is the plain simulator with 1 ms rounds, round for round
    one = simulate_fleet(w, pol, replicas=1, method="dwise", arrivals="poisson:600", slots=8, k=4)
    rt = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)
    plain = simulate(w, pol, arrivals="poisson:600", slots=8, k=4, round_time=rt)
    single = (plain.finish_time - plain.arrival_time) * 1000.0
    assert np.abs(one.completion_rounds - single).max() <= 1.0 + 1e-6


def test_simulate_cli_runs_a_fleet_behind_each_dispatch_method(tmp_path, capsys):
    """`dwise-predict simulate --replicas R` is compare_dispatch on the same workload: the
    figures it writes are simulate_fleet's, run for run."""
    import json

    from dwise_predict.cli import main

    argv = ["simulate", "--synthetic", "paper-llada2.1-mini", "--requests", "240", "--seed", "2"]
    argv += ["--policies", "dwise,fcfs-mixed", "--replicas", "3", "--slots", "8", "--k", "4"]
    argv += ["--arrival", "poisson:500", "--dispatch", "round_robin,dwise", "--quiet"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    assert "requests_per_replica" not in capsys.readouterr().out  # a table, not the JSON
    doc = json.loads((tmp_path / "fleet.json").read_text())
    assert (doc["replicas"], doc["requests"], doc["dispatch_tolerance"]) == (3, 240, 0.2)
    assert [(r["policy"], r["method"]) for r in doc["runs"]] == [
        ("dwise", "round_robin"),
        ("dwise", "dwise"),
        ("fcfs-mixed", "round_robin"),
        ("fcfs-mixed", "dwise"),
    ]
    w = synthetic_workload("paper-llada2.1-mini", n=240, seed=2)
    for r in doc["runs"]:
        assert r["finished"] == r["requests"] == 240
        kw = dict(arrivals="poisson:500", slots=8, k=4, kv_pool_tokens=1 << 21, seed=2)
        pol = make_policy(r["policy"])
        direct = simulate_fleet(w, pol, replicas=3, method=r["method"], **kw).summary()
        assert r["mean_completion_rounds"] == pytest.approx(direct["mean_completion_rounds"])
        assert r["requests_per_replica"] == direct["requests_per_replica"]
    assert doc["runs"][0]["requests_per_replica"] == [80, 80, 80]
    png = (tmp_path / "fleet.png").read_bytes()
    assert png[:4] == b"\x89PNG" and len(png) > 10_000
    # the tolerance reaches the dispatcher and the file records it
    assert main([*argv, "--dispatch-tolerance", "0", "--no-plots", "--out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "fleet.json").read_text())["dispatch_tolerance"] == 0.0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--replicas", "2", "--dispatch", "round_robin,least_loaded"], "least_loaded"),
        (["--replicas", "0"], "at least one replica"),
        (["--dispatch-tolerance", "0.1"], "pass --replicas"),
        (["--dispatch", "dwise"], "pass --replicas"),
        (["--replicas", "2", "--dispatch-tolerance", "-1"], "tolerance"),
        (["--replicas", "2", "--cost-profile", "paper-llada2.0-mini"], "cost-profile"),
    ],
)
def test_simulate_cli_refuses_a_bad_fleet_setting(tmp_path, capsys, extra, message):
    from dwise_predict.cli import main

    argv = ["simulate", "--synthetic", "paper-llada2.1-mini", "--requests", "40"]
    rc = main([*argv, "--no-plots", "--quiet", "--out", str(tmp_path), *extra])
    err = capsys.readouterr().err
    assert rc != 0 and message in err and "Traceback" not in err
    assert not (tmp_path / "fleet.json").exists()
