"""The output-length baselines (SSJF, S³, LTR, TRAIL): kinds trained by the pipeline, saved in a
bundle, evaluated against work, and ranked by as policies in the simulator."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dwise_predict.trainers.baselines import LengthBaselineConfig, train_s3, train_ssjf
from dwise_predict.trainers.dataset import trace_arrays
from dwise_predict.trainers.evaluate import evaluate_bundle, rounds_vs_tokens, tokens_and_rounds
from dwise_predict.trainers.pipeline import parse_only, train_bundle
from synthetic_traces import make_traces, synthetic_featurizer

from dwise_predict.bundle import load_bundle
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.predictors.baselines import (
    LENGTH_KINDS,
    LTRPredictor,
    S3Predictor,
    SSJFPredictor,
    TRAILPredictor,
)
from dwise_predict.ranking import spearman
from dwise_predict.runtime import Workload
from dwise_predict.runtime.lengths import lengths_from_bundle, synthetic_lengths
from dwise_predict.runtime.registry import make_policy, policy_names
from dwise_predict.runtime.request import SimRequest
from dwise_predict.runtime.simulator import simulate
from dwise_predict.runtime.synthetic import synthetic_workload

ONLY = ",".join(LENGTH_KINDS)
CLASSES = {
    "ssjf": SSJFPredictor,
    "s3": S3Predictor,
    "ltr": LTRPredictor,
    "trail": TRAILPredictor,
}


@pytest.fixture(scope="module")
def traces():
    return make_traces(240, 32, seed=0), make_traces(160, 32, seed=1)


@pytest.fixture(scope="module")
def bundle_path(traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("baselines") / "b"
    return train_bundle(
        traces[0], out, only="admission,refinement," + ONLY, featurizer=synthetic_featurizer()
    )


def test_every_baseline_is_a_registered_kind_trained_only_when_named():
    from dwise_predict.trainers.kind import trainable

    from dwise_predict.bundle.modules import registered

    assert set(LENGTH_KINDS) <= set(registered()) and set(LENGTH_KINDS) <= set(trainable())
    assert not set(LENGTH_KINDS) & set(parse_only(None))
    assert parse_only("ssjf,trail") == ("ssjf", "trail")


def test_baselines_train_predict_and_round_trip(traces, bundle_path):
    bundle = load_bundle(bundle_path)
    ev = trace_arrays(traces[1], need_hidden=True)
    assert ev.output_tokens is not None
    manifest = json.loads((bundle_path / "manifest.json").read_text())
    for kind, cls in CLASSES.items():
        model = bundle.need(cls)
        tokens = model.predict_tokens(ev.features)
        rounds = model.arrival_rounds(ev.features)
        assert tokens.shape == (ev.n,) and np.all(np.isfinite(tokens)) and np.all(tokens >= 0)
        assert np.allclose(rounds * model.tokens_per_round, tokens)
        # the planted traces tie the prompt's length to the answer's: every score ranks it
        assert spearman(tokens, ev.output_tokens) > 0.1, kind
        entry = manifest["predictors"][kind]
        assert entry["tokens_per_round"] == pytest.approx(
            ev.output_tokens.sum() / ev.total_rounds.sum(), rel=0.3
        )
        assert all(f.endswith((".txt", ".json", ".safetensors")) for f in entry["files"])
    trail = bundle.need(TRAILPredictor)
    again = trail.refined_rounds(ev.hidden, ev.prompt_tokens, ev.output_budget)
    assert np.all(np.isfinite(again)) and np.all(again >= 0)
    # the hidden state carries the answer's length: the re-estimate ranks work better
    assert spearman(again, ev.remaining) > spearman(trail.arrival_rounds(ev.features), ev.remaining)
    probs = bundle.need(S3Predictor).probabilities(ev.features)
    assert np.allclose(probs.sum(axis=1), 1.0)
    ltr = bundle.need(LTRPredictor)
    score, tok = ltr.score(ev.features), ltr.predict_tokens(ev.features)
    assert np.all(np.diff(tok[np.argsort(score, kind="stable")]) >= -1e-9)  # monotone map


def test_training_is_deterministic_for_a_seed(traces, bundle_path, tmp_path):
    again = train_bundle(traces[0], tmp_path / "b", only=ONLY, featurizer=synthetic_featurizer())
    first = json.loads((bundle_path / "manifest.json").read_text())["files"]
    second = json.loads((again / "manifest.json").read_text())["files"]
    for kind in LENGTH_KINDS:
        for name in json.loads((again / "manifest.json").read_text())["predictors"][kind]["files"]:
            assert first[name]["sha256"] == second[name]["sha256"], name
    other = train_bundle(
        traces[0], tmp_path / "c", only="ssjf", seed=3, featurizer=synthetic_featurizer()
    )
    third = json.loads((other / "manifest.json").read_text())["files"]
    assert third["ssjf.lgb.txt"]["sha256"] != first["ssjf.lgb.txt"]["sha256"]


def test_eval_sets_each_score_against_work(traces, bundle_path):
    bundle = load_bundle(bundle_path)
    m = evaluate_bundle(bundle, traces[1])
    ev = trace_arrays(traces[1], need_hidden=True)
    for kind in LENGTH_KINDS:
        assert -1 <= m[kind]["spearman"] <= 1
    assert m["ssjf"]["spearman"] == pytest.approx(
        spearman(bundle.need(SSJFPredictor).arrival_rounds(ev.features), ev.total_rounds)
    )
    from dwise_predict.trainers.evaluate import predictions

    assert ev.output_tokens is not None
    table = rounds_vs_tokens(
        predictions(bundle, ev), ev.category, ev.output_tokens, ev.total_rounds
    )
    assert {"output_length", "admission", "refined", *LENGTH_KINDS} <= set(table)
    shape = tokens_and_rounds(ev.category, ev.output_tokens, ev.total_rounds)
    assert -1 <= shape["rho_tokens_rounds"] <= 1
    assert set(shape["per_category"]) == set(ev.category.tolist())


def test_eval_cli_reports_the_baselines(traces, bundle_path, tmp_path, capsys):
    from synthetic_traces import write_traces

    from dwise_predict.cli import main

    write_traces(tmp_path / "eval" / "part-0.parquet", traces[1])
    out = tmp_path / "m.json"
    args = ["eval", "--bundle", str(bundle_path), "--traces", str(tmp_path / "eval")]
    assert main([*args, "--out", str(out), "--no-plots", "-q"]) == 0
    m = json.loads(out.read_text())
    assert set(LENGTH_KINDS) <= set(m["rounds_vs_tokens"])
    assert "rho_tokens_rounds" in m["tokens_and_rounds"]
    printed = capsys.readouterr().out
    assert "ssjf: SSJF" in printed and "trail: TRAIL" in printed


def test_a_baseline_refuses_what_it_cannot_learn(traces):
    arrays = trace_arrays(traces[0])
    with pytest.raises(TrainingError, match="too few"):
        train_ssjf(arrays.subset(np.arange(arrays.n) < 10))
    same = arrays.subset(arrays.output_tokens <= 32)
    with pytest.raises(TrainingError, match="one 32-token bucket"):
        train_s3(same, LengthBaselineConfig(min_samples=2))
    with pytest.raises(ConfigError):
        LengthBaselineConfig(ltr_grades=64)


# -- policies -------------------------------------------------------------------------------------
def _workload(lengths: dict[str, list[float]]) -> Workload:
    reqs = [
        SimRequest(
            request_id=f"r{i}",
            prompt_blocks=1,
            prompt_tokens=20,
            rounds_per_block=(4, 4),
            output_budget=64,
            block_size=32,
            category="chat",
            output_tokens=50,
        )
        for i in range(3)
    ]
    return Workload.from_requests(reqs).with_estimates(
        lengths={k: np.asarray(v) for k, v in lengths.items()}
    )


@pytest.mark.parametrize("name", ["ssjf", "s3", "ltr"])
def test_a_length_policy_runs_the_shortest_predicted_first(name):
    policy = make_policy(name)
    assert name in policy_names() and policy.preemptive and policy.batch_former == "mixed"
    assert policy.needs == {"estimate", "length"}
    w = _workload({name: [30.0, 2.0, 10.0]})
    run = simulate(w, policy, slots=1, k=8, check_invariants=True)
    assert run.completion_order.tolist() == [1, 2, 0]
    # the other way round
    w = _workload({name: [2.0, 30.0, 10.0]})
    assert simulate(w, policy, slots=1, k=8).completion_order.tolist() == [0, 2, 1]


def test_trail_reranks_after_the_first_round():
    policy = make_policy("trail")
    assert policy.needs == {"estimate", "length", "refined"}
    # at arrival r0 looks shortest; after its first round TRAIL learns it is the longest
    w = _workload({"trail": [1.0, 5.0, 6.0], "trail:refined": [100.0, 4.0, 5.0]})
    run = simulate(w, policy, slots=1, k=8, check_invariants=True)
    assert run.completion_order.tolist()[-1] == 0
    assert run.refinements >= 1
    plain = simulate(w, make_policy("ssjf").__class__(predictor="trail", name="x"), slots=1, k=8)
    assert plain.completion_order.tolist()[0] == 0  # never re-estimated: r0 runs first


def test_a_length_policy_without_its_estimates_is_refused():
    w = _workload({"ssjf": [1.0, 2.0, 3.0]})
    with pytest.raises(ConfigError, match="ltr"):
        simulate(w, make_policy("ltr"), slots=1)


def test_the_synthetic_lengths_reproduce_the_asked_rho_and_the_seed():
    w = synthetic_workload(n=512, seed=0)
    a = synthetic_lengths(w, {"ssjf": 0.8, "trail": 0.8, "trail:refined": 0.95}, seed=0)
    b = synthetic_lengths(w, {"ssjf": 0.8, "trail": 0.8, "trail:refined": 0.95}, seed=0)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert spearman(a["ssjf"], w.output_tokens) == pytest.approx(0.8, abs=0.01)
    # less the round spent, clipped at 0: the shortest answers tie at 0
    assert 0.85 < spearman(a["trail:refined"], w.output_tokens) < 0.96
    runs = {
        p: simulate(w.with_estimates(lengths=a), make_policy(p), slots=32, k=8).finish_time
        for p in ("fcfs-mixed", "ssjf", "trail")
    }
    assert all(np.isfinite(t).all() for t in runs.values())
    assert runs["ssjf"].mean() < runs["fcfs-mixed"].mean()


def test_lengths_from_a_bundle_feed_the_simulator(traces, bundle_path):
    from dwise_predict.runtime import requests_from_traces

    bundle = load_bundle(bundle_path)
    lengths = lengths_from_bundle(bundle, traces[1])
    assert set(lengths) == {*LENGTH_KINDS, "trail:refined"}
    w = Workload.from_requests(requests_from_traces(traces[1])).with_estimates(lengths=lengths)
    for name in LENGTH_KINDS:
        run = simulate(w, make_policy(name), slots=8, k=4, check_invariants=True)
        assert np.isfinite(run.finish_time).all()


def test_simulate_cli_runs_the_baselines(traces, bundle_path, tmp_path):
    from synthetic_traces import write_traces

    from dwise_predict.cli import main

    policies = "fcfs-mixed,ssjf,s3,ltr,trail,dwise"
    args = ["simulate", "--policies", policies, "--slots", "8", "--no-plots", "-q"]
    syn = [*args, "--synthetic", "paper-llada2.1-mini", "--requests", "128"]
    assert main([*syn, "--out", str(tmp_path / "syn")]) == 0
    write_traces(tmp_path / "eval" / "part-0.parquet", traces[1])
    on_traces = [*args, "--traces", str(tmp_path / "eval"), "--bundle", str(bundle_path)]
    assert main([*on_traces, "--out", str(tmp_path / "tr")]) == 0
    summary = json.loads((tmp_path / "tr" / "summary.json").read_text())
    assert set(policies.split(",")) <= set(json.dumps(summary).replace('"', " ").split())
