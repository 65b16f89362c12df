"""The isotonic map that puts the refined estimate on the scale of actual remaining rounds.

The survival ensemble reports the *mean* of a right-skewed distribution, which ranks requests
well but overestimates typical remaining work (the paper: median predicted/actual 1.16). A
monotone map fitted on the training split (scikit-learn's ``IsotonicRegression`` in
:mod:`dwise_predict.trainers.refinement`) fixes the scale without changing the ranking, so
requests holding refined and admission estimates are ranked consistently.

Stored as two plain arrays and applied with ``np.interp`` (which clips outside the fitted
range, like ``IsotonicRegression(out_of_bounds="clip")``). With ``target_transform="log1p"``
the map was fitted to ``log1p(remaining rounds)``, i.e. it estimates a conditional geometric
mean, the same kind of estimate as the admission model's log-space regression; ``expm1`` is
applied after interpolation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PredictorError

#: what the map was fitted to: remaining rounds ("identity"), their log or log1p
TRANSFORMS = ("identity", "log", "log1p")
#: the one default, for a fit and for a stored map that does not say (training uses it too)
DEFAULT_TRANSFORM = "identity"


#: transform -> its inverse, applied after interpolation (numpy; the torch path mirrors it)
INVERSES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda y: y,
    "log": np.exp,
    "log1p": np.expm1,
}


@dataclass(frozen=True)
class IsotonicMap:
    """Piecewise-linear non-decreasing map from raw mean remaining rounds to calibrated rounds."""

    x_thresholds: np.ndarray
    y_thresholds: np.ndarray
    target_transform: str = DEFAULT_TRANSFORM

    def __post_init__(self) -> None:
        x = np.asarray(self.x_thresholds, dtype=np.float64)
        y = np.asarray(self.y_thresholds, dtype=np.float64)
        if x.ndim != 1 or x.shape != y.shape or len(x) == 0:
            raise PredictorError(
                f"isotonic map needs two equal-length non-empty arrays, got {x.shape} and {y.shape}"
            )
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise PredictorError("isotonic map holds NaN/inf; refit it with `dwise-predict train`")
        if np.any(np.diff(x) < 0) or np.any(np.diff(y) < 0):
            raise PredictorError(
                "isotonic map thresholds are not non-decreasing; the file is corrupt or edited"
            )
        if self.target_transform not in TRANSFORMS:
            raise PredictorError(
                "unknown isotonic target_transform "
                f"{self.target_transform!r}; expected one of {TRANSFORMS}"
            )
        object.__setattr__(self, "x_thresholds", x)
        object.__setattr__(self, "y_thresholds", y)

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        y = np.interp(np.asarray(raw, dtype=np.float64), self.x_thresholds, self.y_thresholds)
        return np.maximum(INVERSES[self.target_transform](y), 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "x_thresholds": self.x_thresholds.tolist(),
            "y_thresholds": self.y_thresholds.tolist(),
            "target_transform": self.target_transform,
            "interpolation": "linear, clipped (numpy.interp)",
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IsotonicMap:
        try:
            return cls(
                np.asarray(d["x_thresholds"], dtype=np.float64),
                np.asarray(d["y_thresholds"], dtype=np.float64),
                d.get("target_transform", DEFAULT_TRANSFORM),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PredictorError(
                f"malformed isotonic map ({e}); refit it with `dwise-predict train`"
            ) from e
