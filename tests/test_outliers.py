"""The INT8 outlier split (export.outliers) on small real ONNX graphs run by onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from dwise_predict.export.outliers import outlier_channels, split_activation_outliers  # noqa: E402
from dwise_predict.export.quantize import quantize_int8  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from dwise_predict.errors import ModelError  # noqa: E402

D = 64
OUTLIERS = (5, 40)


def _graph(path: Path, seed: int = 0) -> Path:
    """x (n, L, 64) -> two MatMuls sharing x (as Q and K share a LayerNorm output), and a
    third on the first one's output."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 0.1, (D, 48)).astype(np.float32)
    w2 = rng.normal(0, 0.1, (D, 16)).astype(np.float32)
    w3 = rng.normal(0, 0.1, (48, 8)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["y"], name="q/MatMul"),
        helper.make_node("MatMul", ["x", "w2"], ["z"], name="k/MatMul"),
        helper.make_node("MatMul", ["y", "w3"], ["u"], name="out/MatMul"),
    ]
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, D])],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [None, None, d])
            for n, d in (("y", 48), ("z", 16), ("u", 8))
        ],
        [numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))
    return path


def _inputs(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(0, 1, (n, 12, D)).astype(np.float32)
    for c in OUTLIERS:
        x[..., c] *= 25.0  # a few channels ~25x the rest, as after a transformer's LayerNorm
    return x


def _run(path: Path, x: np.ndarray) -> list[np.ndarray]:
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(["y", "z", "u"], {"x": x})


def test_outlier_channels_are_large_in_absolute_and_relative_terms() -> None:
    peaks = np.array([1.0, 1.2, 30.0, 0.9, 7.0, 1.1, 5.5])
    assert outlier_channels(peaks).tolist() == [2, 4]  # 5.5 is under 6
    assert outlier_channels(peaks, max_channels=1).tolist() == [2]  # the largest first
    assert outlier_channels(np.full(10, 8.0)).size == 0  # large but uniform: no outliers


def test_split_is_exact_in_fp32_and_makes_int8_far_more_accurate(tmp_path: Path) -> None:
    src = _graph(tmp_path / "toy.onnx")
    feeds = [{"x": _inputs(2, seed)} for seed in range(4)]
    split = split_activation_outliers(src, tmp_path / "split.onnx", feeds)
    # x's two outlier channels, split once for both readers; y has none
    assert split.channels == {"x": 2}
    assert split.fp32_nodes == ("q/MatMul/outliers", "k/MatMul/outliers")
    model = onnx.load(str(tmp_path / "split.onnx"))
    assert sum(n.op_type == "Gather" for n in model.graph.node) == 1
    meta = {p.key: p.value for p in model.metadata_props}
    assert "2 activation channels of 1 MatMul inputs" in meta["dwise.outlier_split"]

    x = _inputs(3, seed=99)  # not a calibration input
    ref = _run(src, x)
    for a, b in zip(ref, _run(tmp_path / "split.onnx", x), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4)

    plain = quantize_int8(src, tmp_path / "plain.int8.onnx", per_channel=True)
    q = quantize_int8(
        tmp_path / "split.onnx",
        tmp_path / "split.int8.onnx",
        per_channel=True,
        exclude=split.fp32_nodes,
    )
    err_plain = [np.abs(a - b).mean() for a, b in zip(ref, _run(plain, x), strict=True)]
    err_split = [np.abs(a - b).mean() for a, b in zip(ref, _run(q, x), strict=True)]
    # y and z read x directly: ~16x smaller error; u reads y (no outliers) and inherits it
    assert err_split[0] < err_plain[0] / 8 and err_split[1] < err_plain[1] / 8
    assert err_split[2] < err_plain[2] / 2
    small = [n for n in onnx.load(str(q)).graph.node if n.name in split.fp32_nodes]
    assert [n.op_type for n in small] == ["MatMul", "MatMul"]  # the split-off products stay FP32


def test_no_outliers_leaves_the_graph_as_it_was(tmp_path: Path) -> None:
    src = _graph(tmp_path / "toy.onnx")
    x = np.random.default_rng(1).normal(0, 1, (2, 12, D)).astype(np.float32)
    split = split_activation_outliers(src, tmp_path / "same.onnx", [{"x": x}])
    assert split.fp32_nodes == () and split.total_channels == 0
    for a, b in zip(_run(src, x), _run(tmp_path / "same.onnx", x), strict=True):
        np.testing.assert_array_equal(a, b)


def test_no_calibration_inputs_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    src = _graph(tmp_path / "toy.onnx")
    with pytest.raises(ModelError, match="no calibration inputs"):
        split_activation_outliers(src, tmp_path / "out.onnx", [])
    assert not (tmp_path / "out.onnx").exists()
