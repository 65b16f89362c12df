"""Train the admission predictor: LightGBM on prompt features, target log(total rounds).

docs/concepts.md, "The predictors": 100 trees, at most 15 leaves, features = word count, newline
count, chat-template token count, and by default the prompt's digits, code symbols and question
marks (``AdmissionConfig.features``; docs/predictors.md, "Admission features"). Deterministic:
``deterministic=True``, ``force_row_wise=True``, a fixed thread count and seed, so the same traces
and seed give the same model text byte for byte.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from dwise_predict.errors import ConfigError, PredictorInputError, TrainingError
from dwise_predict.features import DEFAULT_FEATURE_SET, PromptFeaturizer, feature_set
from dwise_predict.predictors import AdmissionModel

from .dataset import TraceArrays, trace_arrays
from .kind import KindTrainer, TrainedPart, TrainSettings

if TYPE_CHECKING:
    from dwise_predict.bundle import Bundle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdmissionConfig:
    n_trees: int = 100
    num_leaves: int = 15
    learning_rate: float = 0.1
    min_data_in_leaf: int = 20
    seed: int = 0
    num_threads: int = 1
    #: fewer training requests than this is refused (LightGBM would fit noise)
    min_samples: int = 32
    #: the feature set (dwise_predict.features.FEATURE_SETS): ``"counts"`` is the paper's three;
    #: None picks ``"counts+lexical"`` when the traces keep every prompt's text, else ``"counts"``
    features: str | None = None

    def __post_init__(self) -> None:
        if self.features is not None:
            feature_set(self.features)  # an unknown name is refused here, naming the choices
        if self.n_trees < 1 or not 2 <= self.num_leaves <= 131072 or self.learning_rate <= 0:
            raise ConfigError(
                f"invalid admission config {self}: need n_trees "
                ">= 1, num_leaves >= 2, learning_rate > 0"
            )

    def lightgbm_params(self) -> dict[str, Any]:
        return {"objective": "regression", **tree_params(self)}


def tree_params(config: Any, **more: Any) -> dict[str, Any]:
    """LightGBM's parameters from a config's tree settings (``num_leaves``, ``learning_rate``,
    ``min_data_in_leaf``, ``seed``, ``num_threads``), deterministic and quiet; the admission
    model's and the output-length baselines' (which learn from the same features)."""
    return {
        "num_leaves": config.num_leaves,
        "learning_rate": config.learning_rate,
        "min_data_in_leaf": config.min_data_in_leaf,
        "seed": config.seed,
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": config.num_threads,
        "verbose": -1,
        **more,
    }


def train_admission(
    data: str | Path | pa.Table | TraceArrays | tuple[np.ndarray, np.ndarray],
    config: AdmissionConfig | None = None,
    *,
    featurizer: PromptFeaturizer | None = None,
) -> AdmissionModel:
    """Fit the admission model on traces, read or already in arrays (or ``(features (n,
    len(names)), total_rounds (n,))`` with the columns of ``config.features``).

    The returned model estimates TOTAL denoising rounds (``exp`` of the log-rounds regression).
    """
    import lightgbm as lgb

    config = config or AdmissionConfig()
    if isinstance(data, tuple):
        X, rounds = (np.asarray(a, dtype=np.float64) for a in data)
    else:
        arrays = data if isinstance(data, TraceArrays) else trace_arrays(data)
        config = resolved(config, arrays)
        X, rounds = _features(arrays, config), arrays.total_rounds.astype(np.float64)
    names = feature_set(config.features or DEFAULT_FEATURE_SET)
    if X.ndim != 2 or X.shape[1] != len(names) or len(X) != len(rounds):
        raise TrainingError(
            f"admission features {list(names)} must be (n, {len(names)}) with one total_rounds "
            f"each, got {X.shape} and {rounds.shape}"
        )
    if len(X) < config.min_samples:
        raise TrainingError(
            f"{len(X)} requests are too few to train the admission model (need >= "
            f"{config.min_samples}); trace more requests"
        )
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(rounds))):
        raise TrainingError(
            "admission features or total_rounds hold NaN/inf; the traces are corrupt, re-trace them"
        )
    if np.any(rounds < 1):
        raise TrainingError(
            "total_rounds must be >= 1 for every request (log target); the traces are corrupt"
        )
    ds = lgb.Dataset(
        X,
        np.log(rounds),
        feature_name=list(names),
        free_raw_data=True,
        params={"verbose": -1, "min_data_in_leaf": config.min_data_in_leaf},
    )
    booster = lgb.train(config.lightgbm_params(), ds, num_boost_round=config.n_trees)
    info = {"config": asdict(config), "n_train": int(len(X)), "lightgbm": lgb.__version__}
    return AdmissionModel(booster.model_to_string(), names, featurizer=featurizer, info=info)


def resolved(config: AdmissionConfig, arrays: TraceArrays) -> AdmissionConfig:
    """``config`` with its feature set named: the one given, else ``counts+lexical`` when the
    traces carry every prompt's lexical counts (schema v3 records them even with the text
    redacted) or its text, and the paper's ``counts`` when they do not, which is logged."""
    if config.features is not None:
        return config
    if arrays.lexical is not None:
        return replace(config, features=DEFAULT_FEATURE_SET)
    log.warning(
        "the traces carry neither the prompts' lexical counts nor their text (written redacted "
        "before trace schema v3): the admission model reads the three prompt counts, not the "
        "%s features",
        DEFAULT_FEATURE_SET,
    )
    return replace(config, features="counts")


def _features(arrays: TraceArrays, config: AdmissionConfig) -> np.ndarray:
    """The traces' features of ``config.features``; redacted prompts under a set that reads
    them are refused, naming the set that does not."""
    try:
        return arrays.admission_features(feature_set(config.features or DEFAULT_FEATURE_SET))
    except PredictorInputError:
        raise TrainingError(
            f"the admission feature set {config.features!r} reads each prompt's lexical counts, "
            "and these traces were written with prompts redacted before trace schema v3, which "
            "records them: re-trace, or train with `--admission-features counts` "
            "(AdmissionConfig(features='counts'))"
        ) from None


def _train(arrays: TraceArrays, s: TrainSettings) -> TrainedPart:
    cfg = replace(s.config(AdmissionModel.kind, AdmissionConfig), seed=s.seed)
    return TrainedPart(train_admission(arrays, cfg, featurizer=s.featurizer))


#: the admission kind's trainer (named by ``AdmissionModel.trainer``)
TRAINER = KindTrainer(train=_train, config_type=AdmissionConfig)


def evaluate_estimates(
    bundle: Bundle, arrays: TraceArrays
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The admission estimate against total denoising rounds (``AdmissionModel.evaluator``)."""
    (name,) = AdmissionModel.estimates
    return {
        name: (
            bundle.predict_admission_features(
                arrays.admission_features(bundle.need(AdmissionModel).feature_names)
            ),
            arrays.total_rounds.astype(float),
        )
    }
