"""ONNX / INT8 export on small real models: a LightGBM booster trained here, an MLP ensemble built
from weights created here, exported for real (onnxmltools, torch.onnx) and run in real
onnxruntime sessions, each compared with the native predictor."""

from __future__ import annotations

import json
import subprocess
import sys

import lightgbm as lgb
import numpy as np
import onnx
import pytest
from dwise_predict.export.onnx_admission import TOLERANCES as ADMISSION_TOLERANCES
from dwise_predict.export.onnx_admission import admission_probes, admission_to_onnx, check_admission
from dwise_predict.export.onnx_refinement import TOLERANCES as REFINEMENT_TOLERANCES
from dwise_predict.export.onnx_refinement import (
    check_refinement,
    refinement_probes,
    refinement_to_onnx,
)
from dwise_predict.export.parity import (
    ExportCheck,
    ParityReport,
    Tolerance,
    compare,
    gate_int8,
)
from dwise_predict.export.quantize import NotQuantizable, quantize_int8

from dwise_predict.errors import BundleError, BundleIntegrityError, PredictorInputError
from dwise_predict.features import FEATURE_NAMES
from dwise_predict.predictors import AdmissionModel, IsotonicMap, MLPWeights, RefinementEnsemble
from dwise_predict.predictors.onnx_runtime import OnnxAdmission, OnnxRefinement

H, WIDTH, K = 48, 64, 40


@pytest.fixture(scope="module")
def booster():
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, 1500, 1500)
    X = np.stack([np.floor(tokens * 0.7), rng.poisson(tokens / 50), tokens], axis=1).astype(
        np.float64
    )
    y = np.log(3 + 0.04 * tokens + 2 * X[:, 1]) + rng.normal(0, 0.3, len(tokens))
    params = {
        "objective": "regression",
        "num_leaves": 15,
        "verbose": -1,
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": 1,
        "seed": 0,
    }
    return lgb.train(params, lgb.Dataset(X, y), num_boost_round=100)


@pytest.fixture(scope="module")
def admission(booster):
    return AdmissionModel(booster.model_to_string(), FEATURE_NAMES)


@pytest.fixture(scope="module")
def ensemble():
    rng = np.random.default_rng(1)

    def w(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    members = [
        MLPWeights(
            w(H + 2, WIDTH, scale=1 / np.sqrt(H)),
            w(WIDTH, scale=0.1),
            w(WIDTH, K, scale=0.3),
            (w(K, scale=0.5) - 2.5).astype(np.float32),
        )
        for _ in range(3)
    ]
    x = np.linspace(0.0, 40.0, 32)
    calibration = IsotonicMap(x, np.log1p(0.8 * x), "log1p")
    return RefinementEnsemble(
        members, w(H, scale=1.0), np.abs(w(H, scale=1.0)) + 0.5, 800.0, 256.0, calibration
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory, admission, ensemble):
    folder = tmp_path_factory.mktemp("onnx")
    adm = admission_to_onnx(admission, folder / "admission.onnx")
    ref = refinement_to_onnx(ensemble, folder / "refinement.onnx")
    (folder / "calibration.json").write_text(json.dumps(ensemble.calibration.to_dict()))
    return {"folder": folder, "admission": adm, "refinement": ref, "int8": quantize_int8(ref)}


# -- admission ------------------------------------------------------------------------------------
def test_admission_onnx_matches_lightgbm_at_every_split_threshold(admission, booster, files):
    X = admission_probes(admission)
    assert len(X) > 500  # thresholds of 100 trees on 3 features, both sides, plus random rows
    onx = OnnxAdmission(files["admission"])
    assert onx.feature_names == tuple(FEATURE_NAMES) and onx.precision == "fp32"
    raw = onx.raw_score(X)
    err = np.max(np.abs(raw - booster.predict(X, raw_score=True)))
    assert err < ADMISSION_TOLERANCES["fp32"].abs
    np.testing.assert_allclose(onx.predict_features(X), admission.predict_features(X), rtol=1e-4)
    assert onx.predict_one(X[3]) == pytest.approx(admission.predict_one(X[3]), rel=1e-4)
    assert onx.raw_score(np.zeros((0, 3))).shape == (0,)
    check = check_admission(admission, files["admission"], probes=X, batches=(1, 16), repeats=3)
    assert check.kept and check.parity.passed and check.parity.n == len(X)
    assert check.parity.max_abs_error == pytest.approx(
        float(np.max(np.abs(raw - admission.raw_score(X))))
    )
    assert set(check.latency_us) == {"1", "16"} and all(
        v > 0 for d in check.latency_us.values() for v in d.values()
    )


def test_admission_export_is_deterministic_and_atomic(admission, files, tmp_path):
    again = admission_to_onnx(admission, tmp_path / "admission.onnx")
    assert again.read_bytes() == files["admission"].read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "admission.onnx"
    ]  # no temp file left behind


def test_int8_does_not_apply_to_trees(files, tmp_path):
    with pytest.raises(NotQuantizable, match="no MatMul/Gemm"):
        quantize_int8(files["admission"], tmp_path / "admission.int8.onnx")
    assert not (tmp_path / "admission.int8.onnx").exists()


# -- refinement -----------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 7, 300])
def test_refinement_onnx_matches_numpy_for_any_batch(ensemble, files, batch):
    h, p, b = refinement_probes(ensemble, n=batch, seed=batch)
    onx = OnnxRefinement.from_files(files["refinement"], files["folder"] / "calibration.json")
    assert (onx.hidden_size, onx.K, onx.precision) == (H, K, "fp32")
    native_s = ensemble.survival(h, p, b)
    assert np.max(np.abs(onx.survival(h, p, b) - native_s)) < 1e-5
    tol = REFINEMENT_TOLERANCES["fp32"]
    raw = onx.predict(h, p, b, raw=True)
    assert np.all(
        np.abs(raw - ensemble.predict(h, p, b, raw=True))
        <= tol.bound(ensemble.predict(h, p, b, raw=True))
    )
    np.testing.assert_allclose(
        onx.predict(h, p, b), ensemble.predict(h, p, b), rtol=1e-4, atol=1e-3
    )
    assert raw.shape == (batch,) and np.all(raw > 0) and np.all(raw <= K)


