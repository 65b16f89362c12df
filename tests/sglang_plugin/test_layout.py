"""Offline traces laid out as SGLang runs them (``--block-alignment absolute``), checked against
SGLang 0.5.23's real dLLM scheduler serving tiny-bd on CPU; and the plugin's refusal of a bundle
traced in the other layout."""

from __future__ import annotations

import dataclasses

import pytest
from harness import (
    TinyBDRunner,
    environ,
    eval_requests,
    make_scheduler,
    plugin_env,
    serve,
    server_args,
)

from dwise_predict import read_traces
from dwise_predict.bundle import load_bundle, save_bundle
from dwise_predict.errors import FingerprintMismatchError
from dwise_predict.sglang import plugin
from dwise_predict.sglang.config import load_config
from dwise_predict.sglang.seam import server_fingerprint

B, BUDGET, BS = 4, 64, 32


@pytest.fixture(scope="module")
def runner() -> TinyBDRunner:
    return TinyBDRunner()


def _attach(s) -> None:
    plugin.attach(s, load_config())


def _offline(requests, alignment):
    from dwise_predict.tracing.adapters.tiny_bd import load_tiny_bd
    from dwise_predict.tracing.engine import DecodeConfig, DecodeRequest, decode

    cfg = DecodeConfig(
        block_size=BS, threshold=0.95, max_new_tokens=BUDGET, block_alignment=alignment
    )
    reqs = [DecodeRequest(r.rid, list(r.input_ids)) for r in requests]
    return {r.request_id: r for r in decode(load_tiny_bd("tiny-bd"), reqs, cfg, batch_size=B)}


def _whole_blocks(prompt_tokens: int, rounds: list[int]) -> int:
    """How many leading output blocks hold all their masks in both engines: SGLang always
    denoises a full block and cuts the output at the budget afterwards, the tracer shortens the
    last block to the budget, so only blocks ending within the budget are comparable."""
    end, n = prompt_tokens // BS * BS, 0
    for _ in rounds:
        end += BS
        if end - prompt_tokens > BUDGET:
            break
        n += 1
    return n


def test_offline_absolute_traces_match_the_server_and_response_ones_do_not(runner, tmp_path):
    from sglang.srt.plugins import load_plugins

    requests = eval_requests(8, runner, max_new_tokens=BUDGET, max_prompt_tokens=160)
    assert len({len(r.input_ids) % BS for r in requests}) >= 4  # several prompt-tail lengths
    env = {
        "DWISE_SGLANG_POLICY": "observe",
        "DWISE_SGLANG_TRACE_DIR": str(tmp_path / "traces"),
        "DWISE_SGLANG_BUNDLE": None,
        "SGLANG_PLUGINS": None,
    }
    with environ(env):
        load_plugins()
        res, s = serve(requests, max_running_requests=B, runner=runner, on_scheduler=_attach)
    served = {r["request_id"]: r for r in read_traces(tmp_path / "traces" / "dp0").to_pylist()}
    assert server_fingerprint(s).block_alignment == "absolute"
    absolute, response = _offline(requests, "absolute"), _offline(requests, "response")
    same_abs = same_resp = compared = 0
    for q in requests:
        row, a, r = served[q.rid], absolute[q.rid], response[q.rid]
        L = len(q.input_ids)
        assert row["prompt_blocks"] == a.prompt_blocks == L // BS
        n = _whole_blocks(L, row["rounds_per_block"])
        if n == 0:
            continue
        compared += 1
        tokens = BS * n - L % BS  # output tokens of the first n blocks
        same_abs += (
            a.rounds_per_block[:n] == row["rounds_per_block"][:n]
            and a.output_ids[:tokens] == res.output_ids[q.rid][:tokens]
        )
        same_resp += r.rounds_per_block[:n] == row["rounds_per_block"][:n]
    assert compared >= 6
    assert same_abs == compared  # the absolute layout is the server's, block for block
    assert same_resp < compared  # the response layout is not


def test_a_bundle_traced_in_the_other_layout_is_refused_at_attach(tmp_path):
    zoo = load_bundle("tiny-bd")  # traced absolute, as the server runs it (since v0.8.0)
    fp = dataclasses.replace(zoo.fingerprint, block_alignment="response")
    bundle = save_bundle(
        tmp_path / "response-bundle",
        [zoo.admission, zoo.refinement],
        fingerprint=fp,
        name="tiny-bd-response",
    )
    with server_args(pp_max_micro_batch_size=B * 2, max_running_requests=B * 2):
        s = make_scheduler(max_running_requests=B * 2)
        with (
            environ(plugin_env(str(bundle), slots=B, k=2)),
            pytest.raises(FingerprintMismatchError) as e,
        ):
            _attach(s)
        with (
            environ(plugin_env(str(bundle), slots=B, k=2, allow_mismatch="true")),
            pytest.warns(UserWarning, match="block_alignment"),
        ):
            _attach(s)  # the existing override still works
    msg = str(e.value)
    assert "block_alignment: 'response' vs 'absolute'" in msg
