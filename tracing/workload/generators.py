"""Generated categories with exact answers: math, mcq, long_context (and training-only synthetic).

No offline package carries MATH/GSM8K/MMLU-Pro/ARC or multi-needle prompts, so these are
generated. Two constraints shape them:

* the answer must follow from the question alone, because a ~5M-parameter byte-level
  reference dLLM is trained on the train split and its accuracy is checked on eval;
* difficulty must vary *inside* each category (digits, operations, carries, number of options,
  needles, length), because the predictors must rank requests within a category too.

Every generator takes a ``random.Random`` and explicit difficulty knobs; knobs left as None
are drawn from the rng. The same rng state gives the same record.
"""

from __future__ import annotations

import hashlib
import random
import string
from collections.abc import Callable, Collection, Mapping
from typing import Any

from dwise_predict.errors import ConfigError, WorkloadError

from .records import WorkloadRecord

GENERATED_SOURCE = "generated"
#: default (min, max) characters of a long-context prompt
DEFAULT_LONG_CONTEXT_CHARS: tuple[int, int] = (4000, 12000)

_NAMES = (
    "Mia",
    "Liam",
    "Ava",
    "Noah",
    "Zoe",
    "Omar",
    "Lena",
    "Ravi",
    "Yuki",
    "Sara",
    "Tom",
    "Ines",
    "Kofi",
    "Nina",
    "Pablo",
    "Hana",
    "Ivan",
    "Maya",
    "Leo",
    "Amir",
    "Chloe",
    "Jonas",
    "Priya",
    "Elif",
)
_ITEMS = (
    "apples",
    "marbles",
    "stickers",
    "coins",
    "books",
    "pencils",
    "stamps",
    "cards",
    "shells",
    "beads",
    "cookies",
    "tickets",
    "buttons",
    "seeds",
    "bottles",
    "toy cars",
)
_WORDS = (
    "apple",
    "river",
    "stone",
    "cloud",
    "table",
    "garden",
    "window",
    "bridge",
    "candle",
    "forest",
    "planet",
    "rocket",
    "silver",
    "tiger",
    "violin",
    "basket",
    "castle",
    "dragon",
    "engine",
    "feather",
    "glove",
    "harbor",
    "island",
    "jacket",
    "kettle",
    "lemon",
    "mirror",
    "needle",
    "orange",
    "pepper",
    "quartz",
    "rabbit",
    "saddle",
    "ticket",
    "umbrella",
    "valley",
    "wagon",
    "yellow",
    "zebra",
    "anchor",
    "button",
    "copper",
    "desert",
    "falcon",
    "guitar",
    "hammer",
    "insect",
    "jungle",
    "kitten",
    "ladder",
    "magnet",
    "nickel",
    "oyster",
    "parrot",
    "rubber",
    "spider",
    "tunnel",
    "velvet",
    "walnut",
    "blanket",
    "cat",
    "dog",
    "sun",
    "map",
    "pen",
    "cup",
    "hat",
    "box",
    "key",
    "owl",
    "bee",
    "fox",
    "car",
    "bus",
    "tree",
    "book",
    "lamp",
    "ship",
    "fish",
    "bird",
    "moon",
    "star",
    "rain",
    "snow",
    "leaf",
    "rose",
    "bread",
    "chair",
    "clock",
    "horse",
    "mouse",
    "plant",
    "shirt",
    "train",
    "water",
    "whale",
    "music",
)
_COLORS = (
    "red",
    "blue",
    "green",
    "yellow",
    "purple",
    "orange",
    "black",
    "white",
    "silver",
    "golden",
    "brown",
    "gray",
)
_OBJECTS = (
    "door",
    "box",
    "vault",
    "locker",
    "gate",
    "chest",
    "safe",
    "cabinet",
    "drawer",
    "suitcase",
    "mailbox",
    "garage",
)
_PROPERTIES = ("secret code", "access number", "lock combination")
_ADJS = (
    "quiet",
    "old",
    "narrow",
    "bright",
    "heavy",
    "gentle",
    "distant",
    "crowded",
    "empty",
    "ancient",
    "small",
    "busy",
    "cold",
    "warm",
    "tall",
    "muddy",
    "shiny",
    "wooden",
    "rusty",
    "famous",
)
_NOUNS = (
    "village",
    "market",
    "library",
    "station",
    "river",
    "mountain",
    "garden",
    "kitchen",
    "museum",
    "harbor",
    "forest",
    "school",
    "bakery",
    "bridge",
    "farm",
    "theater",
    "castle",
    "workshop",
    "lighthouse",
    "meadow",
    "orchard",
    "tower",
    "road",
    "valley",
    "square",
)
_PEOPLE = (
    "the baker",
    "a traveler",
    "the teacher",
    "an old fisherman",
    "the mayor",
    "a young painter",
    "the gardener",
    "a musician",
    "the librarian",
    "a farmer",
    "the doctor",
    "a sailor",
)
_VERBS = (
    "walked past",
    "looked at",
    "talked about",
    "cleaned",
    "painted",
    "visited",
    "described",
    "photographed",
    "remembered",
    "admired",
    "repaired",
    "counted the windows of",
)
_WEATHER = (
    "rain fell softly",
    "the wind was strong",
    "the sky was clear",
    "fog covered the hills",
    "snow began to fall",
    "the sun was setting",
    "clouds gathered slowly",
    "the air smelled of pine",
)
_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_LETTERS = string.ascii_uppercase

