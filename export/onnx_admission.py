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
from pathlib import Path
from typing import Any

from dwise_predict.errors import MissingDependencyError, ModelError
from dwise_predict.predictors.onnx_runtime import ADMISSION_INPUT, ADMISSION_OUTPUT

from ._onnx_files import save_model_atomic, set_metadata

ADMISSION_ONNX = "admission.onnx"
#: the main-domain opset asked of onnxmltools (it picks the matching ai.onnx.ml version); every
#: onnxruntime >= 1.10 runs it (onnxmltools 1.16 converts up to 15)
DEFAULT_OPSET = 15


def admission_to_onnx(model: Any, path: str | Path, *, feature_names: list[str] | None = None,
                      target_opset: int = DEFAULT_OPSET) -> Path:
    """Write ``model`` (an ``AdmissionModel``, a ``lightgbm.Booster`` or LightGBM model text) to ``path``."""
    try:
        import lightgbm as lgb
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType
    except ImportError as e:
        raise MissingDependencyError(f"ONNX export of the admission model needs onnxmltools ({e}); "
                                     "pip install 'dwise-predict[train]'") from e
    booster, names = _booster_and_names(model, lgb)
    names = list(feature_names or names)
    if len(names) != booster.num_feature():
        raise ModelError(f"{len(names)} feature names given for a model with {booster.num_feature()} features")
    onx = onnxmltools.convert_lightgbm(booster, initial_types=[(ADMISSION_INPUT, FloatTensorType([None, len(names)]))],
                                       target_opset=int(target_opset), zipmap=False)
    _rename_output(onx, ADMISSION_OUTPUT)
    onx.graph.name = "dwise_admission"  # onnxmltools draws a random uuid; same model, same bytes
    set_metadata(onx, {
        "dwise.predictor": "admission",
        "dwise.precision": "fp32",
        "dwise.feature_names": json.dumps(names),
        "dwise.output": f"{ADMISSION_OUTPUT}: log(total denoising rounds), shape (n, 1); estimate = exp(output)",
        "dwise.n_trees": str(booster.num_trees()),
    })
    return save_model_atomic(onx, path)


def _booster_and_names(model: Any, lgb: Any) -> tuple[Any, list[str]]:
    if isinstance(model, lgb.Booster):
        return model, list(model.feature_name())
    if isinstance(model, str):
        booster = lgb.Booster(model_str=model)
        return booster, list(booster.feature_name())
    if hasattr(model, "model_text") and hasattr(model, "feature_names"):  # dwise_predict AdmissionModel
        return lgb.Booster(model_str=model.model_text), list(model.feature_names)
    raise ModelError(f"cannot export {type(model).__name__} as the admission model; pass an AdmissionModel, "
                     "a lightgbm.Booster or LightGBM model text")


def _rename_output(onx: Any, name: str) -> None:
    """Give the single graph output a meaningful name (onnxmltools calls it ``variable``)."""
    graph = onx.graph
    if len(graph.output) != 1:
        raise ModelError(f"expected one output from the LightGBM regressor conversion, got {len(graph.output)}")
    old = graph.output[0].name
    for node in graph.node:
        for i, out in enumerate(node.output):
            if out == old:
                node.output[i] = name
        for i, inp in enumerate(node.input):
            if inp == old:
                node.input[i] = name
    graph.output[0].name = name
