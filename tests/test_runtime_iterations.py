"""The per-iteration ranker (vLLM's order) and the simulator's vLLM round model, numpy only."""

from __future__ import annotations

import numpy as np
import pytest

from dwise_predict.errors import SchedulerError
from dwise_predict.runtime import make_policy
from dwise_predict.runtime.iterations import IterationRanker
from dwise_predict.runtime.vllm_replay import ReplayRequest, replay_vllm


def test_the_key_is_the_policys_own_over_prompt_blocks_and_counted_down_estimates():
    pol = make_policy("dwise-admission")
    rk = IterationRanker(pol, prompt_chunk=32, slots=4)
    rk.add("a", prompt_tokens=100, estimate=50.0)  # P = 4
    rk.add("b", prompt_tokens=10, estimate=60.0)  # P = 1
    rk.add("c", prompt_tokens=64, estimate=10.0)  # P = 2
    assert rk.keys(["a", "b", "c"]).tolist() == [54.0, 61.0, 12.0]
    assert [["a", "b", "c"][i] for i in rk.order(["a", "b", "c"])] == ["c", "a", "b"]
    for _ in range(7):
        rk.denoised("b")
    rk.set_prompt_left("b", 0)
    assert rk.keys(["b"]).tolist() == [53.0]
    rk.committed("b")
    rk.denoised("b")
    rk.preempted("b", prompt_tokens_left=40)  # the block in progress is lost: one step back
    assert rk.keys(["b"]).tolist() == [2 + 53.0]
    assert rk.table.done_rounds[rk.row("b")] == 7
    rk.refine("b", 5.0)
    assert rk.keys(["b"]).tolist() == [7.0] and not rk.refine("b", 1.0)
    assert rk.remove("a") and not rk.remove("a") and "a" not in rk and len(rk) == 2


def test_oracle_needs_the_truth_and_bad_estimates_are_refused():
    rk = IterationRanker(make_policy("oracle"), prompt_chunk=32, slots=4)
    with pytest.raises(SchedulerError, match="true_rounds"):
        rk.add("x", prompt_tokens=10)
    with pytest.raises(SchedulerError, match="NaN"):
        IterationRanker(make_policy("dwise"), prompt_chunk=32, slots=4).add(
            "y", prompt_tokens=10, estimate=float("nan")
        )


def _requests(n: int, seed: int = 0, arrivals: bool = False) -> list[ReplayRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        blocks = tuple(int(x) for x in rng.integers(1, 33, size=int(rng.integers(1, 9))))
        arr = int(rng.integers(0, 200)) if arrivals else 0
        est = float(sum(blocks) * rng.uniform(0.6, 1.6))
        out.append(ReplayRequest(f"r{i}", int(rng.integers(20, 400)), blocks, arr, est))
    return out


def test_a_request_alone_takes_a_prompt_step_and_r_plus_one_steps_a_block():
    r = ReplayRequest("x", 100, (23, 32, 22, 3, 2))
    assert replay_vllm([r], "fcfs", max_num_seqs=4).completion == {"x": 1 + 82 + 5}


def test_replay_ranks_shorter_work_first_and_frees_every_page():
    reqs = _requests(64)
    fcfs = replay_vllm(reqs, "fcfs", max_num_seqs=8)
    oracle = replay_vllm(reqs, make_policy("oracle"), max_num_seqs=8)
    dwise = replay_vllm(reqs, make_policy("dwise"), max_num_seqs=8)
    mean = {
        k: np.mean(list(v.completion.values()))
        for k, v in (("fcfs", fcfs), ("oracle", oracle), ("dwise", dwise))
    }
    assert mean["oracle"] < mean["dwise"] < mean["fcfs"]
    for res in (fcfs, oracle, dwise):
        assert len(res.completion) == 64 and res.kv_pages_leaked == 0 and res.preemptions == 0


def test_replay_preempts_on_a_small_pool_and_still_finishes_everything():
    reqs = _requests(32, seed=1, arrivals=True)
    for order in ("fcfs", "priority", make_policy("dwise")):
        res = replay_vllm(reqs, order, max_num_seqs=8, kv_pages=120)
        assert res.preemptions > 0
        assert len(res.completion) == 32 and res.kv_pages_leaked == 0


def test_a_burst_shares_one_fcfs_horizon_set_at_the_first_ranking():
    rk = IterationRanker(
        make_policy("dwise-uncapped", starvation_slack=1.0), prompt_chunk=100, slots=2
    )
    for i, est in enumerate((10.0, 20.0, 30.0)):
        rk.add(f"r{i}", prompt_tokens=50, estimate=est)  # P = 1 each
    rk.order(["r0", "r1", "r2"])
    horizon = rk.table.fcfs_rounds[[rk.row(f"r{i}") for i in range(3)]]
    # (11 + 21 + 31) / 2 slots = 31.5 for the burst; r2's own work (31) is less
    assert horizon.tolist() == [31.5, 31.5, 31.5]
