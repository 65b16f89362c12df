"""DWISE's anti-starvation rules: the starvation cap's bound, its order, its knobs.

Latencies here are in rounds: every round costs 1 ms and arrival j ms means "before round j".
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from _rounds_helpers import request, serve

from dwise_predict.cli import main
from dwise_predict.errors import ConfigError
from dwise_predict.runtime import (
    DWISE,
    make_policy,
    simulate,
    synthetic_workload,
)
from dwise_predict.sglang.config import load_config


def _long_under_short_stream(n_long: int = 1, stream_rounds: int = 300):
    """``n_long`` long requests at round 0 (21 rounds of work each: 1 prompt block, 2 output
    blocks of 10), then 2 one-round requests before every round for ``stream_rounds`` rounds:
    with B = 2 the shorts alone fill every round, so SRPT never runs the long ones."""
    longs = [request(f"long{i}", 1, (10, 10)) for i in range(n_long)]
    shorts = [request(f"s{j}", 0, (1,)) for j in range(2 * stream_rounds)]
    arrive = [0] * n_long + [j // 2 for j in range(2 * stream_rounds)]
    return [*longs, *shorts], arrive


@pytest.mark.parametrize("clock", ["age", "waited"])
def test_a_long_request_under_a_stream_of_short_ones_finishes_within_the_cap(clock):
    reqs, arrive = _long_under_short_stream()
    plain = serve(reqs, arrive, DWISE(), slots=2)
    assert plain[0] > 300  # SRPT: it waits for the stream to end
    for cap in (20, 50, 120):
        capped = serve(reqs, arrive, DWISE(starvation_cap=cap, starvation_clock=clock), slots=2)
        # promoted the round after its clock passes the cap, it then runs every round
        assert cap < capped[0] <= cap + 21 + 1
        assert capped[1:].max() < plain[0]  # and the shorts still finish (B = 2, one left)


def test_the_starved_run_in_arrival_order_even_when_a_later_one_is_shorter():
    # 31 and 11 rounds of work
    longs = [request("first", 1, (15, 15)), request("second", 1, (5, 5))]
    shorts = [request(f"s{j}", 0, (1,)) for j in range(200)]
    arrive = [0, 1] + [j for j in range(200)]
    capped = serve([*longs, *shorts], arrive, DWISE(starvation_cap=30), slots=1)
    done_first, done_second = capped[0], capped[1] + 1  # back on the common round axis
    # both starve behind the stream; once starved, the earlier arrival runs first to the end
    assert 30 < done_first <= 30 + 31 + 1
    assert done_second == done_first + 11
    plain = serve([*longs, *shorts], arrive, DWISE(), slots=1)
    assert plain[1] + 1 < plain[0]  # SRPT alone would finish the shorter one first


def test_a_cap_no_request_reaches_leaves_dwise_unchanged():
    w = synthetic_workload(n=400, seed=1)
    runs = [
        simulate(w, p, arrivals="burst+poisson:16", slots=32, k=4, seed=1)
        for p in (DWISE(), DWISE(starvation_cap=10**7), DWISE(starvation_cap=10**7, aging=0.0))
    ]
    assert np.array_equal(runs[0].finish_time, runs[1].finish_time)
    assert np.array_equal(runs[0].finish_time, runs[2].finish_time)
    # a cap the run does reach trades mean for the tail on the same workload
    capped = simulate(w, DWISE(starvation_cap=60), arrivals="burst+poisson:16", slots=32, k=4)
    lat0 = runs[0].finish_time - runs[0].arrival_time
    lat1 = capped.finish_time - capped.arrival_time
    assert lat1.max() < lat0.max() and lat1.mean() > lat0.mean()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"starvation_cap": -1}, "starvation_cap=-1"),
        ({"starvation_cap": 2.5}, "whole number of rounds"),
        ({"starvation_cap": True}, "whole number of rounds"),
        ({"starvation_clock": "wall"}, "starvation_clock='wall'"),
    ],
)
def test_bad_starvation_settings_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DWISE(**kwargs)


def test_make_policy_and_the_plugin_settings_carry_the_cap():
    p = make_policy("dwise-admission", starvation_cap=900, starvation_clock="waited")
    assert (p.name, p.starvation_cap, p.starvation_clock) == ("dwise-admission", 900, "waited")
    with pytest.raises(ConfigError, match="policies that have it: .*dwise-uncapped"):
        make_policy("fcfs-mixed", starvation_cap=900)
    cfg = load_config(
        {
            "DWISE_SGLANG_BUNDLE": "tiny-bd",
            "DWISE_SGLANG_POLICY": "dwise-uncapped",
            "DWISE_SGLANG_STARVATION_CAP": "900",
            "DWISE_SGLANG_STARVATION_CLOCK": "waited",
        }
    )
    assert cfg is not None and (cfg.starvation_cap, cfg.starvation_clock) == (900, "waited")
    for env, match in (
        ({"DWISE_SGLANG_STARVATION_CAP": "-3"}, "STARVATION_CAP"),
        ({"DWISE_SGLANG_STARVATION_CAP": "1.5"}, "STARVATION_CAP"),
        ({"DWISE_SGLANG_STARVATION_CLOCK": "wall"}, "STARVATION_CLOCK"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_config(
                {"DWISE_SGLANG_BUNDLE": "tiny-bd", "DWISE_SGLANG_POLICY": "dwise-uncapped", **env}
            )
    # the default carries its own tail rule: an older rule's setting for it is refused, named
    with pytest.raises(ConfigError, match="DWISE_SGLANG_POLICY=dwise: .*no setting starvation_cap"):
        load_config({"DWISE_SGLANG_BUNDLE": "tiny-bd", "DWISE_SGLANG_STARVATION_CAP": "900"})


def test_cli_simulate_takes_the_cap(tmp_path, capsys):
    argv = [
        "simulate",
        "--synthetic",
        "paper-llada2.1-mini",
        "--requests",
        "300",
        "--policies",
        "fcfs-mixed,dwise-uncapped",
        "--arrival",
        "burst+poisson:16",
        "--slots",
        "16",
        "--k",
        "4",
        "--no-plots",
        "--quiet",
    ]
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0
    assert main([*argv, "--starvation-cap", "100", "--out", str(tmp_path / "capped")]) == 0
    capsys.readouterr()
    plain, capped = (
        json.loads((tmp_path / d / "summary.json").read_text())["policies"]
        for d in ("plain", "capped")
    )
    for metric in ("mean_latency", "p99_latency"):  # the cap is the DWISE family's alone
        assert capped["fcfs-mixed"][metric] == plain["fcfs-mixed"][metric]
    assert capped["dwise-uncapped"]["p99_latency"] < plain["dwise-uncapped"]["p99_latency"]


def test_the_fcfs_horizon_is_the_work_live_at_arrival_over_b_and_at_least_its_own():
    from dwise_predict.runtime import RoundResult, Scheduler

    s = Scheduler(DWISE(starvation_slack=1.0), slots=2, k=2)

    def add(rid: str, prompt_blocks: int, est: float) -> int:
        return s.add_request(
            rid, prompt_blocks, est, prompt_tokens=64, output_budget=64, block_size=32
        )

    rows = [add("a", 1, 9.0), add("b", 1, 9.0), add("c", 1, 29.0)]  # work 10 + 10 + 30
    plan = s.plan_round()
    # 50 units over B = 2 slots: 25 rounds; "c" alone needs 30 (one block a round)
    assert s.table.fcfs_rounds[rows].tolist() == [25.0, 25.0, 30.0]
    s.update(RoundResult(plan.rows, np.zeros(plan.rows.size, dtype=bool)))
    late = add("d", 0, 3.0)  # 48 units left live (two prompt blocks ran) + its 3
    s.plan_round()
    assert s.table.fcfs_rounds[late] == pytest.approx((48 + 3) / 2)
    assert s.table.fcfs_rounds[rows].tolist() == [25.0, 25.0, 30.0]  # set once, at arrival


@pytest.mark.parametrize("slack", [1.0, 2.0, 4.0])
def test_under_a_stream_of_short_ones_the_slack_bounds_the_wait_by_the_fcfs_horizon(slack):
    reqs, arrive = _long_under_short_stream()
    # at round 0: the long one's 21 units + two 1-unit shorts over B = 2 is 11.5 rounds, less
    # than its own 21 rounds of work, so its horizon is 21
    horizon = 21
    capped = serve(reqs, arrive, DWISE(starvation_slack=slack), slots=2)
    assert slack * horizon < capped[0] <= slack * horizon + 21 + 1
    assert capped[0] < serve(reqs, arrive, DWISE(), slots=2)[0]


def test_the_slack_is_checked_and_carried_by_every_face():
    with pytest.raises(ConfigError, match="starvation_slack=-0.5"):
        DWISE(starvation_slack=-0.5)
    with pytest.raises(ConfigError, match="starvation_slack=nan"):
        DWISE(starvation_slack=float("nan"))
    assert make_policy("dwise-uncapped", starvation_slack=1.5).starvation_slack == 1.5
    env = {"DWISE_SGLANG_BUNDLE": "tiny-bd", "DWISE_SGLANG_POLICY": "dwise-uncapped"}
    cfg = load_config({**env, "DWISE_SGLANG_STARVATION_SLACK": "1.5"})
    assert cfg is not None and cfg.starvation_slack == 1.5
    with pytest.raises(ConfigError, match="STARVATION_SLACK"):
        load_config({**env, "DWISE_SGLANG_STARVATION_SLACK": "-1"})


@pytest.mark.parametrize("cap", [30, 60, 150])
def test_the_projected_clock_promotes_a_long_request_in_time_to_finish_by_the_cap(cap):
    reqs, arrive = _long_under_short_stream()
    by_age = serve(reqs, arrive, DWISE(starvation_cap=cap), slots=2)
    projected = serve(reqs, arrive, DWISE(starvation_cap=cap, starvation_clock="projected"), 2)
    # promoted once its age plus its 21 estimated rounds of work pass the cap, it then runs
    # every round: it finishes at the cap (the age clock finishes it a whole job later)
    assert cap - 1 <= projected[0] <= cap + 2
    assert cap + 20 <= by_age[0] <= cap + 21 + 1
    # the shorts it displaced: later, so the stream's mean pays a little for the earlier start
    assert projected[1:].mean() >= by_age[1:].mean()


def test_the_projected_slack_and_the_oracle_take_the_same_clock():
    reqs, arrive = _long_under_short_stream()
    # the long one's FCFS horizon is its own 21 rounds of work (see the slack test above)
    slack = serve(reqs, arrive, DWISE(starvation_slack=3.0, starvation_clock="projected"), 2)
    assert 3.0 * 21 - 1 <= slack[0] <= 3.0 * 21 + 2
    # the oracle projects with the true work (21 rounds), so it meets the cap exactly
    oracle = make_policy("oracle", starvation_cap=80, starvation_clock="projected")
    assert (oracle.starvation_cap, oracle.starvation_clock) == (80, "projected")
    assert 79 <= serve(reqs, arrive, oracle, slots=2)[0] <= 81
    assert serve(reqs, arrive, make_policy("oracle"), slots=2)[0] > 300  # SRPT starves it
    cfg = load_config(
        {
            "DWISE_SGLANG_BUNDLE": "tiny-bd",
            "DWISE_SGLANG_POLICY": "dwise-uncapped",
            "DWISE_SGLANG_STARVATION_CLOCK": "projected",
        }
    )
    assert cfg is not None and cfg.starvation_clock == "projected"
