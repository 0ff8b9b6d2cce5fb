"""The embedding engine: one onnxruntime encoder session, per-batch padding, numpy post-processing.

The session is introspected once at load: which of input_ids / attention_mask / token_type_ids it
takes and with which integer dtype, and its output (sentence_embedding, (B, C), pooled and not
normalised: export/encoder.py). `forward` is blocking and runs in the runtime's compute executor;
it never sees protobuf. `postprocess` keeps the first `dimensions` values and L2-normalises
(Matryoshka-style truncation, then re-normalisation).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.embedding.tokenization import Encoded

_KNOWN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_ORT_INT_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


class EmbeddingEngine:
    def __init__(self, session: ort.InferenceSession, pad_id: int):
        self.session = session
        self.pad_id = pad_id
        self.input_types = {}
        for node in session.get_inputs():
            if node.name not in _KNOWN_INPUTS or node.type not in _ORT_INT_TYPES:
                raise ValueError(f"encoder graph input {node.name} ({node.type}) is not one of "
                                 f"{', '.join(_KNOWN_INPUTS)} as int32/int64")
            self.input_types[node.name] = _ORT_INT_TYPES[node.type]
        if "input_ids" not in self.input_types:
            raise ValueError("encoder graph has no input_ids input")
        outputs = [o.name for o in session.get_outputs()]
        self.output = "sentence_embedding" if "sentence_embedding" in outputs else outputs[0]
        self.provider = session.get_providers()[0]

    def feeds(self, batch: list[Encoded]) -> dict[str, np.ndarray]:
        """Pads the batch to its longest row: input_ids / attention_mask / token_type_ids, (B, T)."""
        rows, width = len(batch), max(len(e) for e in batch)
        ids = np.full((rows, width), self.pad_id, dtype=np.int64)  # (B, T)
        types = np.zeros((rows, width), dtype=np.int64)  # (B, T)
        mask = np.zeros((rows, width), dtype=np.int64)  # (B, T)
        for r, e in enumerate(batch):
            ids[r, : len(e)] = e.ids
            types[r, : len(e)] = e.type_ids
            mask[r, : len(e)] = 1
        arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: arrays[name].astype(dtype, copy=False) for name, dtype in self.input_types.items()}

    def forward(self, batch: list[Encoded]) -> np.ndarray:
        """(B, C) float32 pooled embeddings, not normalised. Blocking: run it in the executor."""
        (out,) = self.session.run([self.output], self.feeds(batch))
        return np.asarray(out, dtype=np.float32)


def postprocess(embeddings: np.ndarray, normalize: bool, dimensions: int) -> np.ndarray:
    """(N, C) -> (N, dimensions or C): keep the first `dimensions` values, then L2-normalise if asked."""
    out = embeddings[:, :dimensions] if dimensions else embeddings  # (N, D)
    if normalize:
        norms = np.linalg.norm(out, axis=1, keepdims=True)  # (N, 1)
        out = out / np.maximum(norms, 1e-12)
    return out.astype(np.float32, copy=False)
