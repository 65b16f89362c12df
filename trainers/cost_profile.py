"""Fit a deployment cost profile (alpha, beta, K, delta) from request-level latencies.

Why non-negative least squares with a smooth K: a profile has N x S cell costs (64 x 32 =
2,048 for a 2K-token budget) but a profiling run serves a few hundred requests one at a time,
and most cells are reached by few of them. K is therefore written on a coarse tensor grid of
knots (piecewise linear between knots in b and in s) whose weights are fitted, with a small
second-difference penalty along both axes; non-negative weights give non-negative costs,
and cells no request reached are interpolated from their neighbours instead of left at zero.

Phases are fitted where they are measured, as the cost model defines them:
``alpha`` from the prefill time of each request (linear in prompt blocks m), ``beta`` from its
commit/KV-refresh time (linear in output blocks n), and ``K``, ``delta`` jointly from its
denoising time. Fitting beta and K[:, 0] together from the total would be ill-posed: every
reached block runs its step 0, so ``beta * n`` and ``sum_b K[b, 0]`` move together. Traces
without a phase split are fitted on the total (documented fallback; the total stays right,
the split between beta and K[:, 0] comes from the smoothing).

Cross-validation (5-fold by default) reports R^2, MAPE, Spearman rho and pairwise ordering
accuracy of the predicted *total* request latency, the number a scheduler ranks by.

Machine speed: on a shared CPU a request's times move with what else runs (a busy neighbour
core slows the same forward by 10-40%, even on the thread's own CPU clock), and that drift,
not the cost form, dominated the error. ``dwise-predict profile`` therefore times a fixed probe
(one masked block over an empty cache) between requests; each request's ``probe_ms`` is the
mean of the probes on either side. The fit divides a request's phase times by
``(probe_ms / median probe_ms) ** gamma``, which prices every request at the run's median
speed, with the exponent ``gamma`` chosen by cross-validation among :data:`SPEED_EXPONENTS`
(0 = no correction; a probe is a short, noisy sample of the speed, so the best exponent is
usually under 1). Requests without a probe (older profile traces, ordinary traces) are fitted
as measured.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dwise_predict.cost import CostProfile
from dwise_predict.errors import TrainingError
from dwise_predict.ranking import spearman

#: Fewest requests a profile is fitted from; below it the cross-validation means nothing.
MIN_REQUESTS = 20
#: Exponents of the speed correction ``(probe / median probe) ** gamma`` the fit chooses from.
SPEED_EXPONENTS: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class ProfiledRequest:
    """One request served alone: its shape and its measured phase times (ms)."""

    prompt_blocks: int
    rounds_per_block: tuple[int, ...]
    prefill_ms: float
    denoise_ms: float
    refresh_ms: float
    #: ms of the speed probe next to this request (mean of the probes before and after it);
    #: None where it was not measured
    probe_ms: float | None = None

    @property
    def total_ms(self) -> float:
        return self.prefill_ms + self.denoise_ms + self.refresh_ms

    @property
    def output_blocks(self) -> int:
        return len(self.rounds_per_block)


@dataclass(frozen=True)
class FitConfig:
    """Knobs of the fit. ``smooth`` weighs the second-difference penalty on K's knots."""

    n_blocks: int | None = None  # N; default: the most output blocks seen
    block_knots: int = 8
    step_knots: int = 8
    smooth: float = 1e-3
    folds: int = 5
    seed: int = 0
    #: prefill form: "linear" (alpha * m, the paper's), "quadratic" (+ alpha2 * m^2), or
    #: "auto": quadratic only where it lowers the cross-validated squared error
    prefill: str = "auto"
    #: speed-correction exponent (module docstring); None: chosen by cross-validation among
    #: SPEED_EXPONENTS where every request has a probe, else 0 (times as measured)
    speed_exponent: float | None = None

    @property
    def quadratic_prefill(self) -> bool:
        return self.prefill == "quadratic"


# -- the planted example ----------------------------------------------------------------
#: The DWISE-DWS paper's LLaDA2.0-mini measurements the planted profile reproduces.
PAPER_FORWARD_FIRST_STEP_MS = 6.0
PAPER_FORWARD_LAST_STEP_MS = 8.6
PAPER_ATTENTION_AT_256_MS = 0.61
PAPER_ATTENTION_AT_32K_MS = 1.41


