"""`dwise-predict demo`: the whole pipeline on the embedded defaults, offline.

Stages (each prints what it did and how long it took): build a small workload from the
bundled prompt sources, trace it with the bundled reference model ``tiny-bd``, train the
predictors, evaluate them, and compare scheduling policies in the simulator. The demo is
the composition of the same library calls the other subcommands make; it adds nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DemoContext:
    out: Path
    seed: int
    quiet: bool
    train_size: int
    eval_size: int
    artifacts: dict[str, Any] = field(default_factory=dict)


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name, parents=[common], help="Run the whole pipeline on the embedded defaults (offline)",
        description="Build a workload, trace it with the bundled tiny-bd model, train and evaluate the "
                    "predictors, and compare scheduling policies — all offline, in a few minutes on a CPU.")
    p.add_argument("--out", default="demo-output", metavar="DIR", help="output folder (default: demo-output)")
    p.add_argument("--train-size", type=int, default=60, metavar="N", help="train requests (default: 60)")
    p.add_argument("--eval-size", type=int, default=120, metavar="N", help="eval requests (default: 120)")
    p.set_defaults(func=run)


def stage_workload(ctx: DemoContext) -> None:
    from ..tracing.workload import build_workload, write_splits
    from .workload import summary_table

    splits = build_workload(train_size=ctx.train_size, eval_size=ctx.eval_size, seed=ctx.seed)
    write_splits(splits, ctx.out / "workload")
    ctx.artifacts["workload"] = ctx.out / "workload"
    print(summary_table(splits))


STAGES: list[tuple[str, Callable[[DemoContext], None]]] = [
    ("workload: prompts by category from the bundled sources", stage_workload),
]


def run(args: argparse.Namespace) -> int:
    ctx = DemoContext(out=Path(args.out), seed=args.seed, quiet=args.quiet,
                      train_size=args.train_size, eval_size=args.eval_size)
    ctx.out.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    for i, (title, stage) in enumerate(STAGES, 1):
        print(f"\n[{i}/{len(STAGES)}] {title}")
        t0 = time.perf_counter()
        stage(ctx)
        print(f"    ({time.perf_counter() - t0:.1f} s)")
    print(f"\ndemo finished in {time.perf_counter() - t_all:.1f} s; outputs in {ctx.out}/")
    return 0
