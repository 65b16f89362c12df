"""The one rank-correlation function: Spearman's ρ with average ranks for ties, in numpy.

Why one: the evaluation, the synthetic workload calibration and the benchmarks all report how
well an estimate *ranks* requests (a shortest-remaining-work-first scheduler only needs the
order right), and they must agree on both the value and what an undefined ρ looks like.
ρ is undefined when fewer than 3 pairs are given (two points always give ±1 and say nothing),
when either side is constant (no ranking to compare) or holds NaN; then it is ``None``, never
a number a reader could mistake for "no correlation".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ConfigError

#: fewer pairs than this and ρ is reported as undefined (None)
MIN_PAIRS = 3


def spearman(a: Any, b: Any) -> float | None:
    """Spearman's ρ of ``a`` and ``b`` (average ranks for ties), or None when undefined."""
    x, y = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ConfigError(f"spearman needs two sequences of one length, got {x.size} and {y.size}")
    if x.size < MIN_PAIRS or np.isnan(x).any() or np.isnan(y).any():
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    rx -= rx.mean()
    ry -= ry.mean()
    den = float(np.sqrt((rx * rx).sum() * (ry * ry).sum()))
    if den == 0.0:  # a constant side
        return None
    return float(np.clip((rx * ry).sum() / den, -1.0, 1.0))


def average_ranks(x: np.ndarray) -> np.ndarray:
    """0-based ranks of ``x``; tied values share the mean of their ranks."""
    order = np.argsort(x, kind="mergesort")
    xs = x[order]
    starts = np.r_[0, np.flatnonzero(np.diff(xs)) + 1]
    ends = np.r_[starts[1:], xs.size]
    ranks = np.empty(x.size)
    ranks[order] = np.repeat((starts + ends - 1) / 2.0, ends - starts)
    return ranks
