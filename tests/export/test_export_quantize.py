"""Row-wise dynamic int8 (export/onnx/quantize.py) against a numpy implementation of its formula, on
onnxruntime: the rewritten graph computes what the docstring says, a row's result does not move
with its batch, shared inputs are quantised once, and products of two activations stay fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.onnx.quantize import quantize_rowwise

K, N1, N2 = 64, 48, 32


def _graph(path: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x (B, T, K) -> y1 = x @ W1, y2 = x @ W2 (same input), z = y1 @ y1^T (activations only),
    u = relu(x) @ W1 (a weight used twice)."""
    w1 = rng.normal(scale=0.2, size=(K, N1)).astype(np.float32)
    w2 = rng.normal(scale=0.05, size=(K, N2)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["y1"]),
        helper.make_node("MatMul", ["x", "w2"], ["y2"]),
        helper.make_node("Transpose", ["y1"], ["y1t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["y1", "y1t"], ["z"]),
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MatMul", ["r", "w1"], ["u"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", K])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2", "z", "u")],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return {"w1": w1, "w2": w2}


def _reference(x: np.ndarray, w: np.ndarray, bits: int = 7) -> np.ndarray:
    """The formula of export/onnx/quantize.py in numpy (integer products in int64)."""
    qmax = 2 ** (bits - 1) - 1
    scale = np.maximum(np.abs(x).max(axis=-1, keepdims=True) / np.float32(127), np.float32(1e-12))
    q = np.floor(x / scale + np.float32(128.5)).astype(np.int64) - 128
    col = np.maximum(np.abs(w).max(axis=0), 1e-30) / qmax
    wq = np.clip(np.round(w / col.astype(np.float32)), -qmax, qmax).astype(np.int64)
    return (q @ wq).astype(np.float32) * col.astype(np.float32) * scale


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rowq")
    weights = _graph(tmp / "fp32.onnx", np.random.default_rng(0))
    rewritten = quantize_rowwise(tmp / "fp32.onnx", tmp / "int8.onnx")
    sessions = {
        name: ort.InferenceSession(str(tmp / f"{name}.onnx"), providers=["CPUExecutionProvider"])
        for name in ("fp32", "int8")
    }
    return sessions, weights, rewritten, onnx.load(str(tmp / "int8.onnx"))


def test_rewrites_constant_weight_products_and_shares_the_quantisation(graphs):
    _, _, rewritten, model = graphs
    ops = [n.op_type for n in model.graph.node]
    assert rewritten == 3 and ops.count("MatMulIntegerToFloat") == 3
    assert ops.count("Abs") == 2  # x is quantised once for both of its products, relu(x) once
    assert sum(i.name.startswith("w1") for i in model.graph.initializer) == 2  # W1 once: values + scales
    assert ops.count("MatMul") == 1  # y1 @ y1^T: no constant weight, left in fp32
    assert {i.name for i in model.graph.initializer}.isdisjoint({"w1", "w2"})  # fp32 weights are gone


def test_matches_the_formula_and_stays_close_to_fp32(graphs):
    sessions, weights, _, _ = graphs
    x = np.random.default_rng(1).normal(size=(3, 5, K)).astype(np.float32)
    x[1, 2] = 0.0  # an all-zero row: its scale floor keeps it finite
    x[2, 0] *= 100.0  # one loud row does not coarsen the others
    y1, y2, z, u = sessions["int8"].run(None, {"x": x})
    f1, f2, _fz, _ = sessions["fp32"].run(None, {"x": x})
    np.testing.assert_allclose(y1, _reference(x, weights["w1"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y2, _reference(x, weights["w2"]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(u, _reference(np.maximum(x, 0), weights["w1"]), rtol=1e-5, atol=1e-6)
    assert np.all(y1[1, 2] == 0.0) and np.isfinite(z).all()
    rel = np.abs(y1 - f1).max(axis=-1) / np.abs(f1).max(axis=-1).clip(1e-6)
    assert rel.max() < 0.05  # 8-bit activations, 7-bit weights: a few per cent at most
    assert np.abs(y2 - f2).max() > 0  # and it really is quantised


def test_a_row_gives_the_same_bits_alone_and_in_any_batch(graphs):
    sessions, _, _, _ = graphs
    rng = np.random.default_rng(2)
    crowd = rng.normal(size=(8, 1, K)).astype(np.float32) * rng.uniform(0.01, 10, size=(8, 1, 1)).astype(np.float32)
    together = sessions["int8"].run(["y1", "y2"], {"x": crowd})
    for i in range(8):
        alone = sessions["int8"].run(["y1", "y2"], {"x": crowd[i : i + 1]})
        for a, t in zip(alone, together, strict=True):
            assert np.array_equal(a[0], t[i])
