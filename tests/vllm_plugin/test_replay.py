"""The simulator's vLLM round model predicts what vLLM's real scheduler did, run by run."""

from __future__ import annotations

import random
import statistics

import pytest
from vllm_harness import CANVAS, DWISE_CLS, KV_BLOCK, dwise_env, make_scheduler, serve

from dwise_predict.runtime import make_policy
from dwise_predict.runtime.vllm_replay import ReplayRequest, replay_vllm


@pytest.mark.parametrize("pages", [4096, 48])  # roomy, and short enough to preempt
def test_replay_matches_the_served_runs(model_dir, traces, pages):
    rng = random.Random(3)
    arrivals = {t.rid: rng.randrange(0, 120) for t in traces}
    runs = {
        "fcfs": (make_scheduler(model_dir, max_num_seqs=4, num_blocks=pages), "fcfs"),
        "dwise": (
            make_scheduler(
                model_dir,
                scheduler_cls=DWISE_CLS,
                max_num_seqs=4,
                num_blocks=pages,
                env=dwise_env(),
            ),
            make_policy("dwise"),
        ),
    }
    for name, (sched, order) in runs.items():
        served = serve(sched, traces, arrivals=arrivals)
        est = getattr(sched, "dwise", None)
        reqs = [
            ReplayRequest(
                t.rid,
                len(t.prompt_ids),
                tuple(t.rounds_per_block),
                arrivals[t.rid],
                0.0 if est is None else _estimate(sched, t),
            )
            for t in traces
        ]
        sim = replay_vllm(
            reqs,
            order,
            max_num_seqs=4,
            canvas=CANVAS,
            max_num_batched_tokens=4096,
            kv_pages=pages,
            page_tokens=KV_BLOCK,
        )
        m_served = statistics.mean(served.completion.values())
        m_sim = statistics.mean(sim.completion.values())
        assert abs(m_sim - m_served) <= 0.1 * m_served, (name, pages, m_sim, m_served)
        assert len(sim.completion) == len(traces) and sim.kv_pages_leaked == 0
        if pages == 4096:  # no preemption: the same iteration model, request by request
            assert sim.completion == served.completion, name


def _estimate(sched, t) -> float:
    from vllm_harness import make_request

    st = sched.dwise
    return float(st.bundle.predict_admission_one(st.features(make_request(t))))
