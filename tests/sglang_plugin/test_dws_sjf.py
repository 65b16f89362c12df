"""``DWISE_SGLANG_POLICY=dws-sjf`` inside SGLang 0.5.23's real dLLM scheduler, serving tiny-bd.

The bundle is the shipped tiny-bd one plus a DWS predictor (a 1-layer random BERT with
MiniLM's tokenizer, trained for seconds on synthetic traces whose prompts name their category)
and a cost profile for tiny-bd's decoder. What is checked is the plumbing: each arrival is
priced with ``bundle.predict_cost``, admission follows that price, every request finishes with
the outputs stock SGLang gives it, and a bundle without DWS is refused at start-up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from harness import (
    TinyBDRunner,
    environ,
    eval_requests,
    make_scheduler,
    plugin_env,
    remove_hooks,
    serve,
)

from dwise_predict import load_bundle
from dwise_predict.bundle import save_bundle
from dwise_predict.errors import ConfigError
from dwise_predict.sglang import plugin
from dwise_predict.sglang.config import load_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _dws_helpers import labelled_traces, planted_profile, save_tiny_bert  # noqa: E402

B, K = 2, 2


@pytest.fixture(scope="module")
def dws_bundle(tmp_path_factory) -> Path:
    from dwise_predict.trainers.dws import DWSTrainConfig
    from dwise_predict.trainers.dws_bundle import train_dws_module

    tmp = tmp_path_factory.mktemp("dws-sjf")
    zoo = load_bundle("tiny-bd")
    bs = zoo.fingerprint.block_size
    table = labelled_traces(96, 0, block_size=bs, output_budget=128)
    profile = planted_profile(bs, 128, zoo.fingerprint.to_dict())
    cfg = DWSTrainConfig(
        encoder_path=str(save_tiny_bert(tmp / "bert")),
        stage_a_epochs=1,
        stage_b_epochs=10,
        baselines=False,
        window=48,
        head_tokens=16,
        num_threads=1,
    )
    dws, _ = train_dws_module(table, profile, tmp / "dws", config=cfg, int8=False, probes=16)
    modules = [zoo.admission, zoo.refinement, dws, profile]
    return save_bundle(tmp / "bundle", modules, fingerprint=zoo.fingerprint, name="tiny-bd-dws")


def test_dws_sjf_admits_by_predicted_cost_and_keeps_outputs(dws_bundle):
    from sglang.srt.plugins import load_plugins

    runner = TinyBDRunner()
    reqs = eval_requests(8, runner, max_new_tokens=32, max_prompt_tokens=120)
    remove_hooks()
    with environ({"DWISE_SGLANG_BUNDLE": None}):
        load_plugins()
        stock, _ = serve(reqs, max_running_requests=B, runner=runner)
    remove_hooks()

    seen: dict = {}

    def attach(s):
        state = plugin.attach(s, load_config())
        state.keep_finished = True
        seen["state"] = state

    env = plugin_env(str(dws_bundle), slots=B, k=K, policy="dws-sjf")
    with environ({**env, "SGLANG_PLUGINS": None}):
        load_plugins()
        res, _ = serve(reqs, max_running_requests=B * K, runner=runner, on_scheduler=attach)
    state = seen["state"]
    assert len(res.completion_round) == len(reqs) and res.output_ids == stock.output_ids
    assert res.kv_free_after == res.kv_free_before
    assert res.req_slots_free_after == res.req_slots_free_before
    tracks = dict(state.finished)
    cost = {rid: t.cost_ms for rid, t in tracks.items()}
    want = dws_bundle_costs(dws_bundle, reqs, runner)
    assert all(cost[rid] == pytest.approx(want[rid], rel=1e-5) for rid in want)
    # a burst, non-preemptive SJF: the k·B cheapest are the first residents, and the cheapest
    # request starts no later than the dearest
    by_cost = sorted(tracks, key=lambda rid: cost[rid])
    first = {rid: tracks[rid].first_round for rid in tracks}
    assert first[by_cost[0]] <= first[by_cost[-1]]
    assert max(first[rid] for rid in by_cost[: B * K]) <= min(
        first[rid] for rid in by_cost[B * K :]
    )


def dws_bundle_costs(path: Path, reqs, runner) -> dict:
    """What the bundle prices each request at: its ids decoded by the server's tokenizer (an
    SGLang 0.5.23 Req keeps no text) and SGLang's token count."""
    bundle = load_bundle(path)
    texts = [runner.tokenizer.decode(r.input_ids) for r in reqs]
    tokens = np.array([len(r.input_ids) for r in reqs])
    return dict(zip([r.rid for r in reqs], bundle.predict_cost(texts, prompt_tokens=tokens)))


