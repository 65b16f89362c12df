"""`dwise-predict refresh`: retrain a live bundle from serving traces; publish only a win.

    dwise-predict refresh --bundle live/ --serving-traces traces/dp0 --out live-r2/

A one-shot job (cron, a Kubernetes job). Exit status: 0 = the candidate was at least as good
on the most recent held-out requests and was written to ``--out``; 3 = the live bundle was
kept (nothing written); 1 = an error (named). Everything here is a call to
:func:`dwise_predict.trainers.refresh.refresh_bundle`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: the exit status when the live bundle is kept: not an error, not a publication
KEPT = 3


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Retrain a live bundle from serving traces and publish it only when it is better",
        description="Train a candidate from serving traces (DWISE_SGLANG_TRACE_DIR), score it "
        "and the live bundle on the most recent held-out requests, and write the candidate "
        "as the live bundle's next revision only when it is at least as good (exit 0); "
        f"otherwise keep the live bundle (exit {KEPT}).",
    )
    p.add_argument("--bundle", required=True, help="the live bundle (folder, zoo name, hf://)")
    p.add_argument("--serving-traces", required=True, type=Path, help="serving trace folder")
    p.add_argument("--out", required=True, type=Path, help="a new folder for the candidate")
    p.add_argument(
        "--base-traces", type=Path, help="also train on these (e.g. the bundle's own traces)"
    )
    p.add_argument(
        "--holdout-frac",
        type=float,
        default=0.2,
        help="share of the serving traces, the most recent, to judge on (default: %(default)s)",
    )
    p.add_argument(
        "--min-holdout",
        type=int,
        default=50,
        help="fewest requests to judge on (default: %(default)s)",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.0,
        help="the candidate's admission rho may be this much lower (default: %(default)s)",
    )
    p.add_argument("--report", type=Path, help="write the verdict and both bundles' figures here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..atomic import write_json
    from ..trainers.refresh import RefreshConfig, refresh_bundle

    config = RefreshConfig(
        holdout_frac=args.holdout_frac,
        min_holdout=args.min_holdout,
        margin=args.margin,
        seed=args.seed,
    )
    report = refresh_bundle(
        args.bundle, args.serving_traces, args.out, base_traces=args.base_traces, config=config
    )
    print(report.reason)
    if args.report:
        write_json(args.report, report.to_dict())
    elif not args.quiet:
        print(json.dumps(report.to_dict(), indent=2))
    return 0 if report.promoted else KEPT
