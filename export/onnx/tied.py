"""A decoder's tied embedding stored once: the vocabulary projection reads the embedding table itself.

`x @ wte.weight.T` exports as a MatMul on the table's transpose, which constant folding stores as
a second initializer beside the embedding's Gather table (+147 MiB for GPT-2, +113 MiB for a
SmolLM-135M). `share_tied_table` rewrites that MatMul as `Gemm(transB=1)` on the Gather's table
between a Flatten and a Reshape, and drops the transposed copy. (A Flatten, not a Reshape: the
transformer optimizer's gpt2 post-pass turns Reshape -> Gemm -> Reshape into a MatMul that ignores
transB.) Reduced-precision variants quantise the
projection's weight on their own (`untied_matmul` gives the quantisers back a plain MatMul): their
head is then a compact copy, not a second fp32 table.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

_GEMM = "/tied_head/Gemm"


def _tables(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Constant Gather tables (V, C) by initializer name."""
    inits = {i.name: i for i in graph.initializer}
    return {
        n.input[0]: numpy_helper.to_array(inits[n.input[0]])
        for n in graph.node
        if n.op_type == "Gather" and n.input[0] in inits
    }


def share_tied_table(model: onnx.ModelProto) -> bool:
    """Rewrites, in place, the MatMul whose weight is a Gather table transposed; -> whether one was found."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    tables = _tables(graph)
    for at, node in enumerate(graph.node):
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2:
            continue
        w = numpy_helper.to_array(weight)
        table = next((name for name, t in tables.items() if t.shape == w.shape[::-1] and np.array_equal(t, w.T)), None)
        if table is None:
            continue
        x, out, p = node.input[0], node.output[0], "/tied_head/"
        graph.initializer.extend([numpy_helper.from_array(np.array([w.shape[1]], np.int64), p + "vocab")])
        nodes = [
            helper.make_node("Flatten", [x], [p + "x2d"], name=p + "Flatten", axis=-1),  # (B*T, C)
            helper.make_node("Gemm", [p + "x2d", table], [p + "logits2d"], name=_GEMM, transB=1),  # (B*T, V)
            helper.make_node("Shape", [x], [p + "lead"], name=p + "Shape", start=0, end=-1),  # [B, T]
            helper.make_node("Concat", [p + "lead", p + "vocab"], [p + "shape"], name=p + "Concat", axis=0),
            helper.make_node("Reshape", [p + "logits2d", p + "shape"], [out], name=p + "Unflatten"),  # (B, T, V)
        ]
        del graph.node[at]
        for i, n in enumerate(nodes):
            graph.node.insert(at + i, n)
        graph.initializer.remove(weight)
        return True
    return False


def untied_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of model whose tied head (from `share_tied_table`) is a MatMul on its own transposed
    weight again, the form weight quantisers rewrite; model itself is left as it is."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    gemm = next((n for n in graph.node if n.name == _GEMM), None)
    if gemm is None:
        return copy
    table = numpy_helper.to_array(next(i for i in graph.initializer if i.name == gemm.input[1]))
    name = gemm.input[1] + "/transposed"
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(table.T), name))
    gemm.op_type, gemm.input[1] = "MatMul", name
    del gemm.attribute[:]
    return copy
