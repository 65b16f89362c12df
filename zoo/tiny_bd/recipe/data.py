"""Training examples for tiny-bd: real train-split responses plus freshly generated tasks.

Why this mix: the predictors need a model whose confidence, and so its denoising rounds,
varies with how hard a request is -- inside a category, not only across categories. A tiny
byte-level model cannot learn chat content on 2 CPU cores, but it can learn

* to stop (every response ends with EOS inside the 256-token output budget, and the last
  output block is padded with EOS, exactly what a finished block looks like at decode time);
* tasks whose answer follows from the question, with difficulty knobs: arithmetic word
  problems (more digits and operations: less sure), multiple choice, copy / reverse / count of
  varying length, multi-needle retrieval over *shortened* haystacks (short sequences train fast).

Real responses come only from the workload's TRAIN split (ShareGPT replies -- the first and
the later turns of the same train-split conversations --, IFBench sample outputs, HumanEval
canonical solutions). Generated prompts are drawn with their own seed namespace and checked,
by prompt text, to be absent from the eval split: :func:`build_training_set` raises
:class:`TrainingError` if any training prompt is an eval prompt.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dwise_predict.errors import TrainingError
from dwise_predict.features import ChatTemplate

from ..tokenizer import CHAT_TEMPLATE, EOS, build_tokenizer

#: default share of generated examples per task family (the rest of the set is real data)
DEFAULT_MIX: dict[str, float] = {
    "math": 0.38,
    "mcq": 0.36,
    "synthetic": 0.20,
    "long_context": 0.03,
}

#: every task family ``--mix`` may name; ``free_text`` = scaffolded free-text responses
#: (:mod:`.free_text`), the others are the workload's own generators
FAMILIES: tuple[str, ...] = ("math", "mcq", "synthetic", "long_context", "free_text")

#: the generators' difficulty knobs a training example keeps (``target_chars``: a haystack's
#: drawn length, which decides the sequence-length limit it is encoded under)
KNOB_KEYS = ("digits", "ops", "kind", "task", "length", "n_needles", "n_options", "target_chars")

#: default math difficulty weights: (1-op 1-2 digit, 1-2 digit up to 3 ops, any difficulty)
DEFAULT_MATH_WEIGHTS: tuple[float, float, float] = (0.35, 0.25, 0.40)
#: share of free-text examples per category (eval: chat 30%, instruction 6%, code 4%); the
#: scarce instruction and code prompts are reused, each time with a fresh response
FREE_TEXT_CATEGORY_WEIGHTS: dict[str, float] = {"chat": 0.6, "instruction": 0.25, "code": 0.15}


#: categories ``DataConfig.structured`` may name
STRUCTURED: tuple[str, ...] = ("code", "math")

#: the fixed text after a structured math reply's answer
STRUCTURED_MATH_CLOSING = (
    "I worked out each step above one at a time and then checked every one of them again, "
    "so that is the final answer."
)


@dataclass(frozen=True)
class TrainingExample:
    """One (prompt, response) pair before tokenization; ``knobs`` = the generator's difficulty."""

    prompt: str
    response: str
    category: str
    source: str
    knobs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EncodedExample:
    """Token ids: chat-templated prompt, and the response + EOS padded to whole output blocks."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    category: str

    @property
    def n_tokens(self) -> int:
        """Length of the two-stream sequence (prompt + clean + noisy response)."""
        return len(self.prompt_ids) + 2 * len(self.response_ids)


@dataclass(frozen=True)
class DataConfig:
    """What goes into the training set. Sizes are in examples."""

    n_generated: int = 100_000
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    real_repeats: int = 12
    block_size: int = 32
    max_new_tokens: int = 256
    max_len: int = 1280
    #: haystack length of the training multi-needle prompts (eval ones are 4-12K chars)
    long_context_chars: tuple[int, int] = (700, 1100)
    #: share of the multi-needle prompts drawn at the eval lengths instead (``long_chars``);
    #: such sequences may be up to ``long_max_len`` tokens (one per batch)
    long_context_long_share: float = 0.0
    long_context_long_chars: tuple[int, int] = (4000, 12000)
    long_max_len: int = 12_800
    #: longest free-text response in characters (it must end inside the output budget), and the
    #: longest free-text two-stream sequence (their prompts are up to 1,500 characters)
    free_text_max_chars: int = 230
    free_text_max_len: int = 2048
    #: how free-text responses are shaped (:data:`.free_text.STYLES`)
    free_text_style: str = "list"
    #: categories trained in a structured, mostly predictable shape (:data:`STRUCTURED`): code
    #: as :func:`.free_text.structured_code_response`, math as :func:`structured_math_response`
    structured: tuple[str, ...] = ()
    #: free-text examples per category (relative weights)
    free_text_categories: dict[str, float] = field(
        default_factory=lambda: dict(FREE_TEXT_CATEGORY_WEIGHTS)
    )
    #: math knob weights: (1-op 1-2 digit, 1-2 digit up to 3 ops, any difficulty)
    math_weights: tuple[float, float, float] = DEFAULT_MATH_WEIGHTS
    #: multiple-choice kinds (relative weights); ``None`` draws the kinds uniformly, as the eval
    #: split does. Weighting the kinds that are mid-way through learning gives them the
    #: examples they need within a short stage.
    mcq_kind_weights: dict[str, float] | None = None
    #: math step operations (relative weights over add, sub, mul, div); ``None`` draws them as the
    #: eval split does (add and sub twice as often). Drilling an operation the model has seen too
    #: rarely to learn (multiplication, a sixth of the steps) gives it the examples it needs.
    math_op_weights: dict[str, float] | None = None
    #: the workload whose train split is used and whose eval split is excluded
    workload_train_size: int = 2048
    workload_eval_size: int = 4096
    workload_seed: int = 0


@dataclass
class TrainingSet:
    """Encoded examples plus what the card reports about them."""

    examples: list[EncodedExample]
    counts: dict[str, int]
    dropped_too_long: int
    eval_prompts_checked: int


def render_prompt(prompt: str, template: ChatTemplate | None = None) -> str:
    """The prompt as the model sees it (chat template with the generation prompt)."""
    return (template or ChatTemplate(CHAT_TEMPLATE)).render(prompt)


def encode_examples(
    examples: Sequence[TrainingExample],
    *,
    block_size: int = 32,
    max_new_tokens: int = 256,
    max_len: int = 1280,
) -> tuple[list[EncodedExample], int]:
    """Tokenize; keep only responses that end (EOS included) within ``max_new_tokens``.

    Returns the kept examples and how many were dropped for length (response over budget or
    two-stream sequence over ``max_len``).
    """
    tok = build_tokenizer()
    template = ChatTemplate(CHAT_TEMPLATE)
    prompts = tok.encode_batch(
        [render_prompt(e.prompt, template) for e in examples], add_special_tokens=False
    )
    responses = tok.encode_batch([e.response for e in examples], add_special_tokens=False)
    out: list[EncodedExample] = []
    dropped = 0
    for ex, p, r in zip(examples, prompts, responses):
        resp = list(r.ids) + [EOS]
        if len(resp) > max_new_tokens:
            dropped += 1
            continue
        resp += [EOS] * (-len(resp) % block_size)
        enc = EncodedExample(tuple(p.ids), tuple(resp), ex.category)
        if enc.n_tokens > max_len:
            dropped += 1
            continue
        out.append(enc)
    return out, dropped


# ---------------------------------------------------------------- real responses (train split)


def real_examples(
    train_records: Iterable[Any],
    conversations: dict[str, Any] | None = None,
    max_prompt_chars: int = 4096,
) -> list[TrainingExample]:
    """Responses of the train split's source-backed records.

    ShareGPT: the record's own (prompt, first reply) and, when ``conversations`` (id ->
    conversation) is given, every later (human turn, assistant reply) pair of the same
    conversation. IFBench: the sample output. HumanEval: the canonical solution.
    """
    out: list[TrainingExample] = []
    for rec in train_records:
        if rec.source == "generated":
            continue
        if rec.reference:
            out.append(TrainingExample(rec.prompt, rec.reference, rec.category, rec.source))
        if rec.source == "sharegpt" and conversations is not None:
            conv = conversations.get(str(rec.meta.get("conversation_id")))
            for prompt, reply in _turn_pairs(conv)[1:]:
                if len(prompt) <= max_prompt_chars:
                    out.append(TrainingExample(prompt, reply, rec.category, "sharegpt-turn"))
    return out


def _turn_pairs(conv: Any) -> list[tuple[str, str]]:
    if not isinstance(conv, dict) or not isinstance(conv.get("conversations"), list):
        return []
    turns = [
        t for t in conv["conversations"] if isinstance(t, dict) and isinstance(t.get("value"), str)
    ]
    pairs = []
    for a, b in zip(turns, turns[1:]):
        if (
            a.get("from") in ("human", "user")
            and b.get("from") in ("gpt", "chatgpt", "assistant")
            and a["value"].strip()
            and b["value"].strip()
        ):
            pairs.append((a["value"], b["value"]))
    return pairs


# ---------------------------------------------------------------- generated tasks


def check_named_weights(
    weights: Mapping[str, float], known: Iterable[str], what: str
) -> dict[str, float]:
    """Relative weights over named choices (``what``: "mcq kinds", "free-text categories"),
    refused unless they name known choices with non-negative weights and a positive total."""
    known = tuple(known)
    unknown = sorted(set(weights) - set(known))
    if unknown:
        raise TrainingError(f"unknown {what} {unknown}; known: {', '.join(known)}")
    if any(not w >= 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise TrainingError(f"{what} weights must be >= 0 with a positive sum, got {dict(weights)}")
    return dict(weights)


def check_mcq_kind_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """Multiple-choice kind weights over the workload's mcq kinds, checked."""
    from dwise_predict.tracing.workload import MCQ_KINDS

    return check_named_weights(weights, MCQ_KINDS, "mcq kinds")


