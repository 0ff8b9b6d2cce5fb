"""The fill-mask engines: the embedding engines' sessions, padding or packing, a different output step.

The graph (kind "fill-mask", export/onnx/fill_mask.py) returns `logits` (B, T, V) at every position;
`forward` keeps the rows at the `[MASK]` positions of the whole batch at once, turns them into
probabilities (softmax over the vocabulary, as Hugging Face's fill-mask pipeline does) and keeps
the `keep` most likely tokens of each mask, best first (ties: lower id first). It returns one
`MaskRows` per input, so the embedding `Batcher` scatters them back to their calls unchanged;
each call then slices its own `top_k <= keep`. The packed engine gives the graph the [MASK]
positions (`gather_positions`) and gets their logits alone. Blocking: runs in the runtime's executor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from service.embedding.engine import PackedEncoder, PaddedEncoder
from service.engine.tokenization import Encoded

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


def mask_rows(logits: np.ndarray, inputs: np.ndarray, count: int, keep: int) -> list[MaskRows]:
    """Logits (M, V) of the masks, `inputs` (M,) saying whose (ascending) -> one MaskRows per input."""
    probs = softmax(np.asarray(logits, dtype=np.float32))  # (M, V)
    ids, scores = top_candidates(probs, keep)  # (M, K), (M, K)
    ends = np.cumsum(np.bincount(inputs, minlength=count))  # (B,): where each input's masks end
    starts = ends - np.bincount(inputs, minlength=count)
    return [MaskRows(ids[a:b], scores[a:b]) for a, b in zip(starts, ends, strict=True)]


class FillMaskEngine(PaddedEncoder[list[MaskRows]]):
    runs_by_length = True

    def __init__(self, session: ort.InferenceSession, pad_id: int, mask_id: int, keep: int, model: str = ""):
        super().__init__(session, pad_id, model)
        outputs = [o.name for o in session.get_outputs()]
        if OUTPUT not in outputs:
            raise ValueError(f"fill-mask graph has no {OUTPUT!r} output (has: {', '.join(outputs)})")
        self.output, self.mask_id, self.keep = OUTPUT, mask_id, keep

    def forward(self, batch: list[Encoded]) -> list[MaskRows]:
        """One MaskRows per input of the batch, in batch order."""
        return self.in_runs(batch, self._pass)

    def _pass(self, inputs: list[Encoded]) -> list[MaskRows]:
        feeds = self.feeds(inputs)
        (logits,) = self.session.run([self.output], feeds)  # (B, T, V)
        rows, cols = np.nonzero(feeds["input_ids"] == self.mask_id)  # (M,), (M,): row-major, masks in order
        return mask_rows(logits[rows, cols], rows, len(inputs), self.keep)


class PackedFillMaskEngine(PackedEncoder[list[MaskRows]]):
    """The packed fill-mask graph: + `gather_positions` (M,) -> `logits` (M, V) at the masks only
    (the MLM head runs nowhere else)."""

    def __init__(
        self,
        session: ort.InferenceSession,
        pad_id: int,
        mask_id: int,
        keep: int,
        row_tokens: int,
        model: str = "",
        align: int = 1,
    ):
        super().__init__(session, pad_id, row_tokens, model=model, align=align)
        if "gather_positions" not in [i.name for i in session.get_inputs()]:
            raise ValueError("packed fill-mask graph has no gather_positions input")
        self.output, self.mask_id, self.keep = OUTPUT, mask_id, keep

    def forward(self, batch: list[Encoded]) -> list[MaskRows]:
        """One MaskRows per input of the batch, in batch order."""
        packed = self.pack(batch)
        inputs, offsets = [], []
        for i, e in enumerate(batch):
            at = [k for k, t in enumerate(e.ids) if t == self.mask_id]
            inputs += [i] * len(at)
            offsets += at
        gather = packed.flat_positions(offsets, inputs)  # (M,): input order, masks in order
        (logits,) = self.session.run([self.output], {**self.feeds(packed), "gather_positions": gather})  # (M, V)
        return mask_rows(logits, np.asarray(inputs, np.int64), len(batch), self.keep)
