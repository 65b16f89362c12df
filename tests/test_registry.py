"""One registry of predictor kinds: a kind is one module plus one `register` line.

A toy kind registered here (and only here) is trained by `train_bundle`, evaluated, exported,
and tracked by the SGLang quality monitor, through the hooks its class names; and no production
module outside the registry and the kinds' own modules spells a kind's name.
"""

from __future__ import annotations

import ast
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnxruntime as ort
import pytest
from dwise_predict.export.bundle_export import export_bundle
from dwise_predict.export.parity import ExportCheck, OnnxExporter, Tolerance, compare, decide
from dwise_predict.trainers.admission import AdmissionConfig
from dwise_predict.trainers.dataset import TraceArrays, trace_arrays
from dwise_predict.trainers.evaluate import evaluate_arrays
from dwise_predict.trainers.kind import (
    KindTrainer,
    TrainedPart,
    TrainSettings,
    trainable,
    trainer_for,
)
from dwise_predict.trainers.pipeline import parse_only, train_bundle
from dwise_predict.trainers.refinement import RefinementConfig
from onnx import TensorProto, helper
from synthetic_traces import make_traces

from dwise_predict.atomic import write_json
from dwise_predict.bundle import load_bundle
from dwise_predict.bundle.hooks import Evaluator, Exporter, Trainer
from dwise_predict.bundle.modules import (
    HOOKS,
    BundleFolder,
    all_estimates,
    hook,
    register,
    registered,
    unregister,
)
from dwise_predict.errors import ConfigError, MissingDependencyError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.ranking import spearman
from dwise_predict.sglang.monitor import QualityMonitor

REPO = Path(__file__).resolve().parents[1]


class ToyLinear:
    """A toy kind: total rounds ~ a + b * prompt tokens, fitted by least squares."""

    kind: ClassVar[str] = "toy_linear"
    estimates: ClassVar[Mapping[str, str]] = {"toy_rounds": "total denoising rounds"}
    trainer: ClassVar[str | None] = f"{__name__}:TOY_TRAINER"
    onnx_exporter: ClassVar[str | None] = f"{__name__}:TOY_EXPORTER"
    evaluator: ClassVar[str | None] = f"{__name__}:toy_evaluate"
    monitor_label: ClassVar[str | None] = "toy"

    def __init__(self, a: float, b: float) -> None:
        self.a, self.b = a, b

    def predict(self, prompt_tokens: Any) -> np.ndarray:
        return self.a + self.b * np.asarray(prompt_tokens, dtype=np.float64)

    def save(self, folder: Path) -> list[str]:
        write_json(folder / "toy_linear.json", {"a": self.a, "b": self.b})
        return ["toy_linear.json"]

    def entry(self) -> dict[str, Any]:
        return {"estimate": "a + b * prompt tokens", "model": "least squares"}

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> ToyLinear:
        d = folder.read_json("toy_linear.json")
        return cls(float(d["a"]), float(d["b"]))

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        return "toy linear model"

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        pass


def _toy_train(arrays: TraceArrays, s: TrainSettings) -> TrainedPart:
    b, a = np.polyfit(arrays.prompt_tokens, arrays.total_rounds.astype(float), 1)
    return TrainedPart(ToyLinear(float(a), float(b)), {"n_fit": arrays.n})


def toy_evaluate(bundle: Any, arrays: TraceArrays) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    toy = bundle.need(ToyLinear)
    return {"toy_rounds": (toy.predict(arrays.prompt_tokens), arrays.total_rounds.astype(float))}


def _toy_write(model: ToyLinear, path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "b"], ["bx"]), helper.make_node("Add", ["bx", "a"], ["y"])],
        "toy_linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        [
            helper.make_tensor("a", TensorProto.FLOAT, [], [model.a]),
            helper.make_tensor("b", TensorProto.FLOAT, [], [model.b]),
        ],
    )
    onx = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onx.ir_version = 8
    path.write_bytes(onx.SerializeToString())
    return path


def _toy_check(model: ToyLinear, path: Path, **_: Any) -> ExportCheck:
    x = np.linspace(1.0, 500.0, 64, dtype=np.float32)
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    parity = compare(model.predict(x), out, TOY_TOLERANCES["fp32"])
    return decide(ExportCheck(ToyLinear.kind, "fp32", path.name, parity))


TOY_TOLERANCES = {"fp32": Tolerance(1e-3, 1e-5, "float32 multiply-add")}
TOY_TRAINER = KindTrainer(train=_toy_train)
TOY_EXPORTER = OnnxExporter(
    file="toy_linear.onnx", write=_toy_write, check=_toy_check, tolerances=TOY_TOLERANCES
)