def planted_paper_profile(n_blocks: int = 64, block_size: int = 32) -> CostProfile:
    """The ``paper-llada2.0-mini`` example: heterogeneous step costs as the paper measured.

    A denoising step's forward pass costs 6.0 ms at a block's first step, rising linearly to
    8.6 ms at its last (MoE routing activates more experts as the block fills). Attention,
    inside that forward time, costs 0.61 ms at 256 context tokens and 1.41 ms at 32K, linear
    in the context (prompt + committed output blocks): that slope gives both K's growth
    across output blocks and ``delta`` per prompt block. Prefill (1.5 ms per prompt block)
    and KV refresh (6.5 ms per output block) are linear; they are chosen so prefill and
    refresh take about the paper's shares (5.8% and 6.7%) of a typical request's latency."""
    steps = np.arange(block_size, dtype=np.float64)
    forward = PAPER_FORWARD_FIRST_STEP_MS + (
        PAPER_FORWARD_LAST_STEP_MS - PAPER_FORWARD_FIRST_STEP_MS
    ) * steps / (block_size - 1)
    per_token = (PAPER_ATTENTION_AT_32K_MS - PAPER_ATTENTION_AT_256_MS) / (32768 - 256)
    blocks = np.arange(n_blocks, dtype=np.float64)
    K = forward[None, :] + per_token * (block_size * blocks[:, None] - 256)
    return CostProfile(
        alpha_ms=1.5,
        beta_ms=6.5,
        K_ms=np.round(K, 6),
        delta_ms=round(per_token * block_size, 9),
        block_size=block_size,
        max_steps=block_size,
        fingerprint={
            "model_id": "inclusionAI/LLaDA2.0-mini",
            "block_size": block_size,
            "decoding": "low_confidence",
            "threshold": 0.95,
        },
        hardware="planted from the DWS paper's LLaDA2.0-mini measurements (not measured here)",
        cv=None,
    )


def paper_profile_json() -> str:
    """The exact text of the shipped ``paper-llada2.0-mini.json`` (a test keeps them equal)."""
    return json.dumps(planted_paper_profile().to_json(), indent=2, sort_keys=True) + "\n"


