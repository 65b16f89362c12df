"""`dwise-predict traces compact DIR`: merge a trace folder's small shards into few large ones.

Composes :func:`dwise_predict.tracing.compact.compact_traces` (pyarrow only; imported inside
:func:`run_compact` so building the CLI parser stays light).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..tables import format_table

_COMPACT_HELP = (
    "Merge a trace folder's shards into fewer, larger ones (atomically; every "
    "request kept once; shards of another model are refused)"
)


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Maintain trace folders: compact",
        description=f"Maintain folders written by `dwise-predict trace`. compact: {_COMPACT_HELP}.",
    )
    p.add_argument("action", choices=("compact",), help="what to do with the folder")
    p.add_argument("dir", type=Path, metavar="DIR", help="trace folder (the --out of `trace`)")
    p.add_argument(
        "--shard-size",
        type=int,
        default=100_000,
        help="compact: requests per merged shard (default: 100000)",
    )
    p.set_defaults(func=run_compact)  # the only action so far


def run_compact(args: argparse.Namespace) -> int:
    from dwise_predict.tracing.compact import compact_traces

    s = compact_traces(args.dir, shard_size=args.shard_size)
    rows = [
        ["shards before", s.shards_before],
        ["shards after", len(s.written)],
        ["requests", s.rows_after],
        ["repeated requests dropped", s.duplicates_dropped],
        ["folder", str(s.folder)],
    ]
    if not args.quiet:
        print(format_table(["compact", "value"], rows))
    return 0