def check_math_op_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """Math step operation weights over the workload's operations, checked."""
    from dwise_predict.tracing.workload import MATH_OPS

    return check_named_weights(weights, MATH_OPS, "math operations")


def _fixed_knobs(**knobs: Any) -> Callable[[random.Random], dict[str, Any]]:
    return lambda r: dict(knobs)


def _knob_samplers(
    long_context_chars: tuple[int, int],
    math_weights: Sequence[float] = DEFAULT_MATH_WEIGHTS,
    long_share: float = 0.0,
    long_chars: tuple[int, int] = (4000, 12000),
    mcq_kind_weights: Mapping[str, float] | None = None,
    math_op_weights: Mapping[str, float] | None = None,
) -> dict[str, list[tuple[float, Callable[[random.Random], dict[str, Any]]]]]:
    """Per task family: (weight, knob sampler). Easy problems are over-weighted so the model
    learns content there, while hard ones keep the within-category difficulty range."""
    if mcq_kind_weights is not None:
        mcq_kind_weights = check_mcq_kind_weights(mcq_kind_weights)
    # no op_weights knob at all when unweighted: the stages trained before keep their draws
    ops = {} if math_op_weights is None else {"op_weights": check_math_op_weights(math_op_weights)}
    if len(math_weights) != 3 or min(math_weights) < 0 or sum(math_weights) <= 0:
        raise TrainingError(
            f"math_weights must be 3 non-negative weights (easy, medium, any), got {math_weights}"
        )
    return {
        "math": [
            (math_weights[0], lambda r: {"digits": r.choice((1, 1, 2)), "ops": 1, **ops}),
            (
                math_weights[1],
                lambda r: {"digits": r.choice((1, 2)), "ops": r.randint(1, 3), **ops},
            ),
            (math_weights[2], lambda r: dict(ops)),
        ],
        # uniform kinds keep the draws of the stages trained before kinds could be weighted
        "mcq": [(1.0, lambda r: {})]
        if mcq_kind_weights is None
        else [(w, _fixed_knobs(kind=kind)) for kind, w in mcq_kind_weights.items()],
        "synthetic": [
            (0.7, lambda r: {}),
            (0.3, lambda r: {"length": r.randint(25, 64)}),
        ],
        "long_context": [
            (1.0 - long_share, lambda r: {"chars_range": long_context_chars}),
            (long_share, lambda r: {"chars_range": long_chars}),
        ],
    }


