"""Train the output-length baselines (SSJF, S³, LTR, TRAIL) on the traces a bundle learns from.

The kinds and their inference live in :mod:`dwise_predict.predictors.baselines`; this module
fits them (LightGBM with ``deterministic=True, force_row_wise=True``, one thread and the seed;
TRAIL's ridge in closed form), so the same traces and seed give the same files byte for byte.
They train only when named: ``dwise-predict train --only admission,refinement,ssjf,s3,ltr,trail``
(``KindTrainer.only_when_named``). Every kind's tokens-per-round rate is Σ output tokens /
Σ denoising rounds of its training traces (docs/baselines.md, "The scale").

The evaluators set each baseline's estimate against the work a scheduler would rank by it:
total denoising rounds at arrival, rounds still to go after the first round for TRAIL (the
paper's Table 12: how well an output-length score ranks WORK).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from dwise_predict.bundle.modules import BundleModule
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.features import FEATURE_NAMES
from dwise_predict.predictors.baselines import (
    LTRPredictor,
    S3Predictor,
    SSJFPredictor,
    TRAILPredictor,
)
from dwise_predict.predictors.calibration import IsotonicMap

from .admission import tree_params
from .dataset import TraceArrays
from .kind import KindTrainer, TrainedPart, TrainSettings

if TYPE_CHECKING:
    from dwise_predict.bundle import Bundle

__all__ = [
    "LengthBaselineConfig",
    "train_ltr",
    "train_s3",
    "train_ssjf",
    "train_trail",
]


@dataclass(frozen=True)
class LengthBaselineConfig:
    """One config for the four baselines (each reads the fields it uses)."""

    n_trees: int = 100
    num_leaves: int = 15
    learning_rate: float = 0.1
    min_data_in_leaf: int = 20
    seed: int = 0
    num_threads: int = 1
    #: S³'s bucket width in output tokens (the reference model's block size)
    bucket_tokens: int = 32
    #: LTR: requests per ranking query, and relevance grades (quantiles of output length)
    ltr_group: int = 32
    ltr_grades: int = 16
    #: TRAIL's ridge penalties tried; the one with the least generalized cross-validation error
    #: is kept
    ridge_alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0, 1_000.0, 10_000.0)
    #: fewer training requests than this is refused
    min_samples: int = 32

    def __post_init__(self) -> None:
        if (
            self.n_trees < 1
            or self.num_leaves < 2
            or self.learning_rate <= 0
            or self.bucket_tokens < 1
            or self.ltr_group < 2
            or not 2 <= self.ltr_grades <= 31
            or not self.ridge_alphas
            or min(self.ridge_alphas) <= 0
        ):
            raise ConfigError(
                f"invalid baseline config {self}: need n_trees >= 1, num_leaves >= 2, "
                "learning_rate > 0, bucket_tokens >= 1, ltr_group >= 2, 2 <= ltr_grades <= 31 "
                "and positive ridge_alphas"
            )

    def lightgbm_params(self, **more: Any) -> dict[str, Any]:
        return tree_params(self, **more)


# -- data ----------------------------------------------------------------------------------------
def _checked(arrays: TraceArrays, config: LengthBaselineConfig, kind: str) -> np.ndarray:
    """The output tokens of ``arrays``, refused with the fix when they cannot train ``kind``."""
    if arrays.output_tokens is None:
        raise TrainingError(
            f"the {kind} baseline learns output lengths, and these traces' arrays carry no "
            "output_tokens; read the traces with dwise_predict.trainers.dataset.trace_arrays"
        )
    if arrays.n < config.min_samples:
        raise TrainingError(
            f"{arrays.n} requests are too few to train the {kind} baseline (need >= "
            f"{config.min_samples}); trace more requests"
        )
    tokens = arrays.output_tokens.astype(np.float64)
    if np.any(tokens < 0) or not np.all(np.isfinite(arrays.features)):
        raise TrainingError("negative output tokens or NaN features: the traces are corrupt")
    return tokens


def tokens_per_round(arrays: TraceArrays) -> float:
    """Σ output tokens / Σ denoising rounds: the one rate every baseline states rounds with."""
    rounds = float(arrays.total_rounds.sum())
    if arrays.output_tokens is None or rounds <= 0:
        raise TrainingError(
            "tokens per round needs the traces' output tokens and denoising rounds; read them "
            "with dwise_predict.trainers.dataset.trace_arrays"
        )
    return float(arrays.output_tokens.sum()) / rounds


def _booster(params: dict[str, Any], X: np.ndarray, y: np.ndarray, n: int, **ds: Any) -> str:
    import lightgbm as lgb

    data = lgb.Dataset(
        X,
        y,
        feature_name=list(FEATURE_NAMES),
        free_raw_data=True,
        params={"verbose": -1, "min_data_in_leaf": params["min_data_in_leaf"]},
        **ds,
    )
    return str(lgb.train(params, data, num_boost_round=n).model_to_string())


def _info(config: LengthBaselineConfig, arrays: TraceArrays, **more: Any) -> dict[str, Any]:
    import lightgbm as lgb

    return {"config": asdict(config), "n_train": arrays.n, "lightgbm": lgb.__version__, **more}


# -- the four kinds ------------------------------------------------------------------------------
def train_ssjf(arrays: TraceArrays, config: LengthBaselineConfig | None = None) -> SSJFPredictor:
    """SSJF: LightGBM regression of ``log1p(output_tokens)`` on the admission features."""
    config = config or LengthBaselineConfig()
    tokens = _checked(arrays, config, SSJFPredictor.kind)
    text = _booster(
        config.lightgbm_params(objective="regression"),
        arrays.features,
        np.log1p(tokens),
        config.n_trees,
    )
    return SSJFPredictor(text, tokens_per_round(arrays), info=_info(config, arrays))


def train_s3(arrays: TraceArrays, config: LengthBaselineConfig | None = None) -> S3Predictor:
    """S³: a LightGBM classifier over ``bucket_tokens``-wide output-length buckets (only the
    buckets the training traces reach); its score is the expected bucket's mean length."""
    config = config or LengthBaselineConfig()
    tokens = _checked(arrays, config, S3Predictor.kind)
    w = config.bucket_tokens
    raw = np.maximum(np.ceil(tokens / w).astype(np.int64) - 1, 0)  # bucket of each request
    present = np.unique(raw)
    if present.size < 2:
        raise TrainingError(
            f"every training request's output falls in one {w}-token bucket: S³ has nothing "
            "to classify; trace a workload with varied answer lengths"
        )
    label = np.searchsorted(present, raw)
    edges = [float(c * w) for c in present] + [float((present[-1] + 1) * w)]
    means = [float(tokens[label == j].mean()) for j in range(present.size)]
    text = _booster(
        config.lightgbm_params(objective="multiclass", num_class=int(present.size)),
        arrays.features,
        label.astype(np.float64),
        config.n_trees,
    )
    return S3Predictor(text, edges, means, tokens_per_round(arrays), info=_info(config, arrays))


