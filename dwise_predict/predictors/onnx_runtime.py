"""Predict from the exported ONNX files with onnxruntime alone (no LightGBM, no torch).

Why: a serving process may not want LightGBM's or numpy's threads, or may run the predictors
where only onnxruntime exists (another language's runtime reads the same files). The files are
written by :mod:`dwise_predict.export` and carry their own description in the ONNX metadata
(``dwise.*`` keys: which predictor, what the output means, the shapes), which is checked on load,
so a refinement file handed to the admission loader, or a file for another hidden size, is refused
with a message instead of mis-predicting.

Estimates mean exactly what the native predictors' mean:

* :class:`OnnxAdmission`: estimated TOTAL denoising rounds (``exp`` of the log-rounds output);
* :class:`OnnxRefinement`: denoising rounds STILL TO GO after the first denoising round (the
  ensemble's restricted mean; the isotonic map, plain arrays, is applied in numpy).

Sessions default to one intra-op thread: the scheduler calls these on its own thread and must not
compete with the dLLM server for cores.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import BundleError, BundleIntegrityError
from . import admission as _adm
from . import refinement as _ref
from .admission import check_features
from .calibration import IsotonicMap
from .refinement import check_hidden, per_row

if TYPE_CHECKING:
    from ..bundle import Bundle

#: metadata written by the exporters (``dwise.*`` keys in the ONNX model's metadata_props)
FORMAT = "dwise-onnx"
FORMAT_VERSION = 1
ADMISSION_INPUT = "features"
ADMISSION_OUTPUT = "log_total_rounds"
REFINEMENT_INPUTS = ("hidden", "prompt_tokens", "output_budget")
REFINEMENT_OUTPUTS = ("survival", "mean")


def open_session(
    path: str | Path, expected: str, *, threads: int = 1
) -> tuple[Any, dict[str, str]]:
    """An onnxruntime session for ``path`` and its ``dwise.*`` metadata, refusing other predictors'
    files."""
    import onnxruntime as ort

    path = Path(path)
    if not path.is_file():
        raise BundleError(
            f"ONNX file {path} does not exist; export it with `dwise-predict export BUNDLE`"
        )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, int(threads))
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # onnxruntime raises its own Fail/InvalidProtobuf types
        raise BundleIntegrityError(
            f"{path} is not a loadable ONNX model ({str(e).splitlines()[0]}); "
            "re-export it with `dwise-predict export BUNDLE`"
        ) from e
    meta = dict(session.get_modelmeta().custom_metadata_map)
    if meta.get("dwise.format") != FORMAT:
        raise BundleError(
            f"{path} was not written by dwise-predict's exporter (no dwise.format metadata); "
            "re-export it with `dwise-predict export BUNDLE`"
        )
    version = int(meta.get("dwise.format_version", "0"))
    if version > FORMAT_VERSION:
        raise BundleError(
            f"{path} uses dwise ONNX format v{version}; this dwise-predict reads up to "
            f"v{FORMAT_VERSION}: upgrade dwise-predict"
        )
    kind = meta.get("dwise.predictor")
    if kind != expected:
        raise BundleError(
            f"{path} holds the {kind!r} predictor, not {expected!r}; pass the {expected} ONNX file"
        )
    return session, meta


class OnnxAdmission:
    """Admission predictor from ``admission.onnx``: prompt features -> estimated total rounds."""

    def __init__(self, path: str | Path, *, threads: int = 1) -> None:
        self.path = Path(path)
        self.session, self.meta = open_session(self.path, _adm.AdmissionModel.kind, threads=threads)
        self.feature_names: tuple[str, ...] = tuple(
            json.loads(self.meta.get("dwise.feature_names", "[]"))
        )
        self.precision = self.meta.get("dwise.precision", "fp32")
        if not self.feature_names:
            raise BundleError(f"{self.path} lacks dwise.feature_names metadata; re-export it")

    def raw_score(self, X: Any) -> np.ndarray:
        """log(total rounds), one per row of ``(n, n_features)`` features."""
        X = check_features(X, len(self.feature_names), self.feature_names, float32=True)
        if X.shape[0] == 0:
            return np.zeros(0, dtype=np.float64)
        out = self.session.run([ADMISSION_OUTPUT], {ADMISSION_INPUT: X.astype(np.float32)})[0]
        return np.asarray(out, dtype=np.float64).reshape(-1)

    def predict_features(self, X: Any) -> np.ndarray:
        """Estimated total denoising rounds, one per row."""
        return np.exp(self.raw_score(X))

    def predict_one(self, x: Sequence[float]) -> float:
        return float(self.predict_features([list(x)])[0])

    def __repr__(self) -> str:
        return (
            f"OnnxAdmission({self.path.name}, "
            f"features={list(self.feature_names)}, {self.precision})"
        )


class OnnxRefinement:
    """Refinement ensemble from ``refinement.onnx`` (+ optional isotonic map) -> remaining
    rounds."""

    def __init__(
        self, path: str | Path, calibration: IsotonicMap | None = None, *, threads: int = 1
    ) -> None:
        self.path = Path(path)
        self.session, self.meta = open_session(
            self.path, _ref.RefinementEnsemble.kind, threads=threads
        )
        try:
            self.hidden_size = int(self.meta["dwise.hidden_size"])
            self.K = int(self.meta["dwise.K"])  # noqa: N815 - the name in docs/concepts.md
        except (KeyError, ValueError) as e:
            raise BundleError(
                f"{self.path} lacks dwise.hidden_size/dwise.K metadata; re-export it"
            ) from e
        self.precision = self.meta.get("dwise.precision", "fp32")
        self.outputs = tuple(o.name for o in self.session.get_outputs())
        self.calibration = calibration

    def _run(
        self, names: list[str], hidden: Any, prompt_tokens: Any, output_budget: Any
    ) -> list[np.ndarray]:
        h = check_hidden(hidden, self.hidden_size, owner="the exported model")
        n = h.shape[0]
        p = per_row(prompt_tokens, n, "prompt_tokens").astype(np.float32)
        b = per_row(output_budget, n, "output_budget").astype(np.float32)
        if n == 0:
            return [np.zeros((0, self.K)) if name == "survival" else np.zeros(0) for name in names]
        return self.session.run(names, {"hidden": h, "prompt_tokens": p, "output_budget": b})

    def survival(self, hidden: Any, prompt_tokens: Any, output_budget: Any) -> np.ndarray:
        """Averaged survival curves ``(n, K)``: column k-1 is P(remaining rounds >= k)."""
        if "survival" not in self.outputs:
            raise BundleError(
                f"{self.path} was exported without the survival output; re-export with it"
            )
        return np.asarray(
            self._run(["survival"], hidden, prompt_tokens, output_budget)[0], dtype=np.float64
        )

    def predict(
        self, hidden: Any, prompt_tokens: Any, output_budget: Any, *, raw: bool = False
    ) -> np.ndarray:
        """Estimated rounds still to go after the first denoising round (calibrated unless
        ``raw``)."""
        mean = np.asarray(
            self._run(["mean"], hidden, prompt_tokens, output_budget)[0], dtype=np.float64
        )
        if raw or self.calibration is None:
            return mean
        return self.calibration(mean)

    @classmethod
    def from_files(
        cls, onnx_path: str | Path, calibration_json: str | Path | None = None, *, threads: int = 1
    ) -> OnnxRefinement:
        """Load with the isotonic map stored as JSON arrays (``calibration.json`` of a bundle)."""
        cal = None
        if calibration_json is not None:
            try:
                cal = IsotonicMap.from_dict(
                    json.loads(Path(calibration_json).read_text(encoding="utf-8"))
                )
            except FileNotFoundError as e:
                raise BundleError(f"calibration file {calibration_json} does not exist") from e
            except ValueError as e:
                raise BundleIntegrityError(
                    f"calibration file {calibration_json} is not valid JSON ({e})"
                ) from e
        return cls(onnx_path, cal, threads=threads)

    def __repr__(self) -> str:
        return (
            f"OnnxRefinement({self.path.name}, hidden_size={self.hidden_size}, K={self.K}, "
            f"{self.precision}, calibrated={self.calibration is not None})"
        )


def onnx_predictors(
    bundle: Bundle, *, int8: bool = True, threads: int = 1
) -> tuple[OnnxAdmission | None, OnnxRefinement | None]:
    """The ONNX predictors a loaded, verified bundle carries (``dwise-predict export`` kept them).

    ``bundle`` is a :class:`dwise_predict.bundle.Bundle` (its files' sha256 were checked on load).
    The INT8 refinement file is preferred when present and ``int8`` is true: it is only ever kept
    when it passed its parity gate and was faster than FP32. The isotonic map comes from the
    bundle's ``calibration.json`` (plain arrays).
    """
    from .refinement import CALIBRATION_FILE

    files = set((bundle.manifest.get("files") or {}).keys())
    exports = bundle.manifest.get("exports") or {}

    def kept(name: str) -> bool:
        return name in files and bool((exports.get(name) or {}).get("kept"))

    adm_file = _adm.ONNX_FILE
    admission = OnnxAdmission(bundle.path / adm_file, threads=threads) if kept(adm_file) else None
    ref_int8 = _ref.ONNX_FILE.replace(".onnx", ".int8.onnx")
    candidates = ([ref_int8] if int8 else []) + [_ref.ONNX_FILE]
    ref_name = next((n for n in candidates if kept(n)), None)
    refinement = None
    if ref_name is not None:
        cal = bundle.path / CALIBRATION_FILE
        refinement = OnnxRefinement.from_files(
            bundle.path / ref_name, cal if CALIBRATION_FILE in files else None, threads=threads
        )
    if admission is None and refinement is None:
        raise BundleError(
            f"bundle '{bundle.path}' carries no ONNX predictor; run `dwise-predict export "
            f"{bundle.path}` first"
        )
    return admission, refinement
