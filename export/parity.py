"""Parity gates and latency checks: no exported file is used unless it matches the native model.

Every exported file is compared with the native predictor it came from, on probes that exercise
it (admission: integer feature rows at every split threshold of the forest and around it;
refinement: hidden vectors drawn around the training mean and standard deviation, prompt lengths
and budgets across their scales), and the **max abs error** is reported against a tolerance set
per predictor kind and precision (each exporter's ``TOLERANCES``, with the reason for each).
Latency is the median
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
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """``|exported - native| <= abs + rel * |native|`` elementwise."""

    abs: float
    rel: float = 0.0
    why: str = ""

    def bound(self, native: np.ndarray) -> np.ndarray:
        return self.abs + self.rel * np.abs(native)


@dataclass(frozen=True)
class ParityReport:
    n: int
    max_abs_error: float
    #: None where the gate did not measure it (DWS's train-time gate, see ``onnx_dws``)
    max_rel_error: float | None
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
    return ParityReport(
        n=int(a.size),
        max_abs_error=float(np.max(err)) if finite else float("inf"),
        max_rel_error=float(np.max(rel)) if finite else float("inf"),
        worst_violation=violation,
        tolerance=tolerance,
        passed=finite and violation <= 0.0,
    )


def median_seconds(
    fns: dict[str, Callable[[], Any]], *, repeats: int = 50, number: int = 10, warmup: int = 3
) -> dict[str, float]:
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
    #: batch -> {"native": µs, "exported": µs[, "peer": µs of the FP32 file an INT8 file would
    #: replace]}
    latency_us: dict[str, dict[str, float]] = field(default_factory=dict)
    kept: bool = False
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["parity"]["tolerance"] = asdict(self.parity.tolerance)
        return d


@dataclass(frozen=True)
class OnnxExporter:
    """How one predictor kind becomes gated ONNX files (named by its ``onnx_exporter``).

    ``write(predictor, path) -> path`` writes the FP32 file; ``check(predictor, path, *,
    peer=None, repeats=..., threads=...) -> ExportCheck`` compares a written file (FP32 or INT8)
    with the native predictor against ``tolerances[precision]`` and times both (``peer``: the
    FP32 file an INT8 file would replace, timed alongside). INT8 is tried for every kind; a
    model without weight matrices says :class:`~.quantize.NotQuantizable`.
    """

    file: str
    write: Callable[[Any, Path], Path]
    check: Callable[..., ExportCheck]
    tolerances: dict[str, Tolerance]


# -- timing -------------------------------------------------------------------------------------
def time_batches(
    check: ExportCheck,
    sides: Callable[[int], dict[str, Callable[[], Any]]],
    *,
    batches: tuple[int, ...],
    repeats: int,
) -> None:
    """Fill ``check.latency_us``: per batch size, the median µs of each side (timed interleaved)."""
    for n in batches:
        med = median_seconds(sides(n), repeats=repeats)
        check.latency_us[str(n)] = {k: 1e6 * v for k, v in med.items()}


def decide(check: ExportCheck) -> ExportCheck:
    """Set ``kept``/``reason`` of an FP32 file (an INT8 file waits for :func:`gate_int8`)."""
    if check.precision == "fp32":
        check.kept, check.reason = _fp32_decision(check)
    return check


def _fp32_decision(check: ExportCheck) -> tuple[bool, str]:
    p = check.parity
    if p.passed:
        return (
            True,
            f"parity holds (max abs error {p.max_abs_error:.3g} "
            f"within {p.tolerance.abs:g} + {p.tolerance.rel:g}|x|)",
        )
    return (
        False,
        f"parity fails (max abs error {p.max_abs_error:.3g}, "
        f"tolerance {p.tolerance.abs:g} + {p.tolerance.rel:g}|x|)",
    )


def gate_int8(
    int8: ExportCheck,
    fp32: ExportCheck | None = None,
    *,
    decision_batch: int = 128,
    min_speedup: float = 1.05,
) -> ExportCheck:
    """Keep the INT8 file iff its parity passes and it beats FP32 by ``min_speedup`` at
    ``decision_batch``.

    The FP32 time is the ``peer`` timed interleaved with the INT8 file when present (an
    exporter's ``check(..., peer=fp32_path)``), else the FP32 check's own measurement.
    """
    key = str(decision_batch)
    lat = int8.latency_us.get(key, {})
    fp32_us = lat.get(
        "peer", fp32.latency_us.get(key, {}).get("exported") if fp32 is not None else None
    )
    if "exported" not in lat or fp32_us is None:
        raise ValueError(f"gate_int8 needs INT8 and FP32 latencies at batch {decision_batch}")
    speedup = fp32_us / lat["exported"]
    if not int8.parity.passed:
        int8.kept, int8.reason = (
            False,
            (
                f"parity fails (max abs error {int8.parity.max_abs_error:.3g}); "
                f"speed-up {speedup:.2f}x does not matter"
            ),
        )
    elif speedup < min_speedup:
        int8.kept, int8.reason = (
            False,
            (
                f"parity holds but INT8 is not faster at batch {decision_batch} "
                f"({speedup:.2f}x < {min_speedup:g}x)"
            ),
        )
    else:
        int8.kept, int8.reason = (
            True,
            f"parity holds and INT8 is {speedup:.2f}x faster at batch {decision_batch}",
        )
    return int8
