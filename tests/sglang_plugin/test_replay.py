"""The simulator replays a run served in SGLang 0.5.23's real loop round by round.

Requests arrive over about 1,500 rounds, as the SGLang ladder's Poisson regimes
have them; the simulator is given each request's rounds per block and estimates as the
plugin recorded them, the same arrival rounds (round k at k ms, 1 ms rounds) and SGLang's
KV pool, and must form every round's batch as SGLang ran it: the same requests, each on a
prompt block or not. A replay that is only close on the mean can hide a different schedule.
"""

from __future__ import annotations

import numpy as np
import pytest
from harness import (
    RequestSpec,
    ScriptedRunner,
    environ,
    plugin_env,
    remove_hooks,
    serve,
)

from dwise_predict.runtime import (
    Arrivals,
    RoundTimeModel,
    SimRequest,
    Workload,
    make_policy,
    simulate,
)
from dwise_predict.runtime import scheduler as core

B, K, BLOCK = 2, 4, 32


def _requests(n: int) -> tuple[list[RequestSpec], dict[str, int], list[int]]:
    rng = np.random.default_rng(7)
    specs, lengths = [], {}
    for i in range(n):
        prompt = int(rng.integers(10, 200))
        ids = [10 + (7 * j + i) % 200 for j in range(prompt)]
        specs.append(RequestSpec(f"r{i}", "", ids, 160))
        lengths[f"r{i}"] = int(rng.integers(8, 150))
    # a few at round 0, then one every ~35 rounds: the server stays busy past round 1,000
    gaps = np.r_[np.zeros(4), rng.exponential(35.0, n - 4)]
    return specs, lengths, np.floor(np.cumsum(gaps)).astype(int).tolist()


def _serve(policy: str, specs, lengths, arrive):
    from sglang.srt.plugins import load_plugins

    from dwise_predict.sglang.config import load_config
    from dwise_predict.sglang.plugin import attach

    seen = {}

    def keep(sch) -> None:
        seen["state"] = attach(sch, load_config())
        seen["state"].keep_finished = True

    remove_hooks()
    env = {**plugin_env("tiny-bd", slots=B, k=K, policy=policy), "SGLANG_PLUGINS": "dwise"}
    with environ(env):
        load_plugins()
        res, _ = serve(
            specs,
            max_running_requests=B * K,
            runner=ScriptedRunner(lengths, block_size=BLOCK),
            on_scheduler=keep,
            arrival_rounds=arrive,
        )
    remove_hooks()
    return res, {str(rid): tr for rid, tr in seen["state"].finished}


def _replay(policy: str, specs, tracks, arrive, kv_pool: int, monkeypatch):
    reqs = [
        SimRequest(
            s.rid,
            tracks[s.rid].prompt_tokens // BLOCK,
            tracks[s.rid].prompt_tokens,
            tuple(r + 1 for r in tracks[s.rid].rounds_per_block),  # SGLang's r + 1 forwards
            tracks[s.rid].output_budget,
            BLOCK,
            admission_estimate=tracks[s.rid].admission,
            refined_estimate=tracks[s.rid].refined,
        )
        for s in specs
    ]
    wl = Workload.from_requests(reqs)
    plans = []
    plan_round = core.Scheduler.plan_round

    def recorded(self):
        plan = plan_round(self)
        rows = plan.rows.tolist()
        plans.append(sorted(zip((str(self.table.ids[r]) for r in rows), plan.prompt.tolist())))
        return plan

    monkeypatch.setattr(core.Scheduler, "plan_round", recorded)
    simulate(
        wl,
        make_policy(policy),
        arrivals=Arrivals(np.arange(wl.n), np.asarray(arrive, dtype=np.float64) / 1e3),
        slots=B,
        k=K,
        round_time=RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0),
        kv_pool_tokens=kv_pool,
    )
    return plans


@pytest.mark.parametrize("policy", ["fcfs-mixed", "dwise"])
def test_the_simulator_forms_every_served_round_as_sglang_ran_it(policy, monkeypatch):
    specs, lengths, arrive = _requests(48)
    res, tracks = _serve(policy, specs, lengths, arrive)
    assert res.rounds > 1500 and len(res.completion_round) == len(specs)
    served = [sorted(zip(ids, (bool(p) for p in pre))) for _, ids, pre in res.batches]
    replayed = _replay(policy, specs, tracks, arrive, res.kv_free_before, monkeypatch)
    n = min(len(served), len(replayed))
    first_diff = next((i for i in range(n) if served[i] != replayed[i]), n)
    assert len(replayed) == len(served) and first_diff == n, (
        f"batch {first_diff} differs: served {served[first_diff : first_diff + 1]}, "
        f"replayed {replayed[first_diff : first_diff + 1]}"
    )
