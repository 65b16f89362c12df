"""The admission predictor: estimated TOTAL denoising rounds of a request, from its prompt alone.

A LightGBM regressor (100 trees, at most 15 leaves) over three prompt features (word count,
newline count, token count after the chat template; :mod:`dwise_predict.features`) trained on
``log(total_rounds)``. The estimate is ``exp`` of the regression: a geometric-mean-like estimate
of total denoising rounds (prefill blocks are not included; the scheduler adds them exactly).

Inference never calls LightGBM: the model text is compiled into lookup tables
(:class:`~dwise_predict.predictors.trees.CompiledForest`) that reproduce
``Booster.predict(raw_score=True)`` bit for bit at a fraction of its per-call overhead, which
matters because the scheduler predicts on every arrival. Training lives in
:mod:`dwise_predict.trainers.admission` (it is light too, but keeps the core inference-only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import write_json, write_text
from ..errors import BundleError, ModelError, PredictorInputError
from ..features import FEATURE_NAMES, PromptFeaturizer
from .trees import DEFAULT_GRID_LIMIT, CompiledForest, parse_lightgbm_text

MODEL_FILE = "admission.lgb.txt"
CONFIG_FILE = "admission.json"
#: what the estimate means, recorded in files and manifests
ESTIMATE = "total denoising rounds of the request (exp of the log-rounds regression; prefill blocks excluded)"


class AdmissionModel:
    """Prompt features -> estimated total denoising rounds.

    ``model_text`` is LightGBM's text format (``Booster.model_to_string()``): plain, diffable,
    loadable by LightGBM itself, never pickled. ``featurizer`` (optional) turns raw prompts into
    features; without it only :meth:`predict_features` works.
    """

    def __init__(self, model_text: str, feature_names: Sequence[str] = FEATURE_NAMES, *,
                 featurizer: PromptFeaturizer | None = None, info: dict[str, Any] | None = None,
                 grid_limit: int = DEFAULT_GRID_LIMIT) -> None:
        self.model_text = model_text
        self.feature_names = tuple(feature_names)
        header, trees = parse_lightgbm_text(model_text)
        n_model = int(header["max_feature_idx"]) + 1
        if n_model != len(self.feature_names):
            raise ModelError(
                f"the LightGBM model has {n_model} features but {len(self.feature_names)} names were given "
                f"({list(self.feature_names)}); retrain with `dwise-predict train`"
            )
        self.forest = CompiledForest(trees, n_model, grid_limit=grid_limit)
        self.featurizer = featurizer
        self.info = dict(info or {})

    # -- inference --------------------------------------------------------------------------
    def raw_score(self, X: np.ndarray) -> np.ndarray:
        """The regression output, log(total rounds), for ``(n, n_features)`` features (NaN = missing)."""
        return self.forest.predict_raw(np.asarray(X, dtype=np.float64))

    def predict_features(self, X: np.ndarray) -> np.ndarray:
        """Estimated total denoising rounds, one per row of ``X`` ``(n, n_features)``."""
        X = check_features(X, len(self.feature_names))
        return np.exp(self.forest.predict_raw(X))

    def predict_one(self, x: Sequence[float]) -> float:
        """One request's estimate from its feature row: the per-arrival fast path (~1 µs)."""
        if len(x) != len(self.feature_names):
            raise PredictorInputError(f"expected {len(self.feature_names)} features {list(self.feature_names)}, got {len(x)}")
        for v in x:
            if not (-math.inf < float(v) < math.inf) or v < 0:
                raise PredictorInputError(f"feature row {list(x)} has a negative or non-finite count; features are counts")
        return math.exp(self.forest.predict_raw_one(x))

    def predict(self, prompts: str | Sequence[str]) -> np.ndarray:
        """Estimated total denoising rounds for raw prompts (tokenized with the served model's template)."""
        if self.featurizer is None:
            raise BundleError("this admission model has no tokenizer/chat template; use predict_features, or "
                              "retrain with `dwise-predict train --tokenizer FILE --chat-template FILE`")
        return self.predict_features(self.featurizer(prompts))

    # -- reference path ---------------------------------------------------------------------
    def booster(self) -> Any:
        """The model as a ``lightgbm.Booster`` (for parity checks and export; not used to predict)."""
        import lightgbm as lgb

        return lgb.Booster(model_str=self.model_text)

    # -- files ------------------------------------------------------------------------------
    def save(self, folder: str | Path) -> list[str]:
        """Write ``admission.lgb.txt`` and ``admission.json`` into ``folder``; returns the file names."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / MODEL_FILE, self.model_text)
        config = {"feature_names": list(self.feature_names), "target": "log(total_rounds)", "estimate": ESTIMATE,
                  "n_trees": self.forest.n_trees, "max_leaves": self.forest.max_leaves, "info": self.info}
        write_json(folder / CONFIG_FILE, config)
        return [MODEL_FILE, CONFIG_FILE]

    @classmethod
    def load(cls, folder: str | Path, featurizer: PromptFeaturizer | None = None) -> AdmissionModel:
        folder = Path(folder)
        try:
            config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
            text = (folder / MODEL_FILE).read_text(encoding="utf-8")
        except FileNotFoundError as e:
            raise BundleError(f"admission model file missing: {e.filename}; re-save the bundle") from e
        except (ValueError, UnicodeDecodeError) as e:
            raise BundleError(f"admission model files in {folder} are corrupt ({e}); re-save the bundle") from e
        return cls(text, config["feature_names"], featurizer=featurizer, info=config.get("info"))

    def __repr__(self) -> str:
        return f"AdmissionModel(trees={self.forest.n_trees}, features={list(self.feature_names)})"


def check_features(X: Any, n_features: int, names: Sequence[str] = (), *, float32: bool = False) -> np.ndarray:
    """Admission feature rows as float64 ``(n, n_features)``: counts, finite and >= 0.

    ``float32=True`` also refuses values an ONNX (float32) model cannot represent.
    """
    which = f" {list(names)}" if names else ""
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise PredictorInputError(f"admission features{which} must be numbers, got {type(X).__name__}: {e}") from e
    if X.ndim == 1 and X.shape[0] == n_features:
        X = X[None, :]
    if X.ndim != 2 or X.shape[1] != n_features:
        raise PredictorInputError(f"admission features must have shape (n, {n_features}){which}, got {X.shape}")
    if X.size and (not np.all(np.isfinite(X)) or np.any(X < 0)):
        bad = int(np.flatnonzero(~np.isfinite(X).all(axis=1) | (X < 0).any(axis=1))[0])
        raise PredictorInputError(f"admission feature row {bad} is {X[bad].tolist()}: counts must be finite and >= 0")
    if float32 and (np.finfo(np.float32).max < X).any():
        raise PredictorInputError("admission features exceed float32 range; counts that large are not prompts")
    return X