def structured_math_response(reference: str) -> str:
    """A math reference ("a + b = c. ... The answer is N.") followed by a fixed closing: the
    worked steps' digits stay the uncertain part, and the closing commits many tokens a round,
    as structured text does in a real dLLM.

    Why after the answer, not before the steps: the steps copy their operands from the
    prompt, and a fixed opening in between moves them a block further away; trained that way
    the model stopped copying them (math exact match 2.9% on the validation requests). The
    reference itself is kept as written, so exact match reads the answer as before.
    """
    if " The answer is " not in f" {reference}":
        raise TrainingError(f"not a math reference (no 'The answer is'): {reference[:60]!r}")
    return f"{reference}\n{STRUCTURED_MATH_CLOSING}"


def check_structured(categories: Iterable[str]) -> tuple[str, ...]:
    """The structured categories, checked against :data:`STRUCTURED`."""
    out = tuple(categories)
    unknown = sorted(set(out) - set(STRUCTURED))
    if unknown:
        raise TrainingError(
            f"unknown structured categories {unknown}; known: {', '.join(STRUCTURED)}"
        )
    return out


def generated_examples(
    family: str,
    n: int,
    seed: int,
    exclude: set[str],
    long_context_chars: tuple[int, int] = (700, 1100),
    math_weights: Sequence[float] = DEFAULT_MATH_WEIGHTS,
    long_share: float = 0.0,
    long_chars: tuple[int, int] = (4000, 12000),
    mcq_kind_weights: Mapping[str, float] | None = None,
    math_op_weights: Mapping[str, float] | None = None,
) -> list[TrainingExample]:
    """``n`` fresh examples of one task family, prompts distinct and not in ``exclude``.

    Uses the workload's own generators (same formats as the eval split) with a seed namespace
    of its own, so the draws differ from the workload's.
    """
    from dwise_predict.tracing.workload import GENERATORS

    make = GENERATORS[family]
    samplers = _knob_samplers(
        long_context_chars, math_weights, long_share, long_chars, mcq_kind_weights, math_op_weights
    )[family]
    weights = [w for w, _ in samplers]
    rng = random.Random(f"tiny-bd-train:{seed}:{family}")
    out: list[TrainingExample] = []
    misses = 0
    while len(out) < n:
        knobs = rng.choices(samplers, weights)[0][1](rng)
        rec = make(rng, **knobs)
        if rec.prompt in exclude:
            misses += 1
            if misses > 10 * n + 1000:
                raise TrainingError(
                    f"the {family} generator ran out of fresh prompts after {len(out)} of {n}; "
                    "ask for fewer generated examples"
                )
            continue
        exclude.add(rec.prompt)
        category = "synthetic" if family == "synthetic" else rec.category
        out.append(
            TrainingExample(
                rec.prompt,
                rec.reference or "",
                category,
                "generated",
                {k: v for k, v in rec.meta.items() if k in KNOB_KEYS},
            )
        )
    return out


