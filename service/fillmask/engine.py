"""The fill-mask engine: the embedding engine's session and padding, a different output step.

The graph (kind "fill-mask", export/fill_mask.py) returns `logits` (B, T, V) at every position;
`forward` keeps the rows at the `[MASK]` positions of the whole batch at once, turns them into
probabilities (softmax over the vocabulary, as Hugging Face's fill-mask pipeline does) and keeps
the `keep` most likely tokens of each mask, best first (ties: lower id first). It returns one
`MaskRows` per input, so the embedding `Batcher` scatters them back to their calls unchanged;
each call then slices its own `top_k <= keep`. Blocking: it runs in the runtime's executor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.embedding.engine import EmbeddingEngine
from service.embedding.tokenization import Encoded

OUTPUT = "logits"


@dataclass(frozen=True)
class MaskRows:
    """One input's predictions: per mask (in order), the `keep` best token ids and probabilities."""

    token_ids: np.ndarray  # (M, K) int64
    scores: np.ndarray  # (M, K) float32, descending along K


def softmax(logits: np.ndarray) -> np.ndarray:
    """(M, V) -> (M, V) float32 probabilities, each row summing to 1."""
    shifted = logits - logits.max(axis=-1, keepdims=True)  # (M, V)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def top_candidates(probs: np.ndarray, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, V) -> ids (M, K), probabilities (M, K) of the K most likely tokens, best first."""
    if probs.shape[0] == 0:
        return np.zeros((0, keep), np.int64), np.zeros((0, keep), np.float32)
    part = np.argpartition(-probs, keep - 1, axis=-1)[:, :keep]  # (M, K), unordered
    part_scores = np.take_along_axis(probs, part, axis=-1)  # (M, K)
    order = np.lexsort((part, -part_scores), axis=-1)  # by score descending, then id ascending
    ids = np.take_along_axis(part, order, axis=-1).astype(np.int64)  # (M, K)
    return ids, np.take_along_axis(part_scores, order, axis=-1)


class FillMaskEngine(EmbeddingEngine):
    def __init__(self, session: ort.InferenceSession, pad_id: int, mask_id: int, keep: int):
        super().__init__(session, pad_id)
        outputs = [o.name for o in session.get_outputs()]
        if OUTPUT not in outputs:
            raise ValueError(f"fill-mask graph has no {OUTPUT!r} output (has: {', '.join(outputs)})")
        self.output, self.mask_id, self.keep = OUTPUT, mask_id, keep

    def forward(self, batch: list[Encoded]) -> list[MaskRows]:
        """One MaskRows per input of the batch, in batch order."""
        feeds = self.feeds(batch)
        (logits,) = self.session.run([self.output], feeds)  # (B, T, V)
        rows, cols = np.nonzero(feeds["input_ids"] == self.mask_id)  # (M,), (M,): row-major, masks in order
        probs = softmax(np.asarray(logits[rows, cols], dtype=np.float32))  # (M, V)
        ids, scores = top_candidates(probs, self.keep)  # (M, K), (M, K)
        ends = np.cumsum(np.bincount(rows, minlength=len(batch)))  # (B,): where each row's masks end
        starts = ends - np.bincount(rows, minlength=len(batch))
        return [MaskRows(ids[a:b], scores[a:b]) for a, b in zip(starts, ends, strict=True)]
