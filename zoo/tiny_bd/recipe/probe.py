r"""A one-minute content check of a tiny-bd checkpoint, for watching snapshots during training.

    python -m dwise_predict.zoo.tiny_bd.recipe.probe runs/tiny-bd-train/snapshot
    python -m dwise_predict.zoo.tiny_bd.recipe.probe tiny-bd --mcq 300 --math 60

The full report (``report.py``) traces 2,000 requests and takes half an hour; this answers the
question a long training run raises every ten minutes -- has the model started to read the
prompt? -- on *validation* requests: the eval-split requests (never trained on) after the
report's first 1,000, so a checkpoint chosen by the probe is measured by the report on requests
that played no part in choosing it:

* mcq: accuracy of the answer letter with everything but the letter given (the letter is what
  decoding picks last; chance is 1/options), per kind;
* math: exact match of the decoded answer on one-step problems with 1-2 digit operands
  (threshold 0.95), the easiest arithmetic the eval split holds.

``--free-text N`` adds how free text decodes (a minute or two for N = 24 per category): on the
first N chat, instruction and long-context eval requests, the median tokens committed per
round (EOS padding of the last block included, as the report counts it), the p90/p10 of rounds
per block and the budget-hit share -- what a real dLLM's free text looks like (several tokens
a round on predictable spans, one on content; most requests stop).

``--math-skills`` adds where arithmetic goes wrong (two minutes): on the 1-2 digit problems among
the report's first 1,000 eval requests, how often the first worked step copies the first operand,
picks the operator, copies the second operand, and computes its own operands right, and how often
"The answer is N" copies the last step's result. Exact match needs all of them, so this shows
which skill a run is still missing long before exact match moves. It diagnoses the report's
figures, so it alone reads the report's requests.

``--math-chain N`` asks whether a model that knows its arithmetic facts can chain them (a
minute for N = 100): on N fresh one-digit problems each of one, two and three operations, exact
match, the first worked step, every step's arithmetic on its own operands, and whether each step
starts from the result of the step before.

``--validate DIR`` chooses between finished checkpoints (five minutes each on two cores): it
traces about 1,400 validation requests exactly as the report traces its 1,000 and scores what the
report's goals name -- mcq and math exact match, and for chat and instruction the median tokens
committed per round, the spread of rounds per block and budget hits::

    python -m dwise_predict.zoo.tiny_bd.recipe.probe runs/tiny-bd-train/stage12 \
        --validate runs/val/stage12 --threads 2

``--against OTHER_DIR`` adds, request by request, where it and another checkpoint's validation
traces disagree on mcq and math, with an exact McNemar p: two checkpoints' totals differ by a
few requests either way, and only the disagreements say whether that is more than chance.

``--ensemble OTHER`` (repeatable) says whether several checkpoints are worth distilling together
(``train --teacher A --teacher B``): the letter accuracy of each and of their averaged letter
distribution on the validation mcq questions::

    python -m dwise_predict.zoo.tiny_bd.recipe.probe runs/tiny-bd-train/stage5 \
        --ensemble runs/tiny-bd-train/stage23 --mcq 1000
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from dwise_predict.errors import ConfigError

from ..generate import generate
from ..io import from_pretrained
from .data import DataConfig, TrainingExample, encode_examples, render_prompt
from .distill import Teachers
from .toys import letter_accuracy, letter_probabilities, letters_right


def _validation_records(validation: bool = True) -> list[Any]:
    """The eval split (never trained on); with ``validation``, only the requests after the
    report's first :data:`~.report.REPORT_REQUESTS`."""
    from dwise_predict.tracing.workload import build_workload

    from .report import REPORT_REQUESTS

    dc = DataConfig()
    splits = build_workload(dc.workload_train_size, dc.workload_eval_size, dc.workload_seed)
    return splits.eval[REPORT_REQUESTS:] if validation else splits.eval


def _eval_split_and_model(checkpoint: str, validation: bool = True) -> tuple[list[Any], Any]:
    """The eval split the model was trained to never see, and the checkpoint loaded for decoding.

    With ``validation`` (the default) only the eval requests after the report's first
    :data:`~.report.REPORT_REQUESTS`: a checkpoint watched or chosen on these is then measured by
    the report on requests that played no part in choosing it.
    """
    return _validation_records(validation), from_pretrained(checkpoint)


def _encode_mcq(records: list[Any]) -> list[Any]:
    """Eval mcq records as training examples (prompt and reference answer), for letter scoring."""
    enc, _ = encode_examples(
        [TrainingExample(r.prompt, r.reference or "", "mcq", r.source) for r in records]
    )
    return enc


