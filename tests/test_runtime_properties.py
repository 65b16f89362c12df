"""Property tests over many random small workloads, with the simulator's per-round checks on.

Every round of every replay checks (``check_invariants=True``): the round carries at most B
blocks, at most one per request, only residents run, prompt blocks before denoising; after
the update: residents <= k·B (B for non-preemptive policies), the KV reservations equal the
residents' worst cases and stay under the 90% limit, no request refined twice.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dwise_predict.runtime import (
    DWISE,
    DWSSJF,
    FCFS,
    MLFQ,
    SRPT,
    Arrivals,
    OracleSRPT,
    ScoreSJF,
    SimRequest,
    Workload,
    simulate,
)

POLICIES = [
    FCFS(),
    FCFS(batch_former="mixed", name="fcfs-mixed"),
    DWISE(),
    DWISE(aging=0.5, name="dwise-aging"),
    DWISE(starvation_cap=3, name="dwise-capped"),
    DWISE(starvation_slack=0.5, name="dwise-slack"),
    DWISE(starvation_cap=2, starvation_clock="waited", aging=0.5, name="dwise-capped-waited"),
    OracleSRPT(),
    MLFQ(),
    MLFQ(batch_former="mixed", name="mlfq-mixed"),
    ScoreSJF(),
    SRPT(),
    DWSSJF(),
]

request_st = st.tuples(
    st.integers(1, 4),  # prompt blocks
    st.lists(st.integers(1, 6), min_size=1, max_size=3),  # rounds per output block
    st.floats(0, 30, allow_nan=False),  # admission estimate (noisy)
    st.floats(0, 30, allow_nan=False),  # refined estimate (noisy)
    st.floats(0, 30, allow_nan=False),  # score / cost
    st.floats(0, 3, allow_nan=False),  # arrival time (s)
)


@st.composite
def scenarios(draw):
    reqs = draw(st.lists(request_st, min_size=1, max_size=10))
    slots = draw(st.integers(1, 4))
    k = draw(st.integers(1, 3))
    # KV pool: from "one request at a time" up to roomy; worst case = 32*P + 96 + 64 tokens
    biggest = max(32 * p + 160 for p, *_ in reqs)
    pool = draw(st.integers(int(np.ceil(biggest / 0.9)), int(np.ceil(biggest / 0.9)) * 6))
    workload = Workload.from_requests(
        [
            SimRequest(
                f"r{i}",
                p,
                32 * p,
                tuple(rpb),
                96,
                32,
                output_tokens=32 * len(rpb),
                admission_estimate=a,
                refined_estimate=r,
                cost=c,
                score=c,
            )
            for i, (p, rpb, a, r, c, _) in enumerate(reqs)
        ]
    )
    times = np.array([t for *_, t in reqs])
    order = np.argsort(times, kind="stable")
    return workload, Arrivals(order, times[order]), slots, k, pool


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_policy_finishes_every_request_within_the_round_contract(scenario):
    workload, arrivals, slots, k, pool = scenario
    work = int(workload.work.sum())
    for policy in POLICIES:
        run = simulate(
            workload,
            policy,
            arrivals=arrivals,
            slots=slots,
            k=k,
            kv_pool_tokens=pool,
            check_invariants=True,
        )
        assert np.all(np.isfinite(run.finish_time)), policy.name
        assert sorted(run.completion_order.tolist()) == list(range(workload.n))
        assert np.all(run.finish_time >= run.arrival_time)
        assert np.all(run.first_block_time <= run.finish_time)
        assert np.all(run.round_filled <= slots) and np.all(run.round_filled >= 1)
        assert int(run.round_filled.sum()) == work  # every prompt block and round runs exactly once
        if policy.name.startswith("dwise"):
            assert run.refinements == workload.n  # exactly once per request
        else:
            assert run.refinements == 0


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_dwise_with_exact_estimates_completes_in_oracle_srpt_order(scenario):
    workload, arrivals, slots, k, pool = scenario
    exact = workload.with_estimates(
        admission=workload.total_rounds.astype(float),
        refined=workload.total_rounds.astype(float) - 1.0,
    )
    a = simulate(exact, DWISE(), arrivals=arrivals, slots=slots, k=k, kv_pool_tokens=pool)
    b = simulate(exact, OracleSRPT(), arrivals=arrivals, slots=slots, k=k, kv_pool_tokens=pool)
    assert a.completion_order.tolist() == b.completion_order.tolist()
    assert a.finish_time.tolist() == b.finish_time.tolist()
    assert a.round_filled.tolist() == b.round_filled.tolist()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 2**31 - 1))
def test_replays_are_reproducible(scenario, seed):
    workload, arrivals, slots, k, pool = scenario
    a = simulate(
        workload, DWISE(), arrivals="poisson:2", slots=slots, k=k, kv_pool_tokens=pool, seed=seed
    )
    b = simulate(
        workload, DWISE(), arrivals="poisson:2", slots=slots, k=k, kv_pool_tokens=pool, seed=seed
    )
    assert a.finish_time.tolist() == b.finish_time.tolist()
    assert a.round_ms.tolist() == b.round_ms.tolist()
