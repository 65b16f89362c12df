"""DWS predictor -> ONNX (encoder + pooling + heads in one graph), INT8, and their parity gate.

Why one graph: the light core has no torch, so the exported file is the only way a scheduler
process runs the predictor. Inputs ``input_ids`` and ``attention_mask`` ``(n, L)`` int64 (batch
and length dynamic; the tokenizer and truncation rule live in the bundle), outputs ``surface``
``(n, N, S)`` and, when the baselines were trained, ``baselines`` ``(n, 3)`` (evaluation only).

INT8 is onnxruntime's dynamic quantization of the MatMul/Gemm weights (:mod:`.quantize`), per
channel, after the few activation-outlier channels are split off into FP32 (:mod:`.outliers`). The
gate compares each exported file with the torch model on held-out prompts, on the surface
(max abs error per cell) and on what a scheduler consumes, the expected cost (relative error
of the cost MAE); an INT8 file is kept only when it passes and is faster than FP32 in the same
run, as for every other export.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dwise_predict.errors import MissingDependencyError
from dwise_predict.predictors.dws import (
    BASELINES_OUTPUT,
    INPUTS,
    SURFACE_OUTPUT,
    DWSPredictor,
)

from ._onnx_files import save_model_atomic, set_metadata
from .onnx_refinement import DEFAULT_OPSET, _quiet_exporter
from .outliers import split_activation_outliers
from .parity import ExportCheck, ParityReport, Tolerance, compare
from .quantize import embeddings_int8_per_row, int8_name, quantize_int8

if TYPE_CHECKING:
    from dwise_predict.bundle import BundleDraft

    from .bundle_export import ExportReport

#: surface cells are probabilities: FP32 graph vs torch differ by float rounding only
SURFACE_FP32 = Tolerance(1e-4, 0.0, "surface cells (probabilities); float32 in both, op order only")
#: a sanity bound on how far INT8 may move one cell. What a scheduler ranks by is the cost,
#: which sums N x S cells, so the cost gate below is the one that decides; per-channel INT8 of
#: the trained all-MiniLM-L6-v2 (FFN down-projections in FP32) moved cells by up to 0.13 on
#: tiny-bd traces while moving the cost by 0.05-0.27% (docs/dws.md)
SURFACE_INT8 = Tolerance(
    0.25,
    0.0,
    "surface cells (probabilities); a sanity bound, the cost deviation decides",
)
#: INT8 may move the expected cost by at most this share of the FP32 cost, on average over the
#: probes (the paper's INT8 moved cost MAE by +0.54%). Not the MAE against the truth on the
#: probes: they are training prompts, where FP32's MAE is near 0, so a relative MAE bound there
#: is stricter by orders of magnitude than on new prompts
COST_DEV_REL = 0.01


def int8_keep_fp32(onnx_path: str | Path) -> tuple[str, ...]:
    """Each encoder layer's FFN down-projection: the nodes the second INT8 recipe kept in
    FP32 (the benchmark still measures it as a peer of :func:`quantize_dws`).

    Their input is the GELU output, which carries activation outliers that INT8 clips; keeping
    the whole product in FP32 costs a third of the encoder's arithmetic (1.9x FP32 instead of
    ~2.6x), where splitting off the outlier channels (:mod:`.outliers`) costs almost nothing.
    """
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    return tuple(
        n.name
        for n in graph.node
        if n.op_type == "MatMul"
        and n.name.endswith("/output/dense/MatMul")
        and "/attention/" not in n.name
    )


#: how many probe prompts calibrate the outlier split (one prompt per call, so no padding
#: enters the channel peaks)
CALIBRATION_PROMPTS = 128


def calibration_feeds(tokenizer: Any, prompts: list[str]) -> list[dict[str, np.ndarray]]:
    """ONNX feeds of the first :data:`CALIBRATION_PROMPTS` prompts, one prompt per feed."""
    return [
        dict(zip(INPUTS, tokenizer.encode([p]), strict=True)) for p in prompts[:CALIBRATION_PROMPTS]
    ]


def quantize_dws(
    fp32_path: str | Path,
    dst: str | Path,
    feeds: list[dict[str, np.ndarray]],
    *,
    int8_embeddings: bool = False,
) -> Path:
    """The DWS INT8 recipe: the activation-outlier channels of every MatMul input, measured on
    the calibration ``feeds``, split off into small FP32 products
    (:func:`~.outliers.split_activation_outliers`); every other weight int8 per channel; with
    ``int8_embeddings``, the embedding tables int8 one scale per row. The one place it is
    written: ``train`` exports with it and ``benchmarks/dws.py`` measures it."""
    fp32_path, dst = Path(fp32_path), Path(dst)
    with tempfile.TemporaryDirectory(prefix="dwise-int8-") as tmp:
        split_path = Path(tmp) / f"split.{fp32_path.name}"
        split = split_activation_outliers(fp32_path, split_path, feeds)
        if int8_embeddings:
            embeddings_int8_per_row(split_path, split_path)
        return quantize_int8(split_path, dst, per_channel=True, exclude=split.fp32_nodes)


def dws_to_onnx(trained: Any, path: str | Path, *, opset: int = DEFAULT_OPSET) -> Path:
    """Export ``trained`` (a ``DWSTrained``) to ``path`` (FP32); returns the path."""
    try:
        import onnx
        import torch
    except ImportError as e:
        raise MissingDependencyError(
            f"ONNX export needs torch and onnx ({e}); pip install 'dwise-predict[train]'"
        ) from e
    model = trained.model.eval()
    cfg = trained.config
    ids, mask = trained.tokenizer.encode(["an example prompt", "and a second, longer one"])
    example = (torch.as_tensor(ids), torch.as_tensor(mask))
    outputs = [SURFACE_OUTPUT] + ([BASELINES_OUTPUT] if len(model.baselines) else [])
    with tempfile.TemporaryDirectory(prefix="dwise-onnx-") as tmp:
        raw = Path(tmp) / "dws.onnx"
        # the TorchScript exporter: the dynamo one takes 30+ s to trace a BERT on a CPU, this
        # one ~2 s, and the parity gate below checks the graph either way
        axes = {name: {0: "batch", 1: "length"} for name in INPUTS}
        with _quiet_exporter(), torch.no_grad():
            torch.onnx.export(
                model,
                example,
                str(raw),
                input_names=list(INPUTS),
                output_names=outputs,
                opset_version=opset,
                dynamo=False,
                dynamic_axes=axes,
                verbose=False,
            )
        onx = onnx.load(str(raw), load_external_data=True)
    onx.graph.name = "dwise_dws"
    set_metadata(
        onx,
        {
            "dwise.predictor": DWSPredictor.kind,
            "dwise.precision": "fp32",
            "dwise.n_blocks": str(cfg.n_blocks),
            "dwise.max_steps": str(cfg.max_steps),
            "dwise.inputs": "input_ids, attention_mask (n, L) int64 from the bundle's tokenizer "
            "(dws_tokenizer.json) and truncation rule (dws.json)",
            "dwise.output": "surface (n, N, S): P(output block b needs denoising step s | prompt)"
            + (
                "; baselines (n, 3): output tokens, total steps, direct cost ms"
                if len(outputs) > 1
                else ""
            ),
        },
    )
    return save_model_atomic(onx, path)


@dataclass(frozen=True)
class DWSExportCheck:
    """One exported file against the torch model on the same prompts."""

    file: str
    precision: str
    kept: bool
    reason: str
    surface_max_abs_error: float
    cost_mae_ms: float | None
    cost_mae_rel_change: float | None
    latency_ms_per_request: float
    #: INT8: mean |cost - FP32 cost| / mean FP32 cost on the probes (what the gate bounds)
    cost_deviation_rel: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _latency(predictor: DWSPredictor, prompts: list[str], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        predictor.predict_surface(prompts)
        times.append((time.perf_counter() - t) / len(prompts))
    return 1e3 * statistics.median(times)


def export_dws(
    trained: Any,
    folder: str | Path,
    probes: list[str],
    *,
    int8: bool = True,
    profile: Any = None,
    true_cost: np.ndarray | None = None,
    prompt_blocks: np.ndarray | None = None,
    min_speedup: float = 1.05,
    int8_embeddings: bool = False,
) -> tuple[DWSPredictor, Path | None, list[DWSExportCheck]]:
    """Export FP32 (+ INT8) into ``folder``; returns the FP32 predictor, the kept INT8 path.

    ``probes`` are prompts the gate predicts (held-out prompts, or the training ones when none
    are held out); the first :data:`CALIBRATION_PROMPTS` of them also calibrate the INT8
    recipe's outlier split (:func:`quantize_dws`). INT8 is kept when it is faster and, with
    ``profile`` and ``prompt_blocks``, moves the expected cost by at most 1% of the FP32 cost
    on average. The cost MAE against ``true_cost`` is recorded for both files.

    ``int8_embeddings`` also stores the embedding tables as int8, one scale per row
    (:func:`~.quantize.embeddings_int8_per_row`): for all-MiniLM-L6-v2 the word embeddings are
    47 of the FP32 file's 90 MB, so the INT8 file shrinks from 69 MB to 34 MB (the same gate
    decides). Used for INT8-only bundles, where size is the point.
    """
    from dwise_predict.errors import ModelError

    folder = Path(folder)
    ref = trained.predict_surface(probes)
    fp32_path = dws_to_onnx(trained, folder / "dws.onnx")
    fp32 = DWSPredictor(fp32_path, trained.tokenizer, trained.config)
    s32 = fp32.predict_surface(probes)
    gate = compare(ref, s32, SURFACE_FP32)
    if not gate.passed:
        fp32_path.unlink(missing_ok=True)
        raise ModelError(
            f"the DWS ONNX export differs from the torch model by up to "
            f"{gate.max_abs_error:.2e} per surface cell (tolerance "
            f"{SURFACE_FP32.abs:g}); nothing was written"
        )

    def costs(surface: np.ndarray) -> np.ndarray | None:
        if profile is None or prompt_blocks is None:
            return None
        return np.asarray(profile.expected_cost(surface, prompt_blocks), dtype=np.float64)

    def cost_mae(cost: np.ndarray | None) -> float | None:
        if cost is None or true_cost is None:
            return None
        return float(np.mean(np.abs(cost - true_cost)))

    c32 = costs(s32)
    mae32 = cost_mae(c32)
    lat32 = _latency(fp32, probes)
    checks = [
        DWSExportCheck(
            "dws.onnx", "fp32", True, "parity passed", gate.max_abs_error, mae32, None, lat32
        )
    ]
    if not int8:
        return fp32, None, checks
    feeds = calibration_feeds(fp32.tokenizer, probes)
    q_path = quantize_dws(fp32_path, int8_name(fp32_path), feeds, int8_embeddings=int8_embeddings)
    q = DWSPredictor(q_path, trained.tokenizer, trained.config)
    s8 = q.predict_surface(probes)
    g8 = compare(ref, s8, SURFACE_INT8)
    c8 = costs(s8)
    mae8 = cost_mae(c8)
    rel = None if mae8 is None or mae32 is None else (mae8 - mae32) / max(mae32, 1e-12)
    lat8 = _latency(q, probes)
    reasons = []
    dev: float | None = None
    if not g8.passed:
        reasons.append(f"surface error {g8.max_abs_error:.3f} > {SURFACE_INT8.abs:g}")
    if c32 is not None and c8 is not None:
        dev = float(np.mean(np.abs(c8 - c32)) / max(float(np.mean(c32)), 1e-12))
        if dev > COST_DEV_REL:
            reasons.append(
                f"cost moved {100 * dev:.2f}% of the FP32 cost (> {100 * COST_DEV_REL:g}%)"
            )
    if lat8 * min_speedup > lat32:
        reasons.append(f"not faster than FP32 ({lat8:.2f} vs {lat32:.2f} ms/request)")
    kept = not reasons
    checks.append(
        DWSExportCheck(
            q_path.name,
            "int8",
            kept,
            "; ".join(reasons) or "parity passed and faster than FP32",
            g8.max_abs_error,
            mae8,
            rel,
            lat8,
            dev,
        )
    )
    if not kept:
        q_path.unlink(missing_ok=True)
        return fp32, None, checks
    return fp32, q_path, checks


def carried_check(record: dict[str, Any]) -> ExportCheck:
    """One train-time gate record (:class:`DWSExportCheck`'s JSON) as an export check.

    The parity is the surface's against the torch model; the latency is per request on the
    probe prompts (``latency_us["probes"]``), not at batch 1 and 128 as for the other kinds."""
    precision = str(record["precision"])
    tol = SURFACE_INT8 if precision == "int8" else SURFACE_FP32
    err = float(record["surface_max_abs_error"])
    kept = "kept" if record["kept"] else "dropped"
    parts = [f"written and gated by `train` ({kept}): {record['reason']}"]
    if record.get("cost_mae_ms") is not None:
        parts.append(f"probe cost MAE {record['cost_mae_ms']:.2f} ms")
    if record.get("cost_mae_rel_change") is not None:
        parts.append(f"{100 * record['cost_mae_rel_change']:+.2f}% vs FP32")
    if record.get("cost_deviation_rel") is not None:
        parts.append(f"cost moved {100 * record['cost_deviation_rel']:.2f}% of FP32's")
    parts.append(f"{float(record['latency_ms_per_request']):.2f} ms/request")
    return ExportCheck(
        predictor=DWSPredictor.kind,
        precision=precision,
        file=str(record["file"]),
        parity=ParityReport(
            n=0,
            max_abs_error=err,
            max_rel_error=None,
            worst_violation=err - tol.abs,
            tolerance=tol,
            passed=err <= tol.abs,
        ),
        latency_us={"probes": {"exported": 1e3 * float(record["latency_ms_per_request"])}},
        kept=bool(record["kept"]),
        reason="; ".join(parts),
    )


class DWSExporter:
    """The DWS kind's exporter (``DWSPredictor.onnx_exporter``).

    Why two entry points: ONNX is the DWS predictor's only runtime form (the light core has no
    torch), so its files are written and gated when it is trained, from the torch model, the
    one moment that model exists (:meth:`export_trained`, called by the DWS trainer through
    the registry). ``dwise-predict export`` (:func:`~.bundle_export.export_bundle`) then
    reports those gates like every other kind's (:meth:`export_into`) and leaves the files as
    they are: a bundle holds no torch model to export them again from.
    """

    file = "dws.onnx"

    def export_trained(
        self, trained: Any, folder: str | Path, probes: list[str], **kwargs: Any
    ) -> tuple[DWSPredictor, Path | None, list[DWSExportCheck]]:
        """:func:`export_dws`: FP32 (+ gated INT8) files of a freshly trained model."""
        return export_dws(trained, folder, probes, **kwargs)

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
    ) -> None:
        """Add the bundled predictor's train-time gate records to ``report.carried``."""
        report.carried.extend(carried_check(dict(r)) for r in predictor.exports)


#: named by ``DWSPredictor.onnx_exporter``
EXPORTER = DWSExporter()
