"""Every way a request ends inside vLLM's real scheduler leaves both sides consistent, no KV lost.

finish, abort while waiting, abort while running (mid-block), preemption on KV shortage, and a
randomized run with arrivals over time, aborts and a small KV pool. After each: vLLM holds no
request, every KV block is free again (and, every iteration, free + held = the pool), and the
DWISE state holds exactly the requests vLLM holds.
"""

from __future__ import annotations

import random

from vllm_harness import DWISE_CLS, dwise_env, make_scheduler, serve


def _dwise(model_dir, **kw):
    return make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=dwise_env(), **kw)


def _agree(sched) -> None:
    """The DWISE state ranks exactly the live requests vLLM holds."""
    live = {r for r, req in sched.requests.items() if not req.is_finished()}
    assert set(sched.dwise.ranker.ids()) == live


def _clean(sched, res) -> None:
    assert not sched.requests and not sched.running and not sched.waiting
    assert len(sched.dwise.ranker) == 0
    assert res.kv_blocks_leaked == 0
    assert res.kv_balanced_every_iteration


def test_every_request_finishes_and_frees_its_kv(model_dir, traces):
    sched = _dwise(model_dir, max_num_seqs=4)
    res = serve(sched, traces, before_iteration=lambda it, s, r: _agree(s) or [])
    assert len(res.completion) == len(traces)
    assert sched.dwise.stats.finished == len(traces) and sched.dwise.stats.aborted == 0
    _clean(sched, res)


def test_abort_while_waiting(model_dir, traces):
    sched = _dwise(model_dir, max_num_seqs=2)
    picked: list[str] = []

    def abort(it, s, runner):
        _agree(s)
        if it == 3:
            picked.extend(r.request_id for r in list(s.waiting)[-3:])
            assert all(r not in {q.request_id for q in s.running} for r in picked)
            return list(picked)
        return []

    res = serve(sched, traces, before_iteration=abort)
    assert len(picked) == 3 and sorted(res.aborted) == sorted(picked)
    assert set(res.completion) == {t.rid for t in traces} - set(picked)
    assert sched.dwise.stats.aborted == 3
    _clean(sched, res)


def test_abort_while_running_mid_block(model_dir, traces):
    sched = _dwise(model_dir, max_num_seqs=4)
    picked: list[str] = []

    def abort(it, s, runner):
        _agree(s)
        if picked:
            return []
        mid = [r.request_id for r in s.running if runner.steps.get(r.request_id, 0) > 0]
        if mid:  # a request with denoising steps spent on a block it has not committed
            picked.append(mid[0])
            return [mid[0]]
        return []

    res = serve(sched, traces, before_iteration=abort)
    assert res.aborted == picked and len(picked) == 1
    assert picked[0] not in res.completion
    assert len(res.completion) == len(traces) - 1
    _clean(sched, res)


def test_preemption_on_kv_shortage_loses_only_the_block_in_progress(model_dir, traces):
    roomy = serve(make_scheduler(model_dir, max_num_seqs=6), traces)
    # 48 pages of 16 tokens: six residents of ~150-token prompts with 256-token outputs do not
    # fit, so vLLM preempts (the last running request: under DWISE the most work left)
    sched = _dwise(model_dir, max_num_seqs=6, num_blocks=48)
    victims: list[tuple[str, bool]] = []
    before = sched.schedule

    def schedule(*a, **kw):
        keys = {}
        out = before(*a, **kw)
        for rid in out.preempted_req_ids or ():
            run = [r.request_id for r in sched.running] + [rid]
            keys = dict(zip(run, sched.dwise.ranker.keys(run).tolist()))
            victims.append((rid, keys[rid] == max(keys.values())))
        return out

    sched.schedule = schedule
    res = serve(sched, traces, before_iteration=lambda it, s, r: _agree(s) or [])
    assert res.preemptions > 0 and sched.dwise.stats.preemptions == res.preemptions
    assert len(res.completion) == len(traces)
    # a preempted request recomputes its context and redoes its block: same tokens in the end
    assert res.output_tokens == roomy.output_tokens
    assert sched.dwise.ranker.preemptions == res.preemptions
    assert victims and sum(top for _, top in victims) >= len(victims) // 2
    _clean(sched, res)


def test_randomized_arrivals_aborts_and_preemptions(model_dir, traces):
    roomy = serve(make_scheduler(model_dir, max_num_seqs=4), traces)
    for seed in (0, 1):
        rng = random.Random(seed)
        t = 0.0
        arrivals = {}
        for tr in rng.sample(traces, len(traces)):
            t += rng.expovariate(1 / 12.0)  # a request every 12 iterations on average
            arrivals[tr.rid] = int(t)
        sched = _dwise(model_dir, max_num_seqs=4, num_blocks=40)
        aborted: list[str] = []

        def chaos(it, s, runner, rng=rng, aborted=aborted):
            _agree(s)
            live = sorted(s.requests)
            if live and rng.random() < 0.02:
                aborted.append(rng.choice(live))
                return [aborted[-1]]
            return []

        res = serve(sched, traces, arrivals=arrivals, before_iteration=chaos)
        assert res.aborted == aborted
        done = {tr.rid for tr in traces} - set(aborted)
        assert set(res.completion) == done
        assert all(res.output_tokens[r] == roomy.output_tokens[r] for r in done)
        assert res.preemptions > 0
        _clean(sched, res)
