"""The output-length baselines as plugin policies (``DWISE_SGLANG_POLICY=ssjf`` / ``trail``)
inside SGLang 0.5.23's real dLLM scheduler, serving tiny-bd.

The bundle is the shipped tiny-bd one plus SSJF and TRAIL baselines trained for a second on
synthetic traces of tiny-bd's hidden size. What is checked is the plumbing: each arrival is
ranked by the baseline's estimate (not the admission model's), TRAIL re-estimates from the
first round's pooled hidden rows, every request finishes with the outputs stock SGLang gives
it, and a bundle without the baseline is refused at start-up.
"""

from __future__ import annotations

import sys
from pathlib import Path

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
from dwise_predict.errors import BundleError
from dwise_predict.features import FEATURE_NAMES, feature_row
from dwise_predict.sglang import plugin
from dwise_predict.sglang.config import load_config, planned_policies
from dwise_predict.sglang.prompt import user_prompt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from synthetic_traces import make_traces  # noqa: E402

B, K = 2, 2


@pytest.fixture(scope="module")
def baseline_bundle(tmp_path_factory) -> Path:
    from dwise_predict.trainers.baselines import train_ssjf, train_trail
    from dwise_predict.trainers.dataset import trace_arrays

    tmp = tmp_path_factory.mktemp("baselines")
    zoo = load_bundle("tiny-bd")
    arrays = trace_arrays(make_traces(160, zoo.fingerprint.hidden_size, seed=0), need_hidden=True)
    modules = [zoo.admission, zoo.refinement, train_ssjf(arrays), train_trail(arrays)]
    return save_bundle(tmp / "bundle", modules, fingerprint=zoo.fingerprint, name="tiny-bd-len")


def _serve(bundle: Path, policy: str, reqs, runner):
    from sglang.srt.plugins import load_plugins

    seen: dict = {}

    def attach(s):
        state = plugin.attach(s, load_config())
        state.keep_finished = True
        seen["state"] = state

    remove_hooks()
    env = plugin_env(str(bundle), slots=B, k=K, policy=policy)
    with environ({**env, "SGLANG_PLUGINS": None}):
        load_plugins()
        res, _ = serve(reqs, max_running_requests=B * K, runner=runner, on_scheduler=attach)
    remove_hooks()
    return res, seen["state"]


def test_baseline_policies_rank_by_their_estimates_and_keep_outputs(baseline_bundle):
    from sglang.srt.plugins import load_plugins

    assert {"ssjf", "s3", "ltr", "trail"} <= set(planned_policies())
    runner = TinyBDRunner()
    reqs = eval_requests(8, runner, max_new_tokens=32, max_prompt_tokens=120)
    remove_hooks()
    with environ({"DWISE_SGLANG_BUNDLE": None}):
        load_plugins()
        stock, _ = serve(reqs, max_running_requests=B, runner=runner)
    remove_hooks()
    bundle = load_bundle(baseline_bundle)
    for policy in ("ssjf", "trail"):
        res, state = _serve(baseline_bundle, policy, reqs, runner)
        assert len(res.completion_round) == len(reqs) and res.output_ids == stock.output_ids
        assert res.kv_free_after == res.kv_free_before
        tracks = dict(state.finished)
        model = getattr(bundle, policy)
        for r in reqs:
            text = user_prompt(r.input_ids, state.decoder, state.featurizer)
            x = feature_row(FEATURE_NAMES, text, len(r.input_ids))
            want = float(model.arrival_rounds([x])[0])
            assert tracks[r.rid].admission == pytest.approx(want, rel=1e-9), (policy, r.rid)
        refined = [t for t in tracks.values() if t.refined is not None]
        if policy == "trail":
            assert refined and state.stats.refinements >= len(refined)
            for t in refined:
                again = model.refined_rounds(t.hidden, t.prompt_tokens, t.output_budget)
                assert t.refined == pytest.approx(float(again[0]), rel=1e-6)
        else:
            assert not refined  # SSJF never re-estimates


def test_a_baseline_policy_refuses_a_bundle_without_it(tmp_path):
    zoo = load_bundle("tiny-bd")
    plain = save_bundle(
        tmp_path / "plain", [zoo.admission, zoo.refinement], fingerprint=zoo.fingerprint
    )
    s = make_scheduler(max_running_requests=B * K)
    env = plugin_env(str(plain), slots=B, k=K, policy="ltr")
    with environ(env), pytest.raises(BundleError, match="no ltr predictor"):
        plugin.attach(s, load_config())
