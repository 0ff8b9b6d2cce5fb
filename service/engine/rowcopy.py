"""Moves KV-cache rows inside their buffers on the buffers' own device.

When a generation leaves the batch, `SlotCache.keep` moves the later rows down so the active rows
stay contiguous. On CUDA the buffers live on the device, and onnxruntime's Python API has no copy
between parts of device buffers; bringing the whole cache to the host and back costs two
transfers of every row (tens of MB at 64 rows) for each row that leaves. Instead a tiny ONNX
graph of one Identity node per buffer is run with IO binding by address: input = the source rows'
bytes, output = the destination rows' bytes, so the copy is a device-to-device memcpy
(`cudaMemcpyAsync` on CUDA, `memcpy` on CPU), and the CPU runs the very same code.

The graph copies uint8 vectors, so one graph serves every KV dtype. Rows move down (dst < src);
`blocks` groups consecutive moves into block copies that never overlap their own source.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

COPY_OPSET = 17


def copy_graph(n_buffers: int) -> bytes:
    """An ONNX model: dst{i} = Identity(src{i}) for i < n_buffers, each a uint8 vector of any length."""

    def vec(name: str):
        return helper.make_tensor_value_info(name, TensorProto.UINT8, ["bytes"])

    nodes = [helper.make_node("Identity", [f"src{i}"], [f"dst{i}"]) for i in range(n_buffers)]
    graph = helper.make_graph(
        nodes, "kv_row_copy", [vec(f"src{i}") for i in range(n_buffers)], [vec(f"dst{i}") for i in range(n_buffers)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", COPY_OPSET)])
    model.ir_version = 8  # readable by every onnxruntime this project supports (>= 1.17)
    return model.SerializeToString()


def blocks(moves: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(dst, src) row moves, ascending with dst < src -> (dst, src, count) block copies, run in order.
    A block grows while its rows stay consecutive and shorter than the shift, so its destination
    never overlaps its own source; later blocks only read rows above what earlier ones wrote."""
    out: list[list[int]] = []
    for dst, src in moves:
        if out and (last := out[-1])[0] + last[2] == dst and last[1] + last[2] == src and last[2] < src - dst:
            last[2] += 1
        else:
            out.append([dst, src, 1])
    return [(d, s, c) for d, s, c in out]


class RowCopier:
    """Copies rows between places of the same buffers: `move([(dst, src), ...])`."""

    def __init__(self, providers: list, device: str, bases: list[int], row_bytes: int):
        """providers: the decoder session's (same device); bases: each buffer's address; row_bytes:
        bytes of one row of one buffer."""
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the Identity copies
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(copy_graph(len(bases)), sess_options=opts, providers=providers)
        self.device, self.bases, self.row_bytes = device, bases, row_bytes
        self.runs = 0  # graph runs so far (one per block)

    def move(self, moves: list[tuple[int, int]]) -> None:
        for dst, src, count in blocks(moves):
            size = count * self.row_bytes
            binding = self.session.io_binding()
            for i, base in enumerate(self.bases):
                binding.bind_input(f"src{i}", self.device, 0, np.uint8, [size], base + src * self.row_bytes)
                binding.bind_output(f"dst{i}", self.device, 0, np.uint8, [size], base + dst * self.row_bytes)
            self.session.run_with_iobinding(binding)
            self.runs += 1
