"""A one-minute content check of a tiny-bd checkpoint, for watching snapshots during training.

    python -m dwise_predict.zoo.tiny_bd.probe runs/tiny-bd-train/snapshot
    python -m dwise_predict.zoo.tiny_bd.probe tiny-bd --mcq 300 --math 60

The full report (``report.py``) traces 2,000 requests and takes half an hour; this answers the
question a long training run raises every ten minutes -- has the model started to read the
prompt? -- on eval-split requests (never trained on):

* mcq: accuracy of the answer letter with everything but the letter given (the letter is what
  decoding picks last; chance is 1/options), per kind;
* math: exact match of the decoded answer on one-step problems with 1-2 digit operands
  (threshold 0.95), the easiest arithmetic the eval split holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any

import torch

from .data import DataConfig, TrainingExample, encode_examples, render_prompt
from .generate import generate
from .io import from_pretrained
from .toys import letter_accuracy


def probe(checkpoint: str, n_mcq: int = 300, n_math: int = 60, threshold: float = 0.95) -> dict[str, Any]:
    """Letter accuracy per mcq kind and easy-math exact match of ``checkpoint`` on eval requests."""
    from dwise_predict.tracing.workload import build_workload

    from .report import math_correct

    dc = DataConfig()
    splits = build_workload(dc.workload_train_size, dc.workload_eval_size, dc.workload_seed)
    tb = from_pretrained(checkpoint)
    model = tb.model.eval()
    mcq = [r for r in splits.eval if r.category == "mcq"][:n_mcq]
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for r in mcq:
        by_kind[r.meta["kind"]].append(r)
    letters: dict[str, float] = {}
    chance: list[float] = []
    for kind, recs in sorted(by_kind.items()):
        enc, _ = encode_examples([TrainingExample(r.prompt, r.reference or "", "mcq", r.source) for r in recs])
        letters[kind] = round(letter_accuracy(model, enc), 3)
        chance += [1.0 / r.meta["n_options"] for r in recs]
    overall = sum(letters[k] * len(v) for k, v in by_kind.items()) / max(1, len(mcq))
    easy = [r for r in splits.eval if r.category == "math" and r.meta["ops"] == 1 and r.meta["digits"] <= 2][:n_math]
    right = 0
    for r in easy:
        ids = tb.tokenizer.encode(render_prompt(r.prompt)).ids
        with torch.inference_mode():
            g = generate(model, ids, threshold=threshold, max_new_tokens=64)
        right += math_correct(tb.tokenizer.decode(g.tokens[:g.output_tokens]), r.meta["answer"])
    return {"checkpoint": checkpoint, "revision": tb.revision,
            "mcq_letter_accuracy": round(overall, 3), "mcq_chance": round(sum(chance) / max(1, len(chance)), 3),
            "mcq_letter_accuracy_by_kind": letters, "mcq_n": len(mcq),
            "easy_math_exact_match": round(right / max(1, len(easy)), 3), "easy_math_n": len(easy)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dwise_predict.zoo.tiny_bd.probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="'tiny-bd' or a checkpoint folder (a training snapshot works)")
    ap.add_argument("--mcq", type=int, default=300, help="eval-split mcq questions")
    ap.add_argument("--math", type=int, default=60, help="eval-split one-step 1-2 digit math problems")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(json.dumps(probe(args.checkpoint, args.mcq, args.math), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
