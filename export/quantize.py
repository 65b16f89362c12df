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


def embeddings_int8_per_row(src: str | Path, dst: str | Path, min_elements: int = 1 << 16) -> int:
    """Rewrite every large embedding table (a float 2-D initializer read only by ``Gather``) as
    int8 rows with one float scale per row; returns how many tables were rewritten.

    Why not onnxruntime's ``Gather`` quantization: it gives the whole table one scale, so a
    row of small values (most of a vocabulary) keeps few int8 steps; per row, each token's
    vector keeps its own 127 steps. The lookup becomes ``Gather(int8) -> Cast -> Mul(Gather(
    scale))`` on the looked-up rows only, so it costs nothing measurable.
    """
    try:
        import numpy as np
        import onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as e:
        raise MissingDependencyError(
            f"INT8 export needs onnx ({e}); pip install 'dwise-predict[train]'"
        ) from e
    model = onnx.load(str(src))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    uses: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    nodes = []
    rewritten = 0
    for node in graph.node:
        table = node.input[0] if node.op_type == "Gather" else ""
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        w = numpy_helper.to_array(inits[table]) if table in inits and uses[table] == 1 else None
        if w is None or axis != 0 or w.ndim != 2 or w.dtype != np.float32 or w.size < min_elements:
            nodes.append(node)
            continue
        scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
        graph.initializer.remove(inits[table])
        graph.initializer.extend(
            [
                numpy_helper.from_array(q, f"{table}.int8"),
                numpy_helper.from_array(scale.astype(np.float32), f"{table}.row_scale"),
            ]
        )
        ids, out = node.input[1], node.output[0]
        nodes += [
            helper.make_node("Gather", [f"{table}.int8", ids], [f"{out}.int8"], axis=0),
            helper.make_node("Cast", [f"{out}.int8"], [f"{out}.float"], to=TensorProto.FLOAT),
            helper.make_node("Gather", [f"{table}.row_scale", ids], [f"{out}.scale"], axis=0),
            helper.make_node("Mul", [f"{out}.float", f"{out}.scale"], [out]),
        ]
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    save_model_atomic(model, Path(dst))
    return rewritten
