"""Refinement predictor on SYNTHETIC planted traces: beats admission, calibrated, deterministic,
validated."""

import dataclasses
import logging

import numpy as np
import pytest
import torch
from dwise_predict.trainers.admission import train_admission
from dwise_predict.trainers.dataset import trace_arrays
from dwise_predict.trainers.evaluate import estimate_metrics
from dwise_predict.trainers.refinement import (
    RefinementConfig,
    ensemble_to_torch,
    fit_isotonic,
    survival_nll,
    train_refinement,
)
from synthetic_traces import make_traces

from dwise_predict.bundle.modules import BundleFolder
from dwise_predict.errors import PredictorInputError, TrainingError
from dwise_predict.predictors import IsotonicMap, RefinementEnsemble
from dwise_predict.predictors.calibration import DEFAULT_TRANSFORM, TRANSFORMS

H = 64
CFG = RefinementConfig(epochs=12, seed=0)


@pytest.fixture(scope="module")
def data():
    return make_traces(1200, H, seed=0), trace_arrays(make_traces(1000, H, seed=1))


@pytest.fixture(scope="module")
def ensemble(data):
    return train_refinement(data[0], CFG)


def test_shapes_and_meaning(ensemble, data):
    ev = data[1]
    assert len(ensemble.members) == 3 and int(trace_arrays(data[0]).remaining.max()) == ensemble.K
    assert ensemble.members[0].w1.shape == (H + 2, 256) and ensemble.members[0].w2.shape == (
        256,
        ensemble.K,
    )
    s = ensemble.survival(ev.hidden[:5], ev.prompt_tokens[:5], ev.output_budget[:5])
    assert s.shape == (5, ensemble.K)
    assert np.all(np.diff(s, axis=1) <= 1e-12) and np.all((s >= 0) & (s <= 1))
    raw = ensemble.predict(ev.hidden[:5], ev.prompt_tokens[:5], ev.output_budget[:5], raw=True)
    assert np.allclose(raw, s.sum(axis=1))  # restricted mean = sum of the averaged survival curve


def test_refined_beats_admission_overall_and_within_category(ensemble, data):
    train, ev = data
    model = train_admission(train)
    adm = model.predict_features(ev.admission_features(model.feature_names))
    refined = ensemble.predict(ev.hidden, ev.prompt_tokens, ev.output_budget)
    m_adm = estimate_metrics(adm, ev.total_rounds.astype(float), ev.category)
    m_ref = estimate_metrics(refined, ev.remaining.astype(float), ev.category)
    assert m_ref["spearman"] > m_adm["spearman"] + 0.1
    assert m_ref["within_category_mean_spearman"] > m_adm["within_category_mean_spearman"] + 0.3
    for c, v in m_ref["per_category"].items():
        assert v["spearman"] > m_adm["per_category"][c]["spearman"], c


def test_isotonic_map_fixes_the_scale_without_changing_the_ranking(ensemble, data):
    ev = data[1]
    raw = ensemble.predict(ev.hidden, ev.prompt_tokens, ev.output_budget, raw=True)
    cal = ensemble.predict(ev.hidden, ev.prompt_tokens, ev.output_budget)
    y = ev.remaining.astype(float)
    m_raw, m_cal = estimate_metrics(raw, y, ev.category), estimate_metrics(cal, y, ev.category)
    assert 0.95 <= m_cal["median_ratio"] <= 1.05, m_cal["median_ratio"]
    assert abs(m_raw["median_ratio"] - 1) > abs(m_cal["median_ratio"] - 1)
    assert abs(m_cal["spearman"] - m_raw["spearman"]) < 0.02
    assert ensemble.calibration is not None and np.all(
        np.diff(ensemble.calibration.y_thresholds) >= 0
    )


def test_same_seed_gives_bit_identical_predictions(ensemble, data, caplog):
    with caplog.at_level(logging.INFO, logger="dwise_predict"):
        again = train_refinement(data[0], CFG)
    # each member says it starts (minutes on a CPU at real sizes); cross-fitted calibration
    # trains each on the other folds, so the counts add up to two passes over the traces
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refinement")]
    assert [m.split(":")[0] for m in said] == [f"refinement member {i} of 3" for i in (1, 2, 3)]
    counts = [int(m.split(" over ")[1].split()[0]) for m in said]
    assert sum(counts) == 2 * 1200 and all("12 epochs" in m for m in said)
    ev = data[1]
    a = ensemble.predict(ev.hidden, ev.prompt_tokens, ev.output_budget)
    b = again.predict(ev.hidden, ev.prompt_tokens, ev.output_budget)
    assert np.array_equal(a, b)
    for m1, m2 in zip(ensemble.members, again.members):
        assert np.array_equal(m1.w1, m2.w1) and np.array_equal(m1.w2, m2.w2)


