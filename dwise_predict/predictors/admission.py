"""The admission predictor: estimated TOTAL denoising rounds of a request, from its prompt alone.

A LightGBM regressor (100 trees, at most 15 leaves) over prompt features (word count, newline count,
token count after the chat template, and by default three character counts;
:mod:`dwise_predict.features`) trained on ``log(total_rounds)``. The estimate is ``exp`` of the
regression: a geometric-mean-like estimate of total denoising rounds (prefill blocks are not
included; the scheduler adds them exactly).

Inference never calls LightGBM: the model text is compiled into lookup tables
(:class:`~dwise_predict.predictors.trees.CompiledForest`) that reproduce
``Booster.predict(raw_score=True)`` bit for bit at a fraction of its per-call overhead, which
matters because the scheduler predicts on every arrival. Training lives in
:mod:`dwise_predict.trainers.admission` (it is light too, but keeps the core inference-only).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..atomic import write_text
from ..errors import BundleIntegrityError, PredictorError, PredictorInputError
from ..features import (
    FEATURE_NAMES,
    PromptFeaturizer,
    feature_positions,
    feature_values,
    needs_text,
)
from .trees import DEFAULT_GRID_LIMIT, CompiledForest, parse_lightgbm_text

if TYPE_CHECKING:
    from ..bundle.modules import BundleFolder
    from ..fingerprint import ModelFingerprint

MODEL_FILE = "admission.lgb.txt"
#: format v1 only: the config now lives in the manifest entry
CONFIG_FILE = "admission.json"
TOKENIZER_FILE = "tokenizer.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
ONNX_FILE = "admission.onnx"
#: what the estimate means, recorded in files and manifests
ESTIMATE = (
    "total denoising rounds of the request (exp of the "
    "log-rounds regression; prefill blocks excluded)"
)


class AdmissionModel:
    """Prompt features -> estimated total denoising rounds.

    ``model_text`` is LightGBM's text format (``Booster.model_to_string()``): plain, diffable,
    loadable by LightGBM itself, never pickled. ``featurizer`` (optional) turns raw prompts into
    features; without it only :meth:`predict_features` works.
    """

    def __init__(
        self,
        model_text: str,
        feature_names: Sequence[str] = FEATURE_NAMES,
        *,
        featurizer: PromptFeaturizer | None = None,
        info: dict[str, Any] | None = None,
        grid_limit: int = DEFAULT_GRID_LIMIT,
    ) -> None:
        self.model_text = model_text
        self.feature_names = tuple(feature_names)
        try:
            self._positions = feature_positions(self.feature_names)
        except PredictorInputError as e:
            raise PredictorError(str(e)) from None
        #: whether the features read the prompt's characters, not only its three counts
        self.needs_text = needs_text(self.feature_names)
        header, trees = parse_lightgbm_text(model_text)
        n_model = int(header["max_feature_idx"]) + 1
        if n_model != len(self.feature_names):
            raise PredictorError(
                f"the LightGBM model has {n_model} features but {len(self.feature_names)} names "
                f"were given ({list(self.feature_names)}); retrain with `dwise-predict train`"
            )
        self.forest = CompiledForest(trees, n_model, grid_limit=grid_limit)
        self.featurizer = featurizer
        self.info = dict(info or {})

    # -- features ---------------------------------------------------------------------------
    def row(self, text: str, prompt_tokens: int) -> tuple[float, ...]:
        """The feature row of one request from its user prompt (chat template removed) and
        its token count as served: what a scheduler feeds :meth:`predict_one`."""
        values = feature_values(text, prompt_tokens, self.needs_text)
        return tuple(values[i] for i in self._positions)

    # -- inference --------------------------------------------------------------------------
    def raw_score(self, X: np.ndarray) -> np.ndarray:
        """The regression output, log(total rounds), for ``(n, n_features)`` features (NaN =
        missing)."""
        return self.forest.predict_raw(np.asarray(X, dtype=np.float64))

    def predict_features(self, X: np.ndarray) -> np.ndarray:
        """Estimated total denoising rounds, one per row of ``X`` ``(n, n_features)``."""
        X = check_features(X, len(self.feature_names))
        return np.exp(self.forest.predict_raw(X))

    def predict_one(self, x: Sequence[float]) -> float:
        """One request's estimate from its feature row: the per-arrival fast path (~1 µs)."""
        if len(x) != len(self.feature_names):
            raise PredictorInputError(
                f"expected {len(self.feature_names)} features "
                f"{list(self.feature_names)}, got {len(x)}"
            )
        for v in x:
            if not (-math.inf < float(v) < math.inf) or v < 0:
                raise PredictorInputError(
                    f"feature row {list(x)} has a negative or non-finite count; features are counts"
                )
        return math.exp(self.forest.predict_raw_one(x))

    def predict(self, prompts: str | Sequence[str]) -> np.ndarray:
        """Estimated total denoising rounds for raw prompts (tokenized with the served model's
        template)."""
        if self.featurizer is None:
            raise PredictorInputError(
                "this admission model has no tokenizer/chat template; use predict_features, or "
                "retrain with `dwise-predict train --tokenizer FILE --chat-template FILE`"
            )
        return self.predict_features(self.featurizer(prompts, self.feature_names))

    # -- reference path ---------------------------------------------------------------------
    def booster(self) -> Any:
        """The model as a ``lightgbm.Booster`` (for parity checks and export; not used to
        predict)."""
        import lightgbm as lgb

        return lgb.Booster(model_str=self.model_text)

    # -- bundle module (dwise_predict.bundle.modules) ----------------------------------------
    kind: ClassVar[str] = "admission"
    estimates: ClassVar[Mapping[str, str]] = {"admission": "total denoising rounds"}
    onnx_exporter: ClassVar[str | None] = "dwise_predict.export.onnx_admission:EXPORTER"
    trainer: ClassVar[str | None] = "dwise_predict.trainers.admission:TRAINER"
    evaluator: ClassVar[str | None] = "dwise_predict.trainers.admission:evaluate_estimates"
    #: the quality monitor's ``estimate`` label for the total-rounds estimate at arrival
    monitor_label: ClassVar[str | None] = "admission"

    def save(self, folder: str | Path) -> list[str]:
        """Write the LightGBM text and the featurizer's tokenizer/template; returns the names."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_text(folder / MODEL_FILE, self.model_text)
        return [MODEL_FILE, *save_featurizer(self.featurizer, folder)]

    def entry(self) -> dict[str, Any]:
        """The manifest's record of this predictor: everything but the trees themselves."""
        return {
            "estimate": ESTIMATE,
            "model": "lightgbm",
            "feature_names": list(self.feature_names),
            "target": "log(total_rounds)",
            "n_trees": self.forest.n_trees,
            "max_leaves": self.forest.max_leaves,
            "featurizer": featurizer_spec(self.featurizer),
            "info": self.info,
        }

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> AdmissionModel:
        config = dict(entry)
        if folder.has(CONFIG_FILE):  # bundle format v1 kept the config in admission.json
            config.update(folder.read_json(CONFIG_FILE))
        text = folder.read_text(MODEL_FILE)
        try:
            names = config["feature_names"]
        except KeyError as e:
            raise BundleIntegrityError(
                f"{folder.root}: the admission record lacks {e}; re-save the bundle"
            ) from e
        return cls(
            text,
            names,
            featurizer=load_featurizer(folder, config.get("featurizer")),
            info=config.get("info"),
        )

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        names = ", ".join(entry.get("feature_names") or entry.get("names") or [])
        return (
            f"LightGBM regressor: {entry.get('n_trees', '?')} trees, "
            f"≤ {entry.get('max_leaves', '?')} leaves; features ({names}); "
            "target log(total rounds)"
        )

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        """Nothing to cross-check: the features are prompt counts, not model internals."""

    def __repr__(self) -> str:
        return f"AdmissionModel(trees={self.forest.n_trees}, features={list(self.feature_names)})"


