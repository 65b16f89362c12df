"""The decoding engine on a real (small, random) tiny-bd: exact LowConfidence and JointThreshold
properties, and first-round capture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tracing_helpers import PROMPTS, make_tiny_bd, one_torch_thread  # noqa: F401 (autouse fixture)
from dwise_predict.tracing.adapters.tiny_bd import load_tiny_bd
from dwise_predict.tracing.decoders import joint_threshold_step
from dwise_predict.tracing.engine import DecodeConfig, DecodeRequest, decode, unmask_step

from dwise_predict.errors import WorkloadError

BS = 8


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return load_tiny_bd(make_tiny_bd(tmp_path_factory.mktemp("m") / "tbd", block_size=BS))


@pytest.fixture(scope="module")
def requests(adapter):
    return [DecodeRequest(f"r{i}", adapter.encode_prompt(p)) for i, p in enumerate(PROMPTS)]


def run(adapter, requests, threshold, budget=20, batch_size=4, **decoding):
    cfg = DecodeConfig(block_size=BS, threshold=threshold, max_new_tokens=budget, **decoding)
    return {r.request_id: r for r in decode(adapter, requests, cfg, batch_size=batch_size)}


def independent_first_round(adapter, prompt_ids, length):
    """First denoising round recomputed from scratch: one forward over prompt + masked block, no
    cache."""
    model, mask_id = adapter.model, adapter.info.mask_token_id
    p = len(prompt_ids)
    ids = torch.tensor([prompt_ids + [mask_id] * length])
    pos = torch.arange(p + length)[None]
    chunk = torch.cat(
        [torch.arange(p) // BS, torch.full((length,), 10**6)]
    )  # output block sees every chunk
    mask = (chunk[None, :] <= chunk[:, None])[None, None]
    with torch.no_grad():
        out = model(ids, pos, mask, None)
    return out.hidden[0, p:].mean(0).numpy(), out.logits[0, p:]


def test_hidden_is_mean_of_models_own_first_round_output(adapter, requests):
    res = run(adapter, requests, threshold=0.0, budget=20)
    for q in requests[:6]:
        r = res[q.request_id]
        hidden, logits = independent_first_round(adapter, q.prompt_ids, BS)
        assert r.first_round_hidden.shape == (adapter.info.hidden_size,)
        np.testing.assert_allclose(r.first_round_hidden, hidden, rtol=1e-4, atol=1e-5)
        # τ = 0 unmasks the whole first block in round 1: its tokens are the argmax of those logits
        logits[:, adapter.info.mask_token_id] = float("-inf")
        assert r.output_ids[:BS] == logits.argmax(-1).tolist()


def test_threshold_at_most_zero_takes_one_round_per_block(adapter, requests):
    for thr in (0.0, -1.0):
        for r in run(adapter, requests, threshold=thr, budget=20).values():
            assert r.rounds_per_block == [1] * r.output_blocks
            assert r.total_rounds == r.output_blocks


def test_threshold_above_one_takes_block_size_rounds_per_full_block(adapter, requests):
    res = run(adapter, requests, threshold=1.5, budget=20)  # blocks of 8, 8, then 4 (budget cut)
    for r in res.values():
        for b, rounds in enumerate(r.rounds_per_block):
            length = min(BS, 20 - b * BS)
            assert rounds == length
        if r.hit_budget:
            assert r.rounds_per_block == [8, 8, 4]


def test_rounds_per_block_in_range_and_varied(adapter, requests):
    res = run(adapter, requests, threshold=0.5, budget=32)
    all_rounds = [x for r in res.values() for x in r.rounds_per_block]
    assert all(1 <= x <= BS for x in all_rounds)
    assert len(set(all_rounds)) >= 3, all_rounds  # the peaked model really has varied confidence
    for r in res.values():
        assert r.total_rounds == sum(r.rounds_per_block)
        assert r.finished_eos != r.hit_budget
        assert len(r.round_wall_ms) == r.prompt_blocks + r.total_rounds
        if r.hit_budget:
            assert len(r.output_ids) == 32 and 2 not in r.output_ids
        else:  # EOS inside the last finished block, none before it
            assert (
                2 in r.output_ids[-BS:]
                and 2 not in r.output_ids[: len(r.output_ids) - len(r.output_ids[-BS:])]
            )
    assert any(r.finished_eos for r in res.values()) and any(r.hit_budget for r in res.values())


def test_batch_of_eight_equals_one_at_a_time(adapter, requests):
    one = run(adapter, requests, threshold=0.5, budget=32, batch_size=1)
    eight = run(adapter, requests, threshold=0.5, budget=32, batch_size=8)
    assert one.keys() == eight.keys()
    for rid in one:
        a, b = one[rid], eight[rid]
        assert a.rounds_per_block == b.rounds_per_block
        assert a.output_ids == b.output_ids
        assert (a.finished_eos, a.hit_budget, a.prompt_blocks) == (
            b.finished_eos,
            b.hit_budget,
            b.prompt_blocks,
        )
        np.testing.assert_allclose(a.first_round_hidden, b.first_round_hidden, rtol=1e-4, atol=1e-5)


def test_prompt_blocks_and_prefill_rounds(adapter, requests):
    res = run(adapter, requests, threshold=0.0, budget=8)
    for q in requests:
        r = res[q.request_id]
        assert r.prompt_tokens == len(q.prompt_ids)
        assert r.prompt_blocks == -(-len(q.prompt_ids) // BS)
        assert len(r.round_wall_ms) == r.prompt_blocks + 1


def test_unmask_step_threshold_and_at_least_one():
    mask = 1
    logits = torch.zeros((4, 6))
    logits[0, 3], logits[1, 4], logits[3, 2] = 10.0, 1.0, 3.0  # very sure, less sure, flat (row 2)
    block = torch.tensor([mask, mask, mask, 7])  # position 3 already decided
    probs = (
        torch.softmax(torch.where(torch.arange(6) == mask, float("-inf"), logits), -1)
        .max(-1)
        .values
    )
    new = unmask_step(logits, block, threshold=0.9, mask_id=mask)
    assert probs[0] >= 0.9 > probs[1] > probs[2]
    assert new.tolist() == [3, mask, mask, 7]
    only_one = unmask_step(logits, block, threshold=1.01, mask_id=mask)
    assert only_one.tolist() == [3, mask, mask, 7]  # the single most confident masked position
    nxt = unmask_step(logits, only_one, threshold=1.01, mask_id=mask)
    assert nxt.tolist() == [3, 4, mask, 7]
    allm = torch.full((3,), mask)
    assert unmask_step(torch.zeros(3, 6), allm, threshold=0.0, mask_id=mask).tolist() == [0, 0, 0]


def test_bad_requests_are_refused_before_decoding(adapter, tmp_path):
    cfg = DecodeConfig(block_size=BS, threshold=0.5, max_new_tokens=16)
    with pytest.raises(WorkloadError, match="empty prompt"):
        list(decode(adapter, [DecodeRequest("e", [])], cfg))
    small = load_tiny_bd(make_tiny_bd(tmp_path / "ctx", block_size=BS, max_position=64))
    long_ids = small.encode_prompt("x" * 100)
    with pytest.raises(WorkloadError, match="exceeds the model's context of 64"):
        list(
            decode(
                small,
                [DecodeRequest("ok", small.encode_prompt("hi")), DecodeRequest("long", long_ids)],
                cfg,
            )
        )


def test_joint_threshold_step_unmasks_edits_and_finishes_like_sglang():
    mask = 1
    logits = torch.zeros((4, 6))
    logits[0, 3], logits[1, 4], logits[3, 2] = 10.0, 1.0, 10.0  # sure, unsure, flat, sure of 2
    block = torch.tensor([mask, mask, mask, 7])  # position 3 holds 7, the model prefers 2
    kw = dict(mask_id=mask, threshold=0.5, edit_threshold=0.0, max_post_edit_steps=2)
    new, post, done = joint_threshold_step(logits, block, 0, **kw)
    assert new.tolist() == [3, mask, mask, 2] and (post, done) == (0, False)  # M2T + a T2T edit
    strict = dict(kw, edit_threshold=0.99999)  # position 3's edit is not sure enough
    assert joint_threshold_step(logits, block, 0, **strict)[0].tolist() == [3, mask, mask, 7]
    forced, _, _ = joint_threshold_step(logits, torch.tensor([3, mask, mask, 2]), 0, **kw)
    assert forced.tolist() == [3, 4, mask, 2]  # nothing above 0.5: the most confident mask
    full = torch.tensor([3, 4, 0, 2])  # no mask left, and the argmax everywhere: nothing changes
    assert joint_threshold_step(logits, full, 0, **kw) == (full, 1, True)
    edit = torch.tensor([3, 4, 0, 7])  # no mask left, one edit: a post-edit step
    again, post, done = joint_threshold_step(logits, edit, 0, **kw)
    assert again.tolist() == [3, 4, 0, 2] and (post, done) == (1, False)
    spent = joint_threshold_step(logits, edit, 2, **kw)  # a third post-edit step exceeds 2
    assert spent[0].tolist() == edit.tolist() and spent[1:] == (3, True)


def test_joint_threshold_blocks_take_two_to_s_rounds_and_can_exceed_block_size(adapter, requests):
    cfg = DecodeConfig(block_size=BS, threshold=0.5, max_new_tokens=24, decoding="joint_threshold")
    assert cfg.max_steps_per_block == BS + 16 + 1
    res = run(adapter, requests, 0.5, budget=24, decoding="joint_threshold")
    rounds = [k for r in res.values() for k in r.rounds_per_block]
    assert min(rounds) >= 2 and max(rounds) <= cfg.max_steps_per_block
    assert max(rounds) > BS  # an edited block outlasts its block size: why S is not block_size
    one_by_one = run(adapter, requests, 0.5, budget=24, batch_size=1, decoding="joint_threshold")
    assert {k: v.rounds_per_block for k, v in res.items()} == {
        k: v.rounds_per_block for k, v in one_by_one.items()
    }
    lc = run(adapter, requests, 0.5, budget=24)
    assert max(k for r in lc.values() for k in r.rounds_per_block) <= BS
