"""DWISE's order inside vLLM's real diffusion scheduler: what changes, and what must not."""

from __future__ import annotations

import math
import statistics

from vllm_harness import (
    DWISE_CLS,
    EOS,
    CanvasRunner,
    dwise_env,
    make_request,
    make_scheduler,
    serve,
)


def _stock(model_dir, traces, **kw):
    return serve(make_scheduler(model_dir, max_num_seqs=4, **kw), traces)


def test_outputs_are_vllms_own_and_only_the_order_changes(model_dir, traces):
    stock = _stock(model_dir, traces)
    sched = make_scheduler(model_dir, scheduler_cls=DWISE_CLS, max_num_seqs=4, env=dwise_env())
    dwise = serve(sched, traces)
    n = len(traces)
    assert len(stock.completion) == len(dwise.completion) == n
    for t in traces:
        out = dwise.output_tokens[t.rid]
        # the tokens tiny-bd committed, up to its EOS (vLLM's stop), in every run alike
        assert out == stock.output_tokens[t.rid] == t.tokens[: len(out)]
        assert dwise.finish_reason[t.rid] == stock.finish_reason[t.rid]
        assert (EOS in out) == t.finished_eos
    assert dwise.finish_order != stock.finish_order
    mean_stock = statistics.mean(stock.completion.values())
    mean_dwise = statistics.mean(dwise.completion.values())
    assert mean_dwise < 0.9 * mean_stock, (mean_dwise, mean_stock)
    # the same work was done: every denoising step and commit the traces hold, nothing lost
    assert sched.dwise.stats.denoise_steps == sum(t.total_rounds for t in traces)
    assert sched.dwise.stats.commits == sum(len(t.rounds_per_block) for t in traces)
    assert (dwise.kv_blocks_leaked, stock.kv_blocks_leaked) == (0, 0)


def test_policy_fcfs_through_the_subclass_reproduces_vllms_own_order(model_dir, traces):
    stock = _stock(model_dir, traces)
    sched = make_scheduler(
        model_dir, scheduler_cls=DWISE_CLS, max_num_seqs=4, env=dwise_env(policy="fcfs")
    )
    same = serve(sched, traces)
    assert same.finish_order == stock.finish_order
    assert same.completion == stock.completion


def test_admission_takes_the_smallest_prompt_work_plus_estimate(model_dir, traces):
    sched = make_scheduler(model_dir, scheduler_cls=DWISE_CLS, max_num_seqs=4, env=dwise_env())
    for t in traces:
        sched.add_request(make_request(t))
    st = sched.dwise
    # r̂ is the bundle's admission estimate from the prompt's features; P the prompt's
    # iterations (chunks of max_num_batched_tokens, 4096 here: one for these prompts)
    key = {t.rid: math.ceil(len(t.prompt_ids) / 4096) + st.estimates[t.rid] for t in traces}
    assert len(set(st.estimates.values())) > 4  # estimates differ between requests
    out = sched.schedule()
    admitted = set(out.num_scheduled_tokens)
    assert admitted == set(sorted(key, key=lambda r: key[r])[:4])
    # vLLM's waiting queue and running list are in key order when schedule() reads them
    CanvasRunner(traces).run(sched, out)
    st.order(sched)
    waiting = [r.request_id for r in sched.waiting]
    assert [key[r] for r in waiting] == sorted(key[r] for r in waiting)


def test_r_hat_counts_down_by_the_denoising_steps_of_each_request(model_dir, traces):
    sched = make_scheduler(model_dir, scheduler_cls=DWISE_CLS, max_num_seqs=4, env=dwise_env())
    runner = CanvasRunner(traces)
    by_id = {t.rid: t for t in traces}
    for t in traces:
        sched.add_request(make_request(t))
    st, checked = sched.dwise, 0
    for _ in range(40):
        runner.run(sched, sched.schedule())
        for req in sched.running:
            rid = req.request_id
            t = by_id[rid]
            b = runner.block.get(rid, 0)
            steps = sum(t.rounds_per_block[:b]) + runner.steps.get(rid, 0)
            row = st.ranker.row(rid)
            assert st.ranker.table.done_rounds[row] == steps
            assert st.ranker.table.r_hat[row] == max(st.estimates[rid] - steps, 0.0)
            checked += steps > 0
    assert checked > 20
