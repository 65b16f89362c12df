"""The tail guard (``runtime/tails.py``): its deadlines, when it acts, and when it does not.

Latencies here are in rounds: every round costs 1 ms and arrival j ms means "before round j".
"""

from __future__ import annotations

import numpy as np
import pytest
from _rounds_helpers import ONE_MS_ROUNDS, request, serve

from dwise_predict.errors import ConfigError
from dwise_predict.runtime import (
    DWISE,
    FCFS,
    RoundResult,
    Scheduler,
)
from dwise_predict.runtime.table import THROUGHPUT_HALF_LIFE
from dwise_predict.runtime.tails import BIAS_MIN_ROUNDS, TailGuard, estimate_bias


def _add(sched: Scheduler, rid: str, prompt_blocks: int, estimate: float) -> int:
    return sched.add_request(
        rid,
        prompt_blocks,
        estimate,
        prompt_tokens=max(1, 32 * prompt_blocks),
        output_budget=256,
        block_size=32,
    )


def test_deadlines_come_from_a_virtual_fcfs_server_on_b_rows():
    # B = 2 rows; predicted work P + r-hat = 5, 3, 7, all arriving before round 0: FCFS runs the
    # first two at once (done at 5 and 3), the third on the row freed at 3 (done at 10)
    guard = TailGuard()
    sched = Scheduler(guard, slots=2, k=8)
    rows = np.array([_add(sched, "a", 1, 4.0), _add(sched, "b", 1, 2.0), _add(sched, "c", 1, 6.0)])
    # virtual latencies 5, 3, 10; the default floor is 0.9 x their maximum, 9
    assert np.allclose(guard.deadlines(sched.table, rows), [9.0, 9.0, 10.0])
    p99 = TailGuard(quantile=0.99, scale=1.0)
    sched = Scheduler(p99, slots=2, k=8)
    rows = np.array([_add(sched, "a", 1, 4.0), _add(sched, "b", 1, 2.0), _add(sched, "c", 1, 6.0)])
    # the floor at the p99 of 5, 3, 10: 5 + 0.98 * (10 - 5) = 9.9
    assert np.allclose(p99.deadlines(sched.table, rows), [9.9, 9.9, 10.0])
    # with the floor at half the p99, each request keeps at least its own FCFS latency
    half = TailGuard(quantile=0.99, scale=0.5)
    sched = Scheduler(half, slots=2, k=8)
    rows = np.array([_add(sched, "a", 1, 4.0), _add(sched, "b", 1, 2.0), _add(sched, "c", 1, 6.0)])
    assert np.allclose(half.deadlines(sched.table, rows), [5.0, 4.95, 10.0])


def test_a_long_request_under_a_stream_of_short_ones_finishes_when_fcfs_would_finish_it():
    # one long request (1 prompt block + 2 blocks of 10 rounds) at round 0, then two one-round
    # requests before every round for 300 rounds: with B = 2 the shorts alone fill every round
    reqs = [request("long", 1, (10, 10))] + [request(f"s{j}", 0, (1,)) for j in range(600)]
    arrive = [0] + [j // 2 for j in range(600)]
    plain = serve(reqs, arrive, DWISE(), slots=2)
    guarded = serve(reqs, arrive, TailGuard(), slots=2)
    fcfs = serve(reqs, arrive, FCFS(batch_former="mixed"), slots=2)
    assert plain[0] > 300  # SRPT runs it only once the stream ends
    assert fcfs[0] == 21  # FCFS runs it every round from round 0
    # its virtual FCFS finish is round 21 and its own work 21 rounds: it runs every round
    assert guarded[0] == fcfs[0]


def test_when_nothing_is_late_it_is_plain_dwise():
    # B = 4 rows, work 3, 4, 5 and 40: the long one sets the floor (0.9 x 40 = 36) and owes 40
    # rounds by round 40, so it runs now; the others have 31 rounds and more to spare: DWISE's
    # key, P + r-hat
    guard = TailGuard()
    sched = Scheduler(guard, slots=4, k=8)
    rows = np.array([_add(sched, f"q{i}", 1, w - 1.0) for i, w in enumerate((3, 4, 5, 40))])
    t = sched.table
    keys = guard.key(t, rows, 0)
    assert np.array_equal(keys[:3], t.prompt_blocks[rows[:3]] + t.r_hat[rows[:3]])
    assert keys[3] < 0
    # arrivals 15 rounds apart, each with at most 12 rounds of work: the same schedule
    rng = np.random.default_rng(3)
    reqs = [
        request(f"r{i}", int(rng.integers(0, 3)), tuple(int(x) for x in rng.integers(1, 6, 2)))
        for i in range(40)
    ]
    arrive = [15 * i for i in range(40)]
    assert np.array_equal(serve(reqs, arrive, TailGuard(), 2), serve(reqs, arrive, DWISE(), 2))


def test_a_late_request_outranks_shorter_ones_earliest_deadline_first():
    guard = TailGuard(quantile=0.99, scale=1.0, margin=2.0)
    sched = Scheduler(guard, slots=1, k=8)
    # alone on one row: virtual latencies 10 (a), then 10 + 1 (b), 11 + 1 (c)
    rows = np.array([_add(sched, "a", 0, 10.0), _add(sched, "b", 0, 1.0), _add(sched, "c", 0, 1.0)])
    keys = guard.key(sched.table, rows, 0)
    # a owes 10 rounds by round 11.98 (the floor, p99 of 10, 11, 12): slack 1.98 <= margin 2
    assert keys[0] < keys[1] and keys[0] < keys[2]
    # b and c are not late, but the three owe 12 rounds by round 12 on one row: the prefix is
    # tight, so they too outrank any request outside it, shortest first (ties: arrival order)
    assert keys[1] == keys[2] < 0


def test_the_estimate_bias_is_measured_from_finished_requests():
    guard = TailGuard()
    sched = Scheduler(guard, slots=4, k=8)
    assert estimate_bias(sched.table) == 1.0
    # every request estimated at 4 denoising rounds but done after 1 (no prompt blocks)
    n = int(BIAS_MIN_ROUNDS // 4) + 1
    for i in range(n):
        _add(sched, f"r{i}", 0, 4.0)
    while not sched.idle:
        plan = sched.plan_round()
        sched.update(RoundResult(plan.rows, np.ones(plan.rows.size, dtype=bool), None))
    assert sched.table.finished_estimate == 4.0 * n
    assert sched.table.finished_work == 1.0 * n
    assert estimate_bias(sched.table) == pytest.approx(0.25)


def test_the_scheduler_measures_blocks_per_round():
    sched = Scheduler(TailGuard(), slots=4, k=8)
    assert sched.table.throughput == 4.0  # B until a round has run
    _add(sched, "only", 0, 1000.0)
    for _ in range(THROUGHPUT_HALF_LIFE):  # one block a round, for a half-life
        plan = sched.plan_round()
        sched.update(RoundResult(plan.rows, np.zeros(plan.rows.size, dtype=bool), None))
    assert sched.table.throughput == pytest.approx(1.0 + 3.0 * 0.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"quantile": 0.0}, "quantile"),
        ({"quantile": 1.5}, "quantile"),
        ({"scale": 0.0}, "scale"),
        ({"scale": float("nan")}, "scale"),
        ({"window": 0}, "window"),
        ({"window": True}, "window"),
        ({"window": 2.5}, "window"),
        ({"margin": -1.0}, "margin"),
        ({"margin": float("inf")}, "margin"),
        ({"batch_former": "prefill-first"}, "mixed"),
    ],
)
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TailGuard(**kwargs)


