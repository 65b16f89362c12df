"""`dwise-predict export`: add ONNX (and INT8) predictors to a bundle, each gated on parity.

Composes :func:`dwise_predict.export.bundle_export.export_bundle` (which needs the ``train``
extra: torch, onnx, onnxmltools) and prints the parity/latency table it measured. Every kind
goes through it alike; a kind whose files are written at training (DWS) shows the gates
recorded then.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..atomic import write_json
from ..errors import MissingDependencyError
from ..tables import format_table


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Export a bundle's predictors to ONNX / INT8",
        description="Export a bundle's predictors to ONNX (and INT8 where it pays). Every "
        "file is gated on parity with the native predictor and timed against it; "
        "an INT8 file is kept only if it passes and is faster than FP32.",
    )
    p.add_argument("bundle", metavar="BUNDLE", help="bundle folder")
    p.add_argument(
        "--int8",
        action="store_true",
        help="also try INT8 dynamic quantization (FP32 ONNX files are always exported)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="write the exported bundle to a new folder "
        "(default: update BUNDLE in place, atomically)",
    )
    p.add_argument(
        "--repeats", type=int, default=20, help="timed repetitions per latency median (default 20)"
    )
    p.add_argument(
        "--report",
        default=None,
        metavar="JSON",
        help="also write the parity/latency report as JSON",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from dwise_predict.export.bundle_export import export_bundle
    except ImportError as e:
        raise MissingDependencyError(
            f"`dwise-predict export` needs torch, onnx and onnxmltools ({e}); "
            "pip install 'dwise-predict[train]'"
        ) from e
    report = export_bundle(args.bundle, int8=args.int8, out=args.out, repeats=args.repeats)
    print(
        format_table(
            [
                "file",
                "precision",
                "max abs err",
                "tolerance",
                "native µs b=1",
                "onnx µs b=1",
                "native µs b=128",
                "onnx µs b=128",
                "kept",
            ],
            report.rows(),
        )
    )
    for c in report.all_checks():
        print(f"{c.file}: {c.reason}")
    for name, why in report.not_applicable.items():
        print(f"{name}: not applicable ({why})")
    if args.report:
        write_json(args.report, report.to_dict(), sort_keys=False)
    print(f"exported into {report.bundle}: {', '.join(report.kept_files()) or 'no file kept'}")
    return 0