def _decode(tb: Any, prompt: str, threshold: float, max_new_tokens: int) -> str:
    """The model's answer to ``prompt``, decoded as the tracer does (up to the first EOS)."""
    ids = tb.tokenizer.encode(render_prompt(prompt)).ids
    with torch.inference_mode():
        g = generate(tb.model.eval(), ids, threshold=threshold, max_new_tokens=max_new_tokens)
    return str(tb.tokenizer.decode(g.tokens[: g.output_tokens]))


def probe(
    checkpoint: str, n_mcq: int = 300, n_math: int = 60, threshold: float = 0.95
) -> dict[str, Any]:
    """Letter accuracy per mcq kind and easy-math exact match of ``checkpoint`` on eval requests."""
    from .report import math_correct

    eval_records, tb = _eval_split_and_model(checkpoint)
    model = tb.model.eval()
    mcq = [r for r in eval_records if r.category == "mcq"][:n_mcq]
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for r in mcq:
        by_kind[r.meta["kind"]].append(r)
    letters: dict[str, float] = {}
    chance: list[float] = []
    for kind, recs in sorted(by_kind.items()):
        letters[kind] = round(letter_accuracy(model, _encode_mcq(recs)), 3)
        chance += [1.0 / r.meta["n_options"] for r in recs]
    overall = sum(letters[k] * len(v) for k, v in by_kind.items()) / max(1, len(mcq))
    easy = [
        r
        for r in eval_records
        if r.category == "math" and r.meta["ops"] == 1 and r.meta["digits"] <= 2
    ][:n_math]
    right = sum(math_correct(_decode(tb, r.prompt, threshold, 64), r.meta["answer"]) for r in easy)
    return {
        "checkpoint": checkpoint,
        "revision": tb.revision,
        # None, not 0.0, when asked for none (--mcq 0 --math 0): no measurement is not a zero
        "mcq_letter_accuracy": round(overall, 3) if mcq else None,
        "mcq_chance": round(sum(chance) / len(chance), 3) if chance else None,
        "mcq_letter_accuracy_by_kind": letters,
        "mcq_n": len(mcq),
        "easy_math_exact_match": round(right / len(easy), 3) if easy else None,
        "easy_math_n": len(easy),
    }


def ensemble_letters(checkpoints: list[str], n_mcq: int = 300) -> dict[str, Any]:
    """Letter accuracy of each checkpoint and of their averaged letter distribution, on the
    first ``n_mcq`` validation mcq questions.

    Why: ``train --teacher A --teacher B`` teaches the average of the teachers' distributions,
    and an average is worth teaching only if it is right more often than either teacher. This
    answers that in a minute, before an hour of distillation.
    """
    if len(checkpoints) < 2:
        raise ConfigError("an ensemble needs at least two checkpoints; give --ensemble OTHER")
    mcq = [r for r in _validation_records() if r.category == "mcq"][:n_mcq]
    if not mcq:
        raise ConfigError(f"--mcq {n_mcq} chooses no questions; give --mcq 1 or more")
    enc = _encode_mcq(mcq)
    models = [from_pretrained(c).model for c in checkpoints]
    Teachers(models)  # refuses checkpoints of other vocabularies, as `train --teacher` does
    probabilities = []
    single: dict[str, int] = {}
    for checkpoint, model in zip(checkpoints, models, strict=True):
        p = letter_probabilities(model, enc)
        probabilities.append(p)
        single[checkpoint] = sum(letters_right(p, enc))
    averaged = letters_right(torch.stack(probabilities).mean(dim=0), enc)
    return {
        "mcq_n": len(enc),
        "right": single,
        "ensemble_right": sum(averaged),
        "ensemble_gain_over_best": sum(averaged) - max(single.values()),
    }


def free_text(
    checkpoint: str,
    n_per_category: int = 24,
    threshold: float = 0.95,
    categories: tuple[str, ...] = ("chat", "instruction", "long_context"),
) -> dict[str, Any]:
    """Tokens per round, rounds-per-block spread and budget hits on free-text eval requests."""
    import numpy as np

    from .data import DataConfig

    eval_records, tb = _eval_split_and_model(checkpoint)
    model = tb.model.eval()
    budget = DataConfig().max_new_tokens
    out: dict[str, Any] = {"checkpoint": checkpoint, "revision": tb.revision}
    for cat in categories:
        recs = [r for r in eval_records if r.category == cat][:n_per_category]
        per_round, per_block, hits = [], [], []
        for r in recs:
            ids = tb.tokenizer.encode(render_prompt(r.prompt)).ids
            with torch.inference_mode():
                g = generate(model, ids, threshold=threshold, max_new_tokens=budget)
            blocks = len(g.rounds_per_block)
            per_round.append(blocks * model.config.block_size / max(1, g.total_rounds))
            per_block.append(g.total_rounds / max(1, blocks))
            hits.append(not g.finished_eos)
        if not recs:
            continue
        p10, p90 = np.percentile(per_block, [10, 90])
        out[cat] = {
            "requests": len(recs),
            "median_tokens_per_round": round(float(np.median(per_round)), 2),
            "rounds_per_block_p90_over_p10": round(float(p90 / max(p10, 1e-9)), 2),
            "budget_hit_share": round(float(np.mean(hits)), 3),
        }
    return out