def check_features(
    X: Any, n_features: int, names: Sequence[str] = (), *, float32: bool = False
) -> np.ndarray:
    """Admission feature rows as float64 ``(n, n_features)``: counts, finite and >= 0.

    ``float32=True`` also refuses values an ONNX (float32) model cannot represent.
    """
    which = f" {list(names)}" if names else ""
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise PredictorInputError(
            f"admission features{which} must be numbers, got {type(X).__name__}: {e}"
        ) from e
    if X.ndim == 1 and X.shape[0] == n_features:
        X = X[None, :]
    if X.ndim != 2 or X.shape[1] != n_features:
        raise PredictorInputError(
            f"admission features must have shape (n, {n_features}){which}, got {X.shape}"
        )
    if X.size and (not np.all(np.isfinite(X)) or np.any(X < 0)):
        bad = int(np.flatnonzero(~np.isfinite(X).all(axis=1) | (X < 0).any(axis=1))[0])
        raise PredictorInputError(
            f"admission feature row {bad} is {X[bad].tolist()}: counts must be finite and >= 0"
        )
    if float32 and (np.finfo(np.float32).max < X).any():
        raise PredictorInputError(
            "admission features exceed float32 range; counts that large are not prompts"
        )
    return X


def featurizer_spec(featurizer: PromptFeaturizer | None) -> dict[str, Any] | None:
    """How the featurizer is stored: file names and hashes (None without a featurizer)."""
    if featurizer is None:
        return None
    spec: dict[str, Any] = {
        "tokenizer": TOKENIZER_FILE,
        "tokenizer_hash": featurizer.tokenizer_hash,
        "add_special_tokens": featurizer.add_special_tokens,
        "template_kwargs": featurizer.template_kwargs,
        "chat_template": None,
    }
    if featurizer.chat_template is not None:
        spec["chat_template"] = CHAT_TEMPLATE_FILE
        spec["chat_template_hash"] = featurizer.chat_template_hash
    return spec


