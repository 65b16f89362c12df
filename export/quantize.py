"""INT8 dynamic quantization of an exported ONNX predictor (onnxruntime's ``quantize_dynamic``).

Dynamic quantization stores MatMul/Gemm weights as int8 and quantizes activations on the fly, so
it pays where the time goes into large matrix products (the refinement MLP, a DWS text encoder)
and does nothing for a tree ensemble, which has no weight matrix: there :func:`quantize_int8`
says so (:class:`NotQuantizable`) instead of writing a file identical to the FP32 one. Whether an
INT8 file is *kept* is not decided here: :mod:`.parity` keeps it only when it passes its parity
gate and is faster than FP32 in the same run.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from dwise_predict.errors import MissingDependencyError, ModelError

from ._onnx_files import get_metadata, save_model_atomic, set_metadata

QUANTIZED_OPS = (
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "DynamicQuantizeMatMul",
    "QGemm",
    "MatMulIntegerToFloat",
)


class NotQuantizable(ModelError):
    """The model has no operator dynamic quantization applies to (e.g. a tree ensemble)."""


def int8_name(fp32_path: str | Path) -> Path:
    """``refinement.onnx`` -> ``refinement.int8.onnx``."""
    p = Path(fp32_path)
    return p.with_name(f"{p.stem}.int8{p.suffix}")


def quantize_int8(
    src: str | Path,
    dst: str | Path | None = None,
    *,
    per_channel: bool = False,
    op_types: tuple[str, ...] = ("MatMul", "Gemm"),
    exclude: tuple[str, ...] = (),
) -> Path:
    """Write the INT8 dynamic-quantized version of ``src`` (default name: :func:`int8_name`).

    ``exclude`` names nodes kept in FP32 (e.g. a transformer's FFN down-projections, whose
    inputs carry the activation outliers that per-tensor int8 clips).
    """
    try:
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        raise MissingDependencyError(
            f"INT8 export needs onnx and onnxruntime.quantization ({e}); "
            "pip install 'dwise-predict[train]'"
        ) from e
    src = Path(src)
    dst = Path(dst) if dst is not None else int8_name(src)
    source = onnx.load(str(src))
    if not any(n.op_type in op_types for n in source.graph.node):
        raise NotQuantizable(
            f"{src.name} has no {'/'.join(op_types)} operator, so INT8 dynamic quantization "
            "cannot speed it up; keep the FP32 file"
        )
    with tempfile.TemporaryDirectory(prefix="dwise-int8-") as tmp:
        out = Path(tmp) / dst.name
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint on the root logger
        try:
            quantize_dynamic(
                str(src),
                str(out),
                weight_type=QuantType.QInt8,
                per_channel=per_channel,
                op_types_to_quantize=list(op_types),
                nodes_to_exclude=list(exclude),
            )
        finally:
            root.setLevel(level)
        q = onnx.load(str(out))
    if not any(n.op_type in QUANTIZED_OPS for n in q.graph.node):
        raise NotQuantizable(f"onnxruntime quantized nothing in {src.name}; keep the FP32 file")
    meta = {k: v for k, v in get_metadata(source).items() if k.startswith("dwise.")}
    meta.pop("dwise.format", None)
    meta.pop("dwise.format_version", None)
    set_metadata(
        q,
        {
            **meta,
            "dwise.precision": "int8",
            "dwise.quantization": "dynamic, int8 weights"
            + (", per channel" if per_channel else "")
            + (f", {len(exclude)} nodes kept in fp32" if exclude else ""),
        },
    )
    return save_model_atomic(q, dst)
