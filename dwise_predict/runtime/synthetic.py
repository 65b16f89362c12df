"""A synthetic workload matched to the DWISE paper's LLaDA2.1-mini setting (no GPU needed).

``paper-llada2.1-mini``: 4,096 requests in the categories and proportions of the paper's
Table 1, block size 32, a 256-token output budget, and denoising rounds shaped as the paper
reports them:

* total rounds p25 14 / p50 46 / p90 149 / max 279 (Fig. 2, Table 8), enforced exactly by a
  monotone piecewise log-linear remap of per-category log-normal draws onto those anchors;
* multiple-choice (MMLU-Pro, ARC-C) = 23% of requests but ≈3% of the rounds; chat + instruction
  average ≈115 rounds, code + math ≈45 (Appendix §11); ≈57% of requests use the full budget;
* 150 long-context multi-needle requests of ≈10K prompt tokens (9K–11K), ≈313 prompt blocks;
* a block may take more than 32 rounds (LLaDA2.1's token editing re-masks tokens): the paper's
  maximum of 279 rounds exceeds 8 blocks × 32.

Estimates: ``admission`` = total rounds × log-normal noise whose σ is solved (bisection, same
seed) so that Spearman ρ(admission, truth) equals ``spearman_admission`` (default 0.74, the
paper's prompt-feature predictor); ``refined`` = rounds still to go after the first denoising
round with noise solved for ``spearman`` (default 0.87, the paper's first-round predictor).
The noise has median 1, so both share the truth's scale (the paper's calibrated ratio 1.00).
``cost`` (for DWS-SJF) = total work P + rounds with the admission-level noise (prompt-only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from ..ranking import spearman
from .workload import Workload

PRESETS = ("paper-llada2.1-mini",)
BLOCK_SIZE = 32
OUTPUT_BUDGET = 256
ROUND_ANCHORS = ((0.25, 14.0), (0.50, 46.0), (0.90, 149.0), (1.00, 279.0))


@dataclass(frozen=True)
class _Source:
    source: str
    category: str
    count: int  # of 4,096 (paper Table 1)
    rounds_median: float  # log-normal draw before the global remap
    rounds_sigma: float
    prompt_median: float  # prompt tokens after the chat template
    prompt_sigma: float
    p_full: float  # probability the output uses the whole 256-token budget


# Table 1 of the paper; round and prompt shapes chosen so the remapped workload reproduces the
# category figures quoted in the module docstring (tests/test_runtime_simulator.py checks them).
SOURCES = (
    _Source("sharegpt", "chat", 1085, 124.0, 0.60, 90.0, 0.9, 0.60),
    _Source("ifeval", "instruction", 296, 118.0, 0.55, 70.0, 0.5, 0.70),
    _Source("mbpp", "code", 505, 47.0, 0.45, 110.0, 0.35, 0.92),
    _Source("humaneval", "code", 87, 52.0, 0.45, 150.0, 0.4, 0.92),
    _Source("math-l5", "math", 421, 56.0, 0.45, 90.0, 0.5, 0.90),
    _Source("gsm8k", "math", 345, 46.0, 0.40, 100.0, 0.3, 0.90),
    _Source("mgsm", "multilingual_math", 258, 52.0, 0.45, 130.0, 0.35, 0.85),
    _Source("mmlu-pro", "mcq", 637, 12.0, 0.45, 250.0, 0.5, 0.02),
    _Source("arc-c", "hard_mcq", 312, 6.5, 0.45, 100.0, 0.3, 0.0),
    _Source("multi-needle", "long_context", 150, 60.0, 0.45, 10_000.0, 0.0, 0.30),
)


def noisy_estimate(
    truth: np.ndarray, target_rho: float, rng: np.random.Generator, name: str
) -> np.ndarray:
    """``(truth + 1) · exp(σ z) − 1`` clipped at 0, with σ solved so Spearman ρ(estimate, truth) ≈
    target."""
    if not 0.0 < target_rho <= 1.0:
        raise ConfigError(f"{name} Spearman target {target_rho} must lie in (0, 1]")
    t = np.asarray(truth, dtype=np.float64)
    z = rng.standard_normal(t.size)
    logt = np.log1p(t)

    def est(sigma: float) -> np.ndarray:
        return np.maximum(np.expm1(logt + sigma * z), 0.0)

    if target_rho >= 1.0:
        return t.copy()
    lo, hi = 0.0, 8.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if (spearman(est(mid), t) or 0.0) > target_rho:
            lo = mid
        else:
            hi = mid
    return est(0.5 * (lo + hi))


def _counts(n: int) -> list[int]:
    total = sum(s.count for s in SOURCES)
    raw = np.array([s.count * n / total for s in SOURCES])
    c = np.maximum(np.floor(raw).astype(int), 1)
    while c.sum() < n:
        c[int(np.argmax(raw - c))] += 1
    while c.sum() > n:
        c[int(np.argmax(c))] -= 1
    return c.tolist()


def _remap_to_anchors(x: np.ndarray) -> np.ndarray:
    """Monotone piecewise log-linear map sending x's p25/p50/p90/max onto ROUND_ANCHORS."""
    lx = np.log(x)
    src = [float(lx.min())] + [float(np.quantile(lx, q)) for q, _ in ROUND_ANCHORS]
    dst = [float(lx.min())] + [float(np.log(v)) for _, v in ROUND_ANCHORS]
    dst[0] = min(dst[0], dst[1] - 1e-6)
    return np.exp(np.interp(lx, src, dst))


