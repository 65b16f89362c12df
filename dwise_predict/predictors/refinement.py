"""The refinement predictor: rounds STILL TO GO after the first denoising round, in numpy.

Input (docs/concepts.md, "The predictors"): the first-round hidden vector (final layer, mean-pooled;
``(n, H)``), the prompt token count and the output budget, the last two normalized by the training
maxima (``prompt_tokens_scale``, ``output_budget_scale``); the hidden vector is standardized with
the training mean and standard deviation. Model: a discrete-time survival ensemble: each of the
members is a 2-layer MLP ``Linear(H+2, 256) -> GELU(tanh) -> Linear(256, K)`` emitting hazard
logits ``z_k``, ``k = 1..K``, where ``h_k = sigmoid(z_k)`` is the probability that the request
needs no k-th remaining round given that it needed k-1, so

    S(k) = P(remaining >= k) = prod_{j<=k} (1 - h_j),   raw estimate = sum_{k=1..K} S(k)

(the restricted mean of remaining rounds). Members' survival curves are averaged (not their
hazards). The calibrated estimate applies the isotonic map (:mod:`.calibration`).

GELU is the tanh form so that numpy reproduces the trained function exactly (numpy has no erf);
the trainer uses ``nn.GELU(approximate="tanh")``. Weights live in safetensors; the torch path
for a GPU stream is :func:`dwise_predict.trainers.refinement.ensemble_to_torch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..atomic import write_bytes, write_json
from ..errors import BundleIntegrityError, PredictorError, PredictorInputError
from .calibration import IsotonicMap

if TYPE_CHECKING:
    from ..bundle.modules import BundleFolder
    from ..fingerprint import ModelFingerprint

WEIGHTS_FILE = "refinement.safetensors"
#: format v1 only: the config now lives in the manifest entry
CONFIG_FILE = "refinement.json"
ONNX_FILE = "refinement.onnx"
CALIBRATION_FILE = "calibration.json"
ESTIMATE = "denoising rounds still to go after the first denoising round (total_rounds - 1)"
_GELU_C = float(np.sqrt(2.0 / np.pi))


@dataclass(frozen=True)
class MLPWeights:
    """One member: ``x (n, H+2) -> gelu(x @ w1 + b1) @ w2 + b2`` -> K hazard logits."""

    w1: np.ndarray  # (H+2, width)
    b1: np.ndarray  # (width,)
    w2: np.ndarray  # (width, K)
    b2: np.ndarray  # (K,)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x * x * x)))


def log_one_minus_sigmoid(z: np.ndarray) -> np.ndarray:
    """``log(1 - sigmoid(z)) = -softplus(z)``, stable for large |z|."""
    return -(np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z))))


@dataclass
class RefinementEnsemble:
    """First-round hidden state (+ prompt length, output budget) -> estimated remaining rounds."""

    members: list[MLPWeights]
    hidden_mean: np.ndarray  # (H,)
    hidden_std: np.ndarray  # (H,)
    prompt_tokens_scale: float
    output_budget_scale: float
    calibration: IsotonicMap | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.members:
            raise PredictorError("a refinement ensemble needs at least one member")
        self.hidden_mean = np.asarray(self.hidden_mean, dtype=np.float32)
        self.hidden_std = np.asarray(self.hidden_std, dtype=np.float32)
        d_in, k = self.hidden_size + 2, self.K
        for i, m in enumerate(self.members):
            if m.w1.shape[0] != d_in or m.w2.shape[1] != k or m.w1.shape[1] != m.w2.shape[0]:
                raise PredictorError(
                    f"refinement member {i} has shapes "
                    f"{m.w1.shape}/{m.w2.shape}, expected ({d_in}, w)/(w, {k})"
                )
        if self.prompt_tokens_scale <= 0 or self.output_budget_scale <= 0:
            raise PredictorError(
                "normalization scales must be > 0; retrain with `dwise-predict train`"
            )
        # one matmul for all members' first layers: (H+2, members*width)
        self._w1 = np.ascontiguousarray(
            np.concatenate([m.w1 for m in self.members], axis=1), dtype=np.float32
        )
        self._b1 = np.concatenate([m.b1 for m in self.members]).astype(np.float32)
        self._width = self.members[0].w1.shape[1]
        self._inv_std = (1.0 / self.hidden_std).astype(np.float32)

    @property
    def hidden_size(self) -> int:
        return int(self.hidden_mean.shape[0])

    @property
    def K(self) -> int:  # noqa: N802 - the name in docs/concepts.md
        return int(self.members[0].w2.shape[1])

    @property
    def n_params(self) -> int:
        return sum(m.w1.size + m.b1.size + m.w2.size + m.b2.size for m in self.members)

    # -- inputs -----------------------------------------------------------------------------
    def inputs(self, hidden: Any, prompt_tokens: Any, output_budget: Any) -> np.ndarray:
        """Validated, normalized model input ``(n, H+2)`` float32."""
        h = check_hidden(hidden, self.hidden_size)
        n = h.shape[0]
        p = per_row(prompt_tokens, n, "prompt_tokens")
        b = per_row(output_budget, n, "output_budget")
        return normalized_inputs(
            h,
            p,
            b,
            self.hidden_mean,
            self._inv_std,
            self.prompt_tokens_scale,
            self.output_budget_scale,
        )

    # -- inference --------------------------------------------------------------------------
    def member_logits(self, x: np.ndarray) -> list[np.ndarray]:
        a = gelu_tanh(x @ self._w1 + self._b1)
        w = self._width
        return [a[:, i * w : (i + 1) * w] @ m.w2 + m.b2 for i, m in enumerate(self.members)]

    def survival_from_inputs(self, x: np.ndarray) -> np.ndarray:
        """Averaged survival curves ``(n, K)``: column k-1 is P(remaining rounds >= k)."""
        s = np.zeros((x.shape[0], self.K), dtype=np.float64)
        for z in self.member_logits(x):
            s += np.exp(np.cumsum(log_one_minus_sigmoid(z.astype(np.float64)), axis=1))
        return s / len(self.members)

    def survival(self, hidden: Any, prompt_tokens: Any, output_budget: Any) -> np.ndarray:
        return self.survival_from_inputs(self.inputs(hidden, prompt_tokens, output_budget))

    def predict(
        self, hidden: Any, prompt_tokens: Any, output_budget: Any, *, raw: bool = False
    ) -> np.ndarray:
        """Estimated remaining rounds after the first denoising round, one per row.

        ``raw=True`` returns the ensemble's restricted mean; otherwise the isotonic map is applied
        (a bundle without one returns the raw mean).
        """
        mean = self.survival(hidden, prompt_tokens, output_budget).sum(axis=1)
        if raw or self.calibration is None:
            return mean
        return self.calibration(mean)

    # -- files ------------------------------------------------------------------------------
    def tensors(self) -> dict[str, np.ndarray]:
        out = {"input.hidden_mean": self.hidden_mean, "input.hidden_std": self.hidden_std}
        for i, m in enumerate(self.members):
            for name in ("w1", "b1", "w2", "b2"):
                out[f"member{i}.{name}"] = np.ascontiguousarray(getattr(m, name), dtype=np.float32)
        return out

    # -- bundle module (dwise_predict.bundle.modules) ----------------------------------------
    kind: ClassVar[str] = "refinement"
    estimates: ClassVar[Mapping[str, str]] = {
        "refined_raw": "rounds still to go after the first denoising round "
        "(uncalibrated restricted mean)",
        "refined": "rounds still to go after the first denoising round (isotonic-calibrated)",
    }
    onnx_exporter: ClassVar[str | None] = "dwise_predict.export.onnx_refinement:EXPORTER"
    trainer: ClassVar[str | None] = "dwise_predict.trainers.refinement:TRAINER"
    evaluator: ClassVar[str | None] = "dwise_predict.trainers.refinement:evaluate_estimates"
    #: the quality monitor's ``estimate`` label for the refined total (first round + rest)
    monitor_label: ClassVar[str | None] = "refinement"

    def entry(self) -> dict[str, Any]:
        """The ensemble's description and input normalization: the one place they are stored."""
        return {
            "estimate": ESTIMATE,
            "model": "survival_mlp_ensemble",
            "hidden": "first-round final-layer hidden rows of the first output block, mean-pooled",
            "hidden_size": self.hidden_size,
            "K": self.K,
            "members": len(self.members),
            "width": self._width,
            "activation": "gelu_tanh",
            "inputs": [
                "(hidden - hidden_mean) / hidden_std",
                "prompt_tokens / prompt_tokens_scale",
                "output_budget / output_budget_scale",
            ],
            "prompt_tokens_scale": float(self.prompt_tokens_scale),
            "output_budget_scale": float(self.output_budget_scale),
            "survival": "S(k) = prod_{j<=k} (1 - sigmoid(z_j)); "
            "members' S averaged; raw = sum_k S(k)",
            "n_params": int(self.n_params),
            "calibrated": self.calibration is not None,
            "info": self.info,
        }

    def save(self, folder: str | Path) -> list[str]:
        """Write the weights (safetensors) and the isotonic map (JSON); returns the file names."""
        from safetensors.numpy import save

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_bytes(
            folder / WEIGHTS_FILE, save(self.tensors(), metadata={"format": "dwise-refinement-v1"})
        )
        if self.calibration is None:
            return [WEIGHTS_FILE]
        write_json(folder / CALIBRATION_FILE, self.calibration.to_dict())
        return [WEIGHTS_FILE, CALIBRATION_FILE]

    @classmethod
    def load(cls, folder: BundleFolder, entry: Mapping[str, Any]) -> RefinementEnsemble:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        config = dict(entry)
        if folder.has(CONFIG_FILE):  # bundle format v1 kept the config in refinement.json
            config.update(folder.read_json(CONFIG_FILE))
        try:
            t = load_file(str(folder.path(WEIGHTS_FILE)))
        except (ValueError, SafetensorError) as e:
            raise BundleIntegrityError(
                f"{folder.root}/{WEIGHTS_FILE} is corrupt ({e}); re-save the bundle"
            ) from e
        calibration = None
        if folder.has(CALIBRATION_FILE):
            calibration = IsotonicMap.from_dict(folder.read_json(CALIBRATION_FILE))
        try:
            members = [
                MLPWeights(*(t[f"member{i}.{n}"] for n in ("w1", "b1", "w2", "b2")))
                for i in range(config["members"])
            ]
            return cls(
                members,
                t["input.hidden_mean"],
                t["input.hidden_std"],
                config["prompt_tokens_scale"],
                config["output_budget_scale"],
                calibration,
                config.get("info", {}),
            )
        except KeyError as e:
            raise BundleIntegrityError(
                f"{folder.root}: the refinement weights or record lack {e}; "
                "the bundle is from another format or truncated"
            ) from e

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        params = entry.get("n_params")
        return (
            f"survival-MLP ensemble: {entry.get('members', '?')} × [(H+2 = "
            f"{entry.get('hidden_size', '?')}+2) → {entry.get('width', '?')} GELU → "
            f"K = {entry.get('K', '?')} hazard logits]"
            + (f", {params:,} parameters" if isinstance(params, int) else "")
            + ("; isotonic calibration" if entry.get("calibrated") else "; uncalibrated")
        )

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        """The hidden vectors come from the fingerprinted dLLM: their sizes must agree."""
        fp_h = fingerprint.hidden_size
        if fp_h is not None and fp_h != self.hidden_size:
            raise BundleIntegrityError(
                f"{where}: refinement hidden size {self.hidden_size} differs from the "
                "fingerprint's "
                f"{fp_h}; the bundle is inconsistent, retrain it"
            )

    def __repr__(self) -> str:
        return (
            f"RefinementEnsemble(members={len(self.members)}, hidden_size={self.hidden_size}, "
            f"K={self.K}, calibrated={self.calibration is not None})"
        )