MCQ_KINDS = ("largest", "smallest", "sum", "reverse", "most_letters", "alphabetical")
SYNTHETIC_TASKS = ("copy", "reverse", "count")


def record_id(category: str, prompt: str) -> str:
    """A stable id from the prompt text: equal prompts get equal ids, so dedupe is by prompt."""
    return f"{category}-{hashlib.sha1(prompt.encode('utf-8')).hexdigest()[:12]}"


def _generated(category: str, prompt: str, reference: str, meta: dict[str, Any]) -> WorkloadRecord:
    return WorkloadRecord(
        id=record_id(category, prompt),
        category=category,
        source=GENERATED_SOURCE,
        prompt=prompt,
        reference=reference,
        meta=meta,
    )


def _check_range(name: str, value: int | None, lo: int, hi: int) -> None:
    if value is not None and not (isinstance(value, int) and lo <= value <= hi):
        raise ConfigError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(1 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _carries(a: int, b: int) -> int:
    """Column carries when adding a + b."""
    count = carry = 0
    while a or b:
        carry = 1 if (a % 10 + b % 10 + carry) >= 10 else 0
        count += carry
        a, b = a // 10, b // 10
    return count


def _borrows(a: int, b: int) -> int:
    """Column borrows when subtracting b from a (a >= b)."""
    count = borrow = 0
    while a or b:
        borrow = 1 if (a % 10 - borrow) < b % 10 else 0
        count += borrow
        a, b = a // 10, b // 10
    return count


# ---------------------------------------------------------------- math


#: the operations of a math step; an eval problem draws add and sub twice as often as mul and div
MATH_OPS = ("add", "sub", "mul", "div")


def make_math(
    rng: random.Random,
    digits: int | None = None,
    ops: int | None = None,
    op_weights: Mapping[str, float] | None = None,
) -> WorkloadRecord:
    """An arithmetic word problem: a start amount, then ``ops`` steps (add, subtract, multiply,
    share equally), asking for the final amount. Operands have ``digits`` digits (1-5); multiply and
    share use a one-digit factor. The reference works each step and ends "The answer is N.".

    ``op_weights`` (relative weights over :data:`MATH_OPS`) lets a training set drill one
    operation; ``None`` keeps the eval split's draws (and its random stream) unchanged."""
    _check_range("digits", digits, 1, 5)
    _check_range("ops", ops, 1, 3)
    if op_weights is not None:
        unknown = sorted(set(op_weights) - set(MATH_OPS))
        if unknown or any(not w >= 0 for w in op_weights.values()) or not sum(op_weights.values()):
            raise ConfigError(
                f"op_weights must weight {', '.join(MATH_OPS)} (>= 0, positive sum), "
                f"got {dict(op_weights)}"
            )
    op_choice = None if op_weights is None else [op_weights.get(k, 0.0) for k in MATH_OPS]
    digits = digits if digits is not None else rng.randint(1, 5)
    ops = ops if ops is not None else rng.randint(1, 3)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = _number(rng, digits)
    sentences = [f"{name} has {value} {item}."]
    steps: list[str] = []
    kinds: list[str] = []
    carries = 0
    for _ in range(ops):
        if op_choice is None:
            kind = rng.choice(("add", "add", "sub", "sub", "mul", "div"))
        else:
            kind = rng.choices(MATH_OPS, op_choice)[0]
        if kind == "sub" and value < 2:
            kind = "add"
        if kind == "div":
            divisors = [k for k in range(2, 10) if value % k == 0]
            if not divisors:
                kind = "mul"
        if kind == "add":
            n = _number(rng, digits)
            carries += _carries(value, n)
            sentences.append(
                rng.choice(
                    (
                        f"Then {name} buys {n} more.",
                        f"Then {name} finds {n} more.",
                        f"Then a friend gives {name} {n} more.",
                    )
                )
            )
            steps.append(f"{value} + {n} = {value + n}.")
            value += n
        elif kind == "sub":
            n = rng.randint(1, min(value - 1, 10**digits - 1))
            carries += _borrows(value, n)
            sentences.append(
                rng.choice(
                    (
                        f"Then {name} gives away {n}.",
                        f"Then {name} sells {n}.",
                        f"Then {name} loses {n}.",
                    )
                )
            )
            steps.append(f"{value} - {n} = {value - n}.")
            value -= n
        elif kind == "mul":
            k = rng.randint(2, 9)
            sentences.append(f"Then the number of {item} becomes {k} times as large.")
            steps.append(f"{value} * {k} = {value * k}.")
            value *= k
        else:
            k = rng.choice(divisors)
            sentences.append(f"Then {name} shares them equally among {k} bags and keeps one bag.")
            steps.append(f"{value} / {k} = {value // k}.")
            value //= k
        kinds.append(kind)
    sentences.append(f"How many {item} does {name} have now?")
    reference = " ".join(steps) + f" The answer is {value}."
    return _generated(
        "math",
        " ".join(sentences),
        reference,
        {"answer": value, "digits": digits, "ops": ops, "carries": carries, "op_kinds": kinds},
    )


# ---------------------------------------------------------------- multiple choice


def _distinct(
    rng: random.Random, draw: Callable[[], Any], n: int, exclude: Collection[Any] = ()
) -> list[Any]:
    out: list[Any] = []
    for _ in range(1000 * n):
        v = draw()
        if v not in out and v not in exclude:
            out.append(v)
            if len(out) == n:
                return out
    raise WorkloadError(f"could not draw {n} distinct options; widen the option range")


def make_mcq(
    rng: random.Random,
    kind: str | None = None,
    n_options: int | None = None,
    digits: int | None = None,
) -> WorkloadRecord:
    """A multiple-choice question with lettered options whose answer follows from the question.

    Kinds: largest / smallest number, sum of two numbers, reverse of a word, option with the most
    letters, first word in alphabetical order. ``n_options`` is 4 (A-D) or 5 (A-E); ``digits``
    (1-4) sets the size of numbers. Chance accuracy is 1/n_options.
    """
    if kind is not None and kind not in MCQ_KINDS:
        raise ConfigError(f"unknown mcq kind {kind!r}; valid: {', '.join(MCQ_KINDS)}")
    _check_range("n_options", n_options, 4, 5)
    _check_range("digits", digits, 1, 4)
    kind = kind or rng.choice(MCQ_KINDS)
    n_options = n_options or rng.choice((4, 5))
    digits = digits or rng.randint(1, 4)
    lo = 1 if digits == 1 else 10 ** (digits - 1)
    hi = 10**digits - 1
    if kind in ("largest", "smallest"):
        options: list[Any] = _distinct(
            rng, lambda: rng.randint(lo, hi) if digits > 1 else rng.randint(0, 20), n_options
        )
        answer_value = max(options) if kind == "largest" else min(options)
        question = f"Which number is {kind}?"
    elif kind == "sum":
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        answer_value = a + b
        spread = max(3, answer_value // 10)
        others = _distinct(
            rng,
            lambda: answer_value + rng.choice((-1, 1)) * rng.randint(1, spread),
            n_options - 1,
            exclude={answer_value},
        )
        others = [v if v >= 0 else answer_value + (answer_value - v) for v in others]
        options = [answer_value, *others]
        if len(set(options)) < n_options:  # a mirrored distractor collided: redraw above the answer
            options = [answer_value, *range(answer_value + 1, answer_value + n_options)]
        question = f"What is {a} + {b}?"
    elif kind == "reverse":
        word = rng.choice(_WORDS)
        answer_value = word[::-1]
        pool = [w[::-1] for w in _WORDS if len(w) == len(word) and w != word]
        letters = list(word)

        def shuffled() -> str:
            rng.shuffle(letters)
            return "".join(letters)

        others = _distinct(
            rng,
            lambda: rng.choice(pool) if pool and rng.random() < 0.5 else shuffled(),
            n_options - 1,
            exclude={answer_value},
        )
        options = [answer_value, *others]
        question = rng.choice(
            (
                f"Which word is the reverse of '{word}'?",
                f"Which option is '{word}' spelled backwards?",
            )
        )
    elif kind == "most_letters":
        by_len: dict[int, list[str]] = {}
        for w in _WORDS:
            by_len.setdefault(len(w), []).append(w)
        lengths = rng.sample(sorted(by_len), n_options)
        options = [rng.choice(by_len[n]) for n in lengths]
        answer_value = max(options, key=len)
        question = "Which option has the most letters?"
    else:  # alphabetical
        options = _distinct(rng, lambda: rng.choice(_WORDS), n_options)
        answer_value = min(options)
        question = "Which word comes first in alphabetical order?"
    rng.shuffle(options)
    answer = _LETTERS[options.index(answer_value)]
    lines = [
        question,
        *(f"({_LETTERS[i]}) {opt}" for i, opt in enumerate(options)),
        "Answer with the letter of the correct option.",
    ]
    return _generated(
        "mcq",
        "\n".join(lines),
        f"The answer is ({answer}).",
        {
            "answer": answer,
            "answer_text": str(answer_value),
            "n_options": n_options,
            "kind": kind,
            "digits": digits if kind in ("largest", "smallest", "sum") else None,
            "options": [str(o) for o in options],
        },
    )


# ---------------------------------------------------------------- long context


def _filler_sentence(rng: random.Random) -> str:
    """One distractor sentence; no digits, so it never looks like a needle value."""
    t = rng.randrange(6)
    adj, noun, person = rng.choice(_ADJS), rng.choice(_NOUNS), rng.choice(_PEOPLE)
    if t == 0:
        return f"The {adj} {noun} was {rng.choice(_ADJS)} that morning."
    if t == 1:
        return f"In {rng.choice(_MONTHS)}, {person} {rng.choice(_VERBS)} the {adj} {noun}."
    if t == 2:
        return f"Near the {noun}, {rng.choice(_WEATHER)}."
    if t == 3:
        return f"{person.capitalize()} said that the {noun} by the {rng.choice(_NOUNS)} felt {adj}."
    if t == 4:
        return f"Every visitor to the {noun} noticed the {adj} {rng.choice(_WORDS)} on the shelf."
    return f"Later, {person} {rng.choice(_VERBS)} the {adj} {rng.choice(_WORDS)} beside the {noun}."


def _join_list(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def make_long_context(
    rng: random.Random,
    n_needles: int | None = None,
    chars: int | None = None,
    chars_range: tuple[int, int] = DEFAULT_LONG_CONTEXT_CHARS,
) -> WorkloadRecord:
    """Multi-needle retrieval: 2-4 facts ("The secret code of the blue door is 4821.") hidden among
    distractor sentences, then one question asking for all of them.

    The prompt is about ``chars`` characters long (drawn from ``chars_range`` when None); the
    reference lists the values in the order asked.
    """
    _check_range("n_needles", n_needles, 2, 4)
    lo, hi = _check_chars_range(chars_range)
    if chars is not None and (not isinstance(chars, int) or chars < 500):
        raise ConfigError(f"long-context chars must be an integer >= 500, got {chars!r}")
    n_needles = n_needles or rng.randint(2, 4)
    target = chars if chars is not None else rng.randint(lo, hi)
    prop = rng.choice(_PROPERTIES)
    pairs = rng.sample([(c, o) for c in _COLORS for o in _OBJECTS], n_needles)
    values = rng.sample(range(1000, 10000), n_needles)
    keys = [f"{c} {o}" for c, o in pairs]
    needles = [f"The {prop} of the {k} is {v}." for k, v in zip(keys, values)]
    header = (
        "Read the following text carefully. A few sentences "
        "in it state facts you will be asked about.\n\n"
    )
    question = (
        f"\n\nQuestion: What is the {prop} of {_join_list(['the ' + k for k in keys])}? "
        f"Give all {n_needles} values in this order."
    )
    budget = target - len(header) - len(question) - sum(len(s) + 1 for s in needles)
    sentences: list[str] = []
    size = 0
    while size < budget or len(sentences) < n_needles:  # at least one distractor per needle
        s = _filler_sentence(rng)
        sentences.append(s)
        size += len(s) + 1
    slots = sorted(rng.sample(range(len(sentences) + 1), n_needles))
    order = list(range(n_needles))
    rng.shuffle(order)  # needles appear in the text in an order unrelated to the question
    for offset, (slot, j) in enumerate(zip(slots, order)):
        sentences.insert(slot + offset, needles[j])
    paragraphs, i = [], 0
    while i < len(sentences):
        n = rng.randint(4, 8)
        paragraphs.append(" ".join(sentences[i : i + n]))
        i += n
    prompt = header + "\n\n".join(paragraphs) + question
    reference = f"The values are {_join_list([str(v) for v in values])}."
    facts = [
        {"key": k, "value": v, "position": prompt.index(s)}
        for k, v, s in zip(keys, values, needles)
    ]
    return _generated(
        "long_context",
        prompt,
        reference,
        {
            "answer": values,
            "property": prop,
            "needles": facts,
            "n_needles": n_needles,
            "target_chars": target,
        },
    )


def _check_chars_range(chars_range: Any) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in chars_range)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"long_context_chars must be a (min, max) pair of integers, got {chars_range!r}"
        ) from e
    if not 500 <= lo <= hi:
        raise ConfigError(f"long_context_chars must satisfy 500 <= min <= max, got ({lo}, {hi})")
    return lo, hi


# ---------------------------------------------------------------- synthetic (training only)


def make_synthetic(
    rng: random.Random, task: str | None = None, length: int | None = None
) -> WorkloadRecord:
    """Copy / reverse / count-a-letter over a random lowercase string of ``length`` (1-64)
    characters.

    A warm-up task set for the tiny reference dLLM; not part of the default workload mix.
    """
    if task is not None and task not in SYNTHETIC_TASKS:
        raise ConfigError(f"unknown synthetic task {task!r}; valid: {', '.join(SYNTHETIC_TASKS)}")
    _check_range("length", length, 1, 64)
    task = task or rng.choice(SYNTHETIC_TASKS)
    length = length or rng.randint(3, 24)
    text = "".join(rng.choice("abcdefghij") for _ in range(length))
    answer: str | int
    if task == "copy":
        prompt, reference, answer = f"Copy the text exactly: {text}", text, text
    elif task == "reverse":
        prompt, reference, answer = f"Reverse the text: {text}", text[::-1], text[::-1]
    else:
        letter = rng.choice(text)
        count = text.count(letter)
        prompt, reference, answer = (
            f"How many times does the letter '{letter}' appear in: {text}",
            f"The answer is {count}.",
            count,
        )
    return _generated(
        "synthetic", prompt, reference, {"task": task, "length": length, "answer": answer}
    )


#: category -> generator(rng, **knobs)
GENERATORS: dict[str, Callable[..., WorkloadRecord]] = {
    "math": make_math,
    "mcq": make_mcq,
    "long_context": make_long_context,
    "synthetic": make_synthetic,
}


def generate(
    category: str, n: int, seed: int | str = 0, *, exclude: Collection[str] = (), **knobs: Any
) -> list[WorkloadRecord]:
    """``n`` records of a generated category with distinct prompts (none in ``exclude``).

    Fixed seed, same records. Raises WorkloadError when the knobs leave too few distinct
    prompts (e.g. synthetic length 1).
    """
    if category not in GENERATORS:
        raise ConfigError(f"no generator for category {category!r}; valid: {', '.join(GENERATORS)}")
    if not isinstance(n, int) or n < 0:
        raise ConfigError(f"the number of records must be a non-negative integer, got {n!r}")
    rng = random.Random(f"{seed}:{category}")
    make = GENERATORS[category]
    seen = set(exclude)
    out: list[WorkloadRecord] = []
    misses = 0
    while len(out) < n:
        rec = make(rng, **knobs)
        if rec.prompt in seen:
            misses += 1
            if misses > 1000 + 10 * n:
                raise WorkloadError(
                    f"the {category} generator ran out of distinct prompts after {len(out)} "
                    f"of {n} (knobs {knobs}); ask for fewer or loosen the knobs"
                )
            continue
        seen.add(rec.prompt)
        out.append(rec)
    return out
