"""``dwise-predict export BUNDLE [--int8]``: add gated ONNX / INT8 files to a bundle.

The bundle is loaded (so every hash, the format version and the library requirement are checked
first), each declared predictor whose kind names an exporter (its ``onnx_exporter``) is
exported, every file is gated on parity with the native predictor and
timed against it (:mod:`.parity`), files that fail their gate are not kept, and the result is a new
version of the bundle folder: a copy built beside it (:func:`dwise_predict.bundle.update_bundle`),
with the kept files' sha256 added to ``manifest.json``, their parity/latency record under
``manifest["exports"]`` and the model card re-rendered, renamed into place. A crash leaves the
original bundle untouched.

Manifest record (one entry per kept or refused file)::

    "exports": {"KIND.onnx": {"predictor": KIND, "precision": "fp32", "kept": true,
                              "reason": "...", "parity": {...max_abs_error...},
                              "latency_us": {...}},
                "KIND.int8.onnx": {...}}

Only kept files are in ``manifest["files"]``; refused ones are recorded with ``kept: false`` so the
reason travels with the bundle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dwise_predict.bundle.modules import BundleModule, hook
from dwise_predict.errors import BundleError

from .parity import ExportCheck, OnnxExporter, gate_int8
from .quantize import NotQuantizable, int8_name, quantize_int8

if TYPE_CHECKING:
    from dwise_predict.bundle import BundleDraft

EXPORTS_KEY = "exports"


@dataclass
class ExportReport:
    """What an export produced: one check per exported file, and what was not applicable."""

    bundle: Path
    checks: list[ExportCheck] = field(default_factory=list)
    not_applicable: dict[str, str] = field(default_factory=dict)
    #: files a kind exported when it was trained (ONNX is its only runtime form, e.g. DWS):
    #: their gates, as recorded in the module's manifest entry; the files stay as they are
    carried: list[ExportCheck] = field(default_factory=list)

    def all_checks(self) -> list[ExportCheck]:
        return [*self.checks, *self.carried]

    def kept_files(self) -> list[str]:
        return [c.file for c in self.all_checks() if c.kept]

    def rows(self) -> list[list[Any]]:
        out = []
        for c in self.all_checks():
            lat = c.latency_us
            b1, b128 = lat.get("1", {}), lat.get("128", {})
            out.append(
                [
                    c.file,
                    c.precision,
                    c.parity.max_abs_error,
                    c.parity.tolerance.abs,
                    b1.get("native", float("nan")),
                    b1.get("exported", float("nan")),
                    b128.get("native", float("nan")),
                    b128.get("exported", float("nan")),
                    "yes" if c.kept else "no",
                ]
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "bundle": str(self.bundle),
            "checks": [c.to_dict() for c in self.checks],
            "not_applicable": dict(self.not_applicable),
            "carried": [c.to_dict() for c in self.carried],
        }


@runtime_checkable
class BundleExporter(Protocol):
    """An exporter that decides itself what a bundled predictor's export is (the kinds whose
    files cannot be re-exported from the bundle, e.g. DWS: see ``export/onnx_dws.py``).

    ``export_into`` adds the predictor's checks to ``report`` (``checks`` for files it writes
    into ``draft``, ``carried`` for files already there)."""

    def export_into(
        self,
        draft: BundleDraft,
        predictor: Any,
        report: ExportReport,
        *,
        int8: bool,
        repeats: int,
        min_speedup: float,
        threads: int,
    ) -> None: ...


def exporter_for(cls: type[BundleModule]) -> OnnxExporter | BundleExporter | None:
    """The exporter a module class names in ``onnx_exporter`` (``"module:ATTRIBUTE"``,
    resolved by the kind registry), or None."""
    exporter = hook(cls, "onnx_exporter")
    if exporter is None:
        return None
    if not isinstance(exporter, (OnnxExporter, BundleExporter)):
        raise BundleError(
            f"{cls.onnx_exporter} is a {type(exporter).__name__}, not an OnnxExporter or a "
            "BundleExporter; fix the kind's onnx_exporter"
        )
    return exporter


def export_bundle(
    ref: str | Path,
    *,
    int8: bool = False,
    out: str | Path | None = None,
    repeats: int = 20,
    min_speedup: float = 1.05,
    threads: int = 1,
) -> ExportReport:
    """Export the predictors of bundle ``ref`` (in place, or into a new folder ``out``).

    Every declared module whose class names an ``onnx_exporter`` is written, gated and timed;
    the files go into a draft of the bundle (:func:`dwise_predict.bundle.update_bundle`), which
    verifies the source first, re-renders the card and swaps the new version in atomically.
    """
    from dwise_predict.bundle import update_bundle

    with update_bundle(ref, out=out) as draft:
        for name in (
            draft.manifest.get(EXPORTS_KEY) or {}
        ):  # a re-export replaces the previous files
            draft.remove_file(name)
        report = ExportReport(bundle=draft.destination)
        for kind, predictor in draft.source.modules.items():
            exporter = exporter_for(type(predictor))
            if exporter is None:
                report.not_applicable[kind] = "this predictor kind has no ONNX exporter"
                continue
            if not isinstance(exporter, OnnxExporter):
                exporter.export_into(
                    draft,
                    predictor,
                    report,
                    int8=int8,
                    repeats=repeats,
                    min_speedup=min_speedup,
                    threads=threads,
                )
                continue
            _export_one(
                draft,
                report,
                predictor,
                exporter,
                int8=int8,
                repeats=repeats,
                min_speedup=min_speedup,
                threads=threads,
            )
        draft.manifest[EXPORTS_KEY] = _exports_record(draft, report)
    return report


def _export_one(
    draft: BundleDraft,
    report: ExportReport,
    predictor: Any,
    exporter: OnnxExporter,
    *,
    int8: bool,
    repeats: int,
    min_speedup: float,
    threads: int,
) -> None:
    """FP32 file (kept iff parity holds), then optionally INT8 (kept iff parity holds and is
    faster)."""
    path = exporter.write(predictor, draft.path(exporter.file))
    report.checks.append(exporter.check(predictor, path, repeats=repeats, threads=threads))
    if not int8:
        return
    q_name = int8_name(exporter.file).name
    try:
        q = quantize_int8(path, draft.path(q_name))
    except NotQuantizable as e:
        draft.remove_file(q_name)
        report.not_applicable[q_name] = str(e)
        return
    check = exporter.check(predictor, q, peer=path, repeats=repeats, threads=threads)
    report.checks.append(gate_int8(check, min_speedup=min_speedup))


def _exports_record(draft: BundleDraft, report: ExportReport) -> dict[str, Any]:
    """Drop the files that failed their gate; the record of every file (kept or not) for the
    manifest."""
    exports: dict[str, Any] = {}
    for c in report.checks:
        if not c.kept:
            draft.remove_file(c.file)
        exports[c.file] = c.to_dict()
    for name, why in report.not_applicable.items():
        exports[name] = {"kept": False, "reason": f"not applicable: {why}"}
    return exports
