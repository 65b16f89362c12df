"""Small, fast experiments that explain how tiny-bd learns (docs/reference-model.md, *What
mattered*).

    python -m dwise_predict.zoo.tiny_bd.recipe.toys read-prompt            # ~3 minutes on 2 cores
    python -m dwise_predict.zoo.tiny_bd.recipe.toys mcq-curve --steps 3000  # ~20 minutes on 2 cores

``read-prompt``: can the real Lightning loop learn to read one letter from the prompt
(``Say: x`` -> ``x``, ten letters) in 300 steps? Run for each (padding weight, learning rate)
setting; the answer is how many of 20 prompts a decoded model reads back (chance ~2).

``mcq-curve``: the learning curve of one multiple-choice kind, from scratch: accuracy of the
answer letter (only the letter masked) on 300 held-out questions every 250 steps. It shows the
phase transition that sets how many examples a task needs.

Both print a table and write JSON next to the other training runs (``--out``).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from dwise_predict.atomic import write_json

from ..config import TinyBDConfig
from ..generate import generate
from ..model import TinyBDModel
from ..tokenizer import MASK, build_tokenizer
from .data import (
    DataConfig,
    EncodedExample,
    TrainingExample,
    TrainingSet,
    encode_examples,
    render_prompt,
)
from .train import TrainConfig, diffusion_loss, make_optimizer, train
from .two_stream import collate

BLOCK = 32
#: (padding weight, learning rate) settings of ``read-prompt``: the shipped stages' loss, then the
#: fixes
READ_PROMPT_GRID: tuple[tuple[float, float], ...] = (
    (1.0, 6e-4),
    (1.0, 3e-3),
    (0.1, 3e-3),
    (0.1, 6e-4),
)
_LETTER_INDEX = len("The answer is (")  # the answer letter's position in "The answer is (X)."


def read_prompt(pad_weight: float, lr: float, steps: int = 300, seed: int = 0) -> int:
    """Train a 64-wide 2-layer model on ``Say: x`` -> ``x``; return prompts read back (of 20)."""
    rng = random.Random(seed)
    letters = "abcdefghij"
    examples = [
        TrainingExample(f"Say: {x}", x, "synthetic", "generated")
        for x in (rng.choice(letters) for _ in range(2000))
    ]
    enc, _ = encode_examples(examples, block_size=BLOCK)
    ts = TrainingSet(
        examples=enc, counts={"synthetic": len(enc)}, dropped_too_long=0, eval_prompts_checked=0
    )
    cfg = TinyBDConfig(d_model=64, n_layers=2, n_heads=2, d_ff=128, block_size=BLOCK)
    tc = TrainConfig(
        max_steps=steps,
        minutes=30,
        warmup_steps=20,
        batch_tokens=32 * (11 + 2 * BLOCK),
        threads=1,
        seed=seed,
        lr=lr,
        pad_weight=pad_weight,
        log_every=10**6,
    )
    with tempfile.TemporaryDirectory() as tmp:
        model, _ = train(
            cfg,
            tc,
            DataConfig(block_size=BLOCK),
            Path(tmp) / "log.csv",
            training_set=ts,
            snapshot_dir=None,
        )
    tok = build_tokenizer()
    right = 0
    for x in letters * 2:
        g = generate(
            model, tok.encode(render_prompt(f"Say: {x}")).ids, threshold=0.9, max_new_tokens=BLOCK
        )
        right += tok.decode(g.tokens[: g.output_tokens]) == x
    return right


def letter_probabilities(
    model: TinyBDModel, test: list[EncodedExample], batch_size: int = 64
) -> torch.Tensor:
    """The model's token distribution at each question's masked answer letter, everything else
    given: (questions, vocabulary). Probabilities rather than the argmax, so that several
    checkpoints can be averaged as ``--teacher`` averages them."""
    rows: list[torch.Tensor] = []
    for start in range(0, len(test), batch_size):
        part = test[start : start + batch_size]
        batch = collate(
            [e.prompt_ids for e in part],
            [e.response_ids for e in part],
            BLOCK,
            mask_ratios=[[0.0] * (len(e.response_ids) // BLOCK) for e in part],
        )
        where = [len(e.prompt_ids) + len(e.response_ids) + _LETTER_INDEX for e in part]
        for i, w in enumerate(where):
            batch.input_ids[i, w] = MASK
        with torch.no_grad():
            logits = model(batch.input_ids, batch.position_ids, batch.attn_mask).logits
        rows += [torch.softmax(logits[i, w].float(), dim=-1) for i, w in enumerate(where)]
    return torch.stack(rows)


def letters_right(probabilities: torch.Tensor, test: list[EncodedExample]) -> list[bool]:
    """Per question, whether the most probable token is its answer letter."""
    gold = torch.tensor([e.response_ids[_LETTER_INDEX] for e in test])
    return [bool(x) for x in (probabilities.argmax(dim=-1) == gold)]


def letter_accuracy(model: TinyBDModel, test: list[EncodedExample]) -> float:
    """Share of questions whose masked answer letter is the model's top prediction."""
    right = letters_right(letter_probabilities(model, test), test)
    return sum(right) / len(right)


