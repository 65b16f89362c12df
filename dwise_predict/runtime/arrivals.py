"""Arrival processes: burst, Poisson(λ), burst+Poisson(λ), all from a fixed seed.

As in the DWISE paper, request order and arrival times both come from the seed, so every policy
of one run sees the identical arrival trace. ``burst`` models a backlogged server (all requests
at t = 0); ``poisson:RATE`` spaces requests by exponential gaps of mean 1/RATE seconds;
``burst+poisson:RATE`` puts half the requests at t = 0 and the rest on a Poisson process, so new
requests keep arriving while the backlog drains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

KINDS = ("burst", "poisson", "burst+poisson")


@dataclass(frozen=True)
class ArrivalSpec:
    kind: str
    rate: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"arrival kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "burst":
            if self.rate is not None:
                raise ConfigError(
                    "burst arrivals take no rate; use poisson:RATE or burst+poisson:RATE"
                )
        elif self.rate is None or not math.isfinite(self.rate) or self.rate <= 0:
            raise ConfigError(
                f"{self.kind} arrivals need a positive finite rate in requests/s, got {self.rate!r}"
            )

    @classmethod
    def parse(cls, text: str) -> ArrivalSpec:
        """``burst`` | ``poisson:RATE`` | ``burst+poisson:RATE`` (RATE in requests per second)."""
        s = str(text).strip().lower()
        if ":" not in s:
            if s in ("poisson", "burst+poisson"):
                raise ConfigError(f"arrival {text!r} needs a rate: write {s}:RATE, e.g. {s}:16")
            return cls(s)
        kind, _, rate = s.partition(":")
        try:
            r = float(rate)
        except ValueError:
            raise ConfigError(
                f"arrival rate {rate!r} in {text!r} is not a number; write e.g. poisson:8"
            ) from None
        return cls(kind, r)

    def __str__(self) -> str:
        return self.kind if self.rate is None else f"{self.kind}:{self.rate:g}"


@dataclass(frozen=True)
class Arrivals:
    """``order[j]`` is the j-th request to arrive, at ``times[j]`` seconds (non-decreasing)."""

    order: np.ndarray
    times: np.ndarray


def make_arrivals(spec: ArrivalSpec | str, n: int, seed: int = 0) -> Arrivals:
    """Arrival order and times for ``n`` requests under ``spec``, from ``seed``."""
    if isinstance(spec, str):
        spec = ArrivalSpec.parse(spec)
    if n < 1:
        raise ConfigError(f"need at least one request to schedule, got n={n}")
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    times = np.zeros(n, dtype=np.float64)
    rate = float(spec.rate or 0.0)
    if spec.kind == "poisson":
        times = np.cumsum(rng.exponential(1.0 / rate, size=n))
        times -= times[0]
    elif spec.kind == "burst+poisson":
        half = n // 2
        times[half:] = np.cumsum(rng.exponential(1.0 / rate, size=n - half))
    return Arrivals(order.astype(np.int64), times)