def hardware_description() -> str:
    """One line naming the machine a profile was measured on (CPU, cores, torch threads)."""
    parts = [platform.machine(), platform.processor() or platform.system()]
    try:
        import os

        parts.append(f"{os.cpu_count()} cpus")
        import torch

        parts.append(f"torch {torch.__version__} threads={torch.get_num_threads()}")
        if torch.cuda.is_available():
            parts.append(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return ", ".join(p for p in parts if p)


# -- the design ------------------------------------------------------------------------
def knots(size: int, count: int) -> np.ndarray:
    """Knot positions in [0, size): dense at small indices, where most activity is."""
    if size <= count:
        return np.arange(size)
    return np.unique(np.round(np.geomspace(1, size, count)).astype(np.int64) - 1)


def hat_basis(size: int, at: np.ndarray) -> np.ndarray:
    """``(size, len(at))``: piecewise-linear interpolation weights of every index on the knots."""
    out = np.zeros((size, len(at)))
    if len(at) == 1:
        out[:, 0] = 1.0
        return out
    for i in range(size):
        j = int(np.searchsorted(at, i, side="right")) - 1
        j = min(max(j, 0), len(at) - 2)
        t = (i - at[j]) / (at[j + 1] - at[j])
        t = min(max(t, 0.0), 1.0)
        out[i, j], out[i, j + 1] = 1.0 - t, t
    return out


def _second_differences(at: np.ndarray) -> np.ndarray:
    """Divided second differences on (unevenly spaced) knots: zero on any linear function,
    so the penalty bends K toward straight lines, never toward a flat one."""
    n = len(at)
    if n < 3:
        return np.zeros((0, n))
    x = at.astype(np.float64)
    D = np.zeros((n - 2, n))
    for i in range(1, n - 1):
        h0, h1 = x[i] - x[i - 1], x[i + 1] - x[i]
        c = 2.0 / (h0 + h1)
        D[i - 1, i - 1 : i + 2] = (c / h0, -c * (1.0 / h0 + 1.0 / h1), c / h1)
    # each row scaled to a unit middle coefficient: wide knot gaps are bent as hard as narrow
    out: np.ndarray = D / np.abs(D).max(axis=1, keepdims=True)
    return out


@dataclass(frozen=True)
class _Design:
    """Everything a fit needs as arrays: one row per request."""

    m: np.ndarray  # prompt blocks
    n: np.ndarray  # output blocks
    cells: np.ndarray  # (requests, kb * ks): activity projected on the knot grid
    active: np.ndarray  # number of active cells
    prefill: np.ndarray
    denoise: np.ndarray
    refresh: np.ndarray
    Hb: np.ndarray
    Hs: np.ndarray
    knots_b: np.ndarray
    knots_s: np.ndarray
    speed: np.ndarray  # probe / median probe: > 1 where the machine ran slow (1 = unknown)
    probed: bool  # every request has a probe

    def take(self, idx: np.ndarray) -> _Design:
        return dataclasses.replace(
            self,
            m=self.m[idx],
            n=self.n[idx],
            cells=self.cells[idx],
            active=self.active[idx],
            prefill=self.prefill[idx],
            denoise=self.denoise[idx],
            refresh=self.refresh[idx],
            speed=self.speed[idx],
        )

    def at_median_speed(self, gamma: float) -> _Design:
        """The phase times divided by ``speed ** gamma`` (0: as measured)."""
        if gamma == 0:
            return self
        f = self.speed**gamma
        return dataclasses.replace(
            self, prefill=self.prefill / f, denoise=self.denoise / f, refresh=self.refresh / f
        )

    @property
    def total(self) -> np.ndarray:
        out: np.ndarray = self.prefill + self.denoise + self.refresh
        return out

    @property
    def split(self) -> bool:
        """Whether the phases were measured apart (else only the total is trusted)."""
        return bool(np.any(self.refresh > 0))


def _design(
    requests: Sequence[ProfiledRequest], n_blocks: int, max_steps: int, config: FitConfig
) -> _Design:
    kb, ks = knots(n_blocks, config.block_knots), knots(max_steps, config.step_knots)
    Hb, Hs = hat_basis(n_blocks, kb), hat_basis(max_steps, ks)
    # cumulative "steps reached" counts: activity of block b covers steps [0, r_b)
    cum_s = np.cumsum(Hs, axis=0)  # row r-1 = sum of Hs rows 0..r-1
    rows = np.zeros((len(requests), Hb.shape[1] * Hs.shape[1]))
    for i, r in enumerate(requests):
        rounds = np.minimum(np.asarray(r.rounds_per_block, dtype=np.int64), max_steps)
        nb = min(len(rounds), n_blocks)
        per_block = cum_s[rounds[:nb] - 1]  # (nb, ks)
        grid = Hb[:nb].T @ per_block
        if len(rounds) > n_blocks:  # blocks past N are priced by the last row (see cost.py)
            grid += np.outer(Hb[-1], cum_s[rounds[nb:] - 1].sum(axis=0))
        rows[i] = grid.ravel()
    arr = np.asarray
    probes = [r.probe_ms for r in requests]
    speed = np.ones(len(requests))
    probed = bool(probes) and all(p is not None for p in probes)
    if probed:
        p = arr(probes, dtype=np.float64)
        speed = p / np.median(p)
    return _Design(
        m=arr([r.prompt_blocks for r in requests], dtype=np.float64),
        n=arr([r.output_blocks for r in requests], dtype=np.float64),
        cells=rows,
        active=arr(
            [sum(min(x, max_steps) for x in r.rounds_per_block) for r in requests], dtype=np.float64
        ),
        prefill=arr([r.prefill_ms for r in requests], dtype=np.float64),
        denoise=arr([r.denoise_ms for r in requests], dtype=np.float64),
        refresh=arr([r.refresh_ms for r in requests], dtype=np.float64),
        Hb=Hb,
        Hs=Hs,
        knots_b=kb,
        knots_s=ks,
        speed=speed,
        probed=probed,
    )


def _nnls(
    X: np.ndarray, y: np.ndarray, penalty: np.ndarray | None = None, smooth: float = 0.0
) -> np.ndarray:
    """Non-negative least squares on column-scaled X, with an optional ridge-like penalty."""
    from scipy.optimize import nnls

    scale = np.linalg.norm(X, axis=0)
    scale[scale == 0] = 1.0
    Xs = X / scale
    if penalty is not None and penalty.shape[0] and smooth > 0:
        P = penalty / scale * np.sqrt(smooth)
        Xs = np.vstack([Xs, P])
        y = np.concatenate([y, np.zeros(P.shape[0])])
    coef, _ = nnls(Xs, y, maxiter=50 * Xs.shape[1])
    out: np.ndarray = coef / scale
    return out


@dataclass(frozen=True)
class _Fit:
    alpha: float
    alpha2: float
    beta: float
    delta: float
    W: np.ndarray  # (kb, ks) knot weights of K

    def predict_total(self, d: _Design) -> np.ndarray:
        out: np.ndarray = (
            self.alpha * d.m
            + self.alpha2 * d.m * d.m
            + self.beta * d.n
            + d.cells @ self.W.ravel()
            + self.delta * d.active * d.m
        )
        return out


def _solve(d: _Design, config: FitConfig) -> _Fit:
    """alpha, alpha2, beta, delta and K's knot weights from one design."""
    kb, ks = d.Hb.shape[1], d.Hs.shape[1]
    # rows are weighted by 1/latency: a relative-error fit, so short requests count as much
    # as long ones (MAPE and the ordering of short requests are what scheduling needs)
    Db, Ds = _second_differences(d.knots_b), _second_differences(d.knots_s)
    pen_w = np.vstack([np.kron(Db, np.eye(ks)), np.kron(np.eye(kb), Ds)])
    if d.split:
        # every phase weighted by its request's total: a request's refresh can be 0 (one
        # block, nothing to commit), so weighting by the phase itself would be unbounded
        w = 1.0 / np.maximum(d.total, 1e-9)
        prefill_cols = [d.m] + ([d.m * d.m] if config.quadratic_prefill else [])
        a = _nnls(np.stack(prefill_cols, axis=1) * w[:, None], d.prefill * w)
        alpha, alpha2 = float(a[0]), float(a[1]) if config.quadratic_prefill else 0.0
        beta = float(_nnls((d.n * w)[:, None], d.refresh * w)[0])
        X = np.hstack([d.cells, (d.active * d.m)[:, None]])
        pen = np.hstack([pen_w, np.zeros((pen_w.shape[0], 1))])
        coef = _nnls(X * w[:, None], d.denoise * w, pen, _smooth_weight(X * w[:, None], config))
        return _Fit(alpha, alpha2, beta, float(coef[-1]), coef[:-1].reshape(kb, ks))
    quad = [(d.m * d.m)[:, None]] if config.quadratic_prefill else []
    X = np.hstack([d.m[:, None], *quad, d.n[:, None], (d.active * d.m)[:, None], d.cells])
    w = 1.0 / np.maximum(d.total, 1e-9)
    h = 4 if config.quadratic_prefill else 3
    pen = np.hstack([np.zeros((pen_w.shape[0], h)), pen_w])
    coef = _nnls(X * w[:, None], d.total * w, pen, _smooth_weight(X * w[:, None], config))
    alpha2 = float(coef[1]) if config.quadratic_prefill else 0.0
    return _Fit(
        float(coef[0]), alpha2, float(coef[h - 2]), float(coef[h - 1]), coef[h:].reshape(kb, ks)
    )


def _smooth_weight(X: np.ndarray, config: FitConfig) -> float:
    """The penalty weight, relative to the data's own scale (so ``smooth`` is unit-free)."""
    return float(config.smooth * len(X))


# -- metrics ---------------------------------------------------------------------------
def cost_metrics(
    true_ms: np.ndarray, pred_ms: np.ndarray, max_pairs: int = 2_000_000, seed: int = 0
) -> dict[str, float]:
    """R^2, MAPE (fraction), Spearman rho and pairwise ordering accuracy of predicted costs.

    Pairwise accuracy counts pairs with different true costs whose predicted order agrees
    (sampled when there are more than ``max_pairs`` pairs)."""

    y, p = np.asarray(true_ms, dtype=np.float64), np.asarray(pred_ms, dtype=np.float64)
    ss_res = float(np.sum((y - p) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    n = len(y)
    if n * (n - 1) // 2 <= max_pairs:
        i, j = np.triu_indices(n, k=1)
    else:
        rng = np.random.default_rng(seed)
        i, j = rng.integers(0, n, max_pairs), rng.integers(0, n, max_pairs)
    keep = y[i] != y[j]
    agree = np.sign(y[i] - y[j])[keep] == np.sign(p[i] - p[j])[keep]
    return {
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
        "mape": float(np.mean(np.abs(p - y) / np.abs(y))),
        "spearman": _nan_if_none(spearman(y, p)),
        "pairwise": float(agree.mean()) if agree.size else float("nan"),
    }


def _nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else x


def prompt_coverage_warning(
    requests: Sequence[ProfiledRequest], ratio: float = 4.0, min_long: int = 3
) -> str | None:
    """Why a cross-validated R^2 can mislead, or None.

    The prompt terms (alpha, alpha2, delta) are learned from the prompt lengths the profile saw.
    When fewer than ``min_long`` requests have prompts ``ratio`` times longer than the longest
    of the rest, each of those few sits in a fold whose fit saw no prompt like it, so its
    out-of-fold cost is an extrapolation and one such error can dominate R^2 (MAPE and the
    ordering metrics hardly move). The fit itself uses every request; the warning is about what
    the cross-validation can vouch for."""
    blocks = sorted((r.prompt_blocks for r in requests), reverse=True)
    for n_long in range(1, min(min_long, len(blocks) - 1) + 1):
        rest = blocks[n_long]
        if blocks[n_long - 1] > ratio * max(rest, 1):
            longest = ", ".join(str(b) for b in blocks[:n_long])
            return (
                f"only {n_long} profiled prompt(s) ({longest} blocks) are over {ratio:g}x the "
                f"longest of the rest ({rest} blocks): the cross-validated R^2 extrapolates to "
                "them from shorter prompts and says little about long prompts; profile more "
                "long prompts (a larger --limit, or a workload with more of them first)"
            )
    return None


# -- the fit ---------------------------------------------------------------------------
def _check_requests(requests: Sequence[ProfiledRequest], max_steps: int, folds: int) -> None:
    need = max(MIN_REQUESTS, 2 * folds)
    if len(requests) < need:
        raise TrainingError(
            f"a cost profile needs at least {need} profiled requests, got {len(requests)}: "
            "profile more (`dwise-predict profile --limit 200` or more; a few hundred suffice)"
        )
    for r in requests:
        vals = (r.prefill_ms, r.denoise_ms, r.refresh_ms)
        if not all(np.isfinite(v) and v >= 0 for v in vals):
            raise TrainingError(
                f"a profiled request has a non-finite or negative phase time "
                f"{vals}; re-profile (the measurement is broken)"
            )
        if r.probe_ms is not None and not (np.isfinite(r.probe_ms) and r.probe_ms > 0):
            raise TrainingError(
                f"a profiled request has a speed probe of {r.probe_ms} ms; a probe times a "
                "forward and must be positive: re-profile (the measurement is broken)"
            )
        if not r.rounds_per_block or min(r.rounds_per_block) < 1:
            raise TrainingError("a profiled request has no output block or a block with 0 steps")
        if max(r.rounds_per_block) > max_steps:
            raise TrainingError(
                f"a profiled request ran {max(r.rounds_per_block)} steps in a "
                f"block, more than max_steps={max_steps}: wrong block size?"
            )


def _out_of_fold(
    d: _Design, config: FitConfig, progress: Callable[[str], None] | None
) -> np.ndarray:
    """Out-of-fold predicted totals of a k-fold split (seeded permutation)."""
    order = np.random.default_rng(config.seed).permutation(len(d.m))
    oof = np.zeros(len(d.m))
    for k, test in enumerate(np.array_split(order, config.folds)):
        train = np.setdiff1d(order, test)
        oof[test] = _solve(d.take(train), config).predict_total(d.take(test))
        if progress is not None:
            progress(
                f"{config.prefill} prefill, speed exponent {config.speed_exponent}: "
                f"cross-validation fold {k + 1}/{config.folds}"
            )
    return oof


def speed_exponents(requests: Sequence[ProfiledRequest], config: FitConfig) -> tuple[float, ...]:
    """The speed-correction exponents a fit tries: ``config.speed_exponent`` if set, else
    :data:`SPEED_EXPONENTS` where every request has a probe, else 0 (times as measured)."""
    return _exponents(bool(requests) and all(r.probe_ms is not None for r in requests), config)


def _exponents(probed: bool, config: FitConfig) -> tuple[float, ...]:
    if not probed:
        return (0.0,)
    if config.speed_exponent is not None:
        return (float(config.speed_exponent),)
    return SPEED_EXPONENTS


def fit_runs(requests: Sequence[ProfiledRequest], config: FitConfig) -> int:
    """How many cross-validations :func:`fit_cost_profile` runs (for a progress bar)."""
    forms = 2 if config.prefill == "auto" else 1
    return forms * len(speed_exponents(requests, config))


def _cross_validate(
    d: _Design, config: FitConfig, progress: Callable[[str], None] | None
) -> tuple[FitConfig, _Design, np.ndarray]:
    """The prefill form (lowest squared error) and then the speed exponent (lowest squared
    relative error) that cross-validate best; returns that config, the design at median speed
    and its out-of-fold totals."""
    forms = ["linear", "quadratic"] if config.prefill == "auto" else [config.prefill]
    scored = []
    for gamma in _exponents(d.probed, config):
        dg = d.at_median_speed(gamma)
        by_form = []
        for form in forms:
            variant = dataclasses.replace(config, prefill=form, speed_exponent=gamma)
            oof = _out_of_fold(dg, variant, progress)
            by_form.append((float(np.sum((oof - dg.total) ** 2)), form, variant, oof))
        _, _, variant, oof = min(by_form, key=lambda t: t[0])
        rel = float(np.sum(((oof - dg.total) / np.maximum(dg.total, 1e-9)) ** 2))
        scored.append((rel, gamma, variant, dg, oof))
    _, _, chosen, dg, oof = min(scored, key=lambda t: (t[0], t[1]))
    return chosen, dg, oof


def fit_cost_profile(
    requests: Sequence[ProfiledRequest],
    *,
    block_size: int,
    max_steps: int | None = None,
    fingerprint: dict | None = None,
    hardware: str | None = None,
    config: FitConfig | None = None,
    progress: Callable[[str], None] | None = None,
) -> CostProfile:
    """Fit alpha, beta, K, delta from profiled requests; ``cv`` holds the k-fold metrics
    (and ``speed_exponent``, the speed correction chosen, where the requests have probes)."""
    config = config or FitConfig()
    S = max_steps or block_size
    _check_requests(requests, S, config.folds)
    if config.prefill not in ("linear", "quadratic", "auto"):
        raise TrainingError(
            f"prefill form must be linear, quadratic or auto, not {config.prefill!r}"
        )
    N = config.n_blocks or max(r.output_blocks for r in requests)
    if config.speed_exponent is not None and not (
        np.isfinite(config.speed_exponent) and 0 <= config.speed_exponent <= 1
    ):
        raise TrainingError(f"speed exponent must lie in [0, 1], got {config.speed_exponent}")
    config, d, oof = _cross_validate(_design(requests, N, S, config), config, progress)
    cv = cost_metrics(d.total, oof, seed=config.seed)
    if d.probed:  # the metrics compare with times at the run's median speed
        cv["speed_exponent"] = float(config.speed_exponent or 0.0)
    fit = _solve(d, config)
    K = d.Hb @ fit.W @ d.Hs.T
    return CostProfile(
        alpha_ms=fit.alpha,
        alpha2_ms=fit.alpha2,
        beta_ms=fit.beta,
        K_ms=K,
        delta_ms=fit.delta,
        block_size=block_size,
        max_steps=S,
        fingerprint=dict(fingerprint or {}),
        hardware=hardware if hardware is not None else hardware_description(),
        cv=cv,
    )


def synthetic_requests(
    profile: CostProfile,
    n: int,
    *,
    noise: float = 0.02,
    seed: int = 0,
    max_prompt_blocks: int = 1000,
) -> list[ProfiledRequest]:
    """Requests priced by a known profile, with multiplicative noise on each phase.

    Shapes follow what dLLM traces look like: prompt blocks log-uniform in
    [1, max_prompt_blocks], output blocks geometric up to N, steps per block spread over
    [1, S] with most blocks finishing early."""
    rng = np.random.default_rng(seed)
    N, S = profile.n_blocks, profile.max_steps
    out = []
    for _ in range(n):
        m = int(np.exp(rng.uniform(0, np.log(max_prompt_blocks))))
        nb = int(min(N, rng.geometric(0.12)))
        rounds = np.minimum(S, 1 + rng.geometric(rng.uniform(0.05, 0.5), size=nb) - 1)
        rounds = np.maximum(rounds, 1)
        A = (np.arange(S)[None, :] < rounds[:, None]).astype(np.float64)
        den = float(np.sum(A * (profile.cell_costs(nb) + profile.delta_ms * m)))

        def noisy(x: float) -> float:
            return float(x * np.exp(rng.normal(0.0, noise)))

        out.append(
            ProfiledRequest(
                prompt_blocks=m,
                rounds_per_block=tuple(int(x) for x in rounds),
                prefill_ms=noisy(profile.alpha_ms * m),
                denoise_ms=noisy(den),
                refresh_ms=noisy(profile.beta_ms * nb),
            )
        )
    return out
