"""Admission predictor -> ONNX: the LightGBM forest as one ``TreeEnsembleRegressor`` node.

Converted with onnxmltools (``convert_lightgbm``, ``zipmap=False``) so the output is a plain
tensor; the output is renamed ``log_total_rounds`` (shape ``(n, 1)``) and the file carries the
feature names, so :class:`dwise_predict.predictors.onnx_runtime.OnnxAdmission` can check what it
is fed. ONNX trees compare in float32 where LightGBM compares in float64; the admission features
are integer counts, far below 2**24, so no split can flip, and the parity gate
(:mod:`.parity`) checks it on probes placed at every split threshold.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.errors import MissingDependencyError, ModelError
from dwise_predict.predictors.admission import ONNX_FILE, AdmissionModel
from dwise_predict.predictors.onnx_runtime import ADMISSION_INPUT, ADMISSION_OUTPUT, OnnxAdmission

from ._onnx_files import save_model_atomic, set_metadata
from .parity import ExportCheck, OnnxExporter, Tolerance, compare, decide, time_batches

ADMISSION_ONNX = ONNX_FILE
#: precision -> what is compared, and the bound
TOLERANCES = {
    "fp32": Tolerance(
        1e-4,
        0.0,
        "log(total rounds); float32 thresholds and leaf sums in ONNX vs "
        "float64 in LightGBM: ~1e-6 expected, 1e-4 = 0.01% of the estimate",
    ),
}
#: the main-domain opset asked of onnxmltools (it picks the matching ai.onnx.ml version); every
#: onnxruntime >= 1.10 runs it (onnxmltools 1.16 converts up to 15)
DEFAULT_OPSET = 15


def admission_to_onnx(
    model: Any,
    path: str | Path,
    *,
    feature_names: list[str] | None = None,
    target_opset: int = DEFAULT_OPSET,
) -> Path:
    """Write ``model`` (an ``AdmissionModel``, a ``lightgbm.Booster`` or LightGBM model text) to
    ``path``."""
    try:
        import lightgbm as lgb
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType
    except ImportError as e:
        raise MissingDependencyError(
            f"ONNX export of the admission model needs onnxmltools ({e}); "
            "pip install 'dwise-predict[train]'"
        ) from e
    booster, names = _booster_and_names(model, lgb)
    names = list(feature_names or names)
    if len(names) != booster.num_feature():
        raise ModelError(
            f"{len(names)} feature names given for a model with {booster.num_feature()} features"
        )
    onx = onnxmltools.convert_lightgbm(
        booster,
        initial_types=[(ADMISSION_INPUT, FloatTensorType([None, len(names)]))],
        target_opset=int(target_opset),
        zipmap=False,
    )
    _rename_output(onx, ADMISSION_OUTPUT)
    onx.graph.name = "dwise_admission"  # onnxmltools draws a random uuid; same model, same bytes
    set_metadata(
        onx,
        {
            "dwise.predictor": AdmissionModel.kind,
            "dwise.precision": "fp32",
            "dwise.feature_names": json.dumps(names),
            "dwise.output": f"{ADMISSION_OUTPUT}: log(total denoising "
            "rounds), shape (n, 1); estimate = exp(output)",
            "dwise.n_trees": str(booster.num_trees()),
        },
    )
    return save_model_atomic(onx, path)


def _booster_and_names(model: Any, lgb: Any) -> tuple[Any, list[str]]:
    if isinstance(model, lgb.Booster):
        return model, list(model.feature_name())
    if isinstance(model, str):
        booster = lgb.Booster(model_str=model)
        return booster, list(booster.feature_name())
    if hasattr(model, "model_text") and hasattr(
        model, "feature_names"
    ):  # dwise_predict AdmissionModel
        return lgb.Booster(model_str=model.model_text), list(model.feature_names)
    raise ModelError(
        f"cannot export {type(model).__name__} as the admission model; pass an AdmissionModel, "
        "a lightgbm.Booster or LightGBM model text"
    )


def _rename_output(onx: Any, name: str) -> None:
    """Give the single graph output a meaningful name (onnxmltools calls it ``variable``)."""
    graph = onx.graph
    if len(graph.output) != 1:
        raise ModelError(
            f"expected one output from the LightGBM regressor conversion, got {len(graph.output)}"
        )
    old = graph.output[0].name
    for node in graph.node:
        for i, out in enumerate(node.output):
            if out == old:
                node.output[i] = name
        for i, inp in enumerate(node.input):
            if inp == old:
                node.input[i] = name
    graph.output[0].name = name


def admission_probes(model: Any, *, n_random: int = 512, seed: int = 0) -> np.ndarray:
    """Integer feature rows at, just below and just above every split threshold, plus random
    rows."""
    rng = np.random.default_rng(seed)
    n_features = len(model.feature_names)
    per_feature: list[np.ndarray] = []
    for f in range(n_features):
        th = np.concatenate(
            [t.threshold[t.split_feature == f] for t in model.forest.trees] or [np.zeros(0)]
        )
        th = th[np.isfinite(th) & (th >= 0) & (th < 2**24)]
        vals = np.unique(
            np.concatenate([np.floor(th), np.ceil(th), np.floor(th) - 1, np.ceil(th) + 1, [0, 1]])
        )
        per_feature.append(vals[vals >= 0])
    rows = []
    for f, vals in enumerate(per_feature):  # sweep one feature across its thresholds, others random
        other = np.stack(
            [rng.choice(per_feature[g], size=len(vals)) for g in range(n_features)], axis=1
        )
        other[:, f] = vals
        rows.append(other)
    hi = [max(float(v.max()), 1.0) * 1.5 for v in per_feature]
    rows.append(np.floor(rng.random((n_random, n_features)) * np.asarray(hi)))
    return np.concatenate(rows).astype(np.float64)


def check_admission(
    model: Any,
    onnx_path: str | Path,
    *,
    probes: np.ndarray | None = None,
    peer: str | Path | None = None,
    batches: tuple[int, ...] = (1, 128),
    repeats: int = 50,
    threads: int = 1,
) -> ExportCheck:
    """Parity of ``log(total rounds)`` on probes, and latency of native vs ONNX
    ``predict_features``."""
    onnx_model = OnnxAdmission(onnx_path, threads=threads)
    peer_model = OnnxAdmission(peer, threads=threads) if peer is not None else None
    X = admission_probes(model) if probes is None else np.asarray(probes, dtype=np.float64)
    check = ExportCheck(
        AdmissionModel.kind,
        onnx_model.precision,
        Path(onnx_path).name,
        compare(model.raw_score(X), onnx_model.raw_score(X), TOLERANCES[onnx_model.precision]),
    )

    def sides(b: int) -> dict[str, Any]:
        xb = np.resize(X, (b, X.shape[1]))
        fns = {
            "native": partial(model.predict_features, xb),
            "exported": partial(onnx_model.predict_features, xb),
        }
        if peer_model is not None:
            fns["peer"] = partial(peer_model.predict_features, xb)
        return fns

    time_batches(check, sides, batches=batches, repeats=repeats)
    return decide(check)


EXPORTER = OnnxExporter(
    file=ONNX_FILE, write=admission_to_onnx, check=check_admission, tolerances=TOLERANCES
)
