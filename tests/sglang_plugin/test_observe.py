"""Observe mode and the cold start, through SGLang 0.5.23's real scheduler serving tiny-bd.

Observe mode needs no bundle: SGLang schedules as stock and the plugin writes serving traces.
The cold start is the whole path for a model without a bundle: serve in observe mode, train a
bundle on the serving traces, serve with it under ``dwise``.
"""

from __future__ import annotations

import dataclasses

import pytest
from harness import TinyBDRunner, environ, eval_requests, remove_hooks, serve

from dwise_predict import load_bundle, read_traces
from dwise_predict.errors import ConfigError
from dwise_predict.features import lexical_features
from dwise_predict.sglang import plugin
from dwise_predict.sglang.config import PluginConfig, load_config
from dwise_predict.sglang.observe import request_category

B, K = 4, 2


@pytest.fixture(scope="module")
def runner() -> TinyBDRunner:
    return TinyBDRunner()


def _labelled(requests):
    return [dataclasses.replace(r, label=f"category:{r.category}") for r in requests]


def _attach(s) -> None:
    plugin.attach(s, load_config())


def _serve(requests, runner, env, max_running_requests):
    from sglang.srt.plugins import load_plugins

    remove_hooks()  # a second serve in one test: load the plugin again, with these settings
    with environ({**env, "SGLANG_PLUGINS": None}):
        load_plugins()
        return serve(
            requests, max_running_requests=max_running_requests, runner=runner, on_scheduler=_attach
        )


def test_request_category_comes_from_the_extra_key():
    assert request_category("category:math") == "math"
    assert request_category("category:code|tenant-7") == "code"  # SGLang's namespace suffix
    assert request_category(None) == request_category("other") == "serving"


def test_observe_without_a_bundle_needs_a_trace_dir_and_other_policies_need_a_bundle():
    assert load_config({}) is None  # nothing set: stock SGLang
    with pytest.raises(ConfigError, match="DWISE_SGLANG_TRACE_DIR"):
        load_config({"DWISE_SGLANG_POLICY": "observe"})
    # a planned policy without a bundle: the plugin stays off, as with nothing set
    assert load_config({"DWISE_SGLANG_POLICY": "dwise", "DWISE_SGLANG_TRACE_DIR": "/x"}) is None
    with pytest.raises(ConfigError, match="POLICY=observe"):
        PluginConfig(policy="dwise", trace_dir="/x")
    cfg = load_config({"DWISE_SGLANG_POLICY": "observe", "DWISE_SGLANG_TRACE_DIR": "/tmp/x"})
    assert cfg is not None and cfg.bundle is None


def test_observe_mode_leaves_sglang_stock_and_traces_every_request(runner, tmp_path):
    requests = _labelled(eval_requests(8, runner, max_new_tokens=48, max_prompt_tokens=160))
    stock, _ = serve(requests, max_running_requests=B, runner=runner)
    env = {
        "DWISE_SGLANG_POLICY": "observe",
        "DWISE_SGLANG_TRACE_DIR": str(tmp_path / "traces"),
        "DWISE_SGLANG_BUNDLE": None,
    }
    res, s = _serve(requests, runner, env, B)
    state = s.dwise_serving
    # SGLang's own scheduling, untouched: same rounds, same outputs, nothing leaked
    assert res.completion_round == stock.completion_round and res.rounds == stock.rounds
    assert res.output_ids == stock.output_ids
    assert res.kv_free_after == res.kv_free_before
    assert res.req_slots_free_after == res.req_slots_free_before
    traces = read_traces(tmp_path / "traces" / "dp0").to_pylist()
    by_id = {r.rid: r for r in requests}
    assert sorted(t["request_id"] for t in traces) == sorted(by_id)
    for t in traces:
        spec = by_id[t["request_id"]]
        assert t["category"] == spec.category and t["source"] == "sglang"
        assert t["model_id"] == "tiny-bd" and t["block_size"] == 32
        assert t["output_tokens"] == len(res.output_ids[spec.rid])
        # SGLang ran each prompt block once and each output block r + 1 times (r recorded)
        assert (
            t["prompt_blocks"] + sum(r + 1 for r in t["rounds_per_block"])
            == (res.forwards[spec.rid])
        )
        assert t["first_round_hidden"] is not None and len(t["first_round_hidden"]) == 128
        # the raw prompt's words: the template's frame, read from the server's tokenizer, is cut
        raw = spec.text.removeprefix("<|user|>\n").removesuffix("\n<|assistant|>\n")
        assert (t["word_count"], t["newline_count"]) == (len(raw.split()), raw.count("\n"))
        # the text is not kept by default, its lexical counts are (what the features read)
        assert t["prompt"] is None
        lexical = (t["digit_permille"], t["symbol_permille"], t["question_marks"])
        assert lexical == lexical_features(raw)
    assert state.stats.rounds == res.rounds and state.plugin_us_per_round > 0


@pytest.mark.slow
def test_cold_start_serve_observe_then_train_then_serve_dwise(runner, tmp_path):
    """A model with no bundle: its own server's traces train the bundle it then serves with."""
    from dwise_predict.trainers.pipeline import train_bundle
    from dwise_predict.trainers.refinement import RefinementConfig

    requests = _labelled(eval_requests(48, runner, max_new_tokens=48, max_prompt_tokens=200))
    traces = tmp_path / "traces"
    env = {
        "DWISE_SGLANG_POLICY": "observe",
        "DWISE_SGLANG_TRACE_DIR": str(traces),
        "DWISE_SGLANG_BUNDLE": None,
    }
    observed, _ = _serve(requests, runner, env, 16)
    assert len(observed.completion_round) == 48
    out = train_bundle(
        traces / "dp0",
        tmp_path / "bundle",
        configs={"refinement": RefinementConfig(epochs=3, members=2)},
    )
    bundle = load_bundle(out)
    assert bundle.fingerprint.model_id == "tiny-bd" and bundle.refinement is not None
    assert sorted(bundle.manifest["training"]["categories"]) == sorted(
        {r.category for r in requests}
    )
    served = eval_requests(8, runner, max_new_tokens=48, max_prompt_tokens=160)
    env = {"DWISE_SGLANG_BUNDLE": str(out), "DWISE_SGLANG_SLOTS": str(B), "DWISE_SGLANG_K": str(K)}
    res, s = _serve(served, runner, env, B * K)
    state = s.dwise_serving
    assert len(res.completion_round) == len(served)
    assert res.kv_free_after == res.kv_free_before
    assert 0 < state.stats.refinements <= len(served)
    assert state.stats.phase_mismatches == 0 and state.stats.refused_by_adder == 0
