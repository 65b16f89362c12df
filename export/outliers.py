"""Split activation-outlier channels off a MatMul, so INT8 quantizes the rest finely.

Why: onnxruntime's dynamic quantization gives each MatMul *input* one scale per call, set by
its largest value. A transformer's LayerNorm and GELU outputs carry a few channels that are
10-20x larger than the rest (all-MiniLM-L6-v2 trained for DWS: one channel near 30 where the
median channel peaks near 1.5), so with one scale the ordinary channels get a handful of int8
steps. Keeping whole layers in FP32 avoids that but keeps their cost; splitting off only the
outlier channels (as LLM.int8() does) keeps nearly all of the arithmetic in INT8:

    y = X @ W   ->   y = (X * inlier_mask) @ W  +  X[..., outliers] @ W[outliers, :]

The first product is the one quantization sees, with the outliers zeroed; the second is a
small FP32 product over the 1-5 outlier channels. In FP32 the rewrite is exact up to rounding.
Which channels are outliers is measured on calibration inputs, once, at export.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dwise_predict.errors import MissingDependencyError, ModelError

from ._onnx_files import get_metadata, save_model_atomic, set_metadata

#: a channel is an outlier when its largest |value| on the calibration inputs is above this
#: and above ``DEFAULT_RELATIVE`` x the median channel's (LLM.int8() used 6.0 alone)
DEFAULT_THRESHOLD = 6.0
DEFAULT_RELATIVE = 4.0
#: at most this many channels per input are split off (the FP32 product stays small)
DEFAULT_MAX_CHANNELS = 8


@dataclass(frozen=True)
class OutlierSplit:
    """What :func:`split_activation_outliers` did: the new FP32 MatMuls (to exclude from
    quantization) and how many channels it split off each input tensor."""

    fp32_nodes: tuple[str, ...]
    channels: dict[str, int] = field(default_factory=dict)

    @property
    def total_channels(self) -> int:
        return sum(self.channels.values())


def channel_peaks(
    model_path: str | Path, tensors: list[str], feeds: Iterable[dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Largest |value| per last-axis channel of each named tensor over the calibration feeds
    (empty when there are none: :func:`split_activation_outliers` refuses that first)."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper
    except ImportError as e:
        raise MissingDependencyError(f"outlier calibration needs onnx and onnxruntime ({e})") from e
    probe = onnx.load(str(model_path))
    for name in tensors:
        probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(
        probe.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    peaks: dict[str, np.ndarray] = {}
    for feed in feeds:
        for name, value in zip(tensors, session.run(tensors, feed)):
            v = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            peaks[name] = np.maximum(peaks[name], v) if name in peaks else v
    return peaks


def outlier_channels(
    peaks: np.ndarray,
    threshold: float = DEFAULT_THRESHOLD,
    relative: float = DEFAULT_RELATIVE,
    max_channels: int = DEFAULT_MAX_CHANNELS,
) -> np.ndarray:
    """Sorted indices of the outlier channels among ``peaks`` (the largest first if capped)."""
    idx = np.flatnonzero((peaks > threshold) & (peaks > relative * np.median(peaks)))
    return np.sort(idx[np.argsort(-peaks[idx], kind="stable")][:max_channels])


def split_activation_outliers(
    src: str | Path,
    dst: str | Path,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    threshold: float = DEFAULT_THRESHOLD,
    relative: float = DEFAULT_RELATIVE,
    max_channels: int = DEFAULT_MAX_CHANNELS,
) -> OutlierSplit:
    """Rewrite every MatMul with a constant 2-D weight whose input has outlier channels (see
    the module docstring); writes ``dst`` (FP32, same outputs as ``src``) atomically.

    ``feeds`` are calibration inputs of ``src`` (name -> array). The returned
    :attr:`OutlierSplit.fp32_nodes` must be excluded from quantization; the rewritten MatMuls
    keep their names, so other name-based exclusions still apply.
    """
    try:
        import onnx
        from onnx import helper, numpy_helper
    except ImportError as e:
        raise MissingDependencyError(f"outlier splitting needs onnx ({e})") from e
    model = onnx.load(str(src))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    targets = {
        n.name
        for n in graph.node
        if n.op_type == "MatMul" and n.input[1] in inits and len(inits[n.input[1]].dims) == 2
    }
    inputs = sorted({n.input[0] for n in graph.node if n.name in targets})
    feeds = list(feeds)
    if not feeds:
        raise ModelError(
            "no calibration inputs for the INT8 outlier split; pass at least one prompt's feed"
        )
    peaks = channel_peaks(src, inputs, feeds)
    outliers = {
        x: idx
        for x in inputs
        if (idx := outlier_channels(peaks[x], threshold, relative, max_channels)).size
    }
    nodes, fp32_nodes = [], []
    split_inputs: set[str] = set()
    for node in graph.node:
        x = node.input[0] if node.name in targets else ""
        if x not in outliers:
            nodes.append(node)
            continue
        idx = outliers[x]
        if x not in split_inputs:  # Q, K and V read one input: mask and gather it once
            mask = np.ones(peaks[x].size, dtype=np.float32)
            mask[idx] = 0.0
            graph.initializer.extend(
                [
                    numpy_helper.from_array(mask, f"{x}.inlier_mask"),
                    numpy_helper.from_array(idx.astype(np.int64), f"{x}.outlier_index"),
                ]
            )
            nodes += [
                helper.make_node(
                    "Mul", [x, f"{x}.inlier_mask"], [f"{x}.inliers"], name=f"{x}/inliers"
                ),
                helper.make_node(
                    "Gather",
                    [x, f"{x}.outlier_index"],
                    [f"{x}.outliers"],
                    axis=-1,
                    name=f"{x}/outliers",
                ),
            ]
            split_inputs.add(x)
        w = numpy_helper.to_array(inits[node.input[1]])
        rows = f"{node.name}.outlier_rows"
        graph.initializer.append(numpy_helper.from_array(w[idx].astype(np.float32), rows))
        out = node.output[0]
        small = f"{node.name}/outliers"
        nodes += [
            helper.make_node(
                "MatMul", [f"{x}.inliers", node.input[1]], [f"{out}.inliers"], name=node.name
            ),
            helper.make_node("MatMul", [f"{x}.outliers", rows], [f"{out}.outliers"], name=small),
            helper.make_node(
                "Add", [f"{out}.inliers", f"{out}.outliers"], [out], name=f"{node.name}/sum"
            ),
        ]
        fp32_nodes.append(small)
    del graph.node[:]
    graph.node.extend(nodes)
    split = OutlierSplit(tuple(fp32_nodes), {x: int(outliers[x].size) for x in sorted(outliers)})
    set_metadata(
        model,
        {
            **get_metadata(model),
            "dwise.outlier_split": f"{split.total_channels} activation channels of "
            f"{len(outliers)} MatMul inputs in FP32 (threshold {threshold:g}, "
            f"{relative:g}x the median channel, {len(feeds)} calibration inputs)",
        },
    )
    onnx.checker.check_model(model)
    save_model_atomic(model, Path(dst))
    return split
