"""`dwise-predict export` on real bundles, and the round trip train -> export -> push -> pull ->
load.

Predictors are real: a LightGBM booster trained here and an MLP ensemble from weights made here,
saved with ``save_bundle``. The round trip goes through the loopback Hub endpoint
(tests/hub_server.py) with the real huggingface_hub client.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest
from dwise_predict.export.bundle_export import export_bundle
from dwise_predict.export.hub import push_bundle

from dwise_predict.bundle import load_bundle, save_bundle
from dwise_predict.cli import main
from dwise_predict.errors import BundleError, BundleIntegrityError
from dwise_predict.features import FEATURE_NAMES
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.hub import pull_bundle
from dwise_predict.predictors import AdmissionModel, IsotonicMap, MLPWeights, RefinementEnsemble
from dwise_predict.predictors.onnx_runtime import onnx_predictors

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import LoopbackHub, isolate_hf_home  # noqa: E402

H, WIDTH, K = 32, 64, 30
FP = ModelFingerprint(
    model_id="tiny-bd", block_size=32, threshold=0.95, hidden_size=H, mask_token_id=1
)


def train_admission(seed: int = 0) -> AdmissionModel:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(4, 1500, 1200)
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
        "seed": seed,
    }
    return AdmissionModel(
        lgb.train(params, lgb.Dataset(X, y), num_boost_round=100).model_to_string(), FEATURE_NAMES
    )


def make_refinement(seed: int = 1) -> RefinementEnsemble:
    rng = np.random.default_rng(seed)

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
    x = np.linspace(0.0, 30.0, 16)
    return RefinementEnsemble(
        members,
        w(H, scale=1.0),
        np.abs(w(H, scale=1.0)) + 0.5,
        800.0,
        256.0,
        IsotonicMap(x, np.log1p(0.8 * x), "log1p"),
    )


def inputs(n: int = 64, seed: int = 3):
    rng = np.random.default_rng(seed)
    X = np.stack(
        [rng.integers(0, 900, n), rng.integers(0, 30, n), rng.integers(1, 1500, n)], axis=1
    ).astype(float)
    return (
        X,
        rng.standard_normal((n, H)).astype(np.float32),
        rng.integers(0, 1600, n),
        rng.integers(1, 256, n),
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A freshly trained bundle and its exported copy (exported once: the torch export takes
    seconds)."""
    root = tmp_path_factory.mktemp("bundles")
    fresh = save_bundle(
        root / "fresh", [train_admission(), make_refinement()], fingerprint=FP, name="tiny-bd-test"
    )
    shutil.copytree(fresh, root / "exported")
    report = export_bundle(root / "exported", int8=True, repeats=3)
    return fresh, root / "exported", report


def test_export_adds_gated_files_and_keeps_the_bundle_verifiable(exported):
    fresh, path, report = exported
    files = {c.file: c for c in report.checks}
    assert set(files) == {"admission.onnx", "refinement.onnx", "refinement.int8.onnx"}
    assert files["admission.onnx"].kept and files["refinement.onnx"].kept
    assert "admission.int8.onnx" in report.not_applicable  # trees: nothing to quantize
    bundle = load_bundle(path)  # every sha256 (ONNX files included) verified
    manifest = bundle.manifest
    for name, check in files.items():
        assert (name in manifest["files"]) == check.kept == (path / name).exists()
        assert manifest["exports"][name]["parity"]["max_abs_error"] == check.parity.max_abs_error
    assert manifest["exports"]["admission.int8.onnx"]["kept"] is False
    card = (path / "README.md").read_text()  # re-rendered with the export record, and re-hashed
    assert "## Exported files" in card and "| `refinement.onnx` | refinement | fp32 | yes |" in card
    assert "| `admission.int8.onnx` |  |  | no |" in card
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp folders left

    X, h, p, b = inputs()
    onnx_adm, onnx_ref = onnx_predictors(bundle)
    np.testing.assert_allclose(
        onnx_adm.predict_features(X), bundle.predict_admission_features(X), rtol=1e-4
    )
    expect_ref = "refinement.int8.onnx" if files["refinement.int8.onnx"].kept else "refinement.onnx"
    assert onnx_ref.path.name == expect_ref
    _, fp32_ref = onnx_predictors(bundle, int8=False)
    np.testing.assert_allclose(
        fp32_ref.predict(h, p, b), bundle.predict_refined(h, p, b), rtol=1e-4, atol=1e-3
    )
    # native predictions are untouched by the export
    original = load_bundle(fresh)
    np.testing.assert_array_equal(
        bundle.predict_refined(h, p, b), original.predict_refined(h, p, b)
    )


