"""Parity gates and latency checks: no exported file is used unless it matches the native model.

Every exported file is compared with the native predictor it came from, on probes that exercise
it (admission: integer feature rows at every split threshold of the forest and around it;
refinement: hidden vectors drawn around the training mean and standard deviation, prompt lengths
and budgets across their scales), and the **max abs error** is reported against a tolerance set
per predictor and precision (:data:`TOLERANCES`, with the reason for each). Latency is the median
of many timed calls of both sides in the same run, at batch 1 (one arrival) and 128 (one round's
slots ``B``).

Decisions (:class:`ExportCheck.kept`):

* an FP32 file is kept iff its parity passes (it exists for portability, not speed; its latency is
  reported next to the native one);
* an INT8 file is kept iff its parity passes **and** it is faster than the FP32 file at the
  decision batch by at least ``min_speedup``; otherwise it is deleted, with the reason recorded.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.predictors.onnx_runtime import OnnxAdmission, OnnxRefinement


@dataclass(frozen=True)
class Tolerance:
    """``|exported - native| <= abs + rel * |native|`` elementwise."""

    abs: float
    rel: float = 0.0
    why: str = ""

    def bound(self, native: np.ndarray) -> np.ndarray:
        return self.abs + self.rel * np.abs(native)


#: per (predictor, precision): what is compared, and the bound
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("admission", "fp32"): Tolerance(1e-4, 0.0, "log(total rounds); float32 thresholds and leaf sums in ONNX vs "
                                     "float64 in LightGBM: ~1e-6 expected, 1e-4 = 0.01% of the estimate"),
    ("refinement", "fp32"): Tolerance(1e-2, 1e-4, "raw mean remaining rounds; float32 cumsum over K rounds vs "
                                      "float64 in numpy: far below the one-round granularity of the scheduler"),
    ("refinement", "int8"): Tolerance(0.5, 0.02, "raw mean remaining rounds; INT8 weights may move an estimate by "
                                      "under half a round or 2%, less than one round of the scheduler's decrement"),
}


@dataclass(frozen=True)
class ParityReport:
    n: int
    max_abs_error: float
    max_rel_error: float
    worst_violation: float  # max of |err| - bound; <= 0 means every element is within the tolerance
    tolerance: Tolerance
    passed: bool


def compare(native: Any, exported: Any, tolerance: Tolerance) -> ParityReport:
    """Elementwise parity of two arrays of the same shape (NaN anywhere fails)."""
    a = np.asarray(native, dtype=np.float64)
    b = np.asarray(exported, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"parity needs equal shapes, got native {a.shape} and exported {b.shape}")
    if a.size == 0:
        raise ValueError("parity needs at least one probe")
    err = np.abs(b - a)
    finite = bool(np.all(np.isfinite(err)))
    rel = err / np.maximum(np.abs(a), 1e-12)
    violation = float(np.max(err - tolerance.bound(a))) if finite else float("inf")
    return ParityReport(n=int(a.size), max_abs_error=float(np.max(err)) if finite else float("inf"),
                        max_rel_error=float(np.max(rel)) if finite else float("inf"),
                        worst_violation=violation, tolerance=tolerance, passed=finite and violation <= 0.0)


def median_seconds(fns: dict[str, Callable[[], Any]], *, repeats: int = 50, number: int = 10,
                   warmup: int = 3) -> dict[str, float]:
    """Per-call median seconds of each function, timed interleaved (A, B, A, B, ...).

    Interleaving puts every function under the same background load, which matters on a shared
    machine: a burst of contention then hits all sides instead of biasing one median.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            samples[k].append((time.perf_counter() - t0) / number)
    return {k: statistics.median(v) for k, v in samples.items()}


@dataclass
class ExportCheck:
    """The parity and latency record of one exported file, and whether it is kept."""

    predictor: str
    precision: str
    file: str
    parity: ParityReport
    #: batch -> {"native": µs, "exported": µs[, "peer": µs of the FP32 file an INT8 file would replace]}
    latency_us: dict[str, dict[str, float]] = field(default_factory=dict)
    kept: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["parity"]["tolerance"] = asdict(self.parity.tolerance)
        return d


# -- probes -------------------------------------------------------------------------------------
def admission_probes(model: Any, *, n_random: int = 512, seed: int = 0) -> np.ndarray:
    """Integer feature rows at, just below and just above every split threshold, plus random rows."""
    rng = np.random.default_rng(seed)
    n_features = len(model.feature_names)
    per_feature: list[np.ndarray] = []
    for f in range(n_features):
        th = np.concatenate([t.threshold[t.split_feature == f] for t in model.forest.trees] or [np.zeros(0)])
        th = th[np.isfinite(th) & (th >= 0) & (th < 2**24)]
        vals = np.unique(np.concatenate([np.floor(th), np.ceil(th), np.floor(th) - 1, np.ceil(th) + 1, [0, 1]]))
        per_feature.append(vals[vals >= 0])
    rows = []
    for f, vals in enumerate(per_feature):  # sweep one feature across its thresholds, others random
        other = np.stack([rng.choice(per_feature[g], size=len(vals)) for g in range(n_features)], axis=1)
        other[:, f] = vals
        rows.append(other)
    hi = [max(float(v.max()), 1.0) * 1.5 for v in per_feature]
    rows.append(np.floor(rng.random((n_random, n_features)) * np.asarray(hi)))
    return np.concatenate(rows).astype(np.float64)


