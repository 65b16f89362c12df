"""Build the train and eval workloads: Table-1 proportions, prompt-disjoint splits, fixed seed.

The DWISE paper evaluates on 4,096 requests and trains its predictors on a prompt-disjoint
2,048 with the same composition (Table 1). This module reproduces that mix from the offline
sources and the generators, scaled to any sizes. A source that runs short (HumanEval has 164
problems, IFBench 294 prompts) gives all it has, split between train and eval in the asked
ratio, and the summary records asked vs given, so nothing is hidden and no prompt repeats.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dwise_predict.errors import ConfigError, WorkloadError

from .generators import DEFAULT_LONG_CONTEXT_CHARS, GENERATED_SOURCE, _check_chars_range, generate
from .records import CATEGORIES, WORKLOAD_SCHEMA_VERSION, WorkloadRecord
from .sources import DEFAULT_CHAT_MAX_PROMPT_CHARS, SOURCES, load_sharegpt

#: DWISE paper Table 1 at its sizes, category -> (train, eval). MBPP + HumanEval -> code;
#: IFEval -> instruction; MATH + GSM8K + MGSM -> math; MMLU-Pro + ARC-C -> mcq.
TABLE1_MIX: dict[str, tuple[int, int]] = {
    "chat": (542, 1085),
    "code": (296, 592),
    "instruction": (148, 296),
    "math": (512, 1024),
    "mcq": (475, 949),
    "long_context": (75, 150),
}
DEFAULT_TRAIN_SIZE = 2048
DEFAULT_EVAL_SIZE = 4096
#: upper bound on a split, to catch typos (an extra zero) before minutes of generation
MAX_SPLIT_SIZE = 1_000_000


@dataclass(frozen=True)
class CategorySummary:
    """What one category was asked for and what it gave, per split, and its prompt lengths."""

    category: str
    source: str
    available: int | None  # distinct prompts the source has; None for generated categories
    train_asked: int
    train_given: int
    eval_asked: int
    eval_given: int
    prompt_chars_median: float
    prompt_chars_p90: float

    @property
    def short(self) -> bool:
        """True when the source could not give what was asked."""
        return self.train_given < self.train_asked or self.eval_given < self.eval_asked


@dataclass
class WorkloadSplits:
    """The built workload: prompt-disjoint train and eval records, the per-category summary,
    and the configuration that reproduces it."""

    train: list[WorkloadRecord]
    eval: list[WorkloadRecord]
    summary: list[CategorySummary]
    config: dict[str, Any] = field(default_factory=dict)

    def summary_dict(self) -> dict[str, Any]:
        """JSON-ready summary (no timestamps: same seed, same bytes)."""
        all_prompts = [r.prompt for r in self.train + self.eval]
        return {
            "workload_schema_version": WORKLOAD_SCHEMA_VERSION,
            "config": self.config,
            "train_count": len(self.train),
            "eval_count": len(self.eval),
            "prompt_chars_median": round(_percentile([len(p) for p in all_prompts], 50), 1),
            "categories": [asdict(s) for s in self.summary],
        }


def allocate(total: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainder).

    Ties go to the earlier category, so the result is deterministic; with the Table-1 counts as
    weights and the Table-1 total it returns Table 1 exactly.
    """
    wsum = sum(weights.values())
    if total == 0 or wsum == 0:
        return {c: 0 for c in weights}
    exact = {c: total * w / wsum for c, w in weights.items()}
    counts = {c: math.floor(x) for c, x in exact.items()}
    left = total - sum(counts.values())
    order = sorted(weights, key=lambda c: (-(exact[c] - counts[c]), list(weights).index(c)))
    for c in order[:left]:
        counts[c] += 1
    return counts


