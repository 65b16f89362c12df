"""The plugin inside SGLang 0.5.23's real dLLM scheduler, serving tiny-bd on CPU.

Stock and plugin runs serve the same eval-split requests through the same real classes; only
the plugin (loaded by ``load_plugins()`` from its entry point) differs.
"""

from __future__ import annotations

import json
import statistics

import pytest
from dwise_predict.zoo.tiny_bd.tokenizer import EOS
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
from dwise_predict.errors import ConfigError, FingerprintMismatchError
from dwise_predict.sglang import plugin
from dwise_predict.sglang.config import load_config
from dwise_predict.sglang.seam import SUPPORTED_SGLANG, SGLangIncompatibleError

B, K = 4, 2


@pytest.fixture(scope="module")
def runner() -> TinyBDRunner:
    return TinyBDRunner()


@pytest.fixture(scope="module")
def requests(runner):
    return eval_requests(8, runner, max_new_tokens=48, max_prompt_tokens=160)


def _load_plugins() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()


def _attach(s) -> None:
    plugin.attach(s, load_config())


def _serve_plugin(requests, runner, **settings):
    env = plugin_env("tiny-bd", slots=B, k=K, **settings)
    with environ({**env, "SGLANG_PLUGINS": None}):
        _load_plugins()
        return serve(requests, max_running_requests=B * K, runner=runner, on_scheduler=_attach)


@pytest.fixture(scope="module")
def stock(requests, runner):
    from harness import remove_hooks

    remove_hooks()
    with environ({"DWISE_SGLANG_BUNDLE": None}):
        _load_plugins()  # the entry point is found, but with no bundle it registers nothing
        res, _ = serve(requests, max_running_requests=B, runner=runner)
    remove_hooks()
    return res


def test_algorithm_present():
    from sglang.srt.dllm.algorithm import algo_name_to_cls

    assert "LowConfidence" in algo_name_to_cls


def test_plugin_mixes_phases_and_keeps_outputs(requests, runner, stock, tmp_path):
    res, s = _serve_plugin(
        requests,
        runner,
        trace_dir=tmp_path / "traces",
        monitor_every=4,
        monitor_file=tmp_path / "monitor.json",
    )
    state = s.dwise_serving
    n = len(requests)
    # every request finishes, under both, with the same tokens
    assert len(stock.completion_round) == len(res.completion_round) == n
    assert res.output_ids == stock.output_ids
    # KV and request slots come back; allocator usage matched live requests every round
    assert res.kv_free_after == res.kv_free_before
    assert res.req_slots_free_after == res.req_slots_free_before
    assert stock.kv_free_after == stock.kv_free_before
    assert res.kv_balanced_every_round and stock.kv_balanced_every_round
    # residents never exceed k*B, rounds never carry more than B blocks
    assert res.max_residents <= B * K and state.stats.max_residents <= B * K
    assert res.filled_slots <= B * res.rounds
    # stock runs prefill-only rounds while prompts remain; the plugin mixes
    assert stock.prefill_only_rounds > 0
    assert res.prefill_only_rounds < stock.prefill_only_rounds
    # refinement at most once per request, and it happened (hidden rows were captured)
    assert 0 < state.stats.refinements <= n
    assert state.stats.phase_mismatches == 0 and state.stats.refused_by_adder == 0
    # the plan ran: shortest remaining work first lowers mean completion
    mean_stock = statistics.mean(stock.completion_round.values())
    mean_plugin = statistics.mean(res.completion_round.values())
    assert mean_plugin < mean_stock
    # the monitor saw every finished request and published its file
    assert state.monitor.finished == n
    published = json.loads((tmp_path / "monitor.json").read_text())
    assert published["finished"] == n
    # each track had its arrival number, and with nothing live every cohort is complete: the
    # window holds the last requests by arrival, none left pending
    assert state.arrivals == n and not state.tracks
    if n % 4 == 0:  # the last publication came after the last finish
        assert published["pending"] == 0
        assert published["admission"]["n"] == min(n, state.monitor.window)
    # serving traces: one schema-valid row per request, prompt hashed not stored
    traces = read_traces(tmp_path / "traces" / "dp0").to_pylist()
    assert sorted(t["request_id"] for t in traces) == sorted(r.rid for r in requests)
    assert all(t["prompt"] is None and len(t["prompt_sha256"]) == 64 for t in traces)
    by_id = {r.rid: r for r in requests}
    for t in traces:
        assert t["prompt_tokens"] == len(by_id[t["request_id"]].input_ids)
        assert t["output_tokens"] == len(res.output_ids[t["request_id"]])
        assert t["prompt_blocks"] == t["prompt_tokens"] // 32 and min(t["rounds_per_block"]) >= 1
        # SGLang ran each prompt block once and each output block r + 1 times (r recorded)
        work = t["prompt_blocks"] + sum(r + 1 for r in t["rounds_per_block"])
        assert work == res.forwards[t["request_id"]] == stock.forwards[t["request_id"]]
    assert sum(t["first_round_hidden"] is not None for t in traces) == state.stats.refinements
    # requests stop at their EOS (a server gives each Req the model's EOS ids), not the budget
    stopped = [r for r in requests if len(res.output_ids[r.rid]) < r.max_new_tokens]
    assert stopped and all(res.output_ids[r.rid][-1] == EOS for r in stopped)
    # features and traces count the raw prompt's words and newlines, not the chat template's
    for t in traces:
        raw = (
            by_id[t["request_id"]].text.removeprefix("<|user|>\n").removesuffix("\n<|assistant|>\n")
        )
        assert raw != by_id[t["request_id"]].text
        assert (t["word_count"], t["newline_count"]) == (len(raw.split()), raw.count("\n"))