_STEP = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)\.")
_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a // b if b else None,
}


def _computes(step: tuple[str, str, str, str]) -> bool:
    """Whether one parsed step ``a op b = c`` is right on its own operands."""
    a, op, b, c = step
    return _OPS[op](int(a), int(b)) == int(c)


#: the sub-skills of a worked arithmetic answer, in the order a reference answer uses them
MATH_SKILLS = (
    "first_operand",
    "operator",
    "second_operand",
    "own_arithmetic",
    "step_count",
    "answer_copies_last_step",
)


def score_math_steps(reference: str, output: str) -> dict[str, bool] | None:
    """Which sub-skills ``output`` gets right against ``reference`` (both "a + b = c. ... The
    answer is N."); ``None`` when the output has no parseable step. ``own_arithmetic`` judges the
    output's first step on its own operands, so a copy error does not also count as an arithmetic
    error."""
    ref, got = _STEP.findall(reference), _STEP.findall(output)
    if not ref or not got:
        return None
    from .report import answer_number

    (ra, rop, rb, _), (a, op, b, _) = ref[0], got[0]
    return {
        "first_operand": a == ra,
        "operator": op == rop,
        "second_operand": b == rb,
        "own_arithmetic": _computes(got[0]),
        "step_count": len(got) == len(ref),
        "answer_copies_last_step": answer_number(output) == got[-1][3],
    }


#: what ``--math-chain`` scores on each decoded answer: the answer, the first worked step, and
#: whether the steps hold together (each step's arithmetic on its own operands; each step starting
#: from the result of the one before)
MATH_CHAIN = ("exact", "first_step", "own_arithmetic_every_step", "steps_chained")


def score_math_chain(reference: str, output: str, answer: Any) -> dict[str, bool]:
    """Which parts of a multi-step answer ``output`` gets right: a wrong answer with every step
    right on its own operands and every step chained is a copying error; steps that do not chain
    (``5 + 4 = 12. 11 + 6 = 10.``) are an answer decoded out of order, not a missing fact."""
    from .report import math_correct

    ref, got = _STEP.findall(reference), _STEP.findall(output)
    return {
        "exact": math_correct(output, answer),
        "first_step": bool(got) and bool(ref) and got[0] == ref[0],
        "own_arithmetic_every_step": bool(got) and all(map(_computes, got)),
        "steps_chained": bool(got) and all(got[i][0] == got[i - 1][3] for i in range(1, len(got))),
    }


def step_kind(step: tuple[str, str, str, str]) -> str:
    """A decoded step's kind for the arithmetic breakdown: its first operand's digits and its
    operator, e.g. ``"2-digit +"`` for ``14 + 6 = 20.``."""
    a, op, _, _ = step
    return f"{len(a)}-digit {op}"


