"""`dwise-predict workload`: build the request workload (prompts by category) as JSONL.

Composes :func:`dwise_predict.tracing.workload.build_workload` and ``write_splits``; the
builder is imported inside ``run`` so ``dwise-predict --help`` stays instant.
"""

from __future__ import annotations

import argparse
import logging
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..tables import format_table

if TYPE_CHECKING:
    from ..tracing.workload import WorkloadSplits

log = logging.getLogger(__name__)


def _chars_range(text: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in text.split(","))
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"expected MIN,MAX characters (e.g. 4000,12000), got {text!r}"
        ) from e
    return lo, hi


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Build the request workload (prompts by category) as JSONL",
        description="Build prompt-disjoint train and eval workloads with the DWISE paper's Table-1 "
        "mix (chat, code, instruction, math, mcq, long_context) from offline sources and "
        "generators. Writes DIR/train.jsonl, DIR/eval.jsonl and DIR/summary.json.",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.add_argument(
        "--train-size",
        type=int,
        default=2048,
        metavar="N",
        help="train requests asked (default: 2048)",
    )
    p.add_argument(
        "--eval-size",
        type=int,
        default=4096,
        metavar="N",
        help="eval requests asked (default: 4096)",
    )
    p.add_argument(
        "--categories",
        default=None,
        metavar="A,B",
        help="comma-separated subset of "
        "chat,code,instruction,math,mcq,long_context (default: all six)",
    )
    p.add_argument(
        "--long-context-chars",
        type=_chars_range,
        default=None,
        metavar="MIN,MAX",
        help="length range of long-context prompts in characters (default: 4000,12000)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail when a source has fewer prompts than asked, instead of taking all it has",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..tracing.workload import DEFAULT_LONG_CONTEXT_CHARS, build_workload, write_splits

    categories = None
    if args.categories is not None:
        categories = [c.strip() for c in args.categories.split(",") if c.strip()]
        if not categories:
            raise ConfigError(
                "--categories is empty; give a comma-separated list such as chat,math"
            )
    splits = build_workload(
        train_size=args.train_size,
        eval_size=args.eval_size,
        seed=args.seed,
        categories=categories,
        strict=args.strict,
        long_context_chars=args.long_context_chars or DEFAULT_LONG_CONTEXT_CHARS,
    )
    paths = write_splits(splits, args.out)
    print(summary_table(splits))
    for s in splits.summary:
        if s.short:
            log.warning(
                "%s: source %s has %s distinct prompts, fewer than the %d asked; took all of them",
                s.category,
                s.source,
                s.available,
                s.train_asked + s.eval_asked,
            )
    if not args.quiet:
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def summary_table(splits: WorkloadSplits) -> str:
    """The per-category table (given vs asked per split, prompt characters p50/p90); the demo reuses
    it."""
    rows: list[list[Any]] = []
    for s in splits.summary:
        rows.append(
            [
                s.category,
                s.source,
                s.train_given,
                s.train_asked,
                s.eval_given,
                s.eval_asked,
                int(s.prompt_chars_median),
                int(s.prompt_chars_p90),
                "short source" if s.short else "",
            ]
        )
    rows.append(
        [
            "total",
            "",
            len(splits.train),
            sum(s.train_asked for s in splits.summary),
            len(splits.eval),
            sum(s.eval_asked for s in splits.summary),
            "",
            "",
            "",
        ]
    )
    return format_table(
        [
            "category",
            "source",
            "train",
            "train asked",
            "eval",
            "eval asked",
            "chars p50",
            "chars p90",
            "note",
        ],
        rows,
    )
