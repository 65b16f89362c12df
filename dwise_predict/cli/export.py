"""`dwise-predict export`: add ONNX (and INT8) predictors to a bundle, each gated on parity.

Composes :func:`dwise_predict.export.bundle_export.export_bundle` (which needs the ``train``
extra: torch, onnx, onnxmltools) and prints the parity/latency table it measured.
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
    for c in report.checks:
        print(f"{c.file}: {c.reason}")
    dws = _dws_exports(report.bundle)
    for name, why in report.not_applicable.items():
        if name == "dws" and dws is not None:
            continue  # ONNX from the start: its gate's records are printed below
        print(f"{name}: not applicable ({why})")
    for rec in dws or []:
        mae = rec.get("cost_mae_ms")
        rel = rec.get("cost_mae_rel_change")
        print(
            f"dws: {rec['file']} ({rec['precision']}, written and gated by `train`): "
            f"{'kept' if rec['kept'] else 'dropped'}, {rec['reason']}; surface max abs err "
            f"{rec['surface_max_abs_error']:.2g}"
            + (f", probe cost MAE {mae:.2f} ms" if mae is not None else "")
            + (f" ({100 * rel:+.2f}% vs FP32)" if rel is not None else "")
            + (
                f", cost moved {100 * rec['cost_deviation_rel']:.2f}% of FP32's"
                if rec.get("cost_deviation_rel") is not None
                else ""
            )
            + f", {rec['latency_ms_per_request']:.2f} ms/request"
        )
    if args.report:
        write_json(args.report, report.to_dict(), sort_keys=False)
    print(f"exported into {report.bundle}: {', '.join(report.kept_files()) or 'no file kept'}")
    return 0


def _dws_exports(bundle: Any) -> list[dict[str, Any]] | None:
    """The DWS module's export records (its ONNX files are written by `train`), if any."""
    from ..bundle import load_bundle

    b = load_bundle(bundle)
    return None if b.dws is None else list(b.dws.exports)