def refinement_probes(ensemble: Any, *, n: int = 256, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hidden rows ~ N(mean, (1.5 std)^2); prompt lengths in [0, 2 scale]; budgets in [1, scale]."""
    rng = np.random.default_rng(seed)
    mean = np.asarray(ensemble.hidden_mean, dtype=np.float64)
    std = np.asarray(ensemble.hidden_std, dtype=np.float64)
    hidden = (mean + 1.5 * std * rng.standard_normal((n, mean.shape[0]))).astype(np.float32)
    prompt = np.floor(rng.random(n) * 2 * ensemble.prompt_tokens_scale)
    budget = np.maximum(1.0, np.floor(rng.random(n) * ensemble.output_budget_scale))
    return hidden, prompt, budget


# -- checks -------------------------------------------------------------------------------------
def check_admission(model: Any, onnx_path: str | Path, *, probes: np.ndarray | None = None,
                    batches: tuple[int, ...] = (1, 128), repeats: int = 50, threads: int = 1) -> ExportCheck:
    """Parity of ``log(total rounds)`` on probes, and latency of native vs ONNX ``predict_features``."""
    onnx_model = OnnxAdmission(onnx_path, threads=threads)
    X = admission_probes(model) if probes is None else np.asarray(probes, dtype=np.float64)
    tol = TOLERANCES[("admission", onnx_model.precision)]
    check = ExportCheck("admission", onnx_model.precision, Path(onnx_path).name,
                        compare(model.raw_score(X), onnx_model.raw_score(X), tol))
    for b in batches:
        xb = np.resize(X, (b, X.shape[1]))
        med = median_seconds({"native": partial(model.predict_features, xb),
                              "exported": partial(onnx_model.predict_features, xb)}, repeats=repeats)
        check.latency_us[str(b)] = {k: 1e6 * v for k, v in med.items()}
    check.kept, check.reason = _fp32_decision(check)
    return check


def check_refinement(ensemble: Any, onnx_path: str | Path, *, probes: tuple[Any, Any, Any] | None = None,
                     peer: str | Path | None = None, batches: tuple[int, ...] = (1, 128), repeats: int = 30,
                     threads: int = 1) -> ExportCheck:
    """Parity of the raw restricted mean on probes, and latency of native vs ONNX ``predict(raw=True)``.

    ``peer``: the FP32 file an INT8 file would replace, timed interleaved with it (for :func:`gate_int8`).
    """
    onnx_model = OnnxRefinement(onnx_path, threads=threads)
    peer_model = OnnxRefinement(peer, threads=threads) if peer is not None else None
    h, p, b = refinement_probes(ensemble) if probes is None else probes
    tol = TOLERANCES[("refinement", onnx_model.precision)]
    check = ExportCheck("refinement", onnx_model.precision, Path(onnx_path).name,
                        compare(ensemble.predict(h, p, b, raw=True), onnx_model.predict(h, p, b, raw=True), tol))
    for n in batches:
        idx = np.arange(n) % len(h)
        args = (h[idx], p[idx], b[idx])
        fns: dict[str, Callable[[], Any]] = {"native": partial(ensemble.predict, *args, raw=True),
                                             "exported": partial(onnx_model.predict, *args, raw=True)}
        if peer_model is not None:
            fns["peer"] = partial(peer_model.predict, *args, raw=True)
        check.latency_us[str(n)] = {k: 1e6 * v for k, v in median_seconds(fns, repeats=repeats).items()}
    if onnx_model.precision == "fp32":
        check.kept, check.reason = _fp32_decision(check)
    return check


def _fp32_decision(check: ExportCheck) -> tuple[bool, str]:
    p = check.parity
    if p.passed:
        return True, f"parity holds (max abs error {p.max_abs_error:.3g} within {p.tolerance.abs:g} + {p.tolerance.rel:g}|x|)"
    return False, f"parity fails (max abs error {p.max_abs_error:.3g}, tolerance {p.tolerance.abs:g} + {p.tolerance.rel:g}|x|)"


def gate_int8(int8: ExportCheck, fp32: ExportCheck | None = None, *, decision_batch: int = 128,
              min_speedup: float = 1.05) -> ExportCheck:
    """Keep the INT8 file iff its parity passes and it beats FP32 by ``min_speedup`` at ``decision_batch``.

    The FP32 time is the ``peer`` timed interleaved with the INT8 file when present (see
    :func:`check_refinement`), else the FP32 check's own measurement.
    """
    key = str(decision_batch)
    lat = int8.latency_us.get(key, {})
    fp32_us = lat.get("peer", fp32.latency_us.get(key, {}).get("exported") if fp32 is not None else None)
    if "exported" not in lat or fp32_us is None:
        raise ValueError(f"gate_int8 needs INT8 and FP32 latencies at batch {decision_batch}")
    speedup = fp32_us / lat["exported"]
    if not int8.parity.passed:
        int8.kept, int8.reason = False, (f"parity fails (max abs error {int8.parity.max_abs_error:.3g}); "
                                         f"speed-up {speedup:.2f}x does not matter")
    elif speedup < min_speedup:
        int8.kept, int8.reason = False, (f"parity holds but INT8 is not faster at batch {decision_batch} "
                                         f"({speedup:.2f}x < {min_speedup:g}x)")
    else:
        int8.kept, int8.reason = True, f"parity holds and INT8 is {speedup:.2f}x faster at batch {decision_batch}"
    return int8
