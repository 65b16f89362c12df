"""`dwise-predict traces compact DIR`: merge a trace folder's small shards into few large ones.

Composes :func:`dwise_predict.tracing.compact.compact_traces` (pyarrow only; imported inside
:func:`run_compact` so building the CLI parser stays light).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._common import format_table

_COMPACT_HELP = ("Merge a trace folder's shards into fewer, larger ones (atomically; every "
                 "request kept once; shards of another model are refused)")


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(name, help="Maintain trace folders (compact)",
                              description="Maintain folders written by `dwise-predict trace`.")
    actions = p.add_subparsers(dest="traces_action", metavar="ACTION", required=True)
    c = actions.add_parser("compact", parents=[common], help=_COMPACT_HELP,
                           description=_COMPACT_HELP + ".")
    c.add_argument("dir", type=Path, metavar="DIR", help="trace folder (the --out of `trace`)")
    c.add_argument("--shard-size", type=int, default=100_000,
                   help="requests per merged shard (default: 100000)")
    c.set_defaults(func=run_compact)


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