def test_whitelisted_away_leaves_sglang_stock(requests, runner, stock):
    from sglang.srt.dllm.mixin.scheduler import SchedulerDllmMixin
    from sglang.srt.plugins.hook_registry import HookRegistry

    original = SchedulerDllmMixin.__dict__["_process_dllm_batches"]
    env = plugin_env("tiny-bd", slots=B, k=K)
    with environ({**env, "SGLANG_PLUGINS": "some_other_plugin"}):
        _load_plugins()
        assert not HookRegistry._hooks
        assert SchedulerDllmMixin.__dict__["_process_dllm_batches"] is original
        res, s = serve(requests, max_running_requests=B, runner=runner)
    assert not hasattr(s, "dwise_serving")
    assert res.rounds == stock.rounds and res.completion_round == stock.completion_round


@pytest.mark.parametrize("server", [{"threshold": 0.9}, {"block_size": 16}])
def test_wrong_bundle_refuses_to_start(server):
    with server_args(pp_max_micro_batch_size=B * K, max_running_requests=B * K):
        s = make_scheduler(max_running_requests=B * K, **server)
        with environ(plugin_env("tiny-bd")), pytest.raises(FingerprintMismatchError) as e:
            _attach(s)
    msg = str(e.value)
    assert "tiny-bd" in msg and "but the server runs" in msg
    field = next(iter(server))
    assert field in msg and str(server[field]) in msg


def test_sync_mode_and_too_few_request_slots_refuse():
    with server_args(pp_max_micro_batch_size=B * K, max_running_requests=B * K):
        s = make_scheduler(max_running_requests=B * K)
        s.dllm_config.first_done_first_out_mode = False
        with environ(plugin_env("tiny-bd")), pytest.raises(ConfigError, match="--dllm-fdfo"):
            _attach(s)
        s = make_scheduler(max_running_requests=B)
        with (
            environ(plugin_env("tiny-bd", slots=B, k=K)),
            pytest.raises(ConfigError, match=f"--max-running-requests {B * K}"),
        ):
            _attach(s)


@pytest.mark.parametrize(
    "gone",
    [
        "sglang.srt.dllm.mixin.scheduler.SchedulerDllmMixin.renamed_in_a_later_release",
        "sglang.srt.managers.utils.GenerationBatchResult.renamed_field",  # an instance attribute
    ],
)
def test_missing_sglang_name_fails_at_startup(monkeypatch, gone):
    from sglang.srt.managers.scheduler import Scheduler

    from dwise_predict.sglang import seam

    extra = seam.Name(gone, "read", instance=gone.endswith("renamed_field"))
    monkeypatch.setattr(seam, "SURFACE", (*seam.SURFACE, extra))
    monkeypatch.setattr(plugin, "missing_names", lambda: seam.missing_names(seam.SURFACE))
    with environ({**plugin_env("tiny-bd"), "SGLANG_PLUGINS": "dwise"}):
        _load_plugins()  # SGLang swallows exceptions here, so the refusal waits in __init__
        with pytest.raises(SGLangIncompatibleError) as e:
            Scheduler(
                server_args=None,
                port_args=None,
                gpu_id=0,
                tp_rank=0,
                moe_ep_rank=0,
                pp_rank=0,
                dp_rank=None,
            )
    assert gone in str(e.value) and SUPPORTED_SGLANG in str(e.value)


def test_a_scheduler_without_an_attribute_the_plugin_reads_refuses_to_attach():
    with server_args(pp_max_micro_batch_size=B * K, max_running_requests=B * K):
        s = make_scheduler(max_running_requests=B * K)
        del s.tokenizer
        with environ(plugin_env("tiny-bd")), pytest.raises(SGLangIncompatibleError) as e:
            _attach(s)
    assert "Scheduler.tokenizer" in str(e.value)


def test_every_sglang_name_the_plugin_uses_resolves_in_this_sglang():
    from dwise_predict.sglang import seam

    assert seam.missing_names() == []
    assert len(seam.SURFACE) >= 50
