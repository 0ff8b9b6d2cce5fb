"""The classification engines: the padded graph (role `encoder`: input_ids, attention_mask and, for BERT
pairs, token_type_ids -> logits (B, labels)) and the packed graph (role `packed`: inputs side by side
in rows of `row_tokens`, export/onnx/classifier.py, with `first_index` saying where each input starts and
token type ids packed in the same places) -> logits (B, labels). The core applies the activation."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from service.embedding.engine import PackedEncoder, PaddedEncoder
from service.engine.packing import pack
from service.engine.tokenization import Encoded


class ClassifierEngine(PaddedEncoder[np.ndarray]):
    runs_by_length = True

    def forward(self, batch: list[Encoded]) -> np.ndarray:
        """(B, L) float32 logits, in batch order. Blocking: run it in the executor."""
        return self.in_runs(batch, self._pass)

    def _pass(self, inputs: list[Encoded]) -> np.ndarray:
        (out,) = self.session.run([self.output], self.feeds(inputs))
        return np.asarray(out, dtype=np.float32)


class PackedClassifierEngine(PackedEncoder[np.ndarray]):
    def __init__(self, session: ort.InferenceSession, pad_id: int, row_tokens: int, model: str = "", align: int = 1):
        super().__init__(session, pad_id, row_tokens, "cls", model, align)
        self.types = "token_type_ids" in {i.name for i in session.get_inputs()}

    def forward(self, batch: list[Encoded]) -> np.ndarray:
        """(B, L) float32 logits, in batch order. Blocking: run it in the executor."""
        packed = self.pack(batch)
        feeds = self.feeds(packed)
        feeds["first_index"] = packed.row * packed.input_ids.shape[1] + packed.start  # (B,)
        if self.types:  # packed as the ids were (same lengths, same row_tokens): the same places
            width = max(self.row_tokens, max(len(e) for e in batch))
            feeds["token_type_ids"] = pack([e.type_ids for e in batch], width, 0, self.align).input_ids
        (out,) = self.session.run([self.output], feeds)
        return np.asarray(out, dtype=np.float32)