def test_tampered_onnx_file_is_refused(exported, tmp_path):
    _, path, _ = exported
    copy = shutil.copytree(path, tmp_path / "b")
    data = bytearray((copy / "admission.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "admission.onnx").write_bytes(bytes(data))
    with pytest.raises(BundleIntegrityError, match="admission.onnx does not match its sha256"):
        load_bundle(copy)


def test_round_trip_train_export_push_pull_load(exported, tmp_path, monkeypatch):
    """Loopback endpoint: the exported bundle is pushed, pulled (into a folder and from the cache),
    loaded, and predicts exactly what the freshly trained bundle predicts."""
    fresh, path, _ = exported
    isolate_hf_home(monkeypatch, tmp_path / "hf_home")
    with LoopbackHub(write_token="tok") as hub:
        pushed = push_bundle(path, "org/tiny-bd-test", tag="v1", token="tok", endpoint=hub.url)
        pulled = pull_bundle(
            pushed.hub_ref, tmp_path / "pulled", endpoint=hub.url, cache_dir=tmp_path / "cache"
        )
        cached = pull_bundle(pushed.hub_ref, endpoint=hub.url, cache_dir=tmp_path / "cache")
        # the one entry point: load_bundle("hf://ORG/NAME@REV") resolves through the configured
        # endpoint
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert pushed.hub_ref == "hf://org/tiny-bd-test@v1"
        by_ref = load_bundle(pushed.hub_ref).path
        assert hub.unhandled == []
    X, h, p, b = inputs()
    reference = load_bundle(fresh)
    for folder in (pulled, cached, by_ref):
        got = load_bundle(folder)
        assert got.fingerprint == reference.fingerprint
        np.testing.assert_array_equal(
            got.predict_admission_features(X), reference.predict_admission_features(X)
        )
        np.testing.assert_array_equal(
            got.predict_refined(h, p, b), reference.predict_refined(h, p, b)
        )
        np.testing.assert_array_equal(
            got.predict_refined(h, p, b, raw=True), reference.predict_refined(h, p, b, raw=True)
        )
        a1, r1 = onnx_predictors(got)
        a2, r2 = onnx_predictors(load_bundle(path))
        np.testing.assert_array_equal(a1.predict_features(X), a2.predict_features(X))
        np.testing.assert_array_equal(r1.predict(h, p, b), r2.predict(h, p, b))


def test_cli_export_admission_only_bundle_twice(tmp_path, capsys):
    path = save_bundle(tmp_path / "adm", [train_admission(seed=5)], fingerprint=FP)
    report = tmp_path / "report.json"
    for _ in range(2):  # re-exporting replaces the previous export files and records
        assert (
            main(["export", str(path), "--int8", "--repeats", "2", "--report", str(report), "-q"])
            == 0
        )
    out = capsys.readouterr().out
    assert "admission.onnx" in out and "admission.int8.onnx: not applicable" in out
    bundle = load_bundle(path)
    assert sorted(bundle.manifest["exports"]) == ["admission.int8.onnx", "admission.onnx"]
    assert json.loads(report.read_text())["checks"][0]["file"] == "admission.onnx"
    adm, ref = onnx_predictors(bundle)
    assert ref is None and adm is not None


def test_export_errors(tmp_path, capsys):
    with pytest.raises(BundleError, match="does not exist"):
        export_bundle(tmp_path / "none")
    path = save_bundle(tmp_path / "adm", [train_admission(seed=6)], fingerprint=FP)
    with pytest.raises(BundleError, match="already exists"):
        export_bundle(path, out=path)
    with pytest.raises(BundleError, match="carries no ONNX predictor"):
        onnx_predictors(load_bundle(path))
    assert main(["export", str(tmp_path / "none"), "-q"]) == 1
    assert "does not exist" in capsys.readouterr().err
