"""The load signal: outstanding predicted work kept per event equals the sum over live rows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dwise_predict.cost import load_cost_profile
from dwise_predict.runtime import RoundResult, make_policy
from dwise_predict.runtime.load import LoadTrackingScheduler, WorkPrice


def _drive(sched: LoadTrackingScheduler, rounds: int, seed: int) -> list[tuple[float, float]]:
    """Arrivals, rounds with refinements and finishes, aborts and re-estimates at random; the
    kept figures against a full recount after every event."""
    rng = np.random.default_rng(seed)
    true_left: dict[str, int] = {}
    gaps = []
    nxt = 0

    def check() -> None:
        rounds_now, seconds_now = sched.recount()
        gaps.append(
            (sched.outstanding_rounds - rounds_now, sched.outstanding_seconds - seconds_now)
        )

    for _ in range(rounds):
        for _ in range(int(rng.poisson(1.5))):
            rid = f"r{nxt}"
            nxt += 1
            m = int(rng.integers(0, 6))
            sched.add_request(
                rid,
                m,
                float(rng.uniform(1, 40)),
                prompt_tokens=32 * m + 5,
                output_budget=256,
                block_size=32,
            )
            true_left[rid] = int(rng.integers(1, 50))
            check()
        if true_left and rng.random() < 0.1:  # an abort, waiting or resident
            sched.cancel(str(rng.choice(sorted(true_left))))
            check()
        if rng.random() < 0.05:  # a bundle swap re-estimates the waiting queue
            waiting = sched.table.waiting
            sched.set_estimates(waiting, rng.uniform(1, 30, waiting.size))
            check()
        if sched.idle:
            continue
        plan = sched.plan_round()
        ids = [str(x) for x in plan.ids.tolist()]
        finished = np.zeros(plan.rows.size, dtype=bool)
        refined = np.full(plan.rows.size, np.nan)
        for j, rid in enumerate(ids):
            if rid not in true_left:
                continue  # cancelled while planned: released at update
            if plan.prompt[j]:
                continue
            true_left[rid] -= 1
            if plan.first_denoise[j]:
                refined[j] = float(rng.uniform(0, 60))
            if true_left[rid] <= 0:
                finished[j] = True
                del true_left[rid]
        if rng.random() < 0.05 and ids:  # an abort while the round is out
            gone = ids[0]
            sched.cancel(gone)
            true_left.pop(gone, None)
        sched.update(RoundResult(plan.rows, finished, refined))
        check()
    return gaps


@pytest.mark.parametrize("priced", [False, True])
def test_kept_work_equals_the_recount_after_every_event(priced):
    price = WorkPrice(load_cost_profile("paper-llada2.0-mini")) if priced else None
    sched = LoadTrackingScheduler(make_policy("dwise"), slots=4, k=2, price=price)
    gaps = np.array(_drive(sched, 400, seed=3))
    assert sched.finished > 50 and sched.cancelled > 5 and sched.refinements > 50
    assert np.abs(gaps[:, 0]).max() < 1e-6
    if priced:
        assert np.abs(gaps[:, 1]).max() < 1e-6
        assert sched.outstanding_seconds >= 0
    else:
        assert np.isnan(gaps[:, 1]).all() and math.isnan(sched.outstanding_seconds)
    while not sched.idle:  # run it dry: exactly zero left
        plan = sched.plan_round()
        sched.update(RoundResult(plan.rows, ~plan.prompt))
    assert sched.outstanding_rounds == 0.0


def test_the_price_of_remaining_work():
    profile = load_cost_profile("paper-llada2.0-mini")
    price = WorkPrice(profile)
    sched = LoadTrackingScheduler(make_policy("dwise-uncapped"), slots=2, k=2, price=price)
    sched.add_request("a", 3, 10.0, prompt_tokens=100, output_budget=64, block_size=32)
    step = float(np.mean(profile.K_ms)) + 3 * profile.delta_ms
    prefill = 3 * profile.alpha_ms + profile.alpha2_ms * 9
    assert sched.outstanding_rounds == 13.0
    assert sched.outstanding_seconds == pytest.approx((prefill + 10 * step) / 1000)
    plan = sched.plan_round()  # one prompt block: the first one (j = 0) is paid
    sched.update(RoundResult(plan.rows, np.zeros(1, dtype=bool)))
    left = prefill - (profile.alpha_ms + profile.alpha2_ms)
    assert sched.outstanding_rounds == 12.0
    assert sched.outstanding_seconds == pytest.approx((left + 10 * step) / 1000)