def plan_counts(
    train_size: int,
    eval_size: int,
    categories: Sequence[str] | None = None,
    proportions: Mapping[str, float] | None = None,
) -> dict[str, tuple[int, int]]:
    """How many records each category is asked for, per split: category -> (train, eval)."""
    for name, size in (("train_size", train_size), ("eval_size", eval_size)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(f"{name} must be a non-negative integer, got {size!r}")
        if size > MAX_SPLIT_SIZE:
            raise ConfigError(
                f"{name}={size} is above the limit of {MAX_SPLIT_SIZE}; ask for fewer records"
            )
    if train_size + eval_size == 0:
        raise ConfigError("train_size and eval_size are both 0; ask for at least one record")
    cats = _resolve_categories(categories, proportions)
    if proportions is None:
        train_w = {c: float(TABLE1_MIX[c][0]) for c in cats}
        eval_w = {c: float(TABLE1_MIX[c][1]) for c in cats}
    else:
        missing = [c for c in cats if c not in proportions]
        if missing:
            raise ConfigError(
                f"proportions has no weight for {', '.join(missing)}; give one per category"
            )
        for c, w in proportions.items():
            if (
                isinstance(w, bool)
                or not isinstance(w, (int, float))
                or not math.isfinite(w)
                or w < 0
            ):
                raise ConfigError(f"proportion of {c!r} must be a finite number >= 0, got {w!r}")
        train_w = eval_w = {c: float(proportions[c]) for c in cats}
        if sum(train_w.values()) <= 0:
            raise ConfigError(
                "proportions are all zero; give at least one category a positive weight"
            )
    t, e = allocate(train_size, train_w), allocate(eval_size, eval_w)
    return {c: (t[c], e[c]) for c in cats}


def load_pools(
    categories: Sequence[str] = tuple(SOURCES),
    chat_max_prompt_chars: int | None = DEFAULT_CHAT_MAX_PROMPT_CHARS,
) -> dict[str, list[WorkloadRecord]]:
    """Read the offline sources of the given source-backed categories (to reuse across builds)."""
    pools = {}
    for c in categories:
        if c not in SOURCES:
            continue
        pools[c] = (
            load_sharegpt(max_prompt_chars=chat_max_prompt_chars)
            if c == "chat"
            else SOURCES[c].loader()
        )
    return pools


def build_workload(
    train_size: int = DEFAULT_TRAIN_SIZE,
    eval_size: int = DEFAULT_EVAL_SIZE,
    seed: int = 0,
    categories: Sequence[str] | None = None,
    proportions: Mapping[str, float] | None = None,
    long_context_chars: tuple[int, int] = DEFAULT_LONG_CONTEXT_CHARS,
    *,
    strict: bool = False,
    chat_max_prompt_chars: int | None = DEFAULT_CHAT_MAX_PROMPT_CHARS,
    pools: Mapping[str, Sequence[WorkloadRecord]] | None = None,
) -> WorkloadSplits:
    """Build prompt-disjoint train and eval workloads.

    ``categories`` defaults to the six of Table 1 (or the keys of ``proportions``); counts follow
    Table 1 scaled to the sizes unless ``proportions`` (category -> weight) is given. A source
    that runs short gives all its distinct prompts split in the asked train:eval ratio; with
    ``strict=True`` that is an error instead. ``pools`` lets a caller pass already-loaded source
    records (see :func:`load_pools`). Same arguments, same records in the same order.
    """
    plan = plan_counts(train_size, eval_size, categories, proportions)
    lc_lo, lc_hi = _check_chars_range(long_context_chars)
    if chat_max_prompt_chars is not None and (
        not isinstance(chat_max_prompt_chars, int) or chat_max_prompt_chars < 1
    ):
        raise ConfigError(
            "chat_max_prompt_chars must be a positive "
            f"integer or None, got {chat_max_prompt_chars!r}"
        )
    if pools is None:
        pools = load_pools([c for c, (t, e) in plan.items() if t + e > 0], chat_max_prompt_chars)
    seen: set[str] = set()
    train: list[WorkloadRecord] = []
    eval_: list[WorkloadRecord] = []
    summary: list[CategorySummary] = []
    for (
        category
    ) in CATEGORIES:  # fixed order: a prompt taken by an earlier category is never reused
        if category not in plan:
            continue
        t_ask, e_ask = plan[category]
        if category in SOURCES:
            source = SOURCES[category].source
            if t_ask + e_ask == 0:
                picked, available = [], None
            else:
                pool = _distinct_pool(pools.get(category), category, seen)
                random.Random(f"{seed}:{category}").shuffle(pool)
                available = len(pool)
                t_give, e_give = _given(category, source, available, t_ask, e_ask, strict)
                picked = pool[: t_give + e_give]
        else:
            source, available = GENERATED_SOURCE, None
            t_give, e_give = t_ask, e_ask
            knobs = {"chars_range": (lc_lo, lc_hi)} if category == "long_context" else {}
            picked = generate(category, t_ask + e_ask, seed, exclude=seen, **knobs)
        if t_ask + e_ask == 0:
            t_give = e_give = 0
        seen.update(r.prompt for r in picked)
        train += picked[:t_give]
        eval_ += picked[t_give : t_give + e_give]
        lengths = [len(r.prompt) for r in picked]
        summary.append(
            CategorySummary(
                category,
                source,
                available,
                t_ask,
                t_give,
                e_ask,
                e_give,
                round(_percentile(lengths, 50), 1),
                round(_percentile(lengths, 90), 1),
            )
        )
    random.Random(f"{seed}:order:train").shuffle(train)
    random.Random(f"{seed}:order:eval").shuffle(eval_)
    config = {
        "train_size": train_size,
        "eval_size": eval_size,
        "seed": seed,
        "categories": list(plan),
        "proportions": dict(proportions) if proportions is not None else "table1",
        "long_context_chars": [lc_lo, lc_hi],
        "chat_max_prompt_chars": chat_max_prompt_chars,
        "strict": strict,
    }
    return WorkloadSplits(train=train, eval=eval_, summary=summary, config=config)


def _resolve_categories(
    categories: Sequence[str] | None, proportions: Mapping[str, float] | None
) -> list[str]:
    if categories is None:
        categories = list(proportions) if proportions is not None else list(CATEGORIES)
    if isinstance(categories, str):
        categories = [c for c in categories.split(",") if c]
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ConfigError(
            f"unknown categor{'y' if len(unknown) == 1 else 'ies'} "
            f"{', '.join(map(repr, unknown))}; valid: {', '.join(CATEGORIES)}"
        )
    if not categories:
        raise ConfigError(f"no categories given; choose from {', '.join(CATEGORIES)}")
    if proportions is not None:
        extra = [c for c in proportions if c not in CATEGORIES]
        if extra:
            raise ConfigError(
                f"proportions name unknown categor{'y' if len(extra) == 1 else 'ies'} "
                f"{', '.join(map(repr, extra))}; valid: {', '.join(CATEGORIES)}"
            )
    return [c for c in CATEGORIES if c in set(categories)]  # canonical order, duplicates dropped


def _distinct_pool(
    pool: Sequence[WorkloadRecord] | None, category: str, seen: set[str]
) -> list[WorkloadRecord]:
    """The pool's records with a prompt seen nowhere before (first occurrence kept)."""
    if pool is None:
        raise WorkloadError(
            f"no source records were given for category {category!r}; pass pools[{category!r}] "
            "or leave pools=None to read the installed source"
        )
    out, local = [], set()
    for r in pool:
        if r.prompt in seen or r.prompt in local or not r.prompt.strip():
            continue
        local.add(r.prompt)
        out.append(r)
    return out


def _given(
    category: str, source: str, available: int, t_ask: int, e_ask: int, strict: bool
) -> tuple[int, int]:
    """Counts to take: all asked if the source has them, else everything in the asked ratio."""
    if t_ask + e_ask <= available:
        return t_ask, e_ask
    if strict:
        raise WorkloadError(
            f"category {category!r} asked for {t_ask + e_ask} prompts ({t_ask} train + {e_ask} "
            f"eval) but source {source!r} has only {available} distinct prompts; ask for fewer "
            "(--train-size/--eval-size), drop it with --categories, or allow a short category (no "
            "--strict) to take all it has"
        )
    t_give = math.floor(available * t_ask / (t_ask + e_ask) + 0.5)
    return t_give, available - t_give


def _percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), 0.0 for no values."""
    if not values:
        return 0.0
    v = sorted(values)
    pos = (len(v) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))