def normalized_inputs(
    hidden: np.ndarray,
    prompt_tokens: np.ndarray,
    output_budget: np.ndarray,
    hidden_mean: np.ndarray,
    inv_std: np.ndarray,
    prompt_tokens_scale: float,
    output_budget_scale: float,
) -> np.ndarray:
    """The model input ``(n, H+2)`` float32; the trainer uses this very function, so train =
    serve."""
    n, h = hidden.shape
    x = np.empty((n, h + 2), dtype=np.float32)
    np.multiply(hidden.astype(np.float32, copy=False) - hidden_mean, inv_std, out=x[:, :h])
    x[:, -2] = prompt_tokens / prompt_tokens_scale
    x[:, -1] = output_budget / output_budget_scale
    return x


def check_hidden(hidden: Any, hidden_size: int, owner: str = "the bundle") -> np.ndarray:
    """First-round hidden vectors as ``(n, hidden_size)`` float32, refused with the fix when
    malformed."""
    try:
        h = np.asarray(hidden, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise PredictorInputError(f"hidden must be a float array (n, {hidden_size}): {e}") from e
    if h.ndim == 1:
        h = h[None, :]
    if h.ndim != 2:
        raise PredictorInputError(
            f"hidden must be (n, hidden_size) or (hidden_size,), got shape {h.shape}"
        )
    if h.shape[1] != hidden_size:
        raise PredictorInputError(
            f"hidden size {h.shape[1]} does not match {owner}'s hidden size {hidden_size}: "
            f"pass the first-round hidden state of the model {owner} was trained on"
        )
    finite = np.isfinite(h).all(axis=1)
    if not finite.all():
        raise PredictorInputError(
            f"hidden row {int(np.flatnonzero(~finite)[0])} holds NaN/inf (or overflows "
            "float32); run the dLLM in float32/bf16 without overflow"
        )
    return np.ascontiguousarray(h)


def per_row(v: Any, n: int, name: str) -> np.ndarray:
    """A scalar or one value per hidden row, as float64 ``(n,)``; finite, >= 0 and within
    float32."""
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise PredictorInputError(f"{name} must be numbers, got {type(v).__name__}") from e
    if a.ndim == 0:
        a = np.full(n, float(a))
    if a.shape != (n,):
        raise PredictorInputError(
            f"{name} must be a scalar or have one value per hidden row ({n}), got shape {a.shape}"
        )
    bad = ~np.isfinite(a) | (a < 0) | (a > np.finfo(np.float32).max)
    if bad.any():
        raise PredictorInputError(
            f"{name} must be finite and >= 0 (within float32), got {a[bad][:3].tolist()}"
        )
    return a