def test_a_small_overload_keeps_the_tail_near_fcfs_and_most_of_the_mean_gain():
    # 240 requests, a fifth of them long (4-8 output blocks, up to 5 prompt blocks), admission
    # estimates off by a log-normal factor (sigma 0.3), Poisson arrivals at 1.5x what B = 4
    # rows serve: plain DWISE starves the long ones (p99 over twice FCFS's)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(240):
        long = rng.random() < 0.2
        blocks = int(rng.integers(4, 9)) if long else int(rng.integers(1, 3))
        rounds = tuple(int(x) for x in rng.integers(2, 9, blocks))
        estimate = float(sum(rounds)) * float(np.exp(rng.normal(0, 0.3)))
        reqs.append(request(f"r{i}", int(rng.integers(0, 6 if long else 2)), rounds, estimate))
    work = np.mean([r.prompt_blocks + sum(r.rounds_per_block) for r in reqs])
    arrive = np.floor(np.cumsum(rng.exponential(work / (1.5 * 4), 240))).astype(int).tolist()
    fcfs = serve(reqs, arrive, FCFS(batch_former="mixed"), 4)
    plain = serve(reqs, arrive, DWISE(), 4)
    guarded = serve(reqs, arrive, TailGuard(), 4)

    def p99(x: np.ndarray) -> float:
        return float(np.percentile(x, 99))

    assert p99(plain) > 2 * p99(fcfs)
    # measured: p99 263 against FCFS's 256 (the setting is tuned on the served ladder, where
    # it lands below FCFS's; on 4 rows its promotions crowd: within 5% here, not below)
    assert p99(guarded) <= 1.05 * p99(fcfs)
    assert guarded.max() <= 1.5 * fcfs.max()
    assert guarded.mean() < 0.75 * fcfs.mean()  # measured 80.6 against 115.0


def test_a_baseline_held_to_the_same_tail_rule_ranks_by_its_own_estimates():
    # three requests at once on one row, DWISE's estimates right (3, 2, 1 rounds) and the
    # ssjf baseline's reversed: the guard ranks by whichever estimates it is given
    from dwise_predict.runtime import Arrivals, Workload, simulate
    from dwise_predict.runtime.policies import LengthSRPT

    reqs = [request("a", 0, (3,)), request("b", 0, (2,)), request("c", 0, (1,))]
    wl = Workload.from_requests(reqs).with_estimates(lengths={"ssjf": np.array([1.0, 2.0, 3.0])})
    arrivals = Arrivals(np.arange(3, dtype=np.int64), np.zeros(3))

    def finish_order(policy) -> list[int]:
        run = simulate(wl, policy, arrivals=arrivals, slots=1, k=8, round_time=ONE_MS_ROUNDS)
        return np.argsort(run.finish_time, kind="stable").tolist()

    assert finish_order(TailGuard()) == [2, 1, 0]  # DWISE's own estimates: c, b, a
    guarded = TailGuard(predictor="ssjf", name="ssjf+guard")
    assert guarded.needs == {"estimate", "length"}
    # the baseline's order runs a first, as plain ssjf does; then c (estimated 3, true 1)
    # is due by its virtual FCFS deadline, 6 rounds, and runs before b
    assert finish_order(LengthSRPT(predictor="ssjf")) == [0, 1, 2]
    assert finish_order(guarded) == [0, 2, 1]
    assert TailGuard(predictor="trail", refines=True).needs == {"estimate", "length", "refined"}
    with pytest.raises(ConfigError, match="not an output-length baseline"):
        TailGuard(predictor="lstm")
    with pytest.raises(ConfigError, match="refines=True re-estimates"):
        TailGuard(refines=True)
