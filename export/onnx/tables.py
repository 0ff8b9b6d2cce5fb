"""8-bit embedding tables in the integer variants: com.microsoft `GatherBlockQuantized`.

A Gather reads one row of its table per token, so the table's precision costs no time, only
memory: every int8 and int4 file kept its fp32 tables (GPT-2's 50,257 x 768 token table is 154 MB
of its 225 MB int8 file; all-MiniLM-L6-v2's 30,522 x 384 is 47 MB of 70). This pass rewrites each
Gather on axis 0 of a constant float (rows, C) table as `GatherBlockQuantized` over uint8 values
with one fp32 scale and one uint8 zero point per block of `BLOCK` values along C (asymmetric:
q = round(w / scale) + zero_point, scale = (max - min) / 255 of the block, the block's range
holding 0 so a zero weight stays exact). onnxruntime dequantises only the gathered rows. The
error is at most half a step, 1/510 of a block's range: below the 7-bit weights and per-row
activation scales of the row-wise int8 MatMuls (export/onnx/quantize.py), and the gate judges
the whole variant as before. A table that any other node also reads (a tied head left as a
MatMul on it), or whose width no block size divides, is left in fp32.

onnxruntime's own `MatMulNBitsQuantizer` quantises Gathers to 4 bits only; 8 bits is the kernel's
`bits` attribute, written here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from export.onnx import store

log = logging.getLogger(__name__)

BLOCK = 32
BITS = 8
_QMAX = 2**BITS - 1


def quantize_table(table: np.ndarray, block: int = BLOCK) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, C) float -> (uint8 values (rows, C), fp32 scales (rows, C // block), uint8 zero points)."""
    rows, width = table.shape
    blocks = table.astype(np.float32).reshape(rows, width // block, block)
    lo = np.minimum(blocks.min(axis=-1), 0.0)
    hi = np.maximum(blocks.max(axis=-1), 0.0)
    scale = ((hi - lo) / _QMAX).astype(np.float32)
    scale[scale == 0] = 1.0  # an all-zero block: any scale gives zeros back
    zero = np.clip(np.round(-lo / scale), 0, _QMAX)
    values = np.clip(np.round(blocks / scale[..., None]) + zero[..., None], 0, _QMAX)
    return values.astype(np.uint8).reshape(rows, width), scale, zero.astype(np.uint8)


def dequantize_table(values: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """What the kernel gives back for every row (tests and the error figure)."""
    rows, width = values.shape
    block = width // scale.shape[1]
    q = values.reshape(rows, -1, block).astype(np.float32) - zero[..., None].astype(np.float32)
    return (q * scale[..., None]).reshape(rows, width)


def _block(width: int) -> int | None:
    return next((b for b in (BLOCK, 16) if width % b == 0), None)


def quantize_tables(model: onnx.ModelProto) -> dict:
    """Rewrites, in place, every eligible Gather (module doc); -> what it did, for the manifest."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    done: dict[str, tuple[str, str, str]] = {}  # table -> its quantised initializers
    saved, blocks = 0, set()
    nodes: list[onnx.NodeProto] = []
    for at, node in enumerate(graph.node):
        nodes.append(node)
        if node.op_type != "Gather" or node.input[0] not in inits:
            continue
        name = node.input[0]
        init = inits[name]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        block = _block(init.dims[1]) if len(init.dims) == 2 else None
        if (
            axis != 0
            or block is None
            or init.data_type != TensorProto.FLOAT
            or name in outputs
            or any(r.op_type != "Gather" for r in readers[name])
        ):
            continue
        if name not in done:
            table = numpy_helper.to_array(init)
            values, scale, zero = quantize_table(table, block)
            q = (f"{name}_q8", f"{name}_scales", f"{name}_zero_points")
            graph.initializer.extend(
                [
                    numpy_helper.from_array(values, q[0]),
                    numpy_helper.from_array(scale, q[1]),
                    numpy_helper.from_array(zero, q[2]),
                ]
            )
            done[name] = q
            blocks.add(block)
            saved += table.nbytes - values.nbytes - scale.nbytes - zero.nbytes
        q = done[name]
        nodes[-1] = helper.make_node(
            "GatherBlockQuantized",
            [q[0], node.input[1], q[1], q[2]],
            list(node.output),
            name=(node.name or f"gather_{at}") + "_q8",
            domain="com.microsoft",
            gather_axis=0,
            quantize_axis=1,
            block_size=block,
            bits=BITS,
        )
    if done:
        del graph.node[:]
        graph.node.extend(nodes)
    for name in done:
        graph.initializer.remove(inits[name])
        for value in [v for v in graph.input if v.name == name]:  # an initializer listed as an input too
            graph.input.remove(value)
    if done and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    figures: dict[str, Any] = {"bits": BITS, "block_size": BLOCK, "tables": len(done), "bytes_saved": int(saved)}
    if any(b != BLOCK for b in blocks):
        figures["block_sizes"] = sorted(blocks)
    if done:
        log.info("embedding tables at %d bits: %s", BITS, figures)
    return figures


def quantize_tables_file(path: Path) -> dict:
    """quantize_tables on an ONNX file, rewritten in place (when it had an eligible table)."""
    model = store.load(path)
    figures = quantize_tables(model)
    if figures["tables"]:
        store.save(model, path)
    return figures
