"""Block layouts (``--block-alignment``): the engine on a real (small, random) tiny-bd lays
blocks out at absolute positions as SGLang's dLLM loop does, or response-aligned; the layout is
recorded in the fingerprint, and a bundle of the other layout is refused."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from _tracing_helpers import PROMPTS, make_tiny_bd, one_torch_thread, workload_records  # noqa: F401 (autouse fixture)
from dwise_predict.tracing.adapters.tiny_bd import load_tiny_bd
from dwise_predict.tracing.engine import DecodeConfig, DecodeRequest, decode
from dwise_predict.tracing.runner import trace_workload

from dwise_predict.bundle import load_bundle
from dwise_predict.cli import main
from dwise_predict.errors import ConfigError, FingerprintMismatchError, TraceError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.runtime import FCFS, Workload, requests_from_traces, simulate
from dwise_predict.trace_writer import TraceWriter
from dwise_predict.traces import (
    activity_matrix,
    first_block_masks,
    prompt_blocks,
    read_trace_fingerprint,
    read_traces,
)

BS = 8
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    return load_tiny_bd(make_tiny_bd(tmp_path_factory.mktemp("m") / "tbd", block_size=BS))


@pytest.fixture(scope="module")
def requests(adapter):
    reqs = [DecodeRequest(f"r{i}", adapter.encode_prompt(p)) for i, p in enumerate(PROMPTS)]
    # exact multiples of the block size (the first output block is all masks) and a prompt
    # shorter than one block (nothing to prefill): real token ids of the tokenizer
    ids = adapter.encode_prompt("a long enough prompt to cut into exact blocks of eight")
    assert len(ids) >= 2 * BS
    reqs += [DecodeRequest("exact16", ids[: 2 * BS]), DecodeRequest("short5", ids[:5])]
    return reqs


def run(adapter, requests, alignment, threshold=1.5, budget=20, batch_size=4):
    cfg = DecodeConfig(
        block_size=BS, threshold=threshold, max_new_tokens=budget, block_alignment=alignment
    )
    return {r.request_id: r for r in decode(adapter, requests, cfg, batch_size=batch_size)}


def test_absolute_layout_first_block_holds_the_prompt_tail(adapter, requests):
    """τ > 1 unmasks one position per round, so rounds per block = masks in the block: the
    first block decodes exactly bs - (L mod bs) tokens and every block ends at a multiple of bs."""
    res = run(adapter, requests, "absolute")
    tails = {len(q.prompt_ids) % BS for q in requests}
    assert len(tails) >= 4 and 0 in tails  # the prompts cover several tail lengths
    for q in requests:
        r, L = res[q.request_id], len(q.prompt_ids)
        masks = first_block_masks(L, BS, "absolute")
        assert masks == BS - L % BS
        assert r.prompt_blocks == L // BS == prompt_blocks(L, BS, "absolute")
        assert r.rounds_per_block[0] == min(masks, 20)  # one round per mask of the first block
        ends = L + np.cumsum(r.rounds_per_block)
        assert np.all(ends[:-1] % BS == 0), (L, r.rounds_per_block)  # absolute block boundaries
        assert len(r.output_ids) == sum(r.rounds_per_block) <= 20
        # prefill rounds: the whole prompt blocks only (none for a prompt under one block)
        assert len(r.round_wall_ms) == L // BS + r.total_rounds
    assert res["exact16"].prompt_blocks == 2 and res["short5"].prompt_blocks == 0
    assert res["short5"].rounds_per_block[0] == 3 and res["exact16"].rounds_per_block[0] == BS


def test_response_layout_is_unchanged(adapter, requests):
    res = run(adapter, requests, "response")
    for q in requests:
        r, L = res[q.request_id], len(q.prompt_ids)
        assert r.prompt_blocks == max(1, -(-L // BS)) == prompt_blocks(L, BS)
        full = [min(BS, 20 - b * BS) for b in range(r.output_blocks)]
        assert r.rounds_per_block == full


def test_layouts_differ_and_absolute_is_deterministic_and_batch_independent(adapter, requests):
    a1 = run(adapter, requests, "absolute", threshold=0.5, budget=32, batch_size=1)
    a8 = run(adapter, requests, "absolute", threshold=0.5, budget=32, batch_size=8)
    again = run(adapter, requests, "absolute", threshold=0.5, budget=32, batch_size=8)
    resp = run(adapter, requests, "response", threshold=0.5, budget=32, batch_size=8)
    for rid in a1:
        assert a1[rid].rounds_per_block == a8[rid].rounds_per_block == again[rid].rounds_per_block
        assert a1[rid].output_ids == a8[rid].output_ids == again[rid].output_ids
        np.testing.assert_allclose(
            a1[rid].first_round_hidden, a8[rid].first_round_hidden, rtol=1e-4, atol=1e-5
        )
    # the layout really changes what the model does (the tail shares the first block)
    differ = sum(a8[rid].output_ids != resp[rid].output_ids for rid in a8 if rid != "exact16")
    assert differ >= len(a8) // 2
    # a prompt of whole blocks lays out the same in both (its first block is all masks)
    assert a8["exact16"].output_ids == resp["exact16"].output_ids
    assert a8["exact16"].rounds_per_block == resp["exact16"].rounds_per_block


def test_absolute_first_round_matches_a_cacheless_forward(adapter, requests):
    """The first round recomputed from scratch: whole prompt blocks block-causal, then one block
    of [prompt tail + masks] attending them and itself; hidden = mean over the mask rows."""
    res = run(adapter, requests, "absolute", threshold=0.0, budget=20)
    model, mask_id = adapter.model, adapter.info.mask_token_id
    for q in requests:
        L = len(q.prompt_ids)
        full = L // BS * BS
        masks = min(BS - L % BS, 20)
        ids = torch.tensor([q.prompt_ids + [mask_id] * masks])
        pos = torch.arange(L + masks)[None]
        seg = torch.cat([torch.arange(full) // BS, torch.full((L - full + masks,), 10**6)])
        mask = (seg[None, :] <= seg[:, None])[None, None]
        with torch.no_grad():
            out = model(ids, pos, mask, None)
        r = res[q.request_id]
        np.testing.assert_allclose(
            r.first_round_hidden, out.hidden[0, L:].mean(0).numpy(), rtol=1e-4, atol=1e-5
        )
        logits = out.logits[0, L:].clone()
        logits[:, mask_id] = float("-inf")
        assert r.output_ids[:masks] == logits.argmax(-1).tolist()  # τ = 0: one round


def test_trace_workload_records_the_layout_and_defaults_to_how_tiny_bd_is_served(adapter, tmp_path):
    recs = workload_records(PROMPTS[:6])
    kw = dict(block_size=BS, max_new_tokens=16, threshold=0.5, batch_size=4, flush_interval_s=None)
    absolute = trace_workload(adapter, recs, tmp_path / "abs", **kw)
    response = trace_workload(adapter, recs, tmp_path / "resp", block_alignment="response", **kw)
    assert absolute.fingerprint.block_alignment == "absolute"  # tiny-bd is served by SGLang
    assert response.fingerprint.block_alignment == "response"
    assert read_trace_fingerprint(tmp_path / "abs").block_alignment == "absolute"
    assert "absolute blocks" in absolute.fingerprint.short()
    for folder, alignment in ((tmp_path / "abs", "absolute"), (tmp_path / "resp", "response")):
        for r in read_traces(folder).to_pylist():  # the reader validates rounds against S
            assert r["prompt_blocks"] == prompt_blocks(r["prompt_tokens"], BS, alignment)
            assert len(r["round_wall_ms"]) == r["prompt_blocks"] + r["total_rounds"]
            assert activity_matrix(r["rounds_per_block"], 8).sum() == r["total_rounds"]
    # the simulator replays either layout: prompt_blocks prefill rounds (0 allowed), then rounds
    for folder in (tmp_path / "abs", tmp_path / "resp"):
        table = read_traces(folder)
        run = simulate(Workload.from_requests(requests_from_traces(table)), FCFS(), slots=4, k=2)
        blocks = np.array(table.column("prompt_blocks").to_pylist())
        assert run.finish_time.size == table.num_rows and np.all(np.isfinite(run.finish_time))
        assert run.round_prompt.sum() == blocks.sum()
        assert run.round_filled.sum() == blocks.sum() + sum(
            table.column("total_rounds").to_pylist()
        )
    assert 0 in read_traces(tmp_path / "abs").column("prompt_blocks").to_pylist()
    # resume keeps one layout per folder; a folder traced before the field says so
    with pytest.raises(TraceError, match=r"differs in block_alignment\)"):
        trace_workload(
            adapter, recs, tmp_path / "abs", block_alignment="response", resume=True, **kw
        )
    legacy_fp = dataclasses.replace(response.fingerprint, block_alignment=None)
    with TraceWriter(tmp_path / "legacy", legacy_fp, flush_interval_s=None) as w:
        for row in read_traces(tmp_path / "resp").to_pylist():
            w.add(row)
    assert read_trace_fingerprint(tmp_path / "legacy").alignment == "response"
    with pytest.raises(TraceError, match="predate block_alignment"):
        trace_workload(
            adapter, recs, tmp_path / "legacy", block_alignment="response", resume=True, **kw
        )
    # a layout the engine does not know is refused before anything is traced
    with pytest.raises(ConfigError, match="unknown block alignment 'aligned'"):
        trace_workload(adapter, recs, tmp_path / "bad", block_alignment="aligned", **kw)


def test_cli_flag_picks_the_layout(tmp_path, capsys):
    model = make_tiny_bd(tmp_path / "tbd", block_size=BS)
    wl = tmp_path / "eval.jsonl"
    wl.write_text("".join(json.dumps(r) + "\n" for r in workload_records(PROMPTS[:4])))
    base = ["trace", "--model", str(model), "--workload", str(wl), "--max-new-tokens", "8", "-q"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    assert main([*base, "--out", str(tmp_path / "r"), "--block-alignment", "response"]) == 0
    assert read_trace_fingerprint(tmp_path / "a").block_alignment == "absolute"
    assert read_trace_fingerprint(tmp_path / "r").block_alignment == "response"
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "x"), "--block-alignment", "centered"])
    assert "invalid choice: 'centered'" in capsys.readouterr().err


def test_fingerprint_records_the_layout_and_reads_old_ones_as_response():
    old = {"model_id": "tiny-bd", "block_size": 32, "threshold": 0.95}
    legacy = ModelFingerprint.from_dict(old)
    assert legacy.block_alignment is None and legacy.alignment == "response"
    server = ModelFingerprint.from_dict({**old, "block_alignment": "absolute"})
    traced = ModelFingerprint.from_dict(json.loads(server.to_json()))
    assert traced == server and traced.alignment == "absolute"
    resp = dataclasses.replace(server, block_alignment="response")
    assert resp.mismatches(server) == ["block_alignment"]
    assert legacy.mismatches(server) == []  # accepted, with a note naming both layouts
    note = legacy.legacy_alignment_note(server)
    assert note is not None and "'response'" in note and "'absolute'" in note
    assert legacy.legacy_alignment_note(resp) is None and server.legacy_alignment_note(resp) is None
    with pytest.raises(ConfigError, match="unknown block alignment 'diagonal'"):
        ModelFingerprint(model_id="m", block_size=32, threshold=0.9, block_alignment="diagonal")
    assert prompt_blocks(np.array([0, 5, 32, 33]), 32, "absolute").tolist() == [0, 0, 1, 1]
    assert prompt_blocks(np.array([0, 5, 32, 33]), 32, "response").tolist() == [1, 1, 1, 2]
    assert [first_block_masks(n, 32, "absolute") for n in (5, 32, 33)] == [27, 32, 31]


def test_bundle_check_refuses_the_other_layout_and_warns_on_a_legacy_bundle(caplog):
    """The shipped-era tiny-bd bundle (a read-only fixture) predates block_alignment."""
    legacy = load_bundle(REPO / "tests" / "fixtures" / "tiny-bd-v1")
    assert legacy.fingerprint.block_alignment is None
    server = dataclasses.replace(legacy.fingerprint, block_alignment="absolute")
    with caplog.at_level(logging.WARNING, logger="dwise_predict.bundle.bundle"):
        assert legacy.check(server) == []
    assert "predates block_alignment" in caplog.text and "'absolute'" in caplog.text
    traced = dataclasses.replace(
        legacy, fingerprint=dataclasses.replace(legacy.fingerprint, block_alignment="response")
    )
    with pytest.raises(FingerprintMismatchError) as e:
        traced.check(server)
    msg = str(e.value)
    assert "block_alignment: 'response' vs 'absolute'" in msg
    assert "response blocks" in msg and "absolute blocks" in msg and "allow_mismatch" in msg
    with pytest.warns(UserWarning, match="block_alignment"):
        assert traced.check(server, allow_mismatch=True) == ["block_alignment"]
    # m, the prompt blocks a cost is priced with, follows the bundle's layout
    assert traced.prompt_blocks(["x", "y"], prompt_tokens=[40, 64]).tolist() == [2, 2]
    absolute = dataclasses.replace(traced, fingerprint=server)
    assert absolute.prompt_blocks(["x", "y"], prompt_tokens=[40, 64]).tolist() == [1, 2]


def test_diffusion_gemma_is_response_aligned_only(tmp_path):
    """Its encoder reads the context in a pass of its own and each canvas starts right after
    the prompt (as in SGLang's Gemma4Renoise), so the absolute layout does not exist for it."""
    from _tracing_helpers import make_diffusion_gemma
    from dwise_predict.tracing.adapters import load_adapter

    dg = load_adapter(make_diffusion_gemma(tmp_path / "dg"))
    assert dg.resolve_block_alignment(None) == "response"
    fp = dg.fingerprint(block_size=8, threshold=0.5, max_new_tokens=8)
    assert fp.block_alignment == "response"
    with pytest.raises(ConfigError, match="response-aligned only.*--block-alignment absolute"):
        trace_workload(
            dg, workload_records(PROMPTS[:2]), tmp_path / "t", block_alignment="absolute"
        )


def test_hf_mask_predict_absolute_layout_matches_an_independent_forward(tmp_path):
    """The generic adapter (prefix recomputed every round) runs the absolute layout too: batch
    independent, its default, and its first round equals a cacheless forward of [whole prompt
    blocks | prompt tail + masks]."""
    from _tracing_helpers import make_bert_mask_predict
    from dwise_predict.tracing.adapters import load_adapter

    bs = 4
    ad = load_adapter(f"hf-mask-predict:{make_bert_mask_predict(tmp_path / 'bert')}", block_size=bs)
    assert ad.resolve_block_alignment(None) == "absolute"
    reqs = [DecodeRequest(f"r{i}", ad.encode_prompt(p)) for i, p in enumerate(PROMPTS[:8])]
    assert len({len(q.prompt_ids) % bs for q in reqs}) >= 3
    cfg = DecodeConfig(block_size=bs, threshold=0.6, max_new_tokens=12, block_alignment="absolute")
    one = {r.request_id: r for r in decode(ad, reqs, cfg, batch_size=1)}
    eight = {r.request_id: r for r in decode(ad, reqs, cfg, batch_size=8)}
    for q in reqs:
        a, b = one[q.request_id], eight[q.request_id]
        assert a.rounds_per_block == b.rounds_per_block and a.output_ids == b.output_ids
        L = len(q.prompt_ids)
        full, masks = L // bs * bs, bs - L % bs
        assert a.prompt_blocks == L // bs and a.rounds_per_block[0] <= masks
        ids = torch.tensor([q.prompt_ids + [ad.info.mask_token_id] * masks])
        seg = torch.cat([torch.arange(full) // bs, torch.full((L - full + masks,), 10**6)])
        mask = (seg[None, :] <= seg[:, None])[None, None]
        with torch.no_grad():
            out = ad.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=torch.arange(L + masks)[None],
                output_hidden_states=True,
            )
        np.testing.assert_allclose(
            a.first_round_hidden, out.hidden_states[-1][0, L:].mean(0).numpy(), rtol=1e-4, atol=1e-5
        )
