"""``dwise-predict export BUNDLE [--onnx] [--int8]``: add gated ONNX / INT8 files to a bundle.

The bundle is loaded (so every hash, the format version and the library requirement are checked
first), each predictor is exported, every file is gated on parity with the native predictor and
timed against it (:mod:`.parity`), files that fail their gate are not kept, and the result is a new
version of the bundle folder: a copy built beside it, with the kept files' sha256 added to
``manifest.json`` and their parity/latency record under ``manifest["exports"]``, renamed into place.
A crash leaves the original bundle untouched.

Manifest record (one entry per kept or refused file)::

    "exports": {"admission.onnx": {"predictor": "admission", "precision": "fp32", "kept": true,
                                   "reason": "...", "parity": {...max_abs_error...}, "latency_us": {...}},
                "refinement.onnx": {...}, "refinement.int8.onnx": {...}}

Only kept files are in ``manifest["files"]``; refused ones are recorded with ``kept: false`` so the
reason travels with the bundle.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dwise_predict.errors import BundleError

from .onnx_admission import ADMISSION_ONNX, admission_to_onnx
from .onnx_refinement import REFINEMENT_ONNX, refinement_to_onnx
from .parity import ExportCheck, check_admission, check_refinement, gate_int8
from .quantize import NotQuantizable, int8_name, quantize_int8

MANIFEST = "manifest.json"
EXPORTS_KEY = "exports"


@dataclass
class ExportReport:
    """What an export produced: one check per exported file, and what was not applicable."""

    bundle: Path
    checks: list[ExportCheck] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)

    def kept_files(self) -> list[str]:
        return [c.file for c in self.checks if c.kept]

    def rows(self) -> list[list[Any]]:
        out = []
        for c in self.checks:
            lat = c.latency_us
            b1, b128 = lat.get("1", {}), lat.get("128", {})
            out.append([c.file, c.precision, c.parity.max_abs_error, c.parity.tolerance.abs,
                        b1.get("native", float("nan")), b1.get("exported", float("nan")),
                        b128.get("native", float("nan")), b128.get("exported", float("nan")),
                        "yes" if c.kept else "no"])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"bundle": str(self.bundle), "checks": [c.to_dict() for c in self.checks],
                "not_applicable": dict(self.not_applicable)}


def export_bundle(ref: str | Path, *, onnx: bool = True, int8: bool = False, out: str | Path | None = None,
                  repeats: int = 20, min_speedup: float = 1.05, threads: int = 1) -> ExportReport:
    """Export the predictors of bundle ``ref`` (in place, or into a new folder ``out``)."""
    from dwise_predict.bundle import load_bundle

    if not (onnx or int8):
        raise BundleError("nothing to export: pass --onnx and/or --int8")
    bundle = load_bundle(ref)  # verified before anything is read
    dst = Path(out).expanduser() if out is not None else bundle.path
    if out is not None and dst.exists():
        raise BundleError(f"{dst} already exists; pass a new folder to --out (or omit --out to export in place)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".export", dir=dst.parent))
    try:
        manifest = json.loads(json.dumps(bundle.manifest))  # a deep copy we can edit
        previous = set((manifest.get(EXPORTS_KEY) or {}).keys())
        for name in manifest["files"]:
            if name not in previous:
                _copy(bundle.path / name, tmp / name)
        for extra in sorted(bundle.path.rglob("*")):  # card, plots: anything not in the files table
            rel = extra.relative_to(bundle.path).as_posix()
            if extra.is_file() and rel != MANIFEST and rel not in manifest["files"] and rel not in previous:
                _copy(extra, tmp / rel)
        for name in previous:
            manifest["files"].pop(name, None)
        report = ExportReport(bundle=dst)
        if bundle.admission is not None:
            path = admission_to_onnx(bundle.admission, tmp / ADMISSION_ONNX)
            report.checks.append(check_admission(bundle.admission, path, repeats=repeats, threads=threads))
            if int8:
                try:
                    quantize_int8(path, tmp / int8_name(ADMISSION_ONNX))
                except NotQuantizable as e:
                    report.not_applicable[int8_name(ADMISSION_ONNX).name] = str(e)
        if bundle.refinement is not None:
            path = refinement_to_onnx(bundle.refinement, tmp / REFINEMENT_ONNX)
            fp32 = check_refinement(bundle.refinement, path, repeats=repeats, threads=threads)
            report.checks.append(fp32)
            if int8:
                q = quantize_int8(path)
                report.checks.append(gate_int8(check_refinement(bundle.refinement, q, peer=path, repeats=repeats,
                                                                 threads=threads), min_speedup=min_speedup))
        _finish_manifest(tmp, manifest, report)
        load_bundle(tmp)  # the new version verifies before it replaces anything
        _swap_in(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return report


def _finish_manifest(tmp: Path, manifest: dict[str, Any], report: ExportReport) -> None:
    from dwise_predict.bundle.format import file_record
    from dwise_predict.predictors._files import write_json_atomic

    exports: dict[str, Any] = {}
    for c in report.checks:
        if not c.kept:
            (tmp / c.file).unlink(missing_ok=True)
        else:
            manifest["files"][c.file] = file_record(tmp / c.file)
        exports[c.file] = c.to_dict()
    for name, why in report.not_applicable.items():
        exports[name] = {"kept": False, "reason": f"not applicable: {why}"}
    manifest[EXPORTS_KEY] = exports
    write_json_atomic(tmp / MANIFEST, manifest)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _swap_in(tmp: Path, dst: Path) -> None:
    if not dst.exists():
        os.replace(tmp, dst)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".old", dir=dst.parent))
    os.replace(dst, old / "previous")
    os.replace(tmp, dst)
    shutil.rmtree(old, ignore_errors=True)
