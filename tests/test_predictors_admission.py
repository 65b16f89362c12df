"""Admission predictor: compiled trees == LightGBM, determinism, raw text, bad input."""

import lightgbm as lgb
import numpy as np
import pyarrow as pa
import pytest
from dwise_predict.trainers.admission import AdmissionConfig, train_admission
from dwise_predict.trainers.dataset import trace_arrays
from synthetic_traces import make_traces, synthetic_featurizer

from dwise_predict.bundle.modules import BundleFolder
from dwise_predict.errors import PredictorError, PredictorInputError, TrainingError
from dwise_predict.features import FEATURE_SETS, feature_row
from dwise_predict.predictors import AdmissionModel
from dwise_predict.predictors.trees import CompiledForest, parse_lightgbm_text
from dwise_predict.ranking import spearman


@pytest.fixture(scope="module")
def traces():
    return make_traces(800, 16, seed=3)


@pytest.fixture(scope="module")
def model(traces):
    return train_admission(traces, featurizer=synthetic_featurizer())


def _features(traces, model):
    """The traces' rows of ``model``'s features."""
    return trace_arrays(traces).admission_features(model.feature_names)


def _probe_rows(rng, X):
    """Training rows, random rows, exact thresholds, NaN, inf, zeros and negatives."""
    rows = [X, rng.uniform(-5, X.max(axis=0) * 1.2 + 1, size=(300, X.shape[1]))]
    special = np.array(
        [
            [0, 0, 0],
            [np.nan, 1, 2],
            [3, np.nan, np.nan],
            [np.nan] * 3,
            [np.inf, -np.inf, 0],
            [-1e-40, 1e-40, 0.0],
        ]
    )
    rows.append(np.tile(special, (1, X.shape[1] // 3)))
    return np.vstack(rows)


@pytest.mark.parametrize("grid_limit", [1 << 20, 0], ids=["global-grid", "per-tree-tables"])
def test_compiled_forest_matches_booster_bit_for_bit(model, traces, grid_limit):
    booster = model.booster()
    _, trees = parse_lightgbm_text(model.model_text)
    forest = CompiledForest(trees, len(model.feature_names), grid_limit=grid_limit)
    assert (forest.grid is not None) == (grid_limit > 0)
    X = _probe_rows(np.random.default_rng(0), _features(traces, model))
    # thresholds themselves are the edge of `x <= t`
    cuts = np.array([[c[len(c) // 2] if len(c) else 0.0 for c in forest.cuts]])
    X = np.vstack([X, cuts])
    want = booster.predict(X, raw_score=True)
    assert np.array_equal(forest.predict_raw(X), want)
    assert np.array_equal(np.array([forest.predict_raw_one(r) for r in X]), want)
    assert np.array_equal(forest.predict_raw(X[:1]), want[:1])


@pytest.mark.parametrize("params", [{"zero_as_missing": True}, {"use_missing": False}, {}])
def test_missing_value_rules_match_lightgbm(params):
    """NaN- and zero-missing splits (default_left either way) follow LightGBM's
    NumericalDecision."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(600, 3))
    X[rng.random(X.shape) < 0.15] = np.nan
    X[rng.random(X.shape) < 0.10] = 0.0
    y = (
        np.nan_to_num(X[:, 0]) * 2
        + np.isnan(X[:, 1]) * 3
        + (X[:, 2] == 0) * 1.5
        + rng.normal(size=600) * 0.1
    )
    booster = lgb.train(
        {
            "objective": "regression",
            "num_leaves": 15,
            "verbose": -1,
            "deterministic": True,
            "force_row_wise": True,
            "num_threads": 1,
            "seed": 0,
            "min_data_in_leaf": 5,
            **params,
        },
        lgb.Dataset(X, y),
        num_boost_round=30,
    )
    _, trees = parse_lightgbm_text(booster.model_to_string())
    kinds = {int(m) for t in trees for m in t.missing_type}
    if params.get("use_missing") is False:
        assert kinds == {0}  # missing type None: NaN is read as 0.0
    else:
        assert kinds - {0}, "the model should use a missing-value rule"
    forest = CompiledForest(trees, 3)
    probe = np.vstack([X, [[np.nan, 0.0, -0.0], [0.0, np.nan, 1e-36]]])
    want = booster.predict(probe, raw_score=True)
    assert np.array_equal(forest.predict_raw(probe), want)
    assert np.array_equal(np.array([forest.predict_raw_one(r) for r in probe]), want)


def test_estimate_is_exp_of_log_rounds_and_tracks_total_rounds(model, traces):
    a = trace_arrays(traces)
    X = _features(traces, model)
    est = model.predict_features(X)
    assert np.allclose(np.log(est), model.booster().predict(X), rtol=0, atol=1e-12)
    assert np.corrcoef(np.log(est), np.log(a.total_rounds))[0, 1] > 0.3
    assert model.predict_one(X[0].tolist()) == pytest.approx(est[0], rel=1e-15)
    assert model.forest.n_trees == 100 and model.forest.max_leaves <= 15


def test_raw_text_uses_the_chat_template_token_count(model, traces):
    prompts = traces.column("prompt").to_pylist()[:50]
    X = _features(traces, model)
    assert np.array_equal(model.predict(prompts), model.predict_features(X[:50]))
    # the per-arrival row from the text and the served token count is the traces' row
    tokens = traces.column("prompt_tokens").to_pylist()[:50]
    assert [model.row(p, n) for p, n in zip(prompts, tokens)] == [tuple(x) for x in X[:50]]


def test_same_seed_same_model_text(traces):
    a = train_admission(traces, AdmissionConfig(seed=7))
    b = train_admission(traces, AdmissionConfig(seed=7))
    assert a.model_text == b.model_text


def test_save_load_round_trip(model, traces, tmp_path):
    files = model.save(tmp_path)
    assert sorted(files) == ["admission.lgb.txt", "chat_template.jinja", "tokenizer.json"]
    loaded = AdmissionModel.load(BundleFolder(tmp_path, frozenset(files)), model.entry())
    X = _features(traces, model)
    assert loaded.feature_names == model.feature_names
    assert np.array_equal(loaded.predict_features(X), model.predict_features(X))
    prompts = traces.column("prompt").to_pylist()[:20]
    assert np.array_equal(loaded.predict(prompts), model.predict(prompts))


def test_bad_inputs(model, traces):
    with pytest.raises(PredictorInputError, match=r"shape \(n, 6\)"):
        model.predict_features(np.zeros((2, 4)))
    with pytest.raises(PredictorInputError, match="finite"):
        model.predict_features(np.array([[1.0, np.nan, 3.0, 0, 0, 0]]))
    with pytest.raises(PredictorInputError, match="finite"):
        model.predict_one([1.0, -2.0, 3.0, 0, 0, 0])
    assert model.predict_features(np.zeros((0, 6))).shape == (0,)
    assert model.predict([]).shape == (0,)
    with pytest.raises(TrainingError, match="too few"):
        train_admission(traces.slice(0, 10))
    with pytest.raises(PredictorError, match="not a LightGBM text model"):
        AdmissionModel("hello")
    no_tok = AdmissionModel(model.model_text, model.feature_names)
    with pytest.raises(Exception, match="no tokenizer"):
        no_tok.predict(["hi"])


def _sums_and_chat(rng: np.random.Generator, n: int) -> tuple[list[str], np.ndarray]:
    """Prompts of the same words and characters where numbers take few rounds and words
    many: what the three counts cannot tell apart and the characters can."""
    prompts, rounds = [], []
    for i in range(n):
        k = int(rng.integers(4, 12))
        if i % 2:
            prompts.append(" ".join(str(v) for v in rng.integers(10, 99, k)))
            rounds.append(rng.integers(4, 12))
        else:
            prompts.append(" ".join(rng.choice(["ab", "cd", "ef", "gh"], k)))
            rounds.append(rng.integers(40, 120))
    return prompts, np.asarray(rounds, dtype=np.float64)


def test_lexical_features_rank_what_the_counts_cannot():
    rng = np.random.default_rng(0)
    train_p, train_r = _sums_and_chat(rng, 400)
    test_p, test_r = _sums_and_chat(rng, 200)
    rho = {}
    for name, names in FEATURE_SETS.items():
        X = [[feature_row(names, p, len(p)) for p in ps] for ps in (train_p, test_p)]
        model = train_admission((X[0], train_r), AdmissionConfig(features=name))
        assert model.feature_names == names and model.needs_text == (name != "counts")
        assert model.predict_one(model.row(test_p[0], len(test_p[0]))) > 0
        rho[name] = spearman(model.predict_features(np.asarray(X[1])), test_r)
    # two classes of random rounds: a perfect class ranking reaches sqrt(3)/2 = 0.87
    assert rho["counts+lexical"] > 0.7 and rho["counts"] < 0.3, rho


def test_the_feature_set_is_recorded_and_redacted_prompts_refused(traces):
    both = train_admission(traces)
    assert both.entry()["feature_names"] == list(FEATURE_SETS["counts+lexical"])
    i = traces.column_names.index("prompt")
    redacted = traces.set_column(i, "prompt", pa.array([None] * traces.num_rows, pa.string()))
    # the trace records the prompt's lexical counts: redacted, it trains the same model
    assert train_admission(redacted).model_text == both.model_text
    old = redacted.drop_columns(["digit_permille", "symbol_permille", "question_marks"])
    with pytest.raises(TrainingError, match="redacted.*--admission-features counts"):
        train_admission(old, AdmissionConfig(features="counts+lexical"))
    # by default, traces with neither (redacted before schema v3) train the three counts
    counts = train_admission(old)
    assert counts.feature_names == FEATURE_SETS["counts"] and not counts.needs_text
    assert counts.info["config"]["features"] == "counts"
    assert both.info["config"]["features"] == "counts+lexical"
    with pytest.raises(Exception, match="unknown admission feature set"):
        AdmissionConfig(features="bag-of-words")