def _split_rounds(total: int, blocks: int, rng: np.random.Generator) -> list[int]:
    """Split ``total`` rounds over ``blocks`` blocks, each >= 1 and <= 32 when possible."""
    w = rng.dirichlet(np.full(blocks, 2.0))
    r = 1 + rng.multinomial(total - blocks, w)
    cap = max(BLOCK_SIZE, int(np.ceil(total / blocks)))
    while r.max() > cap:
        excess = int((r - cap).clip(min=0).sum())
        r = np.minimum(r, cap)
        room = cap - r
        add = rng.multinomial(excess, room / room.sum())
        r = r + add
    return r.tolist()


def synthetic_workload(
    preset: str = "paper-llada2.1-mini",
    *,
    n: int = 4096,
    seed: int = 0,
    spearman: float = 0.87,
    spearman_admission: float = 0.74,
) -> Workload:
    """The paper-matched synthetic workload (see the module docstring); same seed, same workload."""
    if preset not in PRESETS:
        raise ConfigError(f"unknown synthetic preset {preset!r}; choose one of {PRESETS}")
    if n < len(SOURCES):
        raise ConfigError(
            f"the synthetic workload needs n >= {len(SOURCES)} (one request per source), got {n}"
        )
    rng = np.random.default_rng(seed)
    counts = _counts(n)
    src_idx = np.repeat(np.arange(len(SOURCES)), counts)
    src_idx = src_idx[rng.permutation(n)]
    med = np.array([s.rounds_median for s in SOURCES])[src_idx]
    sig = np.array([s.rounds_sigma for s in SOURCES])[src_idx]
    raw = med * np.exp(sig * rng.standard_normal(n))
    total = np.maximum(np.rint(_remap_to_anchors(raw)), 1).astype(np.int64)
    # prompts
    pmed = np.array([s.prompt_median for s in SOURCES])[src_idx]
    psig = np.array([s.prompt_sigma for s in SOURCES])[src_idx]
    ptok = pmed * np.exp(psig * rng.standard_normal(n))
    is_long = np.array([s.category == "long_context" for s in SOURCES])[src_idx]
    ptok[is_long] = rng.uniform(9_000, 11_000, size=int(is_long.sum()))
    ptok = np.clip(np.rint(ptok), 8, 16_000).astype(np.int64)
    pblocks = np.maximum(1, -(-ptok // BLOCK_SIZE))
    # output blocks and per-block rounds
    p_full = np.array([s.p_full for s in SOURCES])[src_idx]
    full = rng.random(n) < p_full
    max_blocks = OUTPUT_BUDGET // BLOCK_SIZE
    blocks = np.where(full, max_blocks, rng.integers(1, max_blocks, size=n))
    is_mcq = np.isin(np.array([s.category for s in SOURCES])[src_idx], ("mcq", "hard_mcq"))
    blocks = np.where(is_mcq & ~full, 1, blocks)
    blocks = np.maximum(
        blocks, np.minimum(max_blocks, -(-total // BLOCK_SIZE))
    )  # <= 32 rounds/block when possible
    blocks = np.minimum(blocks, total)  # >= 1 round per block
    full = blocks == max_blocks
    out_tok = np.where(
        full, OUTPUT_BUDGET, (blocks - 1) * BLOCK_SIZE + rng.integers(1, BLOCK_SIZE + 1, size=n)
    )
    rounds: list[int] = []
    offsets = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        rounds.extend(_split_rounds(int(total[i]), int(blocks[i]), rng))
        offsets[i + 1] = len(rounds)
    # estimates
    admission = noisy_estimate(total, spearman_admission, rng, "admission")
    refined = noisy_estimate(total - 1, spearman, rng, "refined")
    cost = noisy_estimate(total + pblocks, spearman_admission, rng, "cost")
    return Workload(
        request_ids=np.array([f"syn-{i:05d}" for i in range(n)], dtype=object),
        category=np.array([SOURCES[j].category for j in src_idx], dtype=object),
        prompt_blocks=pblocks.astype(np.int64),
        prompt_tokens=ptok,
        output_budget=np.full(n, OUTPUT_BUDGET, dtype=np.int64),
        block_size=np.full(n, BLOCK_SIZE, dtype=np.int64),
        output_tokens=out_tok.astype(np.int64),
        rounds_flat=np.asarray(rounds, dtype=np.int64),
        block_offsets=offsets,
        admission=admission,
        refined=refined,
        cost=cost,
    )


def describe(w: Workload) -> dict[str, float | None]:
    """The figures the paper quotes, measured on a workload (for tests, docs and the CLI)."""
    t = w.total_rounds
    cat = w.category
    mcq = np.isin(cat, ("mcq", "hard_mcq"))
    chat = np.isin(cat, ("chat", "instruction"))
    code = np.isin(cat, ("code", "math"))
    long_ = cat == "long_context"
    out: dict[str, float | None] = {
        "requests": float(w.n),
        "rounds_p25": float(np.percentile(t, 25)),
        "rounds_p50": float(np.percentile(t, 50)),
        "rounds_p90": float(np.percentile(t, 90)),
        "rounds_max": float(t.max()),
        "rounds_mean": float(t.mean()),
        "mcq_request_frac": float(mcq.mean()),
        "mcq_work_frac": float(t[mcq].sum() / t.sum()),
        "chat_instruction_mean_rounds": float(t[chat].mean()) if chat.any() else float("nan"),
        "code_math_mean_rounds": float(t[code].mean()) if code.any() else float("nan"),
        "full_budget_frac": float(np.mean(w.output_tokens == w.output_budget)),
        "long_context_requests": float(long_.sum()),
        "long_context_mean_tokens": float(w.prompt_tokens[long_].mean())
        if long_.any()
        else float("nan"),
        "prompt_blocks_total": float(w.prompt_blocks.sum()),
        "denoising_rounds_total": float(t.sum()),
    }
    if w.admission is not None:
        out["admission_spearman"] = spearman(w.admission, t)
    if w.refined is not None:
        out["refined_spearman"] = spearman(w.refined, t - 1)
    return out