def build_training_set(
    config: DataConfig = DataConfig(),
    seed: int = 0,
    splits: Any = None,
    conversations: dict[str, Any] | None = None,
) -> TrainingSet:
    """The whole training set, shuffled with ``seed``, disjoint from the eval split by prompt.

    ``splits`` (a ``WorkloadSplits``) defaults to ``build_workload`` with the config's sizes
    and seed -- the same call the report makes for its eval requests.
    """
    from dwise_predict.tracing.workload import build_workload
    from dwise_predict.tracing.workload.sources import read_sharegpt_conversations

    if splits is None:
        splits = build_workload(
            config.workload_train_size, config.workload_eval_size, config.workload_seed
        )
    eval_prompts = {r.prompt for r in splits.eval}
    if conversations is None:
        convs, _ = read_sharegpt_conversations()
        conversations = {str(c.get("id")): c for c in convs if isinstance(c, dict)}
    structured = check_structured(config.structured)
    real = [
        e
        for e in real_examples(splits.train, conversations)
        if e.prompt not in eval_prompts and e.category not in structured
    ]
    exclude = set(eval_prompts) | {r.prompt for r in splits.train}
    unknown = sorted(set(config.mix) - set(FAMILIES))
    if unknown:
        raise TrainingError(f"unknown task families {unknown}; known: {', '.join(FAMILIES)}")
    generated: list[TrainingExample] = []
    free_text: list[TrainingExample] = []
    for family, share in config.mix.items():
        n = int(round(share * config.n_generated))
        if family == "free_text":
            if n:
                from .free_text import free_text_examples, free_text_sources

                prompts, pools = free_text_sources(conversations, eval_prompts)
                free_text = free_text_examples(
                    prompts,
                    n,
                    seed,
                    pools,
                    config.free_text_max_chars,
                    config.free_text_style,
                    config.free_text_categories,
                    structured_code="code" in structured,
                )
            continue
        generated += generated_examples(
            family,
            n,
            seed,
            exclude,
            config.long_context_chars,
            config.math_weights,
            config.long_context_long_share,
            config.long_context_long_chars,
            config.mcq_kind_weights,
            config.math_op_weights,
        )
    if "math" in structured:
        generated = [
            replace(e, response=structured_math_response(e.response)) if e.category == "math" else e
            for e in generated
        ]
    leaked = [e.prompt for e in real + generated + free_text if e.prompt in eval_prompts]
    if leaked:
        raise TrainingError(
            f"{len(leaked)} training prompts are in the eval split (first: {leaked[0][:60]!r}); "
            "the eval split must never be trained on -- check the workload seed and sizes"
        )
    # encode each distinct example once, then repeat the ids (tokenizer encodings are large)
    kw = {
        "block_size": config.block_size,
        "max_new_tokens": config.max_new_tokens,
        "max_len": config.max_len,
    }
    real_enc, real_dropped = encode_examples(real, **kw)
    # haystacks drawn at the eval lengths go under long_max_len; everything else under max_len
    is_long = [e.knobs.get("target_chars", 0) > config.long_context_chars[1] for e in generated]
    long = [e for e, x in zip(generated, is_long) if x]
    short = [e for e, x in zip(generated, is_long) if not x]
    gen_enc, gen_dropped = encode_examples(short, **kw)
    free_enc, free_dropped = encode_examples(
        free_text, **{**kw, "max_len": config.free_text_max_len}
    )
    long_enc, long_dropped = encode_examples(long, **{**kw, "max_len": config.long_max_len})
    encoded = real_enc * config.real_repeats + gen_enc + free_enc + long_enc
    dropped = real_dropped * config.real_repeats + gen_dropped + free_dropped + long_dropped
    random.Random(f"tiny-bd-shuffle:{seed}").shuffle(encoded)
    counts = Counter(e.category for e in encoded)
    return TrainingSet(
        examples=encoded,
        counts=dict(sorted(counts.items())),
        dropped_too_long=dropped,
        eval_prompts_checked=len(eval_prompts),
    )


def token_budget_batches(
    examples: Sequence[EncodedExample], max_tokens: int, seed: int, max_batch: int = 128
) -> list[list[int]]:
    """Group example indices into batches of similar length with at most ``max_tokens`` padded
    tokens each (batch size x longest sequence), then shuffle the batches with ``seed``.

    Length bucketing keeps padding -- and the quadratic attention over it -- small, which is
    most of the speed on a CPU.
    """
    order = sorted(range(len(examples)), key=lambda i: (examples[i].n_tokens, i))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = examples[i].n_tokens
        if cur and (max(longest, n) * (len(cur) + 1) > max_tokens or len(cur) >= max_batch):
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    random.Random(f"tiny-bd-batches:{seed}").shuffle(batches)
    return batches
