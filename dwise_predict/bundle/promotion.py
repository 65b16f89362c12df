"""Shadow first, then promote; roll back on regression: the judge of a new bundle revision.

Why a judge of its own: a refreshed bundle is better on the held-out slice the refresh job
scored it on, but that slice is old by the time the revision reaches a server. So a new
revision first *shadows*: for ``shadow_requests`` finished requests it predicts beside the live
bundle, on the same requests, and neither ranks anything by it. It is promoted only when its
figures on those requests are at least as good as the live bundle's (:func:`judge`), and after
promotion it stays on *probation* for as many requests again, the previous bundle predicting
beside it: if its live figures fall past ``rollback_drop`` from what it showed in shadow and
the previous bundle does better on the same requests (:class:`Probation`), the previous
bundle comes back.

The figures are the ones the quality monitor reports (``sglang/monitor.py``): the median
predicted/actual ratio (calibration) and Spearman's ρ of predicted against actual rounds
(ranking), of the admission estimate, which orders every request the scheduler sees. Pure
numpy and framework-neutral: the SGLang plugin feeds it finished requests, a test feeds it
numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..ranking import spearman


@dataclass(frozen=True)
class PromotionRule:
    """How long a revision shadows, how much worse it may look, and what rolls it back."""

    #: finished requests both bundles must have predicted before a verdict
    shadow_requests: int = 128
    #: the candidate may rank this much worse (ρ) and sit this much further from a ratio of 1
    #: (|log median ratio|) and still count as at least as good
    margin: float = 0.02
    #: after promotion: roll back when ρ falls more than this below the shadow ρ, or
    #: |log median ratio| grows more than this above the shadow one, and the previous bundle
    #: does better on that figure (:class:`Probation`)
    rollback_drop: float = 0.10

    def __post_init__(self) -> None:
        if not isinstance(self.shadow_requests, int) or self.shadow_requests < 8:
            raise ConfigError(
                f"shadow_requests={self.shadow_requests!r} must be an integer >= 8 (a ρ over "
                "fewer requests says little)"
            )
        for name in ("margin", "rollback_drop"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name}={v!r} must be a finite number >= 0")


@dataclass(frozen=True)
class Figures:
    """One estimate's figures on a set of finished requests (None: undefined)."""

    n: int
    median_ratio: float | None
    spearman: float | None

    @property
    def log_ratio(self) -> float | None:
        """|log median ratio|: how far calibration is from 1, the same both ways."""
        r = self.median_ratio
        return None if r is None or r <= 0 else abs(math.log(r))

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "median_ratio": None if self.median_ratio is None else round(self.median_ratio, 4),
            "spearman": None if self.spearman is None else round(self.spearman, 4),
        }