@pytest.fixture
def toy_kind():
    register(ToyLinear)  # the one line a new kind adds
    yield ToyLinear
    unregister(ToyLinear.kind)


def test_one_register_line_makes_a_kind_trainable_evaluable_exportable_monitored(
    toy_kind, tmp_path
):
    assert ToyLinear.kind in trainable() and ToyLinear.kind in parse_only(None)
    assert all_estimates()["toy_rounds"] == "total denoising rounds"
    assert QualityMonitor().labels["toy"] == ToyLinear.kind

    traces = make_traces(300, seed=0)
    arrays = trace_arrays(traces)
    path = train_bundle(traces, tmp_path / "b", only=f"admission,{ToyLinear.kind}")
    bundle = load_bundle(path)
    toy = bundle.need(ToyLinear)
    b, a = np.polyfit(arrays.prompt_tokens, arrays.total_rounds.astype(float), 1)
    assert toy.a == pytest.approx(a, rel=1e-12) and toy.b == pytest.approx(b, rel=1e-12)
    assert bundle.manifest["training"][ToyLinear.kind] == {"n_fit": 300}

    metrics, preds = evaluate_arrays(bundle, arrays)
    want = spearman(a + b * arrays.prompt_tokens, arrays.total_rounds)
    assert metrics["toy_rounds"]["spearman"] == pytest.approx(want, abs=1e-12)
    assert {"admission", "toy_rounds"} <= set(preds)

    report = export_bundle(path, repeats=1)
    toy_checks = [(c.file, c.kept) for c in report.checks if c.predictor == ToyLinear.kind]
    assert toy_checks == [("toy_linear.onnx", True)]
    assert load_bundle(path).manifest["exports"]["toy_linear.onnx"]["kept"] is True

    m = QualityMonitor(window=4)
    for actual in (10.0, 20.0, 30.0, 40.0):
        m.record(actual, {ToyLinear.kind: 2.0 * actual, "admission": actual})
    snap = m.snapshot()
    assert snap["toy"]["median_ratio"] == 2.0 and snap["drifted"] == ["toy"]
    assert snap["admission"]["median_ratio"] == 1.0


def test_an_unregistered_kind_is_not_trainable(toy_kind):
    unregister(ToyLinear.kind)
    assert ToyLinear.kind not in trainable()
    with pytest.raises(ConfigError, match="--only takes"):
        parse_only(ToyLinear.kind)