def mcq_curve(
    kind: str,
    steps: int,
    d_model: int = 64,
    n_layers: int = 4,
    batch: int = 64,
    lr: float = 6e-4,
    pad_weight: float = 0.1,
    every: int = 250,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Letter accuracy of one mcq kind every ``every`` steps of from-scratch training."""
    from dwise_predict.tracing.workload.generators import make_mcq

    torch.manual_seed(seed)
    rng = random.Random(seed)
    records = [make_mcq(rng, kind=kind, n_options=4) for _ in range(60_000)]
    enc, _ = encode_examples(
        [TrainingExample(r.prompt, r.reference or "", "mcq", "generated") for r in records]
    )
    train_set, test = enc[:-300], enc[-300:]
    model = TinyBDModel(
        TinyBDConfig(
            d_model=d_model, n_layers=n_layers, n_heads=max(2, d_model // 32), d_ff=3 * d_model
        )
    )
    opt = make_optimizer(model, TrainConfig(lr=lr))
    gen = torch.Generator().manual_seed(seed)
    curve: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, step / 50)
        sample = rng.sample(train_set, batch)
        b = collate(
            [e.prompt_ids for e in sample], [e.response_ids for e in sample], BLOCK, generator=gen
        )
        loss = diffusion_loss(model, b, pad_weight=pad_weight)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % every == 0:
            model.eval()
            acc = letter_accuracy(model, test)
            model.train()
            curve.append(
                {
                    "step": step,
                    "examples": step * batch,
                    "letter_accuracy": round(acc, 3),
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
            print(
                f"step {step:6d}  examples {step * batch:8d}  letter accuracy {acc:.3f}",
                file=sys.stderr,
            )
    return curve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dwise_predict.zoo.tiny_bd.recipe.toys",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="toy", required=True)
    rp = sub.add_parser("read-prompt", help="the padding-weight x learning-rate grid")
    rp.add_argument("--steps", type=int, default=300)
    mc = sub.add_parser("mcq-curve", help="learning curve of one multiple-choice kind")
    mc.add_argument("--kind", default="largest")
    mc.add_argument("--steps", type=int, default=3000)
    mc.add_argument("--d-model", type=int, default=64)
    mc.add_argument("--n-layers", type=int, default=4)
    for p in (rp, mc):
        p.add_argument(
            "--out", type=Path, default=Path("runs/tiny-bd-toys"), help="folder for the JSON result"
        )
        p.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any]
    if args.toy == "read-prompt":
        rows = [
            {"pad_weight": w, "lr": lr, "read_back_of_20": read_prompt(w, lr, args.steps)}
            for w, lr in READ_PROMPT_GRID
        ]
        print("| padding weight | lr | prompts read back (of 20; chance ~2) |\n|---|---|---|")
        for r in rows:
            print(f"| {r['pad_weight']} | {r['lr']:g} | {r['read_back_of_20']} |")
        result = {"toy": "read-prompt", "steps": args.steps, "rows": rows}
        path = args.out / "read-prompt.json"
    else:
        curve = mcq_curve(args.kind, args.steps, args.d_model, args.n_layers)
        print("| step | examples | letter accuracy (chance 0.25) |\n|---|---|---|")
        for c in curve:
            print(f"| {c['step']} | {c['examples']} | {c['letter_accuracy']:.3f} |")
        result = {
            "toy": "mcq-curve",
            "kind": args.kind,
            "d_model": args.d_model,
            "n_layers": args.n_layers,
            "curve": curve,
        }
        path = args.out / f"mcq-curve-{args.kind}.json"
    write_json(path, result, sort_keys=False)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