def test_torch_path_matches_numpy(ensemble, data):
    ev = data[1]
    module = ensemble_to_torch(ensemble)
    with torch.no_grad():
        for raw in (True, False):
            got = module(
                torch.from_numpy(ev.hidden),
                torch.from_numpy(ev.prompt_tokens),
                torch.from_numpy(ev.output_budget),
                raw=raw,
            ).numpy()
            want = ensemble.predict(ev.hidden, ev.prompt_tokens, ev.output_budget, raw=raw)
            # the float32 raw mean agrees to 1e-4; a steep isotonic segment (slope ~ 10 here)
            # scales that difference up, so the calibrated estimate gets 1e-3
            tol = 1e-4 if raw else 1e-3
            assert np.max(np.abs(got - want) / np.maximum(want, 1.0)) < tol


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_every_calibration_transform_agrees_on_the_numpy_and_torch_paths(ensemble, data, transform):
    ev = data[1]
    raw = ensemble.predict(ev.hidden, ev.prompt_tokens, ev.output_budget, raw=True)
    cal = fit_isotonic(raw, ev.remaining, transform)
    assert cal.target_transform == transform
    with_map = dataclasses.replace(ensemble, calibration=cal)
    want = with_map.predict(ev.hidden, ev.prompt_tokens, ev.output_budget)
    # the map is on the scale of remaining rounds whatever it was fitted to (not log rounds)
    assert abs(np.median(want) / max(np.median(ev.remaining), 1.0) - 1.0) < 0.6
    with torch.no_grad():
        got = ensemble_to_torch(with_map)(
            torch.from_numpy(ev.hidden),
            torch.from_numpy(ev.prompt_tokens),
            torch.from_numpy(ev.output_budget),
        ).numpy()
    assert np.max(np.abs(got - want) / np.maximum(want, 1.0)) < 1e-4  # float32 torch path


def test_one_calibration_default_everywhere():
    assert RefinementConfig().calibration == DEFAULT_TRANSFORM
    assert IsotonicMap(np.zeros(1), np.zeros(1)).target_transform == DEFAULT_TRANSFORM
    stored = IsotonicMap.from_dict({"x_thresholds": [0.0], "y_thresholds": [1.0]})
    assert stored.target_transform == DEFAULT_TRANSFORM
    raw, remaining = np.arange(20.0), np.arange(20)
    assert fit_isotonic(raw, remaining).target_transform == DEFAULT_TRANSFORM


def test_survival_nll_matches_hand_computation():
    z = torch.tensor([[0.3, -1.0, 2.0], [0.1, 0.2, 0.3]])
    h = torch.sigmoid(z)
    nll = survival_nll(z, torch.tensor([1, 2]), torch.tensor([False, True]))
    # request 0: survived round 1, finished at round 2; request 1: censored after 2 rounds
    want = (
        -(
            torch.log(1 - h[0, 0])
            + torch.log(h[0, 1])
            + torch.log(1 - h[1, 0])
            + torch.log(1 - h[1, 1])
        )
        / 2
    )
    assert torch.allclose(nll, want)


def test_save_load_identical(ensemble, data, tmp_path):
    files = ensemble.save(tmp_path)
    back = RefinementEnsemble.load(BundleFolder(tmp_path, frozenset(files)), ensemble.entry())
    ev = data[1]
    assert np.array_equal(
        back.predict(ev.hidden, ev.prompt_tokens, ev.output_budget),
        ensemble.predict(ev.hidden, ev.prompt_tokens, ev.output_budget),
    )


def test_bad_inputs(ensemble, data):
    ev = data[1]
    h = ev.hidden[:4].copy()
    h[2, 5] = np.nan
    with pytest.raises(PredictorInputError, match="row 2 holds NaN/inf"):
        ensemble.predict(h, 10, 256)
    h[2, 5] = np.inf
    with pytest.raises(PredictorInputError, match="NaN/inf"):
        ensemble.predict(h, 10, 256)
    with pytest.raises(
        PredictorInputError, match=f"hidden size 32 does not match the bundle's hidden size {H}"
    ):
        ensemble.predict(np.zeros((1, 32)), 10, 256)
    with pytest.raises(PredictorInputError, match="one value per hidden row"):
        ensemble.predict(ev.hidden[:3], [1, 2], 256)
    with pytest.raises(PredictorInputError, match="finite and >= 0"):
        ensemble.predict(ev.hidden[:1], -1, 256)
    assert ensemble.predict(np.zeros((0, H)), [], []).shape == (0,)
    one = ensemble.predict(ev.hidden[0], ev.prompt_tokens[0], ev.output_budget[0])
    assert one.shape == (1,)


def test_too_few_samples_and_nothing_to_refine(data):
    with pytest.raises(TrainingError, match="too few"):
        train_refinement(data[0].slice(0, 10), CFG)
    table = data[0].slice(0, 64)
    ones = [[1]] * table.num_rows
    import pyarrow as pa

    t = table.set_column(
        table.schema.get_field_index("rounds_per_block"),
        "rounds_per_block",
        pa.array(ones, type=pa.list_(pa.int32())),
    )
    t = t.set_column(
        t.schema.get_field_index("total_rounds"),
        "total_rounds",
        pa.array([1] * t.num_rows, pa.int32()),
    )
    with pytest.raises(TrainingError, match="K = 0"):
        train_refinement(t, dataclasses.replace(CFG, epochs=1))
