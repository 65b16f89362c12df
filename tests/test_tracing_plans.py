"""One decode plan per adapter kind (tracing/plans.py): the kind decides the decoder, the
fingerprint and who counts rounds; a combination the model cannot run is refused up front."""

from __future__ import annotations

import pytest
from _tracing_helpers import make_diffusion_gemma, make_tiny_bd, one_torch_thread  # noqa: F401 (autouse fixture)
from dwise_predict.tracing.adapters import load_adapter
from dwise_predict.tracing.adapters.base import DecoderDrivenAdapter, NativeLoopAdapter, StepAdapter
from dwise_predict.tracing.engine import DecodeRequest
from dwise_predict.tracing.plans import DecodeSettings, is_native, plan_decoding, request_seed
from dwise_predict.tracing.runner import trace_workload

from dwise_predict.errors import ConfigError


@pytest.fixture(scope="module")
def tbd(tmp_path_factory):
    return load_adapter(make_tiny_bd(tmp_path_factory.mktemp("m") / "tbd", block_size=8))


@pytest.fixture(scope="module")
def dg(tmp_path_factory):
    return load_adapter(make_diffusion_gemma(tmp_path_factory.mktemp("m") / "dg"))


def test_the_adapters_satisfy_their_protocols(tbd, dg):
    assert isinstance(tbd, StepAdapter) and not is_native(tbd)
    assert isinstance(dg, NativeLoopAdapter) and isinstance(dg, DecoderDrivenAdapter)
    assert is_native(dg)


def test_step_plan_is_the_engine_and_counts_rounds_per_forward(tbd):
    plan = plan_decoding(tbd, DecodeSettings(max_new_tokens=16, batch_size=2))
    assert not plan.counts_rounds_per_result
    assert plan.fingerprint.decoding == "low_confidence"
    assert plan.fingerprint.block_alignment == "absolute"  # how SGLang serves tiny-bd
    rounds: list[int] = []
    reqs = [DecodeRequest(f"r{i}", tbd.encode_prompt(p)) for i, p in enumerate(["hi", "a b c"])]
    results = list(plan.run(reqs, lambda n, _s: rounds.append(n)))
    assert {r.request_id for r in results} == {"r0", "r1"}
    # the engine reports every batched forward; each denoising round of a request is one row of
    # one of them (prefill rows come on top)
    assert len(rounds) >= max(r.total_rounds for r in results) > 0
    assert sum(rounds) >= sum(r.total_rounds for r in results)


def test_native_plans_use_the_models_sampler_or_an_engine_decoder(dg):
    own = plan_decoding(dg, DecodeSettings(max_new_tokens=16))
    assert own.counts_rounds_per_result
    assert own.fingerprint.decoding == dg.info.decoding
    assert own.fingerprint.max_steps_per_block == dg.max_steps_per_block()
    driven = plan_decoding(dg, DecodeSettings(max_new_tokens=16, decoding="joint_threshold"))
    assert driven.fingerprint.decoding == "joint_threshold"
    assert driven.fingerprint.extra["decoder_mask_token_id"] == dg.decoder_mask_id()
    assert driven.fingerprint.max_steps_per_block == 8 + 16 + 1


def test_refusals_name_the_fix(tbd, dg):
    with pytest.raises(ConfigError, match="unknown decoding 'beam'"):
        plan_decoding(tbd, DecodeSettings(max_new_tokens=8, decoding="beam"))
    with pytest.raises(ConfigError, match="absolute"):  # DiffusionGemma runs response-aligned
        plan_decoding(dg, DecodeSettings(max_new_tokens=8, block_alignment="absolute"))

    class NotAnAdapter:
        info = tbd.info
        featurizer = tbd.featurizer

        def encode_prompt(self, prompt: str) -> list[int]:
            return [1]

    with pytest.raises(ConfigError, match="neither a step adapter .* nor a native-loop one"):
        plan_decoding(NotAnAdapter(), DecodeSettings(max_new_tokens=8))  # type: ignore[arg-type]


def test_native_seeds_depend_on_the_request_not_the_batch(dg, tmp_path):
    assert request_seed(0, "a") == request_seed(0, "a") != request_seed(1, "a")
    recs = [{"id": i, "category": "chat", "source": "t", "prompt": f"say {i}"} for i in "abc"]
    trace_workload(dg, recs, tmp_path / "all", max_new_tokens=8, seed=3)
    trace_workload(dg, recs[2:], tmp_path / "one", max_new_tokens=8, seed=3)
    from dwise_predict.traces import read_traces

    full = {
        r["request_id"]: r["rounds_per_block"] for r in read_traces(tmp_path / "all").to_pylist()
    }
    alone = read_traces(tmp_path / "one").to_pylist()[0]
    assert full["c"] == alone["rounds_per_block"]
