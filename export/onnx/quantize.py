"""Row-wise dynamic int8 for decoder graphs: integer matrix products whose rows do not see each other.

onnxruntime's `quantize_dynamic` gives a MatMul's activations one scale per tensor, so a row's
result depends on the other rows of its batch, which continuous batching cannot accept. This pass
rewrites every MatMul with a constant 2-D weight as `MatMulIntegerToFloat` over activations
quantised with one scale per row and weights with one scale per output column, in 7 bits (the
AVX2 u8 x s8 kernel's int16 pair sums cannot saturate). The integer products are exact, so a row's
output is the same in any batch (the gate's `batch_max_abs_diff` checks it). The scheme, why 7
bits, and what it replaced: docs/design/export.md; figures: docs/performance.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.onnx import store
from export.onnx.tied import untied_matmul

WEIGHT_BITS = 7
_ZERO_POINT = 128


def quantize_rowwise(src: Path, dst: Path, weight_bits: int = WEIGHT_BITS, keep_down: bool = False) -> int:
    """src (fp32 ONNX) -> dst with row-wise int8 MatMuls; returns how many MatMuls were rewritten.
    keep_down: the products that narrow their input (a (K, N) weight with K > N: a feed-forward
    block's down projection, which reads its widest activations, after the GELU) stay fp32."""
    model = untied_matmul(store.load(src))  # the tied head's own int8 copy, not the fp32 table
    graph = model.graph
    weights = {i.name: i for i in graph.initializer if len(i.dims) == 2 and i.data_type == TensorProto.FLOAT}
    qmax = 2 ** (weight_bits - 1) - 1
    added: list[onnx.TensorProto] = []

    def constant(name: str, value: np.ndarray) -> str:
        added.append(numpy_helper.from_array(value, name))
        return name

    eps = constant("rowq/eps", np.array(1e-12, np.float32))
    inv_127 = constant("rowq/inv_127", np.array(1 / 127, np.float32))
    shift = constant("rowq/shift", np.array(_ZERO_POINT + 0.5, np.float32))
    zero_point = constant("rowq/zero_point", np.array(_ZERO_POINT, np.uint8))
    one = constant("rowq/one", np.array(1.0, np.float32))

    nodes: list[onnx.NodeProto] = []
    quantised: dict[str, tuple[str, str]] = {}  # activation name -> (uint8 tensor, row scales)
    replaced: set[str] = set()
    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if weight is None or (keep_down and weight.dims[0] > weight.dims[1]):
            nodes.append(node)
            continue
        act = node.input[0]
        if act not in quantised:
            p = f"rowq/{len(quantised)}/"
            nodes += [
                helper.make_node("Abs", [act], [p + "abs"], name=p + "Abs"),
                helper.make_node("ReduceMax", [p + "abs"], [p + "absmax"], name=p + "ReduceMax", axes=[-1], keepdims=1),
                helper.make_node("Mul", [p + "absmax", inv_127], [p + "scale_raw"], name=p + "Scale"),
                helper.make_node("Max", [p + "scale_raw", eps], [p + "scale"], name=p + "ScaleFloor"),
                helper.make_node("Div", [act, p + "scale"], [p + "scaled"], name=p + "Div"),
                helper.make_node("Add", [p + "scaled", shift], [p + "shifted"], name=p + "Shift"),
                helper.make_node("Cast", [p + "shifted"], [p + "q"], name=p + "Cast", to=TensorProto.UINT8),
            ]
            quantised[act] = (p + "q", p + "scale")
        q, row_scale = quantised[act]
        name = weight.name + "/rowq"
        if weight.name not in replaced:  # a weight used by several products is quantised once
            w = numpy_helper.to_array(weight).astype(np.float32)
            col_scale = (np.maximum(np.abs(w).max(axis=0), 1e-30) / qmax).astype(np.float32)
            constant(name, np.clip(np.round(w / col_scale), -qmax, qmax).astype(np.int8))
            constant(name + "/scale", col_scale)
        out = node.output[0]
        nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [q, name, one, name + "/scale", zero_point],
                [out + "/unscaled"],
                name=(node.name or out) + "/rowq",
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [out + "/unscaled", row_scale], [out], name=(node.name or out) + "/rowq_scale"),
        ]
        replaced.add(weight.name)

    still_used = {i for n in nodes for i in n.input}
    kept = [i for i in graph.initializer if i.name in still_used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + [c for c in added if c.name in still_used])
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    store.save(model, dst)
    return sum(1 for n in nodes if n.op_type == "MatMulIntegerToFloat")