def figures(predicted: Any, actual: Any) -> Figures:
    """The monitor's figures of ``predicted`` against ``actual`` rounds."""
    p = np.asarray(predicted, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    if p.size == 0:
        return Figures(0, None, None)
    ratio = float(np.median(np.maximum(p, 1e-9) / a))
    return Figures(int(p.size), ratio, spearman(p, a))


def judge(live: Figures, candidate: Figures, margin: float) -> tuple[bool, str]:
    """Whether ``candidate`` is at least as good as ``live`` on the same requests, and why.

    At least as good = ρ no lower than live's minus ``margin`` *and* median ratio no further
    from 1 than live's plus ``margin`` (in |log ratio|). An undefined candidate figure loses;
    an undefined live one does not count against the candidate."""
    rc, lc = candidate.spearman, candidate.log_ratio
    if rc is None or lc is None:
        return False, f"rejected: the candidate's figures are undefined on {candidate.n} requests"
    rl, ll = live.spearman, live.log_ratio
    if rl is not None and rc < rl - margin:
        return False, f"rejected: candidate ρ {rc:.3f} < live ρ {rl:.3f} - {margin:g}"
    if ll is not None and lc > ll + margin + 1e-12:
        return False, (
            f"rejected: candidate median ratio {candidate.median_ratio:.3f} is further from 1 "
            f"than live {live.median_ratio:.3f} (margin {margin:g})"
        )
    return True, (
        f"promoted: candidate ρ {rc:.3f} (live {_fmt(rl)}), median ratio "
        f"{candidate.median_ratio:.3f} (live {_fmt(live.median_ratio)}) on {candidate.n} requests"
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _usable(actual: float, *preds: float | None) -> bool:
    return (
        math.isfinite(actual)
        and actual > 0
        and all(p is not None and math.isfinite(p) and p >= 0 for p in preds)
    )


@dataclass
class _PairedWindow:
    """Finished requests scored by two bundles: (first estimate, second estimate, actual)
    for up to ``rule.shadow_requests`` of them."""

    rule: PromotionRule
    _pairs: list[tuple[float, float, float]] = field(default_factory=list, repr=False)

    def add(self, actual: float, first: float | None, second: float | None) -> None:
        """One finished request: its actual rounds and both estimates. A request that either
        bundle did not estimate (it arrived before the window began) is skipped."""
        if _usable(actual, first, second):
            self._pairs.append((float(first), float(second), float(actual)))  # type: ignore[arg-type]

    @property
    def n(self) -> int:
        return len(self._pairs)

    @property
    def done(self) -> bool:
        return self.n >= self.rule.shadow_requests

    def figures(self) -> tuple[Figures, Figures]:
        """(first, second) figures on the requests seen so far."""
        if not self._pairs:
            return Figures(0, None, None), Figures(0, None, None)
        a = np.asarray(self._pairs)
        return figures(a[:, 0], a[:, 2]), figures(a[:, 1], a[:, 2])


@dataclass
class ShadowTrial(_PairedWindow):
    """A candidate predicting beside the live bundle (``add(actual, live, candidate)``) until
    ``rule.shadow_requests`` finished requests carry both estimates; then :meth:`verdict`."""

    def verdict(self) -> tuple[bool, str, Figures, Figures]:
        """(promote, reason, live figures, candidate figures)."""
        live, cand = self.figures()
        ok, reason = judge(live, cand, self.rule.margin)
        return ok, reason, live, cand

    def candidate_pairs(self) -> list[tuple[float, float]]:
        """(candidate estimate, actual) of every request scored: the candidate's monitor
        window once it is promoted."""
        return [(c, a) for _, c, a in self._pairs]


@dataclass
class Probation(_PairedWindow):
    """A promoted revision's first ``rule.shadow_requests`` finished requests as the live one,
    with the previous bundle predicting beside it (``add(actual, live, previous)``).

    Rolled back when a figure (ρ, or |log median ratio|) falls past ``rule.rollback_drop``
    from its shadow value *and* the previous bundle does better on that figure on the same
    requests: a fall the previous bundle shares is the traffic moving again, which a rollback
    would not mend (that is a new refresh's job)."""

    baseline: Figures = field(kw_only=True)

    def __init__(self, rule: PromotionRule, baseline: Figures) -> None:
        super().__init__(rule)
        self.baseline = baseline

    def verdict(self) -> tuple[bool, str, Figures]:
        """(roll back, reason, live figures on the probation requests)."""
        (now, prev), base, drop = self.figures(), self.baseline, self.rule.rollback_drop
        if _fell(now.spearman, base.spearman, drop):
            fell = f"live ρ {now.spearman:.3f} fell more than {drop:g} below its shadow ρ "
            fell += f"{base.spearman:.3f}"
            better = _fell(now.spearman, prev.spearman, 0.0)
            theirs = f"ρ {_fmt(prev.spearman)}"
        elif _fell(_neg(now.log_ratio), _neg(base.log_ratio), drop):
            fell = f"live median ratio {now.median_ratio:.3f} moved more than {drop:g} (log) "
            fell += f"from its shadow ratio {base.median_ratio:.3f}"
            better = _fell(_neg(now.log_ratio), _neg(prev.log_ratio), 0.0)
            theirs = f"median ratio {_fmt(prev.median_ratio)}"
        else:
            kept = f"kept: live ρ {_fmt(now.spearman)}, median ratio {_fmt(now.median_ratio)}"
            return False, kept, now
        if not better:
            why = f"the previous bundle does no better on the same {now.n} requests ({theirs})"
            return False, f"kept: {fell}, but {why}", now
        why = f"the previous bundle does better on the same {now.n} requests ({theirs})"
        return True, f"rolled back: {fell}; {why}", now


def _neg(x: float | None) -> float | None:
    return None if x is None else -x


def _fell(now: float | None, before: float | None, drop: float) -> bool:
    """Whether ``now`` is more than ``drop`` below ``before`` (False when either is None)."""
    return now is not None and before is not None and now < before - drop
