"""The scheduler runtime: the paper's toy example exactly, the plan/update contract, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dwise_predict.errors import ConfigError, SchedulerError
from dwise_predict.runtime import (
    DWISE,
    FCFS,
    MLFQ,
    Arrivals,
    OracleSRPT,
    RoundResult,
    RoundTimeModel,
    Scheduler,
    SimRequest,
    Workload,
    simulate,
)

# One round = 1 s and nothing else, so finish times read as completion rounds.
ONE_SECOND_ROUNDS = RoundTimeModel(
    overhead_ms=1000.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0
)
IN_ORDER = Arrivals(order=np.arange(4), times=np.zeros(4))


def toy_workload() -> Workload:
    """Four requests in the spirit of the paper's Fig. 4 (A, B long; C, D short), B = 2 slots.

    The paper's text gives the outcome (mean completion 8.5 rounds under SGLang's FCFS
    prefill-first, 6.0 under DWISE) but not the requests' shapes, so these are constructed to
    reproduce it: A = (1 prompt block, 6 rounds), B = (1, 6), C = (1, 1), D = (2, 1).

    FCFS prefill-first, B = 2 residents:
      r1  prefill A, B                    r2-r7  denoise A, B     -> A = B = 7
      r8  prefill C, D (admitted as A, B finish)
      r9  prefill D only (C stalls: a prompt is pending)
      r10 denoise C, D                    -> C = D = 10           mean (7+7+10+10)/4 = 8.5
    DWISE (R = P + r̂: A 7, B 7, C 2, D 3), mixed-phase:
      r1  C prompt, D prompt              r2  C denoise (done), D prompt       -> C = 2
      r3  D denoise (done), A prompt      -> D = 3 (A admitted: now in the top 2)
      r4  A denoise, B prompt             r5-r9 A, B denoise   -> A = 9
      r10 B denoise                       -> B = 10            mean (2+3+9+10)/4 = 6.0
    """
    shapes = {"A": (1, 6), "B": (1, 6), "C": (1, 1), "D": (2, 1)}
    return Workload.from_requests(
        [
            SimRequest(
                name,
                p,
                32 * p,
                (r,),
                256,
                32,
                admission_estimate=float(r),
                refined_estimate=float(r - 1),
            )
            for name, (p, r) in shapes.items()
        ]
    )


def test_toy_example_fcfs_prefill_first_mean_completion_is_8_5_rounds():
    run = simulate(toy_workload(), FCFS(), arrivals=IN_ORDER, slots=2, round_time=ONE_SECOND_ROUNDS)
    assert run.finish_time.tolist() == [7.0, 7.0, 10.0, 10.0]
    assert run.finish_time.mean() == 8.5
    assert run.round_filled.tolist() == [2, 2, 2, 2, 2, 2, 2, 2, 1, 2]
    assert run.round_prompt.tolist() == [2, 0, 0, 0, 0, 0, 0, 2, 1, 0]


def test_toy_example_dwise_mean_completion_is_6_rounds():
    run = simulate(
        toy_workload(), DWISE(), arrivals=IN_ORDER, slots=2, round_time=ONE_SECOND_ROUNDS
    )
    assert run.finish_time.tolist() == [9.0, 10.0, 2.0, 3.0]
    assert run.finish_time.mean() == 6.0
    assert run.completion_order.tolist() == [2, 3, 0, 1]
    # mixed-phase rounds: prompt and denoising blocks share rounds 2, 3 and 4
    assert run.round_prompt.tolist() == [2, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    oracle = simulate(
        toy_workload(), OracleSRPT(), arrivals=IN_ORDER, slots=2, round_time=ONE_SECOND_ROUNDS
    )
    assert oracle.finish_time.tolist() == run.finish_time.tolist()


def _sched(policy=None, **kw) -> Scheduler:
    return Scheduler(policy or DWISE(), **{"slots": 2, "k": 2, "kv_pool_tokens": 10_000, **kw})


def _add(s: Scheduler, rid, p=1, est=3.0, ptok=32, **kw) -> int:
    return s.add_request(rid, p, est, prompt_tokens=ptok, output_budget=64, block_size=32, **kw)


def test_plan_update_follows_algorithm_1_and_refines_once():
    s = _sched()
    rows = {
        rid: _add(s, rid, p, est)
        for rid, p, est in [("long", 1, 50.0), ("short", 1, 2.0), ("mid", 2, 5.0)]
    }
    plan = s.plan_round()
    # ranking R = P + r̂: short 3, mid 7, long 51 -> top B = 2 admitted and run, long waits
    assert plan.request_ids == ["short", "mid"]
    assert plan.prompt.tolist() == [True, True]
    assert sorted(plan.admitted.tolist()) == sorted([rows["short"], rows["mid"]])
    assert s.n_waiting == 1 and s.n_resident == 2
    s.update(RoundResult(plan.rows, np.zeros(2, bool)))
    plan = s.plan_round()  # short: first denoising round; mid: its 2nd prompt block
    assert plan.request_ids == ["short", "mid"]
    assert plan.prompt.tolist() == [False, True]
    assert plan.first_denoise.tolist() == [True, False]
    s.update(RoundResult(plan.rows, np.zeros(2, bool), refined=np.array([40.0, np.nan])))
    t = s.table
    assert t.r_hat[rows["short"]] == 40.0 and t.refined_n[rows["short"]] == 1
    assert t.prompt_blocks[rows["mid"]] == 0
    plan = s.plan_round()  # R: mid 0 + 5, short 40, long 51 (waiting, not in the top 2)
    assert plan.request_ids == ["mid", "short"]
    with pytest.raises(SchedulerError, match="first denoising round"):
        s.update(RoundResult(plan.rows, np.zeros(2, bool), refined=np.array([1.0, 1.0])))
    s.update(RoundResult(plan.rows, np.array([False, False])))
    assert t.r_hat[rows["short"]] == 39.0  # counts down after the refinement, never refined again
    assert t.r_hat[rows["mid"]] == 4.0


def test_a_plan_stays_true_after_update_frees_and_reuses_its_rows():
    s = _sched()
    _add(s, "a", 1, 0.0)
    _add(s, "b", 1, 0.0)
    plan = s.plan_round()
    s.update(RoundResult(plan.rows, np.zeros(2, bool)))
    done = s.plan_round()  # first denoising round of a and b
    s.update(RoundResult(done.rows, np.ones(2, bool)))  # both finish: their rows are freed
    reused = [_add(s, rid, 1, 1.0) for rid in ("c", "d")]
    assert sorted(reused) == sorted(done.rows.tolist())  # the table reused exactly those rows
    assert done.request_ids == ["a", "b"]  # the old plan still names the requests it ran
    assert s.plan_round().request_ids == ["c", "d"]


def test_displaced_resident_is_paused_and_counted_as_preempted():
    s = _sched(k=4)
    _add(s, "a", 1, 10.0)
    _add(s, "b", 1, 10.0)
    plan = s.plan_round()
    s.update(RoundResult(plan.rows, np.zeros(2, bool)))
    _add(s, "c", 1, 0.0)  # a short arrival outranks a and b
    plan = s.plan_round()
    assert plan.request_ids[0] == "c"
    assert s.table.ids[plan.preempted].tolist() == ["b"]
    assert s.table.ids[plan.paused].tolist() == ["b"]
    assert s.preemptions == 1


def test_kv_reservation_blocks_admission_until_memory_frees():
    # limit = 0.9 * 1000 = 900 tokens; worst case = prompt + 64 + 2*32 = prompt + 128
    s = Scheduler(DWISE(), slots=4, k=2, kv_pool_tokens=1000)
    _add(s, "big", 1, 1.0, ptok=600)  # 728 tokens
    _add(s, "other", 1, 2.0, ptok=200)  # 328 tokens: 728 + 328 > 900
    plan = s.plan_round()
    assert plan.request_ids == ["big"] and s.kv.reserved == 728 and s.n_waiting == 1
    s.update(RoundResult(plan.rows, np.zeros(1, bool)))
    plan = s.plan_round()
    s.update(RoundResult(plan.rows, np.ones(1, bool)))  # big finishes, frees its KV
    plan = s.plan_round()
    assert plan.request_ids == ["other"] and s.kv.reserved == 328
    with pytest.raises(SchedulerError, match="raise kv_pool_tokens"):
        _add(s, "huge", 1, 1.0, ptok=5000)


def test_fcfs_prefill_first_admits_in_arrival_order_only_when_a_resident_leaves():
    s = Scheduler(FCFS(), slots=2, k=8, kv_pool_tokens=10_000)
    for rid, p in [("a", 1), ("b", 1), ("c", 3)]:
        _add(s, rid, p, None)
    plan = s.plan_round()
    assert plan.request_ids == ["a", "b"] and s.n_waiting == 1  # cap B, not k*B
    s.update(RoundResult(plan.rows, np.zeros(2, bool)))
    plan = s.plan_round()
    assert plan.prompt.tolist() == [False, False]
    s.update(RoundResult(plan.rows, np.array([True, False])))  # a finishes -> c admitted
    plan = s.plan_round()
    assert plan.request_ids == ["c"] and plan.prompt.tolist() == [
        True
    ]  # b stalls behind c's prompt


def test_mlfq_demotes_by_attained_rounds():
    s = Scheduler(MLFQ(base_quantum=1.0), slots=1, k=4, kv_pool_tokens=10_000)
    _add(s, "old", 1, None)
    for _ in range(3):
        plan = s.plan_round()
        s.update(RoundResult(plan.rows, np.zeros(1, bool)))
    _add(s, "new", 1, None)  # attained 0 -> level 0, ahead of old (3 rounds -> level 2)
    plan = s.plan_round()
    assert plan.request_ids == ["new"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"slots": 0}, "slots"),
        ({"slots": -3}, "slots"),
        ({"k": 0}, "k="),
        ({"kv_pool_tokens": 0}, "pool_tokens"),
        ({"kv_limit_frac": 1.5}, "limit_frac"),
    ],
)
def test_bad_scheduler_config_is_a_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Scheduler(DWISE(), **kwargs)


def test_bad_requests_are_scheduler_errors():
    s = _sched()
    with pytest.raises(SchedulerError, match="admission_estimate"):
        _add(s, "nan", 1, math.nan)
    with pytest.raises(SchedulerError, match="admission_estimate is required"):
        _add(s, "none", 1, None)
    with pytest.raises(SchedulerError, match="prompt_blocks"):
        _add(s, "negative", -1, 1.0)
    _add(s, "x", 1, 1.0)
    with pytest.raises(SchedulerError, match="already queued"):
        _add(s, "x", 1, 1.0)
    with pytest.raises(SchedulerError, match="finite"):
        _add(s, "neg", 1, -2.0)
    with pytest.raises(SchedulerError, match="without a plan"):
        s.update(RoundResult(np.zeros(0, dtype=np.int64), np.zeros(0, bool)))
    plan = s.plan_round()
    with pytest.raises(SchedulerError, match="twice"):
        s.plan_round()
    with pytest.raises(SchedulerError, match="prompt block"):
        s.update(RoundResult(plan.rows, np.ones(1, bool)))
    with pytest.raises(SchedulerError, match="differ"):
        s.update(RoundResult(plan.rows + 1, np.zeros(1, bool)))


def test_bad_sim_requests_and_workloads():
    with pytest.raises(SchedulerError, match="< 1 round"):
        SimRequest("r", 1, 32, (3, 0), 64, 32)
    with pytest.raises(SchedulerError, match="< 1 round"):
        SimRequest("r", 1, 32, (-2,), 64, 32)
    with pytest.raises(SchedulerError, match="empty"):
        SimRequest("r", 1, 32, (), 64, 32)
    with pytest.raises(SchedulerError, match="admission_estimate"):
        SimRequest("r", 1, 32, (2,), 64, 32, admission_estimate=math.nan)
    with pytest.raises(SchedulerError, match="refined"):
        toy_workload().with_estimates(refined=np.array([1.0, np.nan, 2.0, 3.0]))
    with pytest.raises(SchedulerError, match="some requests but not"):
        Workload.from_requests(
            [
                SimRequest("a", 1, 32, (2,), 64, 32, admission_estimate=1.0),
                SimRequest("b", 1, 32, (2,), 64, 32),
            ]
        )
    with pytest.raises(ConfigError, match="needs admission estimates"):
        simulate(toy_workload().with_estimates(admission=None, refined=None), DWISE())


def test_smallest_picks_m_best_with_arrival_tiebreak():
    from dwise_predict.runtime.ranking import smallest

    rng = np.random.default_rng(0)
    for _ in range(200):
        n, m = int(rng.integers(1, 60)), int(rng.integers(1, 20))
        keys = rng.integers(0, 5, n).astype(float)  # many ties
        seq = rng.permutation(n)
        got = smallest(keys, seq, m)
        want = np.lexsort((seq, keys))[:m]
        assert got.tolist() == want.tolist()


def test_prompt_shorter_than_a_block_starts_decoding_at_once():
    # SGLang prefills floor(L / block) prompt blocks: a 20-token prompt has none, and its first
    # round is already its first denoising round (a refined estimate is accepted there).
    s = _sched()
    short = _add(s, "short", p=0, est=5.0, ptok=20)
    long_ = _add(s, "long", p=2, est=5.0, ptok=70)
    plan = s.plan_round()
    by_row = dict(zip(plan.rows.tolist(), zip(plan.prompt.tolist(), plan.first_denoise.tolist())))
    assert by_row[short] == (False, True) and by_row[long_] == (True, False)
    refined = np.where(plan.rows == short, 9.0, np.nan)
    s.update(RoundResult(plan.rows, np.zeros(plan.rows.size, bool), refined))
    assert s.table.r_hat[short] == 9.0 and s.table.prompt_blocks[long_] == 1


def test_cancel_forgets_a_request_in_any_state_and_returns_its_kv():
    # limit 900 tokens; each request reserves 32 + 64 + 64 = 160
    s = Scheduler(DWISE(), slots=2, k=2, kv_pool_tokens=1000)
    for rid, est in [("a", 1.0), ("b", 2.0), ("c", 9.0), ("d", 9.5), ("e", 20.0)]:
        _add(s, rid, 1, est)
    plan = s.plan_round()  # a, b admitted and run
    s.update(RoundResult(plan.rows, np.zeros(2, bool)))
    assert s.n_resident == 2 and s.kv.reserved == 320
    assert s.cancel("a") and s.n_resident == 1 and s.kv.reserved == 160  # a resident
    assert s.cancel("e") and s.n_waiting == 2 and s.kv.reserved == 160  # a waiting request
    assert not s.cancel("a") and not s.cancel("never-added")  # idempotent, no error
    s.check_invariants()
    plan = s.plan_round()  # b denoises; c is admitted into a's place
    assert plan.request_ids == ["b", "c"]
    # cancelled while its round is in flight: released at update, not counted as finished
    assert s.cancel("c")
    assert s.kv.reserved == 320
    s.update(RoundResult(plan.rows, np.array([False, False])))
    assert s.kv.reserved == 160 and s.cancelled == 3 and s.finished == 0
    s.check_invariants()
    with pytest.raises(SchedulerError, match="unknown request id 'c'"):
        s.row_of("c")
    # the freed rows are reused; a reused row is never counted as preempted
    _add(s, "f", 1, 0.5)
    plan = s.plan_round()
    assert plan.request_ids == ["b", "f"] and plan.preempted.size == 0  # R: b 0, f 1.5
    s.update(RoundResult(plan.rows, np.array([True, False])))
    assert s.finished == 1 and s.kv.reserved == 160  # b finished; f resident, d waiting
    s.check_invariants()


def test_a_cancelled_row_reported_finished_in_its_round_is_released_once():
    s = _sched()
    _add(s, "a", 0, 1.0)
    plan = s.plan_round()
    assert s.cancel("a")
    s.update(RoundResult(plan.rows, np.ones(1, bool)))  # the framework also saw it end
    assert s.kv.reserved == 0 and s.idle and s.finished == 0 and s.cancelled == 1
    s.check_invariants()
