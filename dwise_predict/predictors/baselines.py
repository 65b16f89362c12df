"""The learned output-length schedulers as predictor kinds: SSJF, S³, LTR and TRAIL.

Why here: the DWISE paper compares its remaining-work estimates with learned schedulers from
autoregressive serving, which rank requests by their (predicted) OUTPUT LENGTH. On a
block-diffusion LLM output length and denoising work can part ways (docs/baselines.md), so the
library ships the four as predictor kinds, trained by the same pipeline on the same traces as a
bundle's own predictors, and as scheduling policies (``runtime.policies.LengthSRPT``):

* ``ssjf``: a small regressor of output tokens from the prompt (LightGBM on the admission
  features, target ``log1p(output_tokens)``; SSJF's proxy model);
* ``s3``: output-length buckets (a LightGBM classifier over ``block_size``-token buckets; the
  score is the expected bucket length, ``Σ_b p_b · mean tokens of b``; S³);
* ``ltr``: a ranking loss on output length (LightGBM ``lambdarank`` on the admission features;
  its raw score is put on the token scale by an isotonic map fitted on the training split, which
  keeps its ranking; LTR);
* ``trail``: remaining output tokens re-estimated from the first denoising round's pooled
  hidden state (a ridge regressor on the refinement predictor's input; TRAIL), with a prompt
  regressor like SSJF's for the estimate at arrival.

Every kind predicts TOKENS and states them in the scheduler's unit, rounds, with one global
rate: ``tokens_per_round`` = Σ output tokens / Σ denoising rounds of its training traces. An
output-length ranker knows no per-request rate; one constant keeps its ranking and puts prompt
blocks and predicted output on one scale (docs/baselines.md, "The scale").

Inference is numpy plus LightGBM's own ``Booster`` (a core dependency; imported when a model
is first used) over plain files: LightGBM text, safetensors, JSON. Nothing is pickled. Training
lives in :mod:`dwise_predict.trainers.baselines`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..atomic import write_bytes, write_json, write_text
from ..errors import BundleIntegrityError, PredictorError, PredictorInputError
from ..features import FEATURE_NAMES
from .admission import check_features
from .calibration import IsotonicMap

if TYPE_CHECKING:
    from ..bundle.modules import BundleFolder
    from ..fingerprint import ModelFingerprint

__all__ = [
    "LENGTH_KINDS",
    "LTRPredictor",
    "LengthBaseline",
    "S3Predictor",
    "SSJFPredictor",
    "TRAILPredictor",
]

#: the output-length baselines' kinds, in the paper's order
LENGTH_KINDS = ("ssjf", "s3", "ltr", "trail")

_TRAINERS = "dwise_predict.trainers.baselines"


class _Booster:
    """A LightGBM text model, parsed once into a ``Booster`` on first use (LightGBM is a core
    dependency, but a scheduler that never ranks by a baseline never imports it)."""

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or "tree" not in text:
            raise PredictorError("not a LightGBM text model; retrain the baseline")
        self.text = text
        self._booster: Any = None

    def predict(self, X: np.ndarray, **kw: Any) -> np.ndarray:
        if self._booster is None:
            import lightgbm as lgb

            self._booster = lgb.Booster(model_str=self.text)
        return np.asarray(self._booster.predict(X, num_threads=1, **kw), dtype=np.float64)


class LengthBaseline:
    """What the four output-length baselines share: prompt features in, tokens out, one
    tokens-per-round rate to state them in rounds (see the module docstring).

    Every kind has a LightGBM model of the prompt features, saved as its ``FILE``.
    Subclasses set the registry members and :meth:`predict_tokens`; :meth:`arrival_rounds` is
    what a scheduler ranks a new request by, and :meth:`refined_rounds` (``refines`` kinds
    only) what it ranks it by after its first denoising round.
    """

    kind: ClassVar[str] = ""
    estimates: ClassVar[Mapping[str, str]] = {}
    onnx_exporter: ClassVar[str | None] = None
    #: re-estimates after the first denoising round (TRAIL)
    refines: ClassVar[bool] = False
    #: the model family, for the manifest and the card
    model: ClassVar[str] = ""
    #: the scheduler of the paper's comparison this kind stands for, and what it ranks by
    #: (``dwise-predict eval``'s rounds-or-tokens table labels the score with it)
    paper_name: ClassVar[str] = ""
    #: the LightGBM text model's file in a bundle
    FILE: ClassVar[str] = ""

    def __init__(
        self,
        model_text: str,
        tokens_per_round: float,
        feature_names: Sequence[str] = FEATURE_NAMES,
        info: Mapping[str, Any] | None = None,
    ) -> None:
        self.booster = _Booster(model_text)
        tpr = float(tokens_per_round)
        if not np.isfinite(tpr) or tpr <= 0:
            raise PredictorError(
                f"{self.kind}: tokens_per_round={tokens_per_round} must be a finite number > 0; "
                "retrain the baseline"
            )
        self.tokens_per_round = tpr
        self.feature_names = tuple(feature_names)
        self.info = dict(info or {})

    # -- inference ----------------------------------------------------------------------------
    def features(self, X: Any) -> np.ndarray:
        return check_features(X, len(self.feature_names), self.feature_names)

    def predict_tokens(self, X: Any) -> np.ndarray:
        """Predicted output tokens, one per row of the admission features ``X`` (n, 3)."""
        raise NotImplementedError

    def _regressed_tokens(self, X: Any) -> np.ndarray:
        """Tokens from a regressor of ``log1p(output_tokens)`` (SSJF, TRAIL at arrival)."""
        X = self.features(X)
        return _expm1_tokens(self.booster.predict(X)) if len(X) else np.zeros(0)

    def arrival_rounds(self, X: Any) -> np.ndarray:
        """The estimate a request arrives with, in rounds: predicted tokens / tokens per round
        (what :class:`~dwise_predict.runtime.policies.LengthSRPT` ranks by)."""
        return self.predict_tokens(X) / self.tokens_per_round

    def refined_rounds(
        self, hidden: np.ndarray, prompt_tokens: Any, output_budget: Any
    ) -> np.ndarray:
        """Rounds still to go after the first denoising round (``refines`` kinds only)."""
        raise PredictorError(f"the {self.kind} baseline does not re-estimate after round one")

    # -- bundle module --------------------------------------------------------------------------
    def save(self, folder: str | Path) -> list[str]:
        folder = Path(folder)
        write_text(folder / self.FILE, self.booster.text)
        return [self.FILE, *self._save_more(folder)]

    def _save_more(self, folder: Path) -> list[str]:
        """Files a kind saves beside its LightGBM model; returns their names."""
        return []

    def _entry(self, **more: Any) -> dict[str, Any]:
        return {
            "estimate": next(iter(self.estimates.values())),
            "model": self.model,
            "feature_names": list(self.feature_names),
            "tokens_per_round": self.tokens_per_round,
            **more,
            "info": self.info,
        }

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        """Nothing to cross-check: the inputs are prompt counts (TRAIL checks its hidden size)."""

    @classmethod
    def _recorded(cls, entry: Mapping[str, Any], folder: BundleFolder) -> dict[str, Any]:
        """The constructor arguments every baseline's bundle holds: its LightGBM model and
        what :meth:`_entry` records."""
        return {
            "model_text": folder.read_text(cls.FILE),
            "tokens_per_round": cls._need(entry, "tokens_per_round", folder),
            "feature_names": cls._need(entry, "feature_names", folder),
            "info": entry.get("info"),
        }

    @staticmethod
    def _need(entry: Mapping[str, Any], key: str, folder: BundleFolder) -> Any:
        try:
            return entry[key]
        except KeyError as e:
            raise BundleIntegrityError(
                f"{folder.root}: the baseline record lacks {e}; re-save the bundle"
            ) from e


def _expm1_tokens(raw: np.ndarray) -> np.ndarray:
    return np.maximum(np.expm1(raw), 0.0)


class SSJFPredictor(LengthBaseline):
    """SSJF: output tokens from the prompt's admission features (LightGBM, target
    ``log1p(output_tokens)``)."""

    kind: ClassVar[str] = "ssjf"
    estimates: ClassVar[Mapping[str, str]] = {
        "ssjf": "total denoising rounds (predicted output tokens / tokens per round)"
    }
    trainer: ClassVar[str | None] = f"{_TRAINERS}:SSJF_TRAINER"
    evaluator: ClassVar[str | None] = f"{_TRAINERS}:evaluate_ssjf"
    model: ClassVar[str] = "lightgbm regressor"
    paper_name: ClassVar[str] = "SSJF, predicted output length"
    FILE: ClassVar[str] = "ssjf.lgb.txt"

    def predict_tokens(self, X: Any) -> np.ndarray:
        return self._regressed_tokens(X)

    def entry(self) -> dict[str, Any]:
        return self._entry(target="log1p(output_tokens)")

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> SSJFPredictor:
        return cls(**cls._recorded(entry, folder))

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        return (
            "SSJF baseline: LightGBM regressor of log1p(output tokens) on the admission "
            f"features; ÷ {entry.get('tokens_per_round', 0):.2f} tokens per round"
        )


class S3Predictor(LengthBaseline):
    """S³: a classifier over output-length buckets; the score is the expected bucket length."""

    kind: ClassVar[str] = "s3"
    estimates: ClassVar[Mapping[str, str]] = {
        "s3": "total denoising rounds (expected output-length bucket / tokens per round)"
    }
    trainer: ClassVar[str | None] = f"{_TRAINERS}:S3_TRAINER"
    evaluator: ClassVar[str | None] = f"{_TRAINERS}:evaluate_s3"
    model: ClassVar[str] = "lightgbm multiclass over output-length buckets"
    paper_name: ClassVar[str] = "S³, expected output-length bucket"
    FILE: ClassVar[str] = "s3.lgb.txt"

    def __init__(
        self,
        model_text: str,
        bucket_edges: Sequence[float],
        bucket_tokens: Sequence[float],
        tokens_per_round: float,
        **kw: Any,
    ) -> None:
        super().__init__(model_text, tokens_per_round, **kw)
        self.bucket_edges = np.asarray(bucket_edges, dtype=np.float64)
        self.bucket_tokens = np.asarray(bucket_tokens, dtype=np.float64)
        if (
            self.bucket_edges.ndim != 1
            or self.bucket_edges.size != self.bucket_tokens.size + 1
            or self.bucket_tokens.size < 2
            or np.any(np.diff(self.bucket_edges) <= 0)
            or not np.all(np.isfinite(self.bucket_tokens))
        ):
            raise PredictorError(
                f"s3: {self.bucket_tokens.size} bucket lengths need "
                f"{self.bucket_tokens.size + 1} increasing edges (got {self.bucket_edges.size}); "
                "retrain the baseline"
            )

    def probabilities(self, X: Any) -> np.ndarray:
        """``(n, buckets)``: the probability of each output-length bucket."""
        X = self.features(X)
        if not len(X):
            return np.zeros((0, self.bucket_tokens.size))
        return self.booster.predict(X).reshape(len(X), -1)

    def predict_tokens(self, X: Any) -> np.ndarray:
        return self.probabilities(X) @ self.bucket_tokens

    def entry(self) -> dict[str, Any]:
        return self._entry(
            target="output-length bucket (block_size-token buckets)",
            bucket_edges=self.bucket_edges.tolist(),
            bucket_tokens=self.bucket_tokens.tolist(),
        )

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> S3Predictor:
        return cls(
            bucket_edges=cls._need(entry, "bucket_edges", folder),
            bucket_tokens=cls._need(entry, "bucket_tokens", folder),
            **cls._recorded(entry, folder),
        )

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        n = len(entry.get("bucket_tokens") or [])
        return (
            f"S³ baseline: LightGBM classifier over {n} output-length buckets on the admission "
            f"features; expected bucket length ÷ {entry.get('tokens_per_round', 0):.2f} "
            "tokens per round"
        )


class LTRPredictor(LengthBaseline):
    """LTR: a learning-to-rank model of output length (LightGBM ``lambdarank``); its score is
    mapped onto tokens by a monotone map fitted on the training split."""

    kind: ClassVar[str] = "ltr"
    estimates: ClassVar[Mapping[str, str]] = {
        "ltr": "total denoising rounds (ranking score mapped to output tokens / tokens per round)"
    }
    trainer: ClassVar[str | None] = f"{_TRAINERS}:LTR_TRAINER"
    evaluator: ClassVar[str | None] = f"{_TRAINERS}:evaluate_ltr"
    model: ClassVar[str] = "lightgbm lambdarank"
    paper_name: ClassVar[str] = "LTR, ranked output length"
    FILE: ClassVar[str] = "ltr.lgb.txt"
    MAP_FILE: ClassVar[str] = "ltr_tokens.json"

    def __init__(
        self, model_text: str, to_tokens: IsotonicMap, tokens_per_round: float, **kw: Any
    ) -> None:
        super().__init__(model_text, tokens_per_round, **kw)
        self.to_tokens = to_tokens

    def score(self, X: Any) -> np.ndarray:
        """The ranking score (higher = longer output)."""
        X = self.features(X)
        return self.booster.predict(X) if len(X) else np.zeros(0)

    def predict_tokens(self, X: Any) -> np.ndarray:
        return self.to_tokens(self.score(X))

    def _save_more(self, folder: Path) -> list[str]:
        write_json(folder / self.MAP_FILE, self.to_tokens.to_dict())
        return [self.MAP_FILE]

    def entry(self) -> dict[str, Any]:
        return self._entry(target="lambdarank on output-length grades; isotonic map to tokens")

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> LTRPredictor:
        try:
            to_tokens = IsotonicMap.from_dict(folder.read_json(cls.MAP_FILE))
        except PredictorError as e:
            raise BundleIntegrityError(f"{folder.root}/{cls.MAP_FILE}: {e}") from e
        return cls(to_tokens=to_tokens, **cls._recorded(entry, folder))

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        return (
            "LTR baseline: LightGBM lambdarank on the admission features, isotonic map to "
            f"output tokens ÷ {entry.get('tokens_per_round', 0):.2f} tokens per round"
        )


class TRAILPredictor(LengthBaseline):
    """TRAIL: output tokens re-estimated from the first denoising round's pooled hidden state.

    Two parts: at arrival a prompt regressor like SSJF's; after the first denoising round a
    ridge regression of ``log1p(output_tokens)`` on the refinement predictor's input
    (``[(h - mean) / std, prompt_tokens / scale, output_budget / scale]``). No output block is
    committed after the first round, so the tokens still to come are all of them; in rounds,
    one round is spent: ``max(tokens / tokens_per_round - 1, 0)``.
    """

    kind: ClassVar[str] = "trail"
    estimates: ClassVar[Mapping[str, str]] = {
        "trail": "rounds still to go after the first denoising round (remaining output tokens "
        "re-estimated from the first-round hidden state / tokens per round)"
    }
    trainer: ClassVar[str | None] = f"{_TRAINERS}:TRAIL_TRAINER"
    evaluator: ClassVar[str | None] = f"{_TRAINERS}:evaluate_trail"
    refines: ClassVar[bool] = True
    model: ClassVar[str] = "ridge on the first-round hidden state (+ lightgbm at arrival)"
    paper_name: ClassVar[str] = "TRAIL, output length re-estimated after round one"
    FILE: ClassVar[str] = "trail.lgb.txt"
    WEIGHTS_FILE: ClassVar[str] = "trail.safetensors"

    def __init__(
        self,
        model_text: str,
        weights: np.ndarray,
        bias: float,
        hidden_mean: np.ndarray,
        hidden_std: np.ndarray,
        prompt_tokens_scale: float,
        output_budget_scale: float,
        tokens_per_round: float,
        **kw: Any,
    ) -> None:
        super().__init__(model_text, tokens_per_round, **kw)
        self.hidden_mean = np.asarray(hidden_mean, dtype=np.float32).ravel()
        self.hidden_std = np.asarray(hidden_std, dtype=np.float32).ravel()
        self.weights = np.asarray(weights, dtype=np.float64).ravel()
        self.bias = float(bias)
        self.prompt_tokens_scale = float(prompt_tokens_scale)
        self.output_budget_scale = float(output_budget_scale)
        h = self.hidden_mean.size
        if self.hidden_std.size != h or self.weights.size != h + 2:
            raise PredictorError(
                f"trail: weights for {self.weights.size - 2} hidden dimensions, normalization "
                f"for {h}; retrain the baseline"
            )
        if (
            np.any(self.hidden_std <= 0)
            or min(self.prompt_tokens_scale, self.output_budget_scale) <= 0
        ):
            raise PredictorError("trail: non-positive normalization scales; retrain the baseline")

    @property
    def hidden_size(self) -> int:
        return int(self.hidden_mean.size)

    def predict_tokens(self, X: Any) -> np.ndarray:
        return self._regressed_tokens(X)

    def inputs(self, hidden: Any, prompt_tokens: Any, output_budget: Any) -> np.ndarray:
        """The ridge input ``(n, H+2)``; the trainer uses this very function (train = serve)."""
        h = np.asarray(hidden, dtype=np.float32)
        if h.ndim == 1:
            h = h[None, :]
        if h.ndim != 2 or h.shape[1] != self.hidden_size:
            raise PredictorInputError(
                f"trail: hidden states must have shape (n, {self.hidden_size}), got {h.shape}"
            )
        n = h.shape[0]
        pt = np.broadcast_to(np.asarray(prompt_tokens, dtype=np.float64), (n,))
        ob = np.broadcast_to(np.asarray(output_budget, dtype=np.float64), (n,))
        if not (np.all(np.isfinite(h)) and np.all(np.isfinite(pt)) and np.all(np.isfinite(ob))):
            bad = int(np.flatnonzero(~np.isfinite(h).all(axis=1) | ~np.isfinite(pt + ob))[0])
            raise PredictorInputError(f"trail: input row {bad} holds NaN/inf")
        x = np.empty((n, self.hidden_size + 2), dtype=np.float64)
        x[:, :-2] = (h - self.hidden_mean) / self.hidden_std
        x[:, -2] = pt / self.prompt_tokens_scale
        x[:, -1] = ob / self.output_budget_scale
        return x

    def remaining_tokens(self, hidden: Any, prompt_tokens: Any, output_budget: Any) -> np.ndarray:
        """Output tokens still to come after the first denoising round (all of them: none
        is committed yet), from the first round's pooled hidden state."""
        x = self.inputs(hidden, prompt_tokens, output_budget)
        budget = np.broadcast_to(np.asarray(output_budget, dtype=np.float64), (len(x),))
        return np.clip(np.expm1(x @ self.weights + self.bias), 0.0, budget)

    def refined_rounds(
        self, hidden: np.ndarray, prompt_tokens: Any, output_budget: Any
    ) -> np.ndarray:
        tokens = self.remaining_tokens(hidden, prompt_tokens, output_budget)
        return np.maximum(tokens / self.tokens_per_round - 1.0, 0.0)

    def _save_more(self, folder: Path) -> list[str]:
        from safetensors.numpy import save

        tensors: dict[str, np.ndarray] = {
            "weights": self.weights.astype(np.float64),
            "bias": np.array([self.bias], dtype=np.float64),
            "hidden_mean": self.hidden_mean,
            "hidden_std": self.hidden_std,
        }
        write_bytes(
            folder / self.WEIGHTS_FILE, save(tensors, metadata={"format": "dwise-trail-v1"})
        )
        return [self.WEIGHTS_FILE]

    def entry(self) -> dict[str, Any]:
        return self._entry(
            target="log1p(output_tokens): lightgbm at arrival, ridge after the first round",
            hidden_size=self.hidden_size,
            prompt_tokens_scale=self.prompt_tokens_scale,
            output_budget_scale=self.output_budget_scale,
        )

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> TRAILPredictor:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            t = load_file(str(folder.path(cls.WEIGHTS_FILE)))
            return cls(
                weights=t["weights"],
                bias=float(t["bias"][0]),
                hidden_mean=t["hidden_mean"],
                hidden_std=t["hidden_std"],
                prompt_tokens_scale=cls._need(entry, "prompt_tokens_scale", folder),
                output_budget_scale=cls._need(entry, "output_budget_scale", folder),
                **cls._recorded(entry, folder),
            )
        except (ValueError, SafetensorError, KeyError) as e:
            raise BundleIntegrityError(
                f"{folder.root}/{cls.WEIGHTS_FILE} is corrupt or truncated ({e}); "
                "re-save the bundle"
            ) from e

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        return (
            f"TRAIL baseline: ridge on the first-round hidden state (H = "
            f"{entry.get('hidden_size', '?')}) → log1p(output tokens), LightGBM at arrival; "
            f"÷ {entry.get('tokens_per_round', 0):.2f} tokens per round"
        )

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        fp_h = fingerprint.hidden_size
        if fp_h is not None and fp_h != self.hidden_size:
            raise BundleIntegrityError(
                f"{where}: trail hidden size {self.hidden_size} differs from the fingerprint's "
                f"{fp_h}; the bundle is inconsistent, retrain it"
            )