def save_featurizer(featurizer: PromptFeaturizer | None, folder: Path) -> list[str]:
    """Write the tokenizer (and chat template) so raw prompts featurize as at training time."""
    if featurizer is None:
        return []
    write_text(folder / TOKENIZER_FILE, featurizer.tokenizer.to_str())
    if featurizer.chat_template is None:
        return [TOKENIZER_FILE]
    write_text(folder / CHAT_TEMPLATE_FILE, featurizer.chat_template.source)
    return [TOKENIZER_FILE, CHAT_TEMPLATE_FILE]


def load_featurizer(
    folder: BundleFolder, spec: Mapping[str, Any] | None
) -> PromptFeaturizer | None:
    """The featurizer a bundle stored (``spec`` from :func:`featurizer_spec`), or None."""
    if not spec:
        return None
    from tokenizers import Tokenizer

    tok_name = spec.get("tokenizer")
    tpl_name = spec.get("chat_template")
    if not isinstance(tok_name, str):
        raise BundleIntegrityError(
            f"{folder.root}: the featurizer names no tokenizer file; re-save the bundle"
        )
    tok_path = folder.path(tok_name)
    template = folder.read_text(tpl_name) if tpl_name else None
    try:
        tokenizer = Tokenizer.from_file(str(tok_path))
    except Exception as e:  # tokenizers raises a bare Exception
        raise BundleIntegrityError(
            f"{tok_path} is not a valid tokenizer ({e}); re-save the bundle"
        ) from e
    return PromptFeaturizer(
        tokenizer,
        template,
        add_special_tokens=bool(spec.get("add_special_tokens", False)),
        template_kwargs=spec.get("template_kwargs") or {},
    )