def test_a_hook_that_does_not_resolve_names_the_fix(tmp_path, monkeypatch):
    class Broken(ToyLinear):
        kind: ClassVar[str] = "toy_broken"
        trainer: ClassVar[str | None] = "no_such_module_xyz:TRAINER"
        evaluator: ClassVar[str | None] = f"{__name__}:NO_SUCH_ATTRIBUTE"
        onnx_exporter: ClassVar[str | None] = "missing_colon"

    with pytest.raises(ConfigError, match="cannot be imported.*fix Broken.trainer"):
        hook(Broken, "trainer")
    with pytest.raises(ConfigError, match="has no 'NO_SUCH_ATTRIBUTE'"):
        hook(Broken, "evaluator")
    with pytest.raises(ConfigError, match="package.module:ATTRIBUTE"):
        hook(Broken, "onnx_exporter")
    (tmp_path / "needs_absent_pkg.py").write_text("import absent_pkg_for_dwise_tests\nX = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    Broken.trainer = "needs_absent_pkg:X"
    with pytest.raises(MissingDependencyError, match="absent_pkg_for_dwise_tests"):
        hook(Broken, "trainer")
    sys.modules.pop("needs_absent_pkg", None)


#: a hook name that resolves, but to the wrong kind of object
NOT_A_TRAINER = "just a string"


def toy_not_an_evaluator() -> None: ...


def test_a_hook_naming_the_wrong_kind_of_object_is_refused_with_the_protocol():
    class Mistyped(ToyLinear):
        kind: ClassVar[str] = "toy_mistyped"
        trainer: ClassVar[str | None] = f"{__name__}:NOT_A_TRAINER"
        onnx_exporter: ClassVar[str | None] = f"{__name__}:TOY_TRAINER"
        evaluator: ClassVar[str | None] = f"{__name__}:TOY_TOLERANCES"

    with pytest.raises(
        ConfigError, match=r"Mistyped.trainer names .*a str, which is not a .*\.Trainer"
    ):
        hook(Mistyped, "trainer")
    with pytest.raises(ConfigError, match=r"a KindTrainer, which is not a .*\.Exporter"):
        hook(Mistyped, "onnx_exporter")
    with pytest.raises(ConfigError, match=r"a dict, which is not a .*\.Evaluator"):
        hook(Mistyped, "evaluator")
    register(Mistyped)
    try:
        with pytest.raises(ConfigError, match="Adding a predictor kind"):
            parse_only(None)  # the pipeline asks every trainable kind's trainer
    finally:
        unregister(Mistyped.kind)


def test_the_shipped_hooks_follow_their_protocols():
    assert isinstance(hook("admission", "trainer"), Trainer)
    assert isinstance(hook("refinement", "evaluator"), Evaluator)
    for kind in ("admission", "refinement", "dws"):
        assert isinstance(hook(kind, "onnx_exporter"), Exporter)
    assert trainer_for("admission").config_type is AdmissionConfig
    assert trainer_for("refinement").config_type is RefinementConfig


def test_a_config_of_the_wrong_class_is_refused_naming_the_expected_one(tmp_path):
    traces = make_traces(120, seed=0)
    with pytest.raises(
        ConfigError, match=r"trained with a .*RefinementConfig, got a AdmissionConfig"
    ):
        train_bundle(
            traces, tmp_path / "b", only="admission", configs={"refinement": AdmissionConfig()}
        )
    with pytest.raises(ConfigError, match="not a trainable predictor kind"):
        train_bundle(
            traces, tmp_path / "b", only="admission", configs={"admision": AdmissionConfig()}
        )
    assert not (tmp_path / "b").exists()  # refused before anything trained
    settings = TrainSettings(configs={"admission": RefinementConfig()})
    with pytest.raises(ConfigError, match=r"AdmissionConfig, got a RefinementConfig"):
        settings.config("admission", AdmissionConfig)
    assert settings.config("refinement", RefinementConfig) == RefinementConfig()


def test_a_config_reaches_its_kinds_trainer(toy_kind, tmp_path, monkeypatch):
    seen = []

    def train(arrays: TraceArrays, s: TrainSettings) -> TrainedPart:
        seen.append(s.config(ToyLinear.kind, ToyConfig))
        return _toy_train(arrays, s)

    monkeypatch.setitem(globals(), "_CONFIGURED_TRAINER", KindTrainer(train, ToyConfig))
    monkeypatch.setattr(ToyLinear, "trainer", f"{__name__}:_CONFIGURED_TRAINER")
    traces = make_traces(120, seed=0)
    config = ToyConfig(slope_only=True)
    train_bundle(traces, tmp_path / "b", only=ToyLinear.kind, configs={ToyLinear.kind: config})
    assert seen == [config]


@dataclass(frozen=True)
class ToyConfig:
    slope_only: bool = False


def test_every_shipped_hook_resolves():
    for kind, cls in registered().items():
        for name in HOOKS:
            if getattr(cls, name, None):
                assert hook(cls, name) is not None, (kind, name)


# -- no kind name outside the registry and the kinds' modules --------------------------------
PRODUCTION = ("dwise_predict", "trainers", "export", "tracing", "zoo")
#: the simulator names its per-request estimate arrays and estimate levels by estimate
#: (``workload.admission``, ``DWISE(estimates="admission")``): an estimate name there is not a
#: kind lookup, so it is allowed where a kind declares that estimate name
ESTIMATE_NAMES_ALLOWED_IN = ("dwise_predict/runtime/",)


def _own_files() -> set[str]:
    """The registry, and each kind's own modules: its class's file and every hook's module."""
    own = {"dwise_predict/bundle/modules.py", "dwise_predict/bundle/builtin.py"}
    for cls in registered().values():
        own.add(str(Path(inspect.getfile(cls)).resolve().relative_to(REPO)))
        for name in HOOKS:
            ref = getattr(cls, name, None)
            if ref:
                hook(cls, name)  # imports the module it names
                where = sys.modules[str(ref).partition(":")[0]]
                own.add(str(Path(inspect.getfile(where)).resolve().relative_to(REPO)))
    return own


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def test_no_kind_name_literal_outside_the_registry_and_the_kind_modules():
    """A string constant (not a docstring) equal to a registered kind's name is a kind
    identifier spelled by hand; it must come from the kind's class (``AdmissionModel.kind``) or
    the registry instead, so renaming or adding a kind touches one module."""
    kinds = set(registered())
    estimates = set(all_estimates())
    own = _own_files()
    offenders = []
    for root in PRODUCTION:
        for path in sorted((REPO / root).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel in own or "/bundles/" in rel:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = _docstrings(tree)
            lenient = rel.startswith(ESTIMATE_NAMES_ALLOWED_IN)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value in kinds
                    and id(node) not in docs
                    and not (lenient and node.value in estimates)
                ):
                    offenders.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert offenders == []
    assert len(own) >= 8  # the registry, four kind classes' files, their trainers/exporters
