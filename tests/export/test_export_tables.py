"""8-bit embedding tables (export/onnx/tables.py) on onnxruntime: `GatherBlockQuantized` gives back
exactly the dequantised rows, within half a step of the fp32 table; a table another node reads
stays fp32; the tiny models' integer variants carry quantised tables and answer, through the
served graph, what the same graph with the dequantised table as a plain Gather answers."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.onnx.tables import dequantize_table, quantize_table, quantize_tables

V, C = 300, 64


def _gather_graph(table: np.ndarray, also_matmul: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Gather", ["table", "ids"], ["rows"], name="embed")]
    outputs = [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["n", C])]
    if also_matmul:  # a tied head reading the same table
        nodes.append(helper.make_node("MatMul", ["rows", "table_t"], ["logits"]))
        nodes.insert(0, helper.make_node("Transpose", ["table"], ["table_t"]))
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", V]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        outputs,
        [numpy_helper.from_array(table, "table")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _run(model: onnx.ModelProto, ids: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["rows"], {"ids": ids})[0]


def test_the_kernel_gives_back_the_dequantised_rows_within_half_a_step():
    rng = np.random.default_rng(0)
    table = rng.normal(scale=0.05, size=(V, C)).astype(np.float32)
    table[7] = 0.0  # an all-zero row
    table[9, :32] = rng.uniform(0.5, 1.0, 32)  # a block of positive values only: its range holds 0
    model = _gather_graph(table)
    figures = quantize_tables(model)
    assert figures == {"bits": 8, "block_size": 32, "tables": 1, "bytes_saved": table.nbytes - V * C - V * 2 * 5}
    assert [n.op_type for n in model.graph.node] == ["GatherBlockQuantized"]
    ids = np.array([0, 7, 9, 299, 9], np.int64)
    got = _run(model, ids)
    values, scale, zero = quantize_table(table)
    np.testing.assert_array_equal(got, dequantize_table(values, scale, zero)[ids])
    step = np.repeat(scale, 32, axis=1)[ids]
    assert np.all(np.abs(got - table[ids]) <= step / 2 + 1e-7)
    assert np.all(got[1] == 0.0)


def test_a_table_another_node_reads_stays_fp32():
    table = np.random.default_rng(1).normal(size=(V, C)).astype(np.float32)
    model = _gather_graph(table, also_matmul=True)
    assert quantize_tables(model)["tables"] == 0
    assert "Gather" in [n.op_type for n in model.graph.node]


def _dequantised_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with each GatherBlockQuantized turned back into a Gather over its fp32 rows."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {i.name: numpy_helper.to_array(i) for i in out.graph.initializer}
    for at, node in enumerate(list(out.graph.node)):
        if node.op_type != "GatherBlockQuantized":
            continue
        values, ids, scales, zeros = node.input
        table = dequantize_table(inits[values], inits[scales], inits[zeros])
        out.graph.initializer.append(numpy_helper.from_array(table, values + "_fp32"))
        out.graph.node.remove(node)
        out.graph.node.insert(at, helper.make_node("Gather", [values + "_fp32", ids], list(node.output)))
    return out


@pytest.mark.parametrize("name, variant", [("tiny-gpt", "int8"), ("tiny-embed", "int8")])
def test_the_integer_variants_carry_8_bit_tables(tiny_models_root, name, variant):
    directory = tiny_models_root / name
    manifest = json.loads((directory / "model.json").read_text())
    graph = next(g for g in manifest["graphs"] if g["variant"] == variant and g["role"] in ("decoder", "encoder"))
    model = onnx.load(str(directory / graph["file"]))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("GatherBlockQuantized") >= 1
    inits = {i.name: i for i in model.graph.initializer}
    gathered = [n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[0] in inits]
    assert all(inits[t].data_type != TensorProto.FLOAT or len(inits[t].dims) != 2 for t in gathered)
    assert graph["parity"]["tables"][graph["role"]]["tables"] >= 1

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    plain = ort.InferenceSession(_dequantised_copy(model).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = _feeds(session, np.random.default_rng(2).integers(3, 200, size=(2, 5)))
    for got, want in zip(session.run(None, feeds), plain.run(None, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def _feeds(session: ort.InferenceSession, ids: np.ndarray) -> dict[str, np.ndarray]:
    """A prefill of ids (batch, length) for a decoder (an empty KV buffer of 8 positions), or ids
    with their mask for an encoder."""
    rows, length = ids.shape
    if "attention_mask" in {i.name for i in session.get_inputs()}:
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    feeds = {
        "input_ids": ids,
        "position_ids": np.tile(np.arange(length), (rows, 1)),
        "seqlens_k": np.full(rows, length - 1, np.int32),
        "total_sequence_length": np.array(length, np.int32),
        "logits_positions": np.tile(np.arange(length), (rows, 1)),
    }
    for spec in session.get_inputs():
        if spec.name.startswith("past"):
            feeds[spec.name] = np.zeros([rows, spec.shape[1], 8, spec.shape[3]], np.float32)
    return feeds
