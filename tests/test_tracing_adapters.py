"""DiffusionGemma (native loop) and the generic HF mask-predict adapter on tiny random models,
offline."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _tracing_helpers import (  # noqa: F401 (autouse fixture)
    PROMPTS,
    make_bert_mask_predict,
    make_diffusion_gemma,
    make_tiny_bd,
    one_torch_thread,
)
from dwise_predict.tracing.adapters import load_adapter
from dwise_predict.tracing.adapters.diffusion_gemma import DiffusionGemmaAdapter
from dwise_predict.tracing.adapters.hf_mask_predict import (
    HFMaskPredictAdapter,
    prefix_attention_mask,
)
from dwise_predict.tracing.adapters.tiny_bd import TinyBDAdapter
from dwise_predict.tracing.engine import DecodeConfig, DecodeRequest, decode

from dwise_predict.errors import ConfigError, ModelError


@pytest.fixture(scope="module")
def dg(tmp_path_factory):
    return load_adapter(
        make_diffusion_gemma(
            tmp_path_factory.mktemp("dg") / "dg", canvas_length=8, max_denoising_steps=6
        )
    )


@pytest.fixture(scope="module")
def bert_path(tmp_path_factory):
    return make_bert_mask_predict(tmp_path_factory.mktemp("bert") / "bert")


def test_load_adapter_resolves_folders_and_refuses_unknown(tmp_path, dg, bert_path):
    assert isinstance(dg, DiffusionGemmaAdapter)
    assert isinstance(load_adapter(make_tiny_bd(tmp_path / "t")), TinyBDAdapter)
    assert isinstance(
        load_adapter(f"hf-mask-predict:{bert_path}", block_size=4), HFMaskPredictAdapter
    )
    with pytest.raises(ModelError, match="unknown model 'no-such-model'.*accepted: 'tiny-bd'"):
        load_adapter("no-such-model")
    with pytest.raises(ModelError, match="type 'bert'.*hf-mask-predict:"):
        load_adapter(bert_path)


def test_diffusion_gemma_hidden_is_its_own_first_step_output(dg):
    ids = dg.encode_prompt("hello there")
    res = dg.generate_traced(ids, max_new_tokens=8, threshold=0.1, seed=7, request_id="a")
    # independent forward: the same first canvas (the loop's first random draw under the seed), no
    # generate loop
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        canvas = torch.randint(0, dg.info.vocab_size, (1, 8))
    with torch.no_grad():
        out = dg.model(
            input_ids=torch.tensor([ids]), decoder_input_ids=canvas, output_hidden_states=True
        )
        expect = dg.model.model.decoder.norm(out.hidden_states[-1])[0].mean(0).numpy()
    np.testing.assert_allclose(res.first_round_hidden, expect, rtol=1e-4, atol=1e-5)


def test_diffusion_gemma_steps_per_block_and_seed(dg):
    ids = dg.encode_prompt("tell me a story")
    a = dg.generate_traced(ids, max_new_tokens=20, threshold=0.1, seed=3, request_id="s")
    b = dg.generate_traced(ids, max_new_tokens=20, threshold=0.1, seed=3, request_id="s")
    c = dg.generate_traced(ids, max_new_tokens=20, threshold=0.1, seed=4, request_id="s")
    assert a.output_ids == b.output_ids and a.rounds_per_block == b.rounds_per_block
    assert a.output_ids != c.output_ids  # the seed really drives its sampler
    assert a.output_blocks == 3 and all(
        1 <= r <= 6 for r in a.rounds_per_block
    )  # ceil(20/8) canvases
    assert len(a.round_wall_ms) == a.total_rounds and len(a.output_ids) <= 20
    with pytest.raises(ConfigError, match="canvases of 8"):
        dg.resolve_block_size(4)
    with pytest.raises(ConfigError, match="entropy bound"):
        dg.decoding_threshold(0.0)


def test_prefix_mask_block_causal_and_padding():
    m = prefix_attention_mask([[0, 0, 1, 1, 2], [0, 1]], [5, 2], 5, "block_causal")[:, 0]
    assert m[0, 0].tolist() == [True, True, False, False, False]
    assert m[0, 3].tolist() == [True, True, True, True, False]
    assert m[0, 4].tolist() == [True, True, True, True, True]
    assert m[1, 1].tolist() == [True, True, False, False, False]
    assert m[1, 3].tolist() == [False, False, False, True, False]  # padding query sees only itself


def test_hf_mask_predict_hidden_and_batching(bert_path):
    bs = 4
    ad = load_adapter(f"hf-mask-predict:{bert_path}", block_size=bs)
    reqs = [DecodeRequest(f"r{i}", ad.encode_prompt(p)) for i, p in enumerate(PROMPTS[:8])]
    cfg = DecodeConfig(block_size=bs, threshold=0.6, max_new_tokens=12)
    one = {r.request_id: r for r in decode(ad, reqs, cfg, batch_size=1)}
    eight = {r.request_id: r for r in decode(ad, reqs, cfg, batch_size=8)}
    rounds = [x for r in one.values() for x in r.rounds_per_block]
    assert all(1 <= x <= bs for x in rounds) and len(set(rounds)) >= 2
    for q in reqs:
        a, b = one[q.request_id], eight[q.request_id]
        assert a.rounds_per_block == b.rounds_per_block and a.output_ids == b.output_ids
        np.testing.assert_allclose(a.first_round_hidden, b.first_round_hidden, rtol=1e-4, atol=1e-5)
        # independent forward: prompt chunks block-causal, then the fully masked first block
        p = len(q.prompt_ids)
        ids = torch.tensor([q.prompt_ids + [ad.info.mask_token_id] * bs])
        chunk = torch.cat([torch.arange(p) // bs, torch.full((bs,), 10**6)])
        mask = (chunk[None, :] <= chunk[:, None])[None, None]
        with torch.no_grad():
            out = ad.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=torch.arange(p + bs)[None],
                output_hidden_states=True,
            )
        np.testing.assert_allclose(
            a.first_round_hidden, out.hidden_states[-1][0, p:].mean(0).numpy(), rtol=1e-4, atol=1e-5
        )


def test_hf_mask_predict_needs_a_block_size(bert_path):
    ad = load_adapter(f"hf-mask-predict:{bert_path}")
    with pytest.raises(ConfigError, match="--block-size"):
        ad.resolve_block_size(None)
    assert ad.info.mask_token_id == 1 and ad.info.eos_token_ids == (2,)


def test_diffusion_gemma_under_low_confidence_and_joint_threshold(dg, tmp_path):
    """The engine's decoders drive DiffusionGemma's encoder and decoder from all-mask canvases."""
    from dwise_predict.tracing.runner import trace_workload

    from dwise_predict.traces import activity_matrix, read_trace_fingerprint, read_traces

    records = [
        {"id": f"r{i}", "category": "chat", "source": "t", "prompt": p}
        for i, p in enumerate(PROMPTS[:3])
    ]
    rounds = {}
    for decoding in ("low_confidence", "joint_threshold"):
        out = tmp_path / decoding
        trace_workload(dg, records, out, max_new_tokens=16, decoding=decoding)
        fp = read_trace_fingerprint(out)
        assert fp.decoding == decoding
        assert fp.extra["decoder_mask_token_id"] == dg.tokenizer.mask_token_id
        table = read_traces(out)
        assert set(table.column("max_steps_per_block").to_pylist()) == {fp.max_steps_per_block}
        rows = table.to_pylist()
        for r in rows:
            assert r["output_blocks"] == 2 and len(r["first_round_hidden"]) == 32
            assert len(r["round_wall_ms"]) == r["total_rounds"]
            a = activity_matrix(r["rounds_per_block"], fp.max_steps_per_block)
            assert a.sum() == r["total_rounds"]
        rounds[decoding] = [k for r in rows for k in r["rounds_per_block"]]
    assert read_trace_fingerprint(tmp_path / "low_confidence").max_steps_per_block == 8
    assert read_trace_fingerprint(tmp_path / "joint_threshold").max_steps_per_block == 8 + 16 + 1
    assert all(1 <= k <= 8 for k in rounds["low_confidence"])
    assert all(2 <= k <= 25 for k in rounds["joint_threshold"])
    assert max(rounds["joint_threshold"]) > 8
    again = tmp_path / "again"
    trace_workload(dg, records, again, max_new_tokens=16, decoding="joint_threshold")
    assert (
        read_traces(again).column("rounds_per_block").to_pylist()
        == read_traces(tmp_path / "joint_threshold").column("rounds_per_block").to_pylist()
    )


def test_diffusion_gemma_may_take_more_steps_than_its_canvas(tmp_path):
    """Its sampler renoises, so S = max_denoising_steps, which may exceed the canvas length."""
    from dwise_predict.tracing.runner import trace_workload

    from dwise_predict.traces import read_traces

    dg12 = load_adapter(
        make_diffusion_gemma(tmp_path / "dg12", canvas_length=4, max_denoising_steps=12)
    )
    records = [{"id": "a", "category": "chat", "source": "t", "prompt": "hello"}]
    trace_workload(dg12, records, tmp_path / "o", max_new_tokens=8, seed=1)
    row = read_traces(tmp_path / "o").to_pylist()[0]
    assert row["block_size"] == 4 and row["max_steps_per_block"] == 12
    assert all(1 <= k <= 12 for k in row["rounds_per_block"])
