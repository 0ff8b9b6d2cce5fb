"""Embedding vectors on the wire, in one place: float values or packed little-endian float32 bytes.

`EmbedRequest.encoding = EMBEDDING_ENCODING_PACKED_FLOAT32` asks for each vector as
`Embedding.packed` (4 bytes per value, little-endian) instead of `Embedding.values` (one protobuf
float per value), as OpenAI's `encoding_format=base64` and Triton's `raw_output_contents` do: one
bytes copy per vector on the server instead of a Python float per value, and the client reads them
with one `numpy.frombuffer` (client.array).
"""

from __future__ import annotations

import numpy as np

from service.proto import inference_pb2 as pb

WIRE_DTYPE = np.dtype("<f4")


def embeddings(vectors: np.ndarray, packed: bool) -> list[pb.Embedding]:
    """(N, D) float32 -> N Embedding messages: one tobytes() or one tolist() per row, no step per float."""
    if packed:
        wire = vectors.astype(WIRE_DTYPE, copy=False)  # a no-op on little-endian hosts
        return [pb.Embedding(packed=row.tobytes()) for row in wire]
    return [pb.Embedding(values=row) for row in vectors.tolist()]
