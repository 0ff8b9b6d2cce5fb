"""The classification engine: the padded encoder graph (role `encoder`: input_ids, attention_mask and,
for BERT pairs, token_type_ids) -> logits (B, labels); the core applies the activation."""

from __future__ import annotations

import numpy as np

from service.embedding.engine import PaddedEncoder
from service.engine.tokenization import Encoded


class ClassifierEngine(PaddedEncoder[np.ndarray]):
    def forward(self, batch: list[Encoded]) -> np.ndarray:
        """(B, L) float32 logits, in batch order. Blocking: run it in the executor."""
        (out,) = self.session.run([self.output], self.feeds(batch))
        return np.asarray(out, dtype=np.float32)