def train_ltr(arrays: TraceArrays, config: LengthBaselineConfig | None = None) -> LTRPredictor:
    """LTR: LightGBM ``lambdarank`` over seeded queries of ``ltr_group`` requests, graded by
    output-length quantile (longer = higher grade); an isotonic map fitted on the training
    split puts the score on the token scale without changing its ranking."""
    from sklearn.isotonic import IsotonicRegression

    config = config or LengthBaselineConfig()
    tokens = _checked(arrays, config, LTRPredictor.kind)
    n = arrays.n
    order = np.random.default_rng(config.seed).permutation(n)
    ranks = np.argsort(np.argsort(tokens, kind="stable"), kind="stable")
    grade = np.minimum(ranks * config.ltr_grades // n, config.ltr_grades - 1)
    groups = [config.ltr_group] * (n // config.ltr_group)
    if n % config.ltr_group:
        groups.append(n % config.ltr_group)
    text = _booster(
        config.lightgbm_params(objective="lambdarank", metric="ndcg"),
        arrays.features[order],
        grade[order].astype(np.float64),
        config.n_trees,
        group=groups,
    )
    model = LTRPredictor(text, IsotonicMap(np.zeros(1), np.zeros(1)), 1.0)
    score = model.score(arrays.features)
    iso = IsotonicRegression(out_of_bounds="clip", increasing=True).fit(score, tokens)
    to_tokens = IsotonicMap(iso.X_thresholds_, iso.y_thresholds_)
    return LTRPredictor(text, to_tokens, tokens_per_round(arrays), info=_info(config, arrays))


def _ridge_gcv(
    X: np.ndarray, y: np.ndarray, alphas: tuple[float, ...]
) -> tuple[np.ndarray, float, float]:
    """Ridge on centred ``X`` with the penalty of least generalized cross-validation error
    (closed form through one SVD); returns (weights, intercept, alpha)."""
    xm, ym = X.mean(axis=0), float(y.mean())
    Xc, yc = X - xm, y - ym
    U, s, Vt = np.linalg.svd(Xc, full_matrices=False)
    uy = U.T @ yc
    n = len(y)

    def gcv(a: float) -> float:
        d = s**2 / (s**2 + a)
        resid = yc - U @ (d * uy)
        return float(resid @ resid) / n / (1.0 - d.sum() / n) ** 2

    a = min(alphas, key=gcv)  # the config refuses an empty list
    w = Vt.T @ (s / (s**2 + a) * uy)
    return w, ym - float(xm @ w), a


def train_trail(arrays: TraceArrays, config: LengthBaselineConfig | None = None) -> TRAILPredictor:
    """TRAIL: a prompt regressor like SSJF's for arrival, and a ridge regression of
    ``log1p(output_tokens)`` on the first denoising round's pooled hidden state (normalized as
    the refinement predictor normalizes it) for the re-estimate."""
    config = config or LengthBaselineConfig()
    tokens = _checked(arrays, config, TRAILPredictor.kind)
    if arrays.hidden is None:
        raise TrainingError(
            "the trail baseline reads first_round_hidden, which these traces lack; re-trace "
            "with hidden-state capture"
        )
    text = _booster(
        config.lightgbm_params(objective="regression"),
        arrays.features,
        np.log1p(tokens),
        config.n_trees,
    )
    hidden = arrays.hidden.astype(np.float64)
    mean = hidden.mean(axis=0)
    std = hidden.std(axis=0) + 1e-6
    scales = float(arrays.prompt_tokens.max()), float(arrays.output_budget.max())
    tpr = tokens_per_round(arrays)
    shell = TRAILPredictor(text, np.zeros(hidden.shape[1] + 2), 0.0, mean, std, *scales, tpr)
    X = shell.inputs(arrays.hidden, arrays.prompt_tokens, arrays.output_budget)
    w, b, alpha = _ridge_gcv(X, np.log1p(tokens), config.ridge_alphas)
    return TRAILPredictor(
        text,
        w,
        b,
        shell.hidden_mean,
        shell.hidden_std,
        *scales,
        tpr,
        info=_info(config, arrays, ridge_alpha=alpha),
    )


def _trainer(
    kind: str, fit: Callable[[TraceArrays, LengthBaselineConfig], BundleModule], **flags: Any
) -> KindTrainer:
    def train(arrays: TraceArrays, s: TrainSettings) -> TrainedPart:
        config = replace(s.config(kind, LengthBaselineConfig), seed=s.seed)
        return TrainedPart(fit(arrays, config))

    return KindTrainer(train=train, config_type=LengthBaselineConfig, only_when_named=True, **flags)


#: the kinds' trainers (named by each class's ``trainer``)
SSJF_TRAINER = _trainer(SSJFPredictor.kind, train_ssjf)
S3_TRAINER = _trainer(S3Predictor.kind, train_s3)
LTR_TRAINER = _trainer(LTRPredictor.kind, train_ltr)
TRAIL_TRAINER = _trainer(TRAILPredictor.kind, train_trail, needs_hidden=True)


# -- evaluation ----------------------------------------------------------------------------------
Pairs = dict[str, tuple[np.ndarray, np.ndarray]]


#: the baselines ranked by their estimate at arrival
Arrival = TypeVar("Arrival", SSJFPredictor, S3Predictor, LTRPredictor)


def _arrival(cls: type[Arrival]) -> Callable[[Bundle, TraceArrays], Pairs]:
    def evaluate(bundle: Bundle, arrays: TraceArrays) -> Pairs:
        (name,) = cls.estimates
        model = bundle.need(cls)
        return {name: (model.arrival_rounds(arrays.features), arrays.total_rounds.astype(float))}

    evaluate.__doc__ = f"The {cls.kind} estimate against total denoising rounds (its evaluator)."
    return evaluate


evaluate_ssjf = _arrival(SSJFPredictor)
evaluate_s3 = _arrival(S3Predictor)
evaluate_ltr = _arrival(LTRPredictor)


def evaluate_trail(bundle: Bundle, arrays: TraceArrays) -> Pairs:
    """TRAIL's re-estimate against the rounds still to go after the first denoising round."""
    if arrays.hidden is None:
        raise TrainingError(
            "the evaluation traces have no first_round_hidden; the trail baseline cannot be "
            "evaluated (re-trace with hidden-state capture)"
        )
    model = bundle.need(TRAILPredictor)
    (name,) = TRAILPredictor.estimates
    pred = model.refined_rounds(arrays.hidden, arrays.prompt_tokens, arrays.output_budget)
    return {name: (pred, arrays.remaining.astype(float))}