def test_refinement_check_and_int8_gate(ensemble, files):
    probes = refinement_probes(ensemble, n=256)
    fp32 = check_refinement(
        ensemble, files["refinement"], probes=probes, batches=(1, 128), repeats=5
    )
    assert fp32.kept and fp32.parity.passed and fp32.parity.max_abs_error < 1e-2

    q = onnx.load(str(files["int8"]))
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in q.graph.node)
    assert files["int8"].stat().st_size < files["refinement"].stat().st_size
    int8_model = OnnxRefinement(files["int8"])
    assert int8_model.precision == "int8"
    int8 = gate_int8(
        check_refinement(
            ensemble,
            files["int8"],
            probes=probes,
            peer=files["refinement"],
            batches=(1, 128),
            repeats=5,
        )
    )
    assert int8.parity.max_abs_error > fp32.parity.max_abs_error  # it really is quantized
    speedup = int8.latency_us["128"]["peer"] / int8.latency_us["128"]["exported"]
    assert int8.kept == (int8.parity.passed and speedup >= 1.05)
    assert ("faster" in int8.reason) or ("not faster" in int8.reason) or ("fails" in int8.reason)
    json.dumps(int8.to_dict())  # the record is plain JSON


def _check(passed: bool, int8_us: float, fp32_us: float) -> ExportCheck:
    tol = Tolerance(0.5)
    err = 0.1 if passed else 2.0
    return ExportCheck(
        "refinement",
        "int8",
        "r.int8.onnx",
        ParityReport(10, err, err, err - 0.5, tol, passed),
        {"128": {"native": 100.0, "exported": int8_us, "peer": fp32_us}},
    )


@pytest.mark.parametrize(
    "passed, int8_us, fp32_us, kept, reason",
    [
        (True, 50.0, 100.0, True, "2.00x faster"),
        (True, 99.0, 100.0, False, "not faster"),
        (True, 150.0, 100.0, False, "not faster"),
        (False, 10.0, 100.0, False, "parity fails"),
    ],
)
def test_int8_gate_keeps_only_accurate_and_faster_files(passed, int8_us, fp32_us, kept, reason):
    c = gate_int8(_check(passed, int8_us, fp32_us))
    assert c.kept is kept and reason in c.reason


def test_compare_reports_max_abs_error_and_fails_on_nan():
    r = compare([1.0, 10.0, 100.0], [1.001, 10.0, 100.5], Tolerance(0.01, 0.01))
    assert r.max_abs_error == pytest.approx(0.5) and r.passed  # 0.5 <= 0.01 + 0.01 * 100
    assert not compare([1.0, 2.0], [1.0, np.nan], Tolerance(1.0)).passed
    assert not compare([1.0], [1.2], Tolerance(0.1)).passed
    with pytest.raises(ValueError, match="equal shapes"):
        compare([1.0, 2.0], [1.0], Tolerance(1.0))


# -- the core loader refuses what it cannot predict from -----------------------------------------
def test_onnx_runtime_refuses_bad_inputs(files):
    ref = OnnxRefinement(files["refinement"])
    with pytest.raises(PredictorInputError, match="hidden size 5 does not match"):
        ref.predict(np.zeros((2, 5)), 10, 10)
    h = np.zeros((2, H))
    h[1, 3] = np.nan
    with pytest.raises(PredictorInputError, match="hidden row 1 holds NaN"):
        ref.predict(h, 10, 10)
    with pytest.raises(PredictorInputError, match="output_budget must be finite"):
        ref.predict(np.zeros((2, H)), 10, [5, -1])
    with pytest.raises(PredictorInputError, match="one value per hidden row"):
        ref.predict(np.zeros((2, H)), [1, 2, 3], 4)
    assert ref.predict(np.zeros((0, H)), [], []).shape == (0,)
    adm = OnnxAdmission(files["admission"])
    with pytest.raises(PredictorInputError, match="counts must be finite and >= 0"):
        adm.predict_features([[1, -2, 3]])
    with pytest.raises(PredictorInputError, match=r"shape \(n, 3\)"):
        adm.predict_features([[1, 2]])


def test_onnx_runtime_refuses_wrong_missing_or_corrupt_files(files, booster, tmp_path):
    with pytest.raises(BundleError, match="holds the 'admission' predictor, not 'refinement'"):
        OnnxRefinement(files["admission"])
    with pytest.raises(BundleError, match="does not exist"):
        OnnxAdmission(tmp_path / "none.onnx")
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(files["refinement"].read_bytes()[:5000])
    with pytest.raises(BundleIntegrityError, match="not a loadable ONNX model"):
        OnnxRefinement(truncated)
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType

    foreign = tmp_path / "foreign.onnx"  # a plain onnxmltools file, without dwise metadata
    foreign.write_bytes(
        onnxmltools.convert_lightgbm(
            booster, initial_types=[("x", FloatTensorType([None, 3]))], zipmap=False
        ).SerializeToString()
    )
    with pytest.raises(BundleError, match="not written by dwise-predict's exporter"):
        OnnxAdmission(foreign)


def test_onnx_runtime_is_light():
    code = (
        "import sys, dwise_predict.predictors.onnx_runtime; "
        "print(','.join(m for m in ('torch', 'onnxmltools', 'sklearn') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