def math_chain(
    checkpoint: str, per_ops: int = 100, threshold: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """The :data:`MATH_CHAIN` shares on fresh one-digit problems of 1, 2 and 3 operations,
    ``per_ops`` of each, decoded with up to 128 new tokens, and every decoded step's arithmetic
    on its own operands by :func:`step_kind`.

    With one operation every step is a one-digit fact, so that exact match measures the facts.
    With two and three, a later step starts from the previous result, which can have two digits
    (``8 + 6 = 14. 14 - 5 = 9.``): the breakdown tells a one-digit fact missed in a longer prompt
    from a two-digit fact the model never learned. The problems are drawn here, not from the eval
    split (the report's one-digit problems are ~60)."""
    from dwise_predict.tracing.workload.generators import make_math

    tb = from_pretrained(checkpoint)
    by_ops: dict[str, dict[str, float]] = {}
    steps_by_ops: dict[str, dict[str, dict[str, int]]] = {}
    for ops in (1, 2, 3):
        rng = random.Random(f"tiny-bd-probe:math-chain:{seed}:{ops}")
        counts = dict.fromkeys(MATH_CHAIN, 0)
        steps: dict[str, dict[str, int]] = defaultdict(lambda: {"right": 0, "steps": 0})
        for _ in range(per_ops):
            r = make_math(rng, digits=1, ops=ops)
            out = _decode(tb, r.prompt, threshold, 128)
            for k, ok in score_math_chain(r.reference or "", out, r.meta["answer"]).items():
                counts[k] += ok
            for step in _STEP.findall(out):
                tally = steps[step_kind(step)]
                tally["right"] += _computes(step)
                tally["steps"] += 1
        by_ops[str(ops)] = {k: round(v / max(1, per_ops), 3) for k, v in counts.items()}
        steps_by_ops[str(ops)] = dict(sorted(steps.items()))
    return {
        "checkpoint": checkpoint,
        "revision": tb.revision,
        "problems_per_ops": per_ops,
        "share_right_by_ops": by_ops,
        "step_arithmetic_by_ops": steps_by_ops,
    }


def math_skills(
    checkpoint: str, n_requests: int = 1000, max_digits: int = 2, threshold: float = 0.95
) -> dict[str, Any]:
    """Sub-skill shares on the ``max_digits``-digit math problems among the first ``n_requests``
    eval requests (the report's set), decoded with up to 128 new tokens."""
    eval_records, tb = _eval_split_and_model(checkpoint, validation=False)
    recs = [
        r
        for r in eval_records[:n_requests]
        if r.category == "math" and r.meta["digits"] <= max_digits
    ]
    counts = dict.fromkeys(MATH_SKILLS, 0)
    unparsed = 0
    for r in recs:
        scored = score_math_steps(r.reference or "", _decode(tb, r.prompt, threshold, 128))
        if scored is None:
            unparsed += 1
            continue
        for k, ok in scored.items():
            counts[k] += ok
    n = max(1, len(recs))
    return {
        "checkpoint": checkpoint,
        "revision": tb.revision,
        "problems": len(recs),
        "max_digits": max_digits,
        "no_parseable_step": unparsed,
        "share_right": {k: round(v / n, 3) for k, v in counts.items()},
    }


def validate(
    checkpoint: str,
    out_dir: Path,
    n_scored: int = 2000,
    n_free_text: int = 800,
    threshold: float = 0.95,
    threads: int | None = None,
) -> dict[str, Any]:
    """The report's own measures on validation requests, for choosing between checkpoints.

    Traces, as the report does, the mcq and math requests among the first ``n_scored``
    validation requests and the chat and instruction requests among the first ``n_free_text``
    (defaults: about 540 mcq, 580 math, 240 chat and 50 instruction, five minutes on two cores),
    and scores exact match, the per-request median of tokens committed per round, the spread of
    rounds per block and budget hits. The traces stay in ``out_dir``, so a rerun only scores.
    """
    import numpy as np

    from .report import BUDGET, accuracy, load_stats, spread, trace_eval

    records = _validation_records()
    chosen = [r for r in records[:n_scored] if r.category in ("mcq", "math")] + [
        r for r in records[:n_free_text] if r.category in ("chat", "instruction")
    ]
    if not chosen:
        raise ConfigError("no validation requests chosen; raise n_scored or n_free_text")
    by_id = {r.id: r for r in chosen}
    trace_eval(checkpoint, chosen, threshold, out_dir, 32, False, threads)
    stats, fingerprint = load_stats(out_dir, by_id)  # the traced model's revision and block
    by_cat: dict[str, list[Any]] = defaultdict(list)
    for st in stats:
        if st.request_id in by_id:
            by_cat[st.category].append(st)
    out: dict[str, Any] = {
        "checkpoint": checkpoint,
        "revision": fingerprint["revision"],
        "threshold": threshold,
        "budget": BUDGET,
        "accuracy": {
            k: {"requests": v["requests"], "exact_match": round(v["exact_match"], 4)}
            for k, v in accuracy(by_cat).items()
        },
    }
    block = int(fingerprint["block_size"])
    for cat in ("chat", "instruction"):
        g = by_cat.get(cat, [])
        if not g:
            continue
        out[cat] = {
            "requests": len(g),
            "median_tokens_per_round": round(
                float(np.median([s.output_blocks * block / max(1, s.total_rounds) for s in g])), 3
            ),
            "rounds_per_block_p90_over_p10": round(spread([s.rounds_per_block for s in g]), 2),
            "budget_hit_share": round(float(np.mean([s.hit_budget for s in g])), 3),
        }
    return out


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p: how likely a split of the disagreements at least this uneven
    is when the two checkpoints are equally good (a binomial test at 1/2)."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, j) for j in range(k + 1)) / 2**n)


def compare_validations(dir_a: Path, dir_b: Path) -> dict[str, Any]:
    """Request by request, where two ``--validate`` runs disagree on mcq and math exact match.

    Two checkpoints' totals on a few hundred requests differ by a few either way; whether that
    difference is real depends on how many requests each alone gets right, which totals hide.
    """
    from dwise_predict.traces import read_traces

    from .report import math_correct, mcq_correct

    records = {r.id: r for r in _validation_records()}
    scorers = {"mcq": mcq_correct, "math": math_correct}

    def right(d: Path) -> dict[str, tuple[str, bool]]:
        cols = ["request_id", "category", "output_text"]
        out = {}
        for t in read_traces(d, columns=cols, validate=False).to_pylist():
            rec = records.get(t["request_id"])
            if rec is not None and t["category"] in scorers:
                ok = scorers[t["category"]](t["output_text"] or "", rec.meta.get("answer"))
                out[t["request_id"]] = (t["category"], bool(ok))
        return out

    a, b = right(dir_a), right(dir_b)
    result: dict[str, Any] = {"a": str(dir_a), "b": str(dir_b)}
    for cat in scorers:
        ids = [i for i, (c, _) in a.items() if c == cat and i in b]
        only_a = sum(a[i][1] and not b[i][1] for i in ids)
        only_b = sum(b[i][1] and not a[i][1] for i in ids)
        result[cat] = {
            "requests": len(ids),
            "right_a": sum(a[i][1] for i in ids),
            "right_b": sum(b[i][1] for i in ids),
            "only_a_right": only_a,
            "only_b_right": only_b,
            "mcnemar_p": round(mcnemar_p(only_a, only_b), 4),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dwise_predict.zoo.tiny_bd.recipe.probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "checkpoint", help="'tiny-bd' or a checkpoint folder (a training snapshot works)"
    )
    ap.add_argument("--mcq", type=int, default=300, help="eval-split mcq questions")
    ap.add_argument(
        "--math", type=int, default=60, help="eval-split one-step 1-2 digit math problems"
    )
    ap.add_argument(
        "--math-skills",
        action="store_true",
        help="also break arithmetic into sub-skills on the report's 1-2 digit problems (2 min)",
    )
    ap.add_argument(
        "--math-chain",
        type=int,
        default=0,
        metavar="N",
        help="also decode N fresh one-digit problems each of 1, 2 and 3 operations: exact match, "
        "first step, arithmetic on its own operands, steps chained, and each decoded step's "
        "arithmetic by operand digits and operator (a minute for N = 100)",
    )
    ap.add_argument(
        "--free-text",
        type=int,
        default=0,
        metavar="N",
        help="also decode the first N chat, instruction and long-context eval requests: "
        "tokens per round, rounds-per-block spread, budget hits",
    )
    ap.add_argument(
        "--validate",
        type=Path,
        metavar="DIR",
        help="instead, trace the validation requests into DIR and score them as the report does "
        "(mcq and math exact match, chat and instruction tokens per round; 5 min on 2 cores)",
    )
    ap.add_argument(
        "--against",
        type=Path,
        metavar="OTHER_DIR",
        help="with --validate: also compare, request by request, with another checkpoint's "
        "--validate DIR (disagreements on mcq and math, exact McNemar p)",
    )
    ap.add_argument(
        "--ensemble",
        action="append",
        default=[],
        metavar="OTHER",
        help="instead, score mcq letters of the checkpoint, of each OTHER (repeatable) and of "
        "their averaged distribution: what `train --teacher` would teach (a minute)",
    )
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.math_chain < 0:
        ap.error(f"--math-chain takes problems per operation count (>= 0), got {args.math_chain}")
    if args.against is not None and args.validate is None:
        ap.error("--against compares two --validate runs; give --validate DIR too")
    if args.ensemble and args.validate is not None:
        ap.error("--ensemble scores letters, --validate traces requests; run them one at a time")
    if args.validate is not None:
        out = validate(args.checkpoint, args.validate, threads=args.threads)
        if args.against is not None:
            out["against"] = compare_validations(args.against, args.validate)
        print(json.dumps(out, indent=2))
        return 0
    if args.ensemble:
        print(json.dumps(ensemble_letters([args.checkpoint, *args.ensemble], args.mcq), indent=2))
        return 0
    out = probe(args.checkpoint, args.mcq, args.math)
    if args.free_text:
        out["free_text"] = free_text(args.checkpoint, args.free_text)
    if args.math_skills:
        out["math_skills"] = math_skills(args.checkpoint)
    if args.math_chain:
        out["math_chain"] = math_chain(args.checkpoint, args.math_chain)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
