"""Bundle modules: a new predictor kind is one module plus one register line, and the shipped
kinds keep loading bundles written before the module protocol (format v1)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import lightgbm as lgb
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from dwise_predict.export.bundle_export import export_bundle
from dwise_predict.export.parity import ExportCheck, OnnxExporter, Tolerance, compare, decide
from onnx import TensorProto, helper

from dwise_predict.atomic import write_json
from dwise_predict.bundle import load_bundle, read_manifest, record_evaluation, save_bundle
from dwise_predict.bundle.modules import BundleFolder, register, unregister
from dwise_predict.errors import BundleVersionError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.predictors import AdmissionModel, RefinementEnsemble

FP = ModelFingerprint(model_id="toy/dllm", block_size=32, threshold=0.9, decoding="low_confidence")
REPO = Path(__file__).resolve().parents[1]


class ToyScale:
    """A toy predictor kind: estimate = factor * x. Everything a kind needs, nothing more."""

    kind: ClassVar[str] = "toy_scale"
    estimates: ClassVar[Mapping[str, str]] = {"toy": "a toy quantity"}
    onnx_exporter: ClassVar[str | None] = f"{__name__}:TOY_EXPORTER"

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.factor * np.asarray(x, dtype=np.float64)

    def save(self, folder: Path) -> list[str]:
        write_json(folder / "toy.json", {"factor": self.factor})
        return ["toy.json"]

    def entry(self) -> dict[str, Any]:
        return {"estimate": "factor times x", "model": "one multiplication"}

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> ToyScale:
        return cls(float(folder.read_json("toy.json")["factor"]))

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        return f"toy model: {entry['model']}"

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        pass


def _toy_write(model: ToyScale, path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "f"], ["y"])],
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        [helper.make_tensor("f", TensorProto.FLOAT, [], [model.factor])],
    )
    onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onx.ir_version = 8
    path.write_bytes(onx.SerializeToString())
    return path


def _toy_check(
    model: ToyScale, path: Path, *, peer: Path | None = None, repeats: int = 1, threads: int = 1
) -> ExportCheck:
    x = np.linspace(0.0, 100.0, 64, dtype=np.float32)
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    check = ExportCheck(
        ToyScale.kind, "fp32", path.name, compare(model.predict(x), out, TOY_TOLERANCES["fp32"])
    )
    return decide(check)


TOY_TOLERANCES = {"fp32": Tolerance(1e-3, 1e-6, "float32 multiply")}
TOY_EXPORTER = OnnxExporter(
    file="toy.onnx", write=_toy_write, check=_toy_check, tolerances=TOY_TOLERANCES
)


@pytest.fixture
def toy_kind():
    register(ToyScale)
    yield ToyScale
    unregister(ToyScale.kind)


def test_a_new_kind_round_trips_save_load_card_record_export(toy_kind, tmp_path):
    path = save_bundle(tmp_path / "toy", [ToyScale(2.5)], fingerprint=FP)
    bundle = load_bundle(path)
    toy = bundle.module(ToyScale)
    assert toy is not None and toy.factor == 2.5 and list(bundle.modules) == ["toy_scale"]
    assert np.array_equal(toy.predict([1.0, 4.0]), [2.5, 10.0])
    card = (path / "README.md").read_text()
    assert "| toy_scale | toy model: one multiplication | factor times x | toy.json |" in card

    metrics = {"n_requests": 10, "toy": {"spearman": 0.875, "median_ratio": 1.0, "n": 10}}
    record_evaluation(path, metrics)
    card = (path / "README.md").read_text()
    assert "| toy | a toy quantity | 0.875 |" in card
    assert load_bundle(path).manifest["metrics"]["toy"]["spearman"] == 0.875

    report = export_bundle(path, repeats=1)
    checks = [(c.predictor, c.file, c.kept) for c in report.checks]
    assert checks == [("toy_scale", "toy.onnx", True)]
    again = load_bundle(path)  # every hash (the ONNX file included) verifies
    assert again.manifest["exports"]["toy.onnx"]["kept"] is True
    onx = onnx.load(str(path / "toy.onnx"))
    assert onx.graph.node[0].op_type == "Mul"


def test_metrics_for_a_kind_the_bundle_lacks_are_refused(toy_kind, tmp_path):
    path = save_bundle(tmp_path / "toy", [ToyScale(1.0)], fingerprint=FP)
    with pytest.raises(Exception, match="no \\['admission'\\] predictor"):
        record_evaluation(path, {"admission": {"spearman": 0.5, "n": 3}})


def test_an_unknown_kind_is_refused_as_written_by_a_newer_library(toy_kind, tmp_path):
    path = save_bundle(tmp_path / "toy", [ToyScale(1.0)], fingerprint=FP)
    unregister(ToyScale.kind)  # this "library" does not know the kind
    with pytest.raises(BundleVersionError, match="kind 'toy_scale'.*newer dwise-predict.*upgrade"):
        load_bundle(path)


def test_a_format_v1_bundle_loads_through_the_migration(tmp_path):
    """The zoo's tiny-bd bundle up to v0.3.0 (kept as a fixture) was written before the module
    protocol: it loads through the v1 migration, its admission estimates equal LightGBM's own,
    and a v2 re-save predicts identically."""
    src = REPO / "tests" / "fixtures" / "tiny-bd-v1"
    assert json.loads((src / "manifest.json").read_text())["format_version"] == 1
    old = load_bundle(src)
    admission, refinement = old.need(AdmissionModel), old.need(RefinementEnsemble)
    X = np.array([[3, 0, 20], [40, 2, 90], [200, 9, 700], [1, 0, 5]], dtype=np.float64)
    booster = lgb.Booster(model_file=str(src / "admission.lgb.txt"))
    assert np.allclose(
        admission.predict_features(X),
        np.exp(booster.predict(X, raw_score=True)),
        rtol=1e-12,
        atol=0,
    )
    # a bundle on the paper's three counts is fed three counts by a scheduler, from the text
    assert old.admission_row("What is 7 * 8?\nAnswer.", 20) == (6.0, 1.0, 20.0)
    assert not admission.needs_text

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((6, refinement.hidden_size)).astype(np.float32)
    prompts = ["What is 7 * 8?", "Write a haiku about queues."]
    new = load_bundle(
        save_bundle(tmp_path / "v2", old.modules.values(), fingerprint=old.fingerprint)
    )
    assert read_manifest(new.path)["format_version"] == 2
    assert np.array_equal(new.predict_admission(prompts), old.predict_admission(prompts))
    assert np.array_equal(
        new.predict_refined(hidden, 30, 256), old.predict_refined(hidden, 30, 256)
    )
    assert np.array_equal(
        new.predict_refined(hidden, 30, 256, raw=True),
        old.predict_refined(hidden, 30, 256, raw=True),
    )


def test_a_v1_bundle_updated_in_place_keeps_its_predictions(tmp_path):
    """Recording an evaluation into a v1 bundle rewrites its manifest as v2; same predictions."""
    d = tmp_path / "tiny"
    shutil.copytree(REPO / "zoo" / "bundles" / "tiny-bd", d)
    before = load_bundle(d)
    h = before.need(RefinementEnsemble).hidden_size
    hidden = np.random.default_rng(1).standard_normal((4, h))
    record_evaluation(d, {"n_requests": 4, "admission": {"spearman": 0.5, "n": 4}})
    after = load_bundle(d)
    assert json.loads((d / "manifest.json").read_text())["format_version"] == 2
    assert np.array_equal(
        after.predict_refined(hidden, 12, 256), before.predict_refined(hidden, 12, 256)
    )
    assert np.array_equal(after.predict_admission(["hi"]), before.predict_admission(["hi"]))


_KIND_LITERAL = re.compile(r"""["'](admission|refinement|refine)["']""")


def test_kind_names_appear_only_in_each_predictors_own_module():
    own = {"onnx_admission.py", "onnx_refinement.py"}
    offenders = [
        f"{p.relative_to(REPO)}:{n}"
        for folder in (REPO / "dwise_predict" / "bundle", REPO / "export")
        for p in sorted(folder.rglob("*.py"))
        if p.name not in own
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _KIND_LITERAL.search(line)
    ]
    assert offenders == []