def test_dws_sjf_refuses_a_bundle_without_dws(tmp_path):
    zoo = load_bundle("tiny-bd")  # has DWS since v0.4.0: keep only the DWISE predictors
    plain = save_bundle(
        tmp_path / "no-dws", [zoo.admission, zoo.refinement], fingerprint=zoo.fingerprint
    )
    s = make_scheduler(max_running_requests=B * K)
    env = plugin_env(str(plain), slots=B, k=K, policy="dws-sjf")
    with environ(env), pytest.raises(ConfigError, match="no DWS predictor"):
        plugin.attach(s, load_config())


def _serve_dwise(bundle: Path, reqs, runner, **settings):
    from sglang.srt.plugins import load_plugins

    seen: dict = {}

    def attach(s):
        state = plugin.attach(s, load_config())
        state.keep_finished = True
        seen["state"] = state

    remove_hooks()
    env = plugin_env(str(bundle), slots=B, k=K, policy="dwise", **settings)
    with environ({**env, "SGLANG_PLUGINS": None}):
        load_plugins()
        res, _ = serve(reqs, max_running_requests=B * K, runner=runner, on_scheduler=attach)
    remove_hooks()
    return res, dict(seen["state"].finished)


def test_dwise_with_the_lightgbm_dws_admission_estimate():
    """DWISE_SGLANG_ADMISSION=lightgbm+dws: each arrival is ranked by the mean of the admission
    model's estimate and the DWS surface's expected rounds (the shipped bundle's INT8 DWS),
    outputs stay stock's, and nothing leaks."""
    from dwise_predict.bundle import mean_with_dws

    runner = TinyBDRunner()
    reqs = eval_requests(8, runner, max_new_tokens=32, max_prompt_tokens=120)
    plain, plain_tracks = _serve_dwise("tiny-bd", reqs, runner)
    res, tracks = _serve_dwise("tiny-bd", reqs, runner, admission="lightgbm+dws")
    assert res.output_ids == plain.output_ids and len(tracks) == len(reqs)
    assert res.kv_free_after == res.kv_free_before
    assert res.req_slots_free_after == res.req_slots_free_before
    bundle = load_bundle("tiny-bd")
    texts = [runner.tokenizer.decode(r.input_ids) for r in reqs]
    dws = dict(zip([r.rid for r in reqs], bundle.predict_dws_rounds(texts)))
    for rid, t in tracks.items():
        want = float(mean_with_dws(plain_tracks[rid].admission, dws[rid]))
        assert t.admission == pytest.approx(want, rel=1e-5)
    assert any(abs(t.admission - plain_tracks[rid].admission) > 0.5 for rid, t in tracks.items())


def test_the_lightgbm_dws_admission_estimate_refuses_a_bundle_without_dws(tmp_path):
    zoo = load_bundle("tiny-bd")
    plain = save_bundle(
        tmp_path / "no-dws", [zoo.admission, zoo.refinement], fingerprint=zoo.fingerprint
    )
    s = make_scheduler(max_running_requests=B * K)
    env = plugin_env(str(plain), slots=B, k=K, policy="dwise", admission="lightgbm+dws")
    with environ(env), pytest.raises(ConfigError, match="ADMISSION=lightgbm\\+dws.*no DWS"):
        plugin.attach(s, load_config())
    with (
        environ({**env, "DWISE_SGLANG_ADMISSION": "bert"}),
        pytest.raises(ConfigError, match="ADMISSION='bert' is not one of"),
    ):
        load_config()
